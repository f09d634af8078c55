"""Audio features for many segments at once: segments share encoder calls up to a chunk budget."""

from __future__ import annotations

from collections.abc import Sequence

import mlx.core as mx
import numpy as np

from mlx_qwen3asr.checkpoints.loading import ASRModel
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.runtime.device import tuning

# Encoder work per call, in 100-frame chunks: bounds activation memory however much audio a batch holds.
ENCODER_CHUNKS_PER_CALL = 256


def encode_segments(model: ASRModel, mels: Sequence[np.ndarray]) -> list[mx.array]:
    """Audio features of each segment; segments share encoder calls up to a chunk budget."""
    cfg = model.config.audio_config
    features: list[mx.array] = []
    group: list[np.ndarray] = []
    chunks = 0

    def flush() -> None:
        batch = encoder_batch(group, cfg, model.dtype)
        tower = model.net.audio_tower
        # The conv stem's activations are the largest of the encoder: evaluated a few chunks at a time
        # they stay in cache and bounded.
        stem = []
        step = tuning().stem_chunks
        for i in range(0, batch.chunks.shape[0], step):
            stem.append(tower.embed_chunks(batch.chunks[i : i + step]))
            mx.eval(stem[-1])
        out = tower.encode_embedded(mx.concatenate(stem, axis=0), batch)
        mx.eval(out)
        offsets = np.cumsum([0, *batch.token_counts])
        features.extend(out[offsets[i] : offsets[i + 1]] for i in range(len(group)))

    for mel in mels:
        n = -(-mel.shape[1] // cfg.chunk_frames)
        if group and chunks + n > ENCODER_CHUNKS_PER_CALL:
            flush()
            group, chunks = [], 0
        group.append(mel)
        chunks += n
    if group:
        flush()
    return features
