"""Qwen3-ASR modules: the AuT audio encoder, the Qwen3 text decoder and the model that joins them.

Module names follow the checkpoint's keys (after the release's `thinker.` prefix), so loading needs no
renaming beyond `sanitize`.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_qwen3asr.model.config import AudioConfig, ModelConfig, TextConfig, conv_output_length
from mlx_qwen3asr.model.ops import Linear, attention, attention_with_prefix, gelu, project, silu

# --------------------------------------------------------------------------------------------------
# Audio encoder
# --------------------------------------------------------------------------------------------------


@dataclass
class EncoderBatch:
    """The audio of one or more segments, laid out for the encoder.

    The transformer's dense parts run on the T real tokens only; attention runs on windows.
    chunks:   (N, n_mels, chunk_frames, 1) mel chunks of every segment, in order; tails zero-padded.
    rows:     (T,) row of the flattened conv output (N * tokens_per_chunk rows) holding each real token,
              segments one after another.
    slots:    (W * window_tokens,) token of every attention window slot, or T for an empty slot.
    key_mask: (W, window_tokens) True where a window slot holds a real token; None when all do.
    gather:   (T,) slot of each real token.
    token_counts: audio tokens per segment (sum T).
    """

    chunks: mx.array
    rows: mx.array
    slots: mx.array
    key_mask: mx.array | None
    gather: mx.array
    token_counts: list[int]


def sinusoids(length: int, channels: int, max_timescale: float = 10000.0) -> np.ndarray:
    """Whisper's sinusoidal table, computed in float32 like the reference."""
    log_timescale_increment = np.log(max_timescale) / (channels // 2 - 1)
    inv_timescales = np.exp(-log_timescale_increment * np.arange(channels // 2, dtype=np.float32))
    scaled_time = np.arange(length, dtype=np.float32)[:, None] * inv_timescales[None, :].astype(np.float32)
    return np.concatenate([np.sin(scaled_time), np.cos(scaled_time)], axis=1).astype(np.float32)


class AudioAttention(nn.Module):
    def __init__(self, config: AudioConfig):
        super().__init__()
        d = config.d_model
        self.num_heads = config.encoder_attention_heads
        self.head_dim = d // self.num_heads
        self.scale = self.head_dim**-0.5
        self.window = config.tokens_per_chunk * config.chunks_per_window
        self.q_proj = nn.Linear(d, d, bias=True)
        self.k_proj = nn.Linear(d, d, bias=True)
        self.v_proj = nn.Linear(d, d, bias=True)
        self.out_proj = nn.Linear(d, d, bias=True)

    def __call__(self, x: mx.array, batch: EncoderBatch) -> mx.array:
        """(T, D) packed tokens -> (T, D); each token attends within its window."""
        T, D = x.shape
        pad = mx.zeros((1, D), dtype=x.dtype)

        def windows(y: mx.array) -> mx.array:
            y = mx.concatenate([y, pad], axis=0)[batch.slots]
            return y.reshape(-1, self.window, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = windows(self.q_proj(x)), windows(self.k_proj(x)), windows(self.v_proj(x))
        mask = None if batch.key_mask is None else batch.key_mask[:, None, None, :]
        out = attention(q, k, v, self.scale, mask)
        out = out.transpose(0, 2, 1, 3).reshape(-1, D)[batch.gather]
        return self.out_proj(out)


class AudioEncoderLayer(nn.Module):
    def __init__(self, config: AudioConfig):
        super().__init__()
        d = config.d_model
        self.self_attn = AudioAttention(config)
        self.self_attn_layer_norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, config.encoder_ffn_dim)
        self.fc2 = nn.Linear(config.encoder_ffn_dim, d)
        self.final_layer_norm = nn.LayerNorm(d)

    def __call__(self, x: mx.array, batch: EncoderBatch) -> mx.array:
        x = x + self.self_attn(self.self_attn_layer_norm(x), batch)
        return x + self.fc2(gelu(self.fc1(self.final_layer_norm(x))))


class AudioEncoder(nn.Module):
    """AuT: a conv stem per 100-frame chunk, a transformer attending within 8-chunk windows, a projector."""

    def __init__(self, config: AudioConfig):
        super().__init__()
        self.config = config
        ch, d = config.downsample_hidden_size, config.d_model
        self.conv2d1 = nn.Conv2d(1, ch, 3, stride=2, padding=1)
        self.conv2d2 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.conv2d3 = nn.Conv2d(ch, ch, 3, stride=2, padding=1)
        self.conv_out = nn.Linear(ch * config.conv_freq_bins, d, bias=False)
        self.layers = [AudioEncoderLayer(config) for _ in range(config.encoder_layers)]
        self.ln_post = nn.LayerNorm(d)
        self.proj1 = nn.Linear(d, d)
        self.proj2 = nn.Linear(d, config.output_dim)
        # Positions restart in every chunk, so only the first tokens_per_chunk rows are ever used.
        self._positions = mx.array(sinusoids(config.tokens_per_chunk, d))

    def embed_chunks(self, chunks: mx.array) -> mx.array:
        """(N, n_mels, frames, 1) mel chunks -> (N, tokens_per_chunk, d_model)."""
        x = gelu(self.conv2d1(chunks))
        x = gelu(self.conv2d2(x))
        x = gelu(self.conv2d3(x))
        N, F, T, C = x.shape
        # The reference flattens (channel, freq) with channel major.
        x = self.conv_out(x.transpose(0, 2, 3, 1).reshape(N, T, C * F))
        return x + self._positions[:T].astype(x.dtype)

    def encode_embedded(self, x: mx.array, batch: EncoderBatch) -> mx.array:
        """(N, tokens_per_chunk, d_model) chunk embeddings of a batch -> (T, output_dim) features."""
        x = x.reshape(-1, x.shape[-1])[batch.rows]
        for layer in self.layers:
            x = layer(x, batch)
        x = self.ln_post(x)
        return self.proj2(gelu(self.proj1(x)))

    def __call__(self, batch: EncoderBatch) -> mx.array:
        """Encode a batch of segments; returns (T, output_dim), segments one after another."""
        return self.encode_embedded(self.embed_chunks(batch.chunks), batch)


# --------------------------------------------------------------------------------------------------
# Text decoder
# --------------------------------------------------------------------------------------------------


class KVCache:
    """Keys and values of one decoder layer, grown in steps so decoding appends without copying.

    A cache may start from a shared prefix (keys and values of a prompt start that every row has,
    batch 1): it is attended to by every row without being copied per row, and `offset` counts only
    the row's own positions after it.
    """

    step = 256

    def __init__(self, prefix: tuple[mx.array, mx.array] | None = None):
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0
        self.prefix = prefix

    @property
    def prefix_len(self) -> int:
        return 0 if self.prefix is None else self.prefix[0].shape[2]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        B, H, L, Dk = keys.shape
        prev = self.offset
        if self.keys is None or prev + L > self.keys.shape[2]:
            n_steps = (self.step + L - 1) // self.step
            grow_k = mx.zeros((B, H, n_steps * self.step, Dk), dtype=keys.dtype)
            grow_v = mx.zeros((B, H, n_steps * self.step, values.shape[3]), dtype=values.dtype)
            if self.keys is not None:
                self.keys = mx.concatenate([self.keys[..., :prev, :], grow_k], axis=2)
                self.values = mx.concatenate([self.values[..., :prev, :], grow_v], axis=2)
            else:
                self.keys, self.values = grow_k, grow_v
        self.offset += L
        self.keys[..., prev : self.offset, :] = keys
        self.values[..., prev : self.offset, :] = values
        return self.keys[..., : self.offset, :], self.values[..., : self.offset, :]

    @classmethod
    def stack(cls, caches: list[KVCache], capacity: int = 0) -> KVCache:
        """One cache holding the rows of several, each one's positions right-aligned at the largest offset.

        Rows of a shorter cache get zero keys and values in front (the caller masks them as padding).
        The result has room for `capacity` positions (at least the largest offset); past them it grows
        in steps as usual.
        """
        width = max(c.offset for c in caches)
        capacity = max(capacity, width)

        def aligned(a: mx.array, offset: int) -> mx.array:
            return mx.pad(a[..., :offset, :], [(0, 0), (0, 0), (width - offset, capacity - width), (0, 0)])

        out = cls(caches[0].prefix)
        out.keys = mx.concatenate([aligned(c.keys, c.offset) for c in caches], axis=0)
        out.values = mx.concatenate([aligned(c.values, c.offset) for c in caches], axis=0)
        out.offset = width
        return out

    def keep_rows(self, rows: mx.array) -> None:
        """Drop the batch rows not listed (finished sequences stop costing attention work)."""
        if self.keys is not None:
            self.keys, self.values = self.keys[rows], self.values[rows]

    @property
    def state(self) -> list[mx.array]:
        return [] if self.keys is None else [self.keys, self.values]


class Attention(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.scale = hd**-0.5
        bias = config.attention_bias
        self.q_proj = Linear(h, self.n_heads * hd, bias=bias)
        self.k_proj = Linear(h, self.n_kv_heads * hd, bias=bias)
        self.v_proj = Linear(h, self.n_kv_heads * hd, bias=bias)
        self.o_proj = Linear(self.n_heads * hd, h, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        # MRoPE with identical temporal/height/width positions (text and audio) is plain NeoX RoPE.
        self.rope = nn.RoPE(hd, traditional=False, base=config.rope_theta)

    def __call__(
        self, x: mx.array, mask=None, cache: KVCache | None = None, left_pad: mx.array | None = None
    ) -> mx.array:
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = 0 if cache is None else cache.prefix_len + cache.offset
        if left_pad is not None:
            # Left-padded rows: each row's first real token follows the prefix directly (pads get
            # the positions before it).
            offset = offset - left_pad
        q = self.rope(q, offset=offset)
        k = self.rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        if cache is not None and cache.prefix is not None:
            out = attention_with_prefix(q, *cache.prefix, k, v, self.scale, mask)
        else:
            out = attention(q, k, v, self.scale, mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, i, bias=False)
        self.up_proj = Linear(h, i, bias=False)
        self.down_proj = Linear(i, h, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(
        self, x: mx.array, mask=None, cache: KVCache | None = None, left_pad: mx.array | None = None
    ) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x), mask, cache, left_pad)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = [DecoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(
        self,
        x: mx.array,
        mask=None,
        cache: list[KVCache] | None = None,
        left_pad: mx.array | None = None,
    ) -> mx.array:
        """(B, L, hidden) input embeddings -> (B, L, hidden) final hidden states.

        left_pad: (B,) pad tokens before each row's first real token, for batches of prompts of
        different lengths; positions then count from each row's first real token. The caller's mask
        must hide the pad keys.
        """
        if mask is None and x.shape[1] > 1:
            mask = "causal"
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if cache is None else cache[i], left_pad)
        return self.norm(x)


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


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
            self.lm_head = Linear(t.hidden_size, t.vocab_size, bias=False)

    def make_cache(self, prefix: list[tuple[mx.array, mx.array]] | None = None) -> list[KVCache]:
        """A cache per decoder layer, each starting from its layer's shared prefix when given."""
        if prefix is None:
            return [KVCache() for _ in self.model.layers]
        return [KVCache(p) for p in prefix]

    def embed(self, input_ids: mx.array, audio_features: mx.array) -> mx.array:
        """Token embeddings with the audio features in place of the audio pad tokens, row by row."""
        x = self.model.embed_tokens(input_ids)
        is_audio = input_ids == self.config.audio_token_id
        # The k-th pad token in reading order takes the k-th audio feature.
        index = mx.maximum(mx.cumsum(is_audio.reshape(-1).astype(mx.int32)) - 1, 0).reshape(input_ids.shape)
        return mx.where(is_audio[..., None], audio_features.astype(x.dtype)[index], x)

    def logits(self, hidden: mx.array) -> mx.array:
        if "lm_head" in self:
            return self.lm_head(hidden)
        embed = self.model.embed_tokens
        if isinstance(embed, nn.Embedding):
            return project(embed.weight, hidden)
        return embed.as_linear(hidden)

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


def mel_chunks(mel: np.ndarray, chunk_frames: int) -> np.ndarray:
    """(n_mels, L) -> (ceil(L / chunk_frames), n_mels, chunk_frames, 1), the tail zero-padded."""
    n_mels, L = mel.shape
    n = -(-L // chunk_frames)
    padded = np.zeros((n_mels, n * chunk_frames), dtype=mel.dtype)
    padded[:, :L] = mel
    return padded.reshape(n_mels, n, chunk_frames).transpose(1, 0, 2)[..., None]


def encoder_batch(mels: list[np.ndarray], config: AudioConfig, dtype=mx.float32) -> EncoderBatch:
    """Lay out the mel spectrograms of several segments for one encoder call."""
    cf, tpc, cpw = config.chunk_frames, config.tokens_per_chunk, config.chunks_per_window
    window = tpc * cpw
    chunk_arrays, slot_rows = [], []
    chunk_base = 0
    counts = []
    for mel in mels:
        L = mel.shape[1]
        if L == 0:
            raise ValueError("a segment has no mel frames")
        chunk_arrays.append(mel_chunks(mel, cf))
        n_chunks = -(-L // cf)
        per_chunk = np.full(n_chunks, tpc)
        per_chunk[-1] = conv_output_length(L - (n_chunks - 1) * cf)
        n_windows = -(-n_chunks // cpw)
        # Each window slot holds a conv-output row, or -1 where the window is not full.
        rows = np.full(n_windows * window, -1, dtype=np.int64)
        for c in range(n_chunks):
            start = (c // cpw) * window + (c % cpw) * tpc
            rows[start : start + per_chunk[c]] = (chunk_base + c) * tpc + np.arange(per_chunk[c])
        slot_rows.append(rows)
        counts.append(int(per_chunk.sum()))
        chunk_base += n_chunks
    slot_rows_all = np.concatenate(slot_rows)
    valid = slot_rows_all >= 0
    gather = np.flatnonzero(valid)  # slot of each real token, in order
    slots = np.full(slot_rows_all.size, gather.size, dtype=np.int64)  # empty slots -> the zero row
    slots[gather] = np.arange(gather.size)
    valid_windows = valid.reshape(-1, window)
    return EncoderBatch(
        chunks=mx.array(np.concatenate(chunk_arrays, axis=0)).astype(dtype),
        rows=mx.array(slot_rows_all[gather].astype(np.int32)),
        slots=mx.array(slots.astype(np.int32)),
        key_mask=None if valid_windows.all() else mx.array(valid_windows),
        gather=mx.array(gather.astype(np.int32)),
        token_counts=counts,
    )


__all__ = [
    "AudioEncoder",
    "EncoderBatch",
    "KVCache",
    "Qwen3ASR",
    "TextModel",
    "encoder_batch",
]
