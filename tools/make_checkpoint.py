"""Write a Qwen3-ASR or Qwen3-ForcedAligner checkpoint exactly as published, with seeded random weights.

    python tools/make_checkpoint.py --preset 0.6b -o checkpoints/random-0.6b
    python tools/make_checkpoint.py --preset aligner --layout hf -o checkpoints/random-aligner-hf

Everything but the weights comes from the published metadata (`tools/published/real-checkpoints/`,
`--metadata-dir`): config.json, generation_config.json, preprocessor_config.json,
tokenizer_config.json, chat_template.json and configuration.json are copied as they are, and the
`tiny` presets change only the size fields of config.json. The vocabulary and merges come from
`tools/published/tokenizer/` (identical in every published folder).

Presets: `tiny` and `0.6b` (Qwen/Qwen3-ASR-0.6B), `1.7b` (Qwen/Qwen3-ASR-1.7B, two shards and an index
as released), `aligner` and `aligner-tiny` (Qwen/Qwen3-ForcedAligner-0.6B: 24-layer 1024-wide encoder,
5000-class timestamp head, vocabulary 152064).

`diarizer` writes the model folder of the speaker diarizer instead (mlx_qwen3asr.diarize): the files
speakrs's CPU mode loads (`speakrs.required_model_files("CPU")`), pyannote's community-1 pipeline as
speakrs stores it: `segmentation-3.0.safetensors` (PyanNet: SincNet, 4 bidirectional LSTM layers, two
linear layers, a 7-class powerset head; ONNX initializer names), `wespeaker-multimask-tail.safetensors`
(WeSpeaker ResNet34 with its batch norms folded into the convolutions, `*.weight_bias`, and the 256-wide
embedding layer), the PLDA as six `plda_*.npy` arrays (float64) and
`wespeaker-voxceleb-resnet34.min_num_samples.txt`. Names, shapes and dtypes (float32 tensors) are those
speakrs 0.7.0's loader checks; the SincNet constants are computed as pyannote initialises them, the rest
is seeded random, with a well-conditioned PLDA.

Layouts:
  release  `thinker.*` weight names, the tied head stored as a copy of the embedding, bfloat16;
  hf       the transformers-native `-hf` repositories: their config.json, weights named
           `model.audio_tower.*`, `model.multi_modal_projector.linear_{1,2}.*`,
           `model.language_model.*` (no head for the tied ASR models, `score.weight` for the aligner),
           and a transformers-v5 tokenizer (tokenizer.json and tokenizer_config.json only).

The weights are the same numbers in both layouts for the same preset and seed. Real weights never reach
machines without a model hub; these stand in for them, scaled so that the model's output varies (plain
random init emits one token forever, and puts every aligner timestamp in one class).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# The published metadata travels with the repository (tools/published/, copied from the release
# downloads; its README says what is real and what is reconstructed).
PUBLISHED = Path(__file__).resolve().parent / "published"
DEFAULT_METADATA_DIR = PUBLISHED / "real-checkpoints"
DEFAULT_TOKENIZER_DIR = PUBLISHED / "tokenizer"
HF_TOKENIZER = "Qwen3-ASR-0.6B-hf/tokenizer-as-saved-by-transformers-5.23"
RELEASE_SIDE_FILES = (
    "generation_config.json",
    "preprocessor_config.json",
    "tokenizer_config.json",
    "chat_template.json",
    "configuration.json",
)
VOCAB_FILES = ("vocab.json", "merges.txt")
TIMESTAMP_TOKEN = "<timestamp>"


@dataclass(frozen=True)
class Preset:
    release: str  # metadata folder of the release layout
    hf: str  # metadata folder holding the -hf config.json
    tiny: bool = False
    shards: bool = False  # split as the release's index does


PRESETS: dict[str, Preset] = {
    "tiny": Preset("Qwen3-ASR-0.6B", "Qwen3-ASR-0.6B-hf", tiny=True),
    "0.6b": Preset("Qwen3-ASR-0.6B", "Qwen3-ASR-0.6B-hf"),
    "1.7b": Preset("Qwen3-ASR-1.7B", "Qwen3-ASR-1.7B-hf", shards=True),
    "aligner": Preset("Qwen3-ForcedAligner-0.6B", "Qwen3-ForcedAligner-0.6B-hf"),
    "aligner-tiny": Preset("Qwen3-ForcedAligner-0.6B", "Qwen3-ForcedAligner-0.6B-hf", tiny=True),
}
LAYOUTS = ("release", "hf")

# The tiny presets' sizes. Each size field appears under every name the published configs use for it.
TINY_AUDIO = {
    "d_model": 64, "encoder_layers": 2, "num_hidden_layers": 2, "encoder_attention_heads": 4,
    "num_key_value_heads": 4, "encoder_ffn_dim": 128, "output_dim": 64, "downsample_hidden_size": 32,
}  # fmt: skip
TINY_TEXT = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "max_window_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip

# Logit spread of the tied head; ~8 keeps greedy decoding from collapsing onto one token.
TARGET_LOGIT_STD = 8.0
# Sharper q/k norms give peaked attention, as trained models have; the aligner needs more of it (and a
# larger head) for its timestamp classes to vary from word to word: x3 on the tiny shapes, x2 on the
# real ones, where x3 made attention so peaked that float32 implementations drifted 2e-2 apart at 170 s
# and near-tied classes flipped (x2: within 5e-4, classes still varying).
QK_NORM_SCALE = {"asr": 1.4, "aligner": 2.0, "aligner-tiny": 3.0}
ALIGNER_HEAD_SCALE = 4.0


# --------------------------------------------------------------------------------------------------
# Configs
# --------------------------------------------------------------------------------------------------


def _read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def _resize(section: dict, sizes: dict) -> None:
    for key, value in sizes.items():
        if key in section:
            section[key] = value


def published_config(
    preset: str, layout: str = "release", metadata_dir: Path = DEFAULT_METADATA_DIR, tied: bool | None = None
) -> dict:
    """The published config.json of the preset in `layout`, resized for the tiny presets."""
    p = PRESETS[preset]
    config = _read_json(metadata_dir / (p.release if layout == "release" else p.hf) / "config.json")
    sections = config["thinker_config"] if layout == "release" else config
    if p.tiny:
        _resize(sections["audio_config"], TINY_AUDIO)
        _resize(sections["text_config"], TINY_TEXT)
    if tied is not None:
        sections["text_config"]["tie_word_embeddings"] = tied
    return config


def release_config(preset: str, metadata_dir: Path = DEFAULT_METADATA_DIR, tied: bool | None = None) -> dict:
    return published_config(preset, "release", metadata_dir, tied)


def is_aligner(config: dict) -> bool:
    return config["thinker_config"].get("model_type") == "qwen3_forced_aligner"


def hf_head_name(config: dict) -> str | None:
    if is_aligner(config):
        return "score.weight"
    return None if config["thinker_config"]["text_config"]["tie_word_embeddings"] else "lm_head.weight"


# --------------------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    name: str  # release-layout name
    shape: tuple[int, ...]
    kind: str  # how it is drawn: "linear", "conv", "bias", "norm", "qk_norm", "final_norm", "embed", "head"


def release_tensors(config: dict) -> list[Tensor]:
    """Every tensor of the release layout, in the order the weights are drawn."""
    thinker = config["thinker_config"]
    a, t = thinker["audio_config"], thinker["text_config"]
    d, ch, ffn = a["d_model"], a["downsample_hidden_size"], a["encoder_ffn_dim"]
    freq = a["num_mel_bins"]
    for _ in range(3):
        freq = (freq - 1) // 2 + 1
    out: list[Tensor] = []

    def add(name: str, shape: tuple[int, ...], kind: str) -> None:
        out.append(Tensor(name, tuple(int(s) for s in shape), kind))

    pre = "thinker.audio_tower."
    add(pre + "conv2d1.weight", (ch, 1, 3, 3), "conv")
    add(pre + "conv2d1.bias", (ch,), "bias")
    for i in (2, 3):
        add(pre + f"conv2d{i}.weight", (ch, ch, 3, 3), "conv")
        add(pre + f"conv2d{i}.bias", (ch,), "bias")
    add(pre + "conv_out.weight", (d, ch * freq), "linear")
    for i in range(a["encoder_layers"]):
        lp = f"{pre}layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "out_proj"):
            add(lp + f"self_attn.{proj}.weight", (d, d), "linear")
            add(lp + f"self_attn.{proj}.bias", (d,), "bias")
        for norm in ("self_attn_layer_norm", "final_layer_norm"):
            add(lp + f"{norm}.weight", (d,), "norm")
            add(lp + f"{norm}.bias", (d,), "bias")
        add(lp + "fc1.weight", (ffn, d), "linear")
        add(lp + "fc1.bias", (ffn,), "bias")
        add(lp + "fc2.weight", (d, ffn), "linear")
        add(lp + "fc2.bias", (d,), "bias")
    add(pre + "ln_post.weight", (d,), "norm")
    add(pre + "ln_post.bias", (d,), "bias")
    add(pre + "proj1.weight", (d, d), "linear")
    add(pre + "proj1.bias", (d,), "bias")
    add(pre + "proj2.weight", (a["output_dim"], d), "linear")
    add(pre + "proj2.bias", (a["output_dim"],), "bias")

    h, hd = t["hidden_size"], t["head_dim"]
    nh, nkv, inter = t["num_attention_heads"], t["num_key_value_heads"], t["intermediate_size"]
    add("thinker.model.embed_tokens.weight", (t["vocab_size"], h), "embed")
    for i in range(t["num_hidden_layers"]):
        lp = f"thinker.model.layers.{i}."
        add(lp + "input_layernorm.weight", (h,), "norm")
        add(lp + "post_attention_layernorm.weight", (h,), "norm")
        add(lp + "self_attn.q_proj.weight", (nh * hd, h), "linear")
        add(lp + "self_attn.k_proj.weight", (nkv * hd, h), "linear")
        add(lp + "self_attn.v_proj.weight", (nkv * hd, h), "linear")
        add(lp + "self_attn.o_proj.weight", (h, nh * hd), "linear")
        add(lp + "self_attn.q_norm.weight", (hd,), "qk_norm")
        add(lp + "self_attn.k_norm.weight", (hd,), "qk_norm")
        add(lp + "mlp.gate_proj.weight", (inter, h), "linear")
        add(lp + "mlp.up_proj.weight", (inter, h), "linear")
        add(lp + "mlp.down_proj.weight", (h, inter), "linear")
    add("thinker.model.norm.weight", (h,), "final_norm")
    # The release stores the head even when it is tied to the embedding (as a copy of it).
    rows = thinker["classify_num"] if is_aligner(config) else t["vocab_size"]
    add("thinker.lm_head.weight", (rows, h), "head")
    return out


# The -hf names of the release's tensors (transformers' convert_qwen3_asr_to_hf.py), first match wins.
HF_NAMES = (
    ("thinker.audio_tower.proj1.", "model.multi_modal_projector.linear_1."),
    ("thinker.audio_tower.proj2.", "model.multi_modal_projector.linear_2."),
    ("thinker.audio_tower.", "model.audio_tower."),
    ("thinker.model.", "model.language_model."),
)


def layout_name(name: str, layout: str, head: str | None) -> str | None:
    """The tensor's name in `layout`; None where the layout does not store it (the -hf tied head).

    head: the -hf name of the head (`score.weight` for the aligner, `lm_head.weight` for an untied ASR
    model, None for a tied one).
    """
    if layout == "release":
        return name
    if name == "thinker.lm_head.weight":
        return head
    for old, new in HF_NAMES:
        if name.startswith(old):
            return new + name[len(old) :]
    raise ValueError(f"no -hf name for {name}")


def weight_specs(preset: str, layout: str = "release", metadata_dir: Path = DEFAULT_METADATA_DIR) -> dict:
    """{name: shape} of every tensor the preset's checkpoint stores in `layout` (all bfloat16)."""
    config = release_config(preset, metadata_dir)
    head = hf_head_name(config)
    specs = {}
    for tensor in release_tensors(config):
        name = layout_name(tensor.name, layout, head)
        if name is not None:
            specs[name] = tensor.shape
    return dict(sorted(specs.items()))


