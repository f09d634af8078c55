"""Qwen3-ASR's thinker: the audio encoder and the text decoder joined, with the output head.

Module names follow the checkpoint's keys (after the release's `thinker.` prefix), so loading needs no
renaming beyond `sanitize`.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlx_qwen3asr.model.cache import KVCache
from mlx_qwen3asr.model.config import ModelConfig
from mlx_qwen3asr.model.decoder import TextModel
from mlx_qwen3asr.model.encoder import AudioEncoder


class Qwen3ASR(nn.Module):
    """The thinker: audio encoder, text decoder and head (vocabulary, or timestamp classes for the aligner)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.audio_tower = AudioEncoder(config.audio_config)
        self.model = TextModel(config.text_config)
        t = config.text_config
        if config.is_forced_aligner:
            self.lm_head = nn.Linear(t.hidden_size, config.classify_num, bias=False)
        elif not t.tie_word_embeddings:
            self.lm_head = nn.Linear(t.hidden_size, t.vocab_size, bias=False)

    def make_cache(
        self, prefix: list[tuple[mx.array, mx.array]] | None = None, left_pad: mx.array | None = None
    ) -> list[KVCache]:
        """A cache per decoder layer, each starting from its layer's shared prefix when given.

        left_pad: (B,) pad positions in front of each row's first real one, for a batch of prompts of
        different lengths left-padded to one width (KVCache.left_pad).
        """
        if prefix is None:
            return [KVCache(left_pad=left_pad) for _ in self.model.layers]
        return [KVCache(p, left_pad) for p in prefix]

    def embed(self, input_ids: mx.array, audio_features: mx.array) -> mx.array:
        """Token embeddings with the audio features in place of the audio pad tokens, row by row."""
        x = self.model.embed_tokens(input_ids)
        if audio_features.size == 0:  # a prompt without audio
            return x
        is_audio = input_ids == self.config.audio_token_id
        # The k-th pad token in reading order takes the k-th audio feature.
        index = mx.maximum(mx.cumsum(is_audio.reshape(-1).astype(mx.int32)) - 1, 0).reshape(input_ids.shape)
        return mx.where(is_audio[..., None], audio_features.astype(x.dtype)[index], x)

    def logits(self, hidden: mx.array) -> mx.array:
        if "lm_head" in self:
            return self.lm_head(hidden)
        return self.model.embed_tokens.as_linear(hidden)

    def __call__(self, inputs_embeds: mx.array, mask=None, cache: list[KVCache] | None = None) -> mx.array:
        return self.logits(self.model(inputs_embeds, mask, cache))

    @staticmethod
    def sanitize(weights: dict[str, mx.array], config: ModelConfig) -> dict[str, mx.array]:
        """Map a release or MLX-converted state dict onto this module tree."""
        out = {}
        for key, value in weights.items():
            if key.startswith("thinker."):
                key = key[len("thinker.") :]
            # Conv weights are OIHW in the release and OHWI in MLX conversions.
            is_conv = key.startswith("audio_tower.conv2d") and key.endswith(".weight") and value.ndim == 4
            if is_conv and tuple(value.shape[1:3]) != (3, 3):
                value = value.transpose(0, 2, 3, 1)
            out[key] = value
        if config.text_config.tie_word_embeddings and not config.is_forced_aligner:
            # The release stores the tied head as a copy of the embedding; the head reuses the embedding.
            out.pop("lm_head.weight", None)
        return out


__all__ = ["Qwen3ASR"]
