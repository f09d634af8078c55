"""Write a Qwen3-ASR checkpoint in the original release layout with seeded random weights.

    python tools/make_checkpoint.py --preset 0.6b -o checkpoints/random-0.6b

The layout is the release's: config.json with a nested `thinker_config`, bfloat16 safetensors named
`thinker.*` (one file, or shards with model.safetensors.index.json), preprocessor_config.json and the
tokenizer files. Real weights never reach machines without a model hub; these stand in for them in
tests and benchmarks, so the scales are chosen to make a model whose greedy output changes from step
to step (plain random init emits one token forever, which makes a greedy-id comparison toothless).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

SUPPORTED_LANGUAGES = [
    "Chinese", "English", "Cantonese", "Arabic", "German", "French", "Spanish", "Portuguese",
    "Indonesian", "Italian", "Korean", "Russian", "Thai", "Vietnamese", "Japanese", "Turkish", "Hindi",
    "Malay", "Dutch", "Swedish", "Danish", "Finnish", "Polish", "Czech", "Filipino", "Persian", "Greek",
    "Romanian", "Hungarian", "Macedonian",
]  # fmt: skip

PRESETS: dict[str, dict] = {
    "tiny": {
        "audio": dict(d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128,
                      output_dim=64, downsample_hidden_size=32),
        "text": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16),
    },
    "0.6b": {
        "audio": dict(d_model=896, encoder_layers=18, encoder_attention_heads=14, encoder_ffn_dim=3584,
                      output_dim=1024, downsample_hidden_size=480),
        "text": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=128),
    },
    "1.7b": {
        "audio": dict(d_model=1024, encoder_layers=24, encoder_attention_heads=16, encoder_ffn_dim=4096,
                      output_dim=2048, downsample_hidden_size=480),
        "text": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=128),
    },
}  # fmt: skip

VOCAB_SIZE = 151936
PREPROCESSOR_CONFIG = {
    "chunk_length": 30,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "processor_class": "Qwen3ASRProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
}
TOKENIZER_FILES = (
    "vocab.json",
    "merges.txt",
    "tokenizer_config.json",
    "chat_template.json",
    "tokenizer.json",
)
# Logit spread of the tied head; ~8 keeps greedy decoding from collapsing onto one token.
TARGET_LOGIT_STD = 8.0


def build_config(preset: str, tie_word_embeddings: bool = True) -> dict:
    p = PRESETS[preset]
    audio = {
        "activation_function": "gelu",
        "conv_chunksize": 500,
        "max_source_positions": 1500,
        "model_type": "qwen3_asr_audio_encoder",
        "n_window": 50,
        "n_window_infer": 800,
        "num_mel_bins": 128,
        "scale_embedding": False,
        **p["audio"],
    }
    text = {
        "attention_bias": False,
        "hidden_act": "silu",
        "max_position_embeddings": 65536,
        "model_type": "qwen3_asr_text",
        "rms_norm_eps": 1e-6,
        "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20], "rope_type": "default"},
        "rope_theta": 1000000,
        "tie_word_embeddings": tie_word_embeddings,
        "vocab_size": VOCAB_SIZE,
        **p["text"],
    }
    return {
        "architectures": ["Qwen3ASRForConditionalGeneration"],
        "model_type": "qwen3_asr",
        "support_languages": SUPPORTED_LANGUAGES,
        "thinker_config": {
            "audio_config": audio,
            "text_config": text,
            "audio_end_token_id": 151670,
            "audio_start_token_id": 151669,
            "audio_token_id": 151676,
            "model_type": "qwen3_asr_thinker",
            "user_token_id": 872,
        },
        "tie_word_embeddings": tie_word_embeddings,
        "torch_dtype": "bfloat16",
        # The release was written by a transformers of this series; 4.57.3+ would otherwise take a
        # local config without a version for a Mistral tokenizer and patch its pre-tokenizer regex.
        "transformers_version": "4.57.1",
    }


def random_weights(config: dict, seed: int = 0):
    """Yield (name, float32 array) in the release's naming, one tensor at a time."""
    rng = np.random.default_rng(seed)
    a = config["thinker_config"]["audio_config"]
    t = config["thinker_config"]["text_config"]

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    def linear(out_f, in_f):
        return normal((out_f, in_f), in_f**-0.5)

    def near_one(n, scale=1.0):
        return (scale * (1.0 + normal((n,), 0.05))).astype(np.float32)

    d, ch, ffn = a["d_model"], a["downsample_hidden_size"], a["encoder_ffn_dim"]
    freq = a["num_mel_bins"]
    for _ in range(3):
        freq = (freq - 1) // 2 + 1
    pre = "thinker.audio_tower."
    yield pre + "conv2d1.weight", normal((ch, 1, 3, 3), 9**-0.5)
    yield pre + "conv2d1.bias", normal((ch,), 0.02)
    for i in (2, 3):
        yield pre + f"conv2d{i}.weight", normal((ch, ch, 3, 3), (9 * ch) ** -0.5)
        yield pre + f"conv2d{i}.bias", normal((ch,), 0.02)
    yield pre + "conv_out.weight", linear(d, ch * freq)
    for i in range(a["encoder_layers"]):
        lp = f"{pre}layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            yield lp + f"self_attn.{proj}.weight", linear(d, d)
            yield lp + f"self_attn.{proj}.bias", normal((d,), 0.02)
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            yield lp + f"{norm}.weight", near_one(d)
            yield lp + f"{norm}.bias", normal((d,), 0.02)
        yield lp + "fc1.weight", linear(ffn, d)
        yield lp + "fc1.bias", normal((ffn,), 0.02)
        yield lp + "fc2.weight", linear(d, ffn)
        yield lp + "fc2.bias", normal((d,), 0.02)
    yield pre + "ln_post.weight", near_one(d)
    yield pre + "ln_post.bias", normal((d,), 0.02)
    yield pre + "proj1.weight", linear(d, d)
    yield pre + "proj1.bias", normal((d,), 0.02)
    yield pre + "proj2.weight", linear(a["output_dim"], d)
    yield pre + "proj2.bias", normal((a["output_dim"],), 0.02)

    h, hd = t["hidden_size"], t["head_dim"]
    nh, nkv, inter = t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"]
    embed = normal((t["vocab_size"], h), 0.02)
    yield "thinker.model.embed_tokens.weight", embed
    for i in range(t["num_hidden_layers"]):
        lp = f"thinker.model.layers.{i}."
        yield lp + "input_layernorm.weight", near_one(h)
        yield lp + "post_attention_layernorm.weight", near_one(h)
        yield lp + "self_attn.q_proj.weight", linear(nh * hd, h)
        yield lp + "self_attn.k_proj.weight", linear(nkv * hd, h)
        yield lp + "self_attn.v_proj.weight", linear(nkv * hd, h)
        yield lp + "self_attn.o_proj.weight", linear(h, nh * hd)
        # Slightly sharper q/k norms give peaked attention, as trained models have.
        yield lp + "self_attn.q_norm.weight", near_one(hd, 1.4)
        yield lp + "self_attn.k_norm.weight", near_one(hd, 1.4)
        yield lp + "mlp.gate_proj.weight", linear(inter, h)
        yield lp + "mlp.up_proj.weight", linear(inter, h)
        yield lp + "mlp.down_proj.weight", linear(h, inter)
    # The final norm sets the logit scale of the head: unit-rms hidden states times 0.02-std rows.
    yield "thinker.model.norm.weight", near_one(h, TARGET_LOGIT_STD / (0.02 * h**0.5))
    # The release stores the head even when it is tied to the embedding.
    yield (
        "thinker.lm_head.weight",
        embed if t["tie_word_embeddings"] else linear(t["vocab_size"], h) * 0.02 * h**0.5,
    )