def random_weights(config: dict, seed: int = 0) -> Iterator[tuple[str, np.ndarray]]:
    """Yield (release name, float32 array) one tensor at a time, seeded."""
    rng = np.random.default_rng(seed)
    t = config["thinker_config"]["text_config"]
    aligner = is_aligner(config)
    h = t["hidden_size"]
    embed = None

    def normal(shape, std):
        value = rng.standard_normal(shape, dtype=np.float32)
        value *= np.float32(std)  # in place: the same float32 products, without a second array
        return value

    def near_one(n, scale=1.0):
        return (scale * (1.0 + normal((n,), 0.05))).astype(np.float32)

    for tensor in release_tensors(config):
        shape, kind = tensor.shape, tensor.kind
        if kind == "linear":
            value = normal(shape, shape[1] ** -0.5)
        elif kind == "conv":
            value = normal(shape, (9 * shape[1]) ** -0.5)
        elif kind == "bias":
            value = normal(shape, 0.02)
        elif kind == "norm":
            value = near_one(shape[0])
        elif kind == "qk_norm":
            kind = ("aligner-tiny" if h < 256 else "aligner") if aligner else "asr"
            value = near_one(shape[0], QK_NORM_SCALE[kind])
        elif kind == "embed":
            value = embed = normal(shape, 0.02)
        elif kind == "final_norm":
            # Sets the logit scale of a tied head: unit-rms hidden states times 0.02-std rows.
            value = near_one(shape[0], 1.0 if aligner else TARGET_LOGIT_STD / (0.02 * h**0.5))
        elif kind == "head":
            if aligner:
                value = normal(shape, ALIGNER_HEAD_SCALE * h**-0.5)
            elif t["tie_word_embeddings"]:
                value = embed
            else:
                value = normal(shape, 0.02)
        else:
            raise AssertionError(kind)
        yield tensor.name, value


