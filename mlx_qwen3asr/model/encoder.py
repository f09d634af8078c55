"""The AuT audio encoder: a conv stem per mel chunk, a transformer attending within windows, a projector.

Module names follow the checkpoint's keys (`audio_tower.*`), so loading needs no renaming beyond
Qwen3ASR.sanitize. encoder_batch lays out the mel spectrograms of several segments for one call.
"""

from __future__ import annotations

from dataclasses import dataclass

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from mlx_qwen3asr.model.config import AudioConfig, conv_output_length


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
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
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
        return x + self.fc2(nn.gelu(self.fc1(self.final_layer_norm(x))))


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
        x = nn.gelu(self.conv2d1(chunks))
        x = nn.gelu(self.conv2d2(x))
        x = nn.gelu(self.conv2d3(x))
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
        return self.proj2(nn.gelu(self.proj1(x)))

    def __call__(self, batch: EncoderBatch) -> mx.array:
        """Encode a batch of segments; returns (T, output_dim), segments one after another."""
        return self.encode_embedded(self.embed_chunks(batch.chunks), batch)


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
    "encoder_batch",
    "mel_chunks",
    "sinusoids",
]