def _save(tensors: dict, path: Path) -> None:
    import mlx.core as mx

    mx.save_safetensors(
        str(path), {k: mx.array(v).astype(mx.bfloat16) for k, v in tensors.items()}, metadata={"format": "pt"}
    )


def write_checkpoint(
    out: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    tokenizer_dir: str | Path | None = None,
    shard_mb: float | None = None,
    tie_word_embeddings: bool = True,
) -> Path:
    """Write the checkpoint to `out` and return its path. `shard_mb` splits the weights into shards."""
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {', '.join(PRESETS)}")
    out = Path(out)
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else default_tokenizer_dir()
    if not (tokenizer_dir / "vocab.json").is_file():
        raise FileNotFoundError(f"{tokenizer_dir}: no vocab.json; pass --tokenizer-dir")
    out.mkdir(parents=True, exist_ok=True)
    config = build_config(preset, tie_word_embeddings)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR_CONFIG, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, out / name)

    limit = None if shard_mb is None else int(shard_mb * 2**20)
    shards: list[dict] = [{}]
    size = 0
    for name, value in random_weights(config, seed):
        nbytes = value.size * 2
        if limit is not None and shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = value
        size += nbytes
    if len(shards) == 1:
        _save(shards[0], out / "model.safetensors")
    else:
        weight_map = {}
        total = 0
        for i, shard in enumerate(shards, 1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _save(shard, out / fname)
            for k, v in shard.items():
                weight_map[k] = fname
                total += v.size * 2
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


def default_tokenizer_dir() -> Path:
    """The shared Qwen3-ASR vocabulary that sits beside the repository."""
    return Path(__file__).resolve().parents[2] / "shared" / "tokenizer"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    ap.add_argument("-o", "--output", required=True, help="directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokenizer-dir", default=None, help="directory with vocab.json, merges.txt, ...")
    ap.add_argument("--shard-mb", type=float, default=None, help="split weights into shards of this size")
    ap.add_argument(
        "--untied", action="store_true", help="write a separate lm_head (tie_word_embeddings false)"
    )
    args = ap.parse_args(argv)
    path = write_checkpoint(
        args.output, args.preset, args.seed, args.tokenizer_dir, args.shard_mb, not args.untied
    )
    print(f"wrote {args.preset} checkpoint to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