# --------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------


def _save(tensors: dict, path: Path) -> int:
    import mlx.core as mx

    mx.save_safetensors(str(path), tensors, metadata={"format": "pt"})
    return sum(v.nbytes for v in tensors.values())


def _bf16(value: np.ndarray):
    import mlx.core as mx

    return mx.array(value).astype(mx.bfloat16)


def shard_plan(preset: str, metadata_dir: Path, shard_mb: float | None, names_sizes: list[tuple[str, int]]):
    """File name of every tensor: the release's own index for sharded presets, else by size."""
    p = PRESETS[preset]
    if p.shards and shard_mb is None:
        index = metadata_dir / p.release / "model.safetensors.index.json.RECONSTRUCTED"
        weight_map = _read_json(index)["weight_map"]
        return {name: weight_map[name] for name, _ in names_sizes}
    if shard_mb is None:
        return {name: "model.safetensors" for name, _ in names_sizes}
    limit = int(shard_mb * 2**20)
    groups: list[list[str]] = [[]]
    size = 0
    for name, nbytes in names_sizes:
        if groups[-1] and size + nbytes > limit:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    if len(groups) == 1:
        return dict.fromkeys(groups[0], "model.safetensors")
    return {
        name: f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        for i, group in enumerate(groups, 1)
        for name in group
    }


