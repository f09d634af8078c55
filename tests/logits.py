"""Our model's logits at every prompt position, in one pass, for the parity and conversion checks."""

from __future__ import annotations

import mlx.core as mx

from mlx_qwen3asr.model.qwen3asr import Qwen3ASR


def prefill_logits(net: Qwen3ASR, prompt_ids: list[int], audio_features: mx.array) -> mx.array:
    """Logits of every prompt position."""
    ids = mx.array([prompt_ids], dtype=mx.int32)
    return net(net.embed(ids, audio_features))[0]
