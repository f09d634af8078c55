"""The Qwen3 text decoder: embeddings, decoder layers with grouped-query attention, the final norm.

Module names follow the checkpoint's keys (`model.*`), so loading needs no renaming beyond
Qwen3ASR.sanitize. Every call takes `(x, mask, cache)`: the cache (model/cache.py) knows each row's
positions and padding and so gives the mask when none is passed. Every operation is one of MLX's own
(nn.Linear or nn.QuantizedLinear, mx.fast.rms_norm, mx.fast.rope, mx.fast.scaled_dot_product_attention,
nn.silu), the same on every device.
"""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn

from mlx_qwen3asr.model.cache import KVCache, causal
from mlx_qwen3asr.model.config import TextConfig


class Attention(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        h, hd = config.hidden_size, config.head_dim
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.scale = hd**-0.5
        bias = config.attention_bias
        self.q_proj = nn.Linear(h, self.n_heads * hd, bias=bias)
        self.k_proj = nn.Linear(h, self.n_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(h, self.n_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * hd, h, bias=bias)
        self.q_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        self.k_norm = nn.RMSNorm(hd, eps=config.rms_norm_eps)
        # MRoPE with identical temporal/height/width positions (text and audio) is plain NeoX RoPE.
        self.rope = nn.RoPE(hd, traditional=False, base=config.rope_theta)

    def __call__(self, x: mx.array, mask=None, cache: KVCache | None = None) -> mx.array:
        B, L, _ = x.shape
        q = self.q_norm(self.q_proj(x).reshape(B, L, self.n_heads, -1)).transpose(0, 2, 1, 3)
        k = self.k_norm(self.k_proj(x).reshape(B, L, self.n_kv_heads, -1)).transpose(0, 2, 1, 3)
        v = self.v_proj(x).reshape(B, L, self.n_kv_heads, -1).transpose(0, 2, 1, 3)
        offset = 0 if cache is None else cache.positions
        q = self.rope(q, offset=offset)
        k = self.rope(k, offset=offset)
        if cache is not None:
            k, v = cache.update_and_fetch(k, v)
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return self.o_proj(out.transpose(0, 2, 1, 3).reshape(B, L, -1))


class MLP(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        h, i = config.hidden_size, config.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def __call__(self, x: mx.array) -> mx.array:
        return self.down_proj(nn.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, mask=None, cache: KVCache | None = None) -> mx.array:
        x = x + self.self_attn(self.input_layernorm(x), mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class TextModel(nn.Module):
    def __init__(self, config: TextConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = [DecoderLayer(config) for _ in range(config.num_hidden_layers)]
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def __call__(self, x: mx.array, mask=None, cache: list[KVCache] | None = None) -> mx.array:
        """(B, L, hidden) input embeddings -> (B, L, hidden) final hidden states.

        mask: by default the cache's (causal, each row's padding hidden: KVCache.mask), or causal when
        there is no cache.
        """
        if mask is None:
            mask = causal(x.shape[1]) if cache is None else cache[0].mask(x.shape[1])
        for i, layer in enumerate(self.layers):
            x = layer(x, mask, None if cache is None else cache[i])
        return self.norm(x)


__all__ = ["Attention", "DecoderLayer", "MLP", "TextModel"]