def _hf_tokenizer_json(metadata_dir: Path) -> dict:
    """The aligner's transformers-v5 tokenizer.json: the ASR one plus `<timestamp>`, as its release
    tokenizer_config.json declares it."""
    data = _read_json(metadata_dir / HF_TOKENIZER / "tokenizer.json")
    release = _read_json(metadata_dir / PRESETS["aligner"].release / "tokenizer_config.json")
    (key,) = [k for k, e in release["added_tokens_decoder"].items() if e["content"] == TIMESTAMP_TOKEN]
    if all(t["content"] != TIMESTAMP_TOKEN for t in data["added_tokens"]):
        data["added_tokens"].append({"id": int(key), **release["added_tokens_decoder"][key]})
    return data


def write_checkpoint(
    out: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    *,
    layout: str = "release",
    shard_mb: float | None = None,
    tie_word_embeddings: bool | None = None,
    metadata_dir: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
) -> Path:
    """Write the checkpoint into `out` and return its path.

    shard_mb: split the weights into shards of about this size (the `1.7b` preset is sharded as
        released unless this is given).
    tie_word_embeddings: override the text config's tie flag (an ASR checkpoint with its own head).
    """
    if preset == DIARIZER_PRESET:  # not a Qwen checkpoint: the diarizer's model folder (layout unused)
        return write_diarizer(out, seed)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}: use one of {', '.join([*PRESETS, DIARIZER_PRESET])}")
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    metadata_dir = Path(metadata_dir) if metadata_dir else DEFAULT_METADATA_DIR
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else DEFAULT_TOKENIZER_DIR
    p = PRESETS[preset]
    for needed in (metadata_dir / p.release / "config.json", tokenizer_dir / "vocab.json"):
        if not needed.is_file():
            raise FileNotFoundError(f"{needed} is missing: pass --metadata-dir / --tokenizer-dir")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    config = release_config(preset, metadata_dir, tie_word_embeddings)
    aligner = is_aligner(config)
    if layout == "release":
        if p.tiny or tie_word_embeddings is not None:
            text = json.dumps(config, indent=2, ensure_ascii=False) + "\n"
            (out / "config.json").write_text(text, encoding="utf-8")
        else:
            shutil.copyfile(metadata_dir / p.release / "config.json", out / "config.json")
        for name in RELEASE_SIDE_FILES:
            if (metadata_dir / p.release / name).is_file():
                shutil.copyfile(metadata_dir / p.release / name, out / name)
        for name in VOCAB_FILES:
            shutil.copyfile(tokenizer_dir / name, out / name)
    else:
        if p.tiny or tie_word_embeddings is not None:
            text = (
                json.dumps(published_config(preset, "hf", metadata_dir, tie_word_embeddings), indent=2) + "\n"
            )
            (out / "config.json").write_text(text, encoding="utf-8")
        else:
            shutil.copyfile(metadata_dir / p.hf / "config.json", out / "config.json")
        shutil.copyfile(metadata_dir / HF_TOKENIZER / "tokenizer_config.json", out / "tokenizer_config.json")
        if aligner:
            tokenizer = _hf_tokenizer_json(metadata_dir)
            (out / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
        else:
            shutil.copyfile(metadata_dir / HF_TOKENIZER / "tokenizer.json", out / "tokenizer.json")

    head = hf_head_name(config)
    tensors = release_tensors(config)
    names = [(t.name, 2 * int(np.prod(t.shape))) for t in tensors]
    plan = shard_plan(preset, metadata_dir, shard_mb, names)
    files: dict[str, dict] = {}
    for name, value in random_weights(config, seed):
        stored = layout_name(name, layout, head)
        if stored is None:
            continue
        files.setdefault(plan[name], {})[stored] = _bf16(value)
    weight_map: dict[str, str] = {}
    total = 0
    for fname in sorted(files):
        shard = files.pop(fname)
        total += _save(shard, out / fname)
        weight_map.update(dict.fromkeys(shard, fname))
        del shard
    if len({*weight_map.values()}) > 1:
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return out


# --------------------------------------------------------------------------------------------------
# The speaker diarizer's models (speakrs, CPU mode)
# --------------------------------------------------------------------------------------------------

DIARIZER_PRESET = "diarizer"
SEGMENTATION_FILE = "segmentation-3.0.safetensors"
EMBEDDING_FILE = "wespeaker-multimask-tail.safetensors"
MIN_SAMPLES_FILE = "wespeaker-voxceleb-resnet34.min_num_samples.txt"
PLDA_FILES = (
    "plda_lda.npy",
    "plda_tr.npy",
    "plda_mu.npy",
    "plda_psi.npy",
    "plda_mean1.npy",
    "plda_mean2.npy",
)
# The shortest input (samples at 16 kHz) the embedding takes: one 25 ms filterbank frame.
EMBEDDING_MIN_SAMPLES = 400

# PyanNet (pyannote/segmentation-3.0): SincNet (80 sinc filters of 251 taps, two 5-tap convolutions of 60
# channels), a 4-layer bidirectional LSTM of 128 units, linear 256 -> 128 -> 128, 7 powerset classes.
_SINC_FILTERS, _SINC_TAPS, _SAMPLE_RATE = 80, 251, 16000
_LSTM_LAYERS, _LSTM_HIDDEN, _SINC_CHANNELS, _CLASSES = 4, 128, 60, 7
_LSTM_INPUT_GAIN, _LSTM_RECURRENT_GAIN, _LINEAR_GAIN = 4.0, 6.0, 3.0
# WeSpeaker ResNet34: 32 channels doubled in each of 4 stages of 3, 4, 6, 3 basic blocks; statistics
# pooling of 80 / 8 mel bands x 256 channels, mean and deviation, into a 256-wide embedding.
_RESNET_BLOCKS, _RESNET_CHANNELS, _EMBEDDING = (3, 4, 6, 3), 32, 256
# The PLDA: a 256 -> 128 LDA, then a 128-dimensional PLDA space.
_LDA_IN, _LDA_OUT = 256, 128
# The ONNX export names its unnamed initializers onnx::<Op>_<number>; speakrs takes them in number order.
_ONNX_FIRST_NUMBER = 1000


def _mel(hz):
    return 2595 * np.log10(1 + hz / 700)


def _hz(mel):
    return 700 * (10 ** (mel / 2595) - 1)


def segmentation_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The segmentation model's tensors as speakrs stores them (float32), seeded."""
    rng = np.random.default_rng([seed, 1])

    def uniform(shape, bound):
        return rng.uniform(-bound, bound, shape).astype(np.float32)

    tensors: dict[str, np.ndarray] = {}
    number = _ONNX_FIRST_NUMBER

    def onnx(op: str, value: np.ndarray) -> None:
        nonlocal number
        tensors[f"onnx::{op}_{number}"] = value
        number += 1

    # SincNet's filterbank, as asteroid's ParamSincFB initialises it (mel-spaced bands), jittered.
    half = _SINC_TAPS // 2
    mel = np.linspace(_mel(30.0), _mel(_SAMPLE_RATE / 2 - (50 + 50)), _SINC_FILTERS // 2 + 1)
    hz = _hz(mel) * (1 + 0.02 * rng.standard_normal(mel.shape))
    n_lin = np.linspace(0, _SINC_TAPS / 2 - 1, half)
    n = 2 * np.pi * np.arange(-(_SINC_TAPS - 1) / 2, 0) / _SAMPLE_RATE
    prefix = "sincnet.conv1d.0.filterbank."
    tensors["sincnet.wav_norm1d.weight"] = np.ones(1, np.float32)
    tensors["sincnet.wav_norm1d.bias"] = np.zeros(1, np.float32)
    tensors[prefix + "low_hz_"] = hz[:-1].reshape(-1, 1).astype(np.float32)
    tensors[prefix + "band_hz_"] = np.diff(hz).reshape(-1, 1).astype(np.float32)
    tensors[prefix + "window_"] = (0.54 - 0.46 * np.cos(2 * np.pi * n_lin / _SINC_TAPS)).astype(np.float32)
    tensors[prefix + "n_"] = n.reshape(1, -1).astype(np.float32)
    channels = [_SINC_FILTERS, _SINC_CHANNELS, _SINC_CHANNELS]
    for k in (1, 2):
        bound = (channels[k - 1] * 5) ** -0.5
        tensors[f"sincnet.conv1d.{k}.weight"] = uniform((channels[k], channels[k - 1], 5), bound)
        tensors[f"sincnet.conv1d.{k}.bias"] = uniform((channels[k],), bound)
    for k, width in enumerate(channels):
        tensors[f"sincnet.norm1d.{k}.weight"] = (1 + 0.05 * rng.standard_normal(width)).astype(np.float32)
        tensors[f"sincnet.norm1d.{k}.bias"] = (0.05 * rng.standard_normal(width)).astype(np.float32)
    # The LSTM as ONNX holds it, per layer: B [2, 8H] (input and recurrent biases), W [2, 4H, in], R [2, 4H, H].
    # PyTorch's init (bounds H^-0.5) leaves the output all but constant, so one powerset class would win
    # every frame: larger input and recurrent weights make it follow the audio.
    bound = _LSTM_HIDDEN**-0.5
    for layer in range(_LSTM_LAYERS):
        width = _SINC_CHANNELS if layer == 0 else 2 * _LSTM_HIDDEN
        onnx("LSTM", uniform((2, 8 * _LSTM_HIDDEN), bound))
        onnx("LSTM", uniform((2, 4 * _LSTM_HIDDEN, width), _LSTM_INPUT_GAIN * bound))
        onnx("LSTM", uniform((2, 4 * _LSTM_HIDDEN, _LSTM_HIDDEN), _LSTM_RECURRENT_GAIN * bound))
    # Linear layers as MatMul by the transposed weight, their biases under their own names.
    sizes = [
        (2 * _LSTM_HIDDEN, 128, "linear.0.bias"),
        (128, 128, "linear.1.bias"),
        (128, _CLASSES, "classifier.bias"),
    ]
    for fan_in, fan_out, bias in sizes:
        onnx("MatMul", uniform((fan_in, fan_out), _LINEAR_GAIN * fan_in**-0.5))
        tensors[bias] = uniform((fan_out,), fan_in**-0.5)
    # The sinc filters' n_ / 2, folded into a constant by the export.
    onnx("Div", (n / 2).reshape(1, -1).astype(np.float32))
    return tensors


def _resnet_layers() -> list[tuple[str, int, int, int]]:
    """(name, out channels, in channels, kernel) of every convolution of the ResNet34 trunk."""
    layers = [("resnet.conv1", _RESNET_CHANNELS, 1, 3)]
    width = _RESNET_CHANNELS
    for stage, blocks in enumerate(_RESNET_BLOCKS, 1):
        out = _RESNET_CHANNELS * 2 ** (stage - 1)
        for block in range(blocks):
            name = f"resnet.layer{stage}.{block}"
            layers.append((f"{name}.conv1", out, width, 3))
            layers.append((f"{name}.conv2", out, out, 3))
            if width != out:
                layers.append((f"{name}.shortcut.0", out, width, 1))
            width = out
    return layers


def embedding_tensors(seed: int = 0) -> dict[str, np.ndarray]:
    """The speaker embedding's tensors as speakrs stores them (float32, batch norms folded), seeded."""
    rng = np.random.default_rng([seed, 2])
    tensors: dict[str, np.ndarray] = {}
    for name, out, inp, kernel in _resnet_layers():
        std = (2.0 / (inp * kernel * kernel)) ** 0.5  # He init keeps the activations' scale through ReLU
        tensors[f"{name}.weight"] = (std * rng.standard_normal((out, inp, kernel, kernel))).astype(np.float32)
        tensors[f"{name}.weight_bias"] = (0.05 * rng.standard_normal(out)).astype(np.float32)
    pooled = 2 * (80 // 8) * _RESNET_CHANNELS * 8
    tensors["resnet.seg_1.weight"] = (pooled**-0.5 * rng.standard_normal((_EMBEDDING, pooled))).astype(
        np.float32
    )
    tensors["resnet.seg_1.bias"] = (0.05 * rng.standard_normal(_EMBEDDING)).astype(np.float32)
    return tensors


def plda_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    """The PLDA's arrays (float64), seeded: an orthonormal LDA and a well-conditioned transform."""
    rng = np.random.default_rng([seed, 3])
    lda, _ = np.linalg.qr(rng.standard_normal((_LDA_IN, _LDA_OUT)))
    tr, _ = np.linalg.qr(rng.standard_normal((_LDA_OUT, _LDA_OUT)))
    return {
        "plda_mean1.npy": 0.1 * rng.standard_normal(_LDA_IN),
        "plda_mean2.npy": 0.1 * rng.standard_normal(_LDA_OUT),
        "plda_lda.npy": lda,
        "plda_mu.npy": 0.1 * rng.standard_normal(_LDA_OUT),
        "plda_tr.npy": tr * rng.uniform(0.5, 2.0, (_LDA_OUT, 1)),
        "plda_psi.npy": np.sort(rng.uniform(0.05, 5.0, _LDA_OUT))[::-1].copy(),
    }


def diarizer_specs(seed: int = 0) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
    """{file: {tensor: (shape, dtype)}} of the diarizer folder's weight files (the .npy files: {"": ...})."""
    specs: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {}
    for fname, tensors in (
        (SEGMENTATION_FILE, segmentation_tensors(seed)),
        (EMBEDDING_FILE, embedding_tensors(seed)),
    ):
        specs[fname] = {k: (tuple(v.shape), str(v.dtype)) for k, v in tensors.items()}
    for fname, value in plda_arrays(seed).items():
        specs[fname] = {"": (tuple(value.shape), str(value.dtype))}
    return specs


def write_diarizer(out: str | Path, seed: int = 0) -> Path:
    """Write the diarizer's model folder (speakrs CPU mode) with seeded random weights; return its path."""
    from safetensors.numpy import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file(segmentation_tensors(seed), str(out / SEGMENTATION_FILE), metadata={"format": "pt"})
    save_file(embedding_tensors(seed), str(out / EMBEDDING_FILE), metadata={"format": "pt"})
    for fname, value in plda_arrays(seed).items():
        np.save(out / fname, value)
    (out / MIN_SAMPLES_FILE).write_text(f"{EMBEDDING_MIN_SAMPLES}\n")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=[*PRESETS, DIARIZER_PRESET], default="tiny")
    ap.add_argument("--layout", choices=LAYOUTS, default="release")
    ap.add_argument("-o", "--output", required=True, help="directory to write")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shard-mb", type=float, default=None, help="split weights into shards of this size")
    ap.add_argument(
        "--untied", action="store_true", help="an ASR head of its own (tie_word_embeddings false)"
    )
    ap.add_argument(
        "--metadata-dir", default=None, help=f"published metadata (default {DEFAULT_METADATA_DIR})"
    )
    ap.add_argument(
        "--tokenizer-dir", default=None, help=f"vocab.json and merges.txt (default {DEFAULT_TOKENIZER_DIR})"
    )
    args = ap.parse_args(argv)
    if args.preset == DIARIZER_PRESET:
        path = write_diarizer(args.output, args.seed)
        print(f"wrote the {DIARIZER_PRESET} model files (speakrs, CPU mode) to {path}")
        return 0
    path = write_checkpoint(
        args.output,
        args.preset,
        args.seed,
        layout=args.layout,
        shard_mb=args.shard_mb,
        tie_word_embeddings=False if args.untied else None,
        metadata_dir=args.metadata_dir,
        tokenizer_dir=args.tokenizer_dir,
    )
    print(f"wrote {args.preset} checkpoint ({args.layout} layout) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
