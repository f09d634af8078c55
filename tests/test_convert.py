"""mlxasr-convert: every layout converts, every recipe loads back and transcribes, failures leave nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from logits import prefill_logits
from mlx.utils import tree_flatten

import mlx_qwen3asr
from mlx_qwen3asr.checkpoints.convert import ConvertError, convert_checkpoint
from mlx_qwen3asr.cli.convert import main
from mlx_qwen3asr.model.encoder import encoder_batch

REPO_ROOT = Path(__file__).resolve().parents[1]
CONVS = ("conv2d1", "conv2d2", "conv2d3")
MLX_COMMUNITY_BLOCK = {"group_size": 64, "bits": 4, "mode": "affine"}
# name -> (CLI flags, decoder bits, encoder bits or None for float)
RECIPES = {
    "bf16": ([], None, None),
    "8bit": (["--bits", "8"], 8, None),  # the defaults: the encoder stays float, as mlx-community's
    "4bit": (["--bits", "4"], 4, None),
    "8bit-encoder": (["--bits", "8", "--encoder-bits", "8"], 8, 8),
    "4bit-encoder": (["--bits", "4", "--encoder-bits", "4"], 4, 4),
    "mixed": (["--bits", "4", "--encoder-bits", "8"], 4, 8),
}
# Logits cosine against the float32 model that each recipe must reach on the tiny preset.
MIN_COSINE = {"bf16": 0.99999, "8bit": 0.995, "4bit": 0.95, "8bit-encoder": 0.995, "4bit-encoder": 0.9}
MIN_COSINE["mixed"] = 0.95


def load(path) -> mlx_qwen3asr.ASRModel:
    return mlx_qwen3asr.load(path, dtype="float32")


def signal(seconds: float, seed: int = 0, sample_rate: int = 16000) -> np.ndarray:
    """Noise under a syllable-rate envelope over a gliding tone: enough structure to exercise the encoder."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 3.5 * t)
    tone = np.sin(2 * np.pi * (200 + 50 * np.sin(2 * np.pi * 0.7 * t)) * t)
    return (0.3 * envelope * (0.6 * tone + 0.4 * rng.standard_normal(t.size))).astype(np.float32)


def prompt_logits(asr: mlx_qwen3asr.ASRModel) -> np.ndarray:
    """Logits of every position of a fixed audio prompt: exercises convs, both stacks and the head."""
    cfg = asr.config
    mel = np.random.default_rng(1).standard_normal((cfg.audio_config.num_mel_bins, 230)).astype(np.float32)
    features = asr.net.audio_tower(encoder_batch([mel], cfg.audio_config))
    ids = [872, 198, cfg.audio_start_token_id] + [cfg.audio_token_id] * features.shape[0]
    ids += [cfg.audio_end_token_id, 198, 1000, 2000, 3000]
    return np.array(prefill_logits(asr.net, ids, features))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def stored(path: Path) -> dict[str, mx.array]:
    tensors: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(mx.load(str(file)))
    return tensors


def as_np(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32) if x.dtype == mx.bfloat16 else x)


def assert_same_tensors(a: dict[str, mx.array], b: dict[str, mx.array]) -> None:
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype, key
        np.testing.assert_array_equal(as_np(a[key]), as_np(b[key]), err_msg=key)


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    assert_same_tensors(dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters())))


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def leftovers(directory: Path) -> list[str]:
    """Names a conversion may have left behind in the destination's parent."""
    return sorted(p.name for p in directory.iterdir() if p.name.startswith("."))


def copy_checkpoint(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


@pytest.fixture(scope="module")
def original(checkpoints) -> Path:
    return checkpoints("tiny")


@pytest.fixture(scope="module")
def reference(original):
    asr = load(original)
    return asr, prompt_logits(asr)


@pytest.fixture(scope="module")
def converted(original, tmp_path_factory):
    """Each recipe converted once, through the in-process CLI."""
    base = tmp_path_factory.mktemp("converted")
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in made:
            dst = base / name
            assert main([str(original), "-o", str(dst), *RECIPES[name][0]]) == 0
            made[name] = dst
        return made[name]

    return get


def mlx_layout(src: Path, dst: Path) -> Path:
    """An mlx-audio style conversion written by hand: prefix stripped, OHWI convs, no tied head."""
    copy_checkpoint(src, dst)
    weights = {}
    for key, value in mx.load(str(src / "model.safetensors")).items():
        key = key.removeprefix("thinker.")
        if key.startswith("audio_tower.conv2d") and key.endswith(".weight"):
            value = value.transpose(0, 2, 3, 1)
        weights[key] = value
    del weights["lm_head.weight"]
    mx.eval(weights)
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    return dst


def mlx_community_4bit(src: Path, dst: Path) -> Path:
    """What mlx-community publishes: the text stack 4-bit from the bf16 weights, the encoder untouched."""
    mlx_layout(src, dst)
    asr = mlx_qwen3asr.load(dst, dtype="bfloat16")
    nn.quantize(
        asr.net,
        group_size=64,
        bits=4,
        class_predicate=lambda p, m: p.startswith("model.") and hasattr(m, "to_quantized"),
    )
    mx.eval(asr.net.parameters())
    mx.save_safetensors(str(dst / "model.safetensors"), dict(tree_flatten(asr.net.parameters())))
    config = json.loads((dst / "config.json").read_text())
    config["quantization"] = dict(MLX_COMMUNITY_BLOCK)
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return dst


# --------------------------------------------------------------------------------------------------
# Recipes: convert -> load -> transcribe
# --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(RECIPES))
def test_round_trip(name, converted, original, reference, measurements):
    path = converted(name)
    _, decoder_bits, encoder_bits = RECIPES[name]
    config = json.loads((path / "config.json").read_text())
    source_config = json.loads((original / "config.json").read_text())
    # The source config is kept as is, nested thinker_config included; only the block is added.
    assert {k: v for k, v in config.items() if not k.startswith("quantization")} == source_config

    asr = load(path)
    net = asr.net
    q_proj = net.model.layers[0].self_attn.q_proj
    enc_fc1 = net.audio_tower.layers[1].fc1
    if decoder_bits is None:
        assert "quantization" not in config and "quantization_config" not in config
        assert (
            isinstance(q_proj, nn.Linear)
            and not isinstance(q_proj, nn.QuantizedLinear)
            and type(net.model.embed_tokens) is nn.Embedding
        )
    else:
        assert config["quantization"] == config["quantization_config"]
        assert {k: config["quantization"][k] for k in ("group_size", "bits", "mode")} == {
            "group_size": 64,
            "bits": decoder_bits,
            "mode": "affine",
        }
        assert isinstance(q_proj, nn.QuantizedLinear) and (q_proj.bits, q_proj.group_size) == (
            decoder_bits,
            64,
        )
        down = net.model.layers[1].mlp.down_proj
        assert isinstance(down, nn.QuantizedLinear) and down.bits == decoder_bits
        embed = net.model.embed_tokens
        assert isinstance(embed, nn.QuantizedEmbedding) and (embed.bits, embed.group_size) == (
            decoder_bits,
            64,
        )
    encoder_linears = [enc_fc1, net.audio_tower.layers[0].self_attn.out_proj, net.audio_tower.conv_out]
    encoder_linears += [net.audio_tower.proj1, net.audio_tower.proj2]
    per_layer = {k for k in config.get("quantization", {}) if k not in ("group_size", "bits", "mode")}
    if encoder_bits is None:
        assert all(type(layer) is nn.Linear for layer in encoder_linears)
        assert not per_layer  # exactly mlx-community's block
    else:
        assert all(isinstance(m, nn.QuantizedLinear) and m.bits == encoder_bits for m in encoder_linears)
        if encoder_bits != decoder_bits:
            assert config["quantization"]["audio_tower.layers.1.fc1"] == {
                "group_size": 64,
                "bits": encoder_bits,
            }
            assert all(k.startswith("audio_tower.") for k in per_layer) and len(per_layer) == 15
        else:
            assert not per_layer
    # Convolutions and norms are never quantized.
    for conv in CONVS:
        assert type(getattr(net.audio_tower, conv)) is nn.Conv2d
    assert type(net.model.norm) is nn.RMSNorm and type(net.audio_tower.ln_post) is nn.LayerNorm
    assert type(net.model.layers[0].input_layernorm) is nn.RMSNorm
    assert "lm_head" not in net

    # Stored names are the MLX module tree's, convs OHWI, floats in bfloat16, no tied head copy.
    tensors = stored(path)
    assert not any(k.startswith(("thinker.", "lm_head")) for k in tensors)
    assert tensors["audio_tower.conv2d2.weight"].shape[1:3] == (3, 3)
    assert tensors["model.norm.weight"].dtype == mx.bfloat16
    assert tensors["audio_tower.conv2d1.weight"].dtype == mx.bfloat16
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(tensors) and set(index["weight_map"].values()) == {
        "model.safetensors"
    }
    # Tokenizer, preprocessor and template files travel along.
    for file in ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.json"):
        assert (path / file).read_bytes() == (original / file).read_bytes()
    assert (path / "preprocessor_config.json").is_file()

    ref_asr, ref_logits = reference
    if decoder_bits is None:
        assert_same_params(net, ref_asr.net)  # bf16 source -> bf16 output: lossless
    cos = cosine(prompt_logits(asr), ref_logits)
    measurements.append(f"convert {name}: tiny logits cosine vs float32 source {cos:.5f}")
    assert cos > MIN_COSINE[name]

    result = mlx_qwen3asr.transcribe(asr, signal(2.5), vad=False)
    assert isinstance(result, mlx_qwen3asr.Transcription)
    assert result.segments and result.duration == pytest.approx(2.5)


def test_default_4bit_matches_mlx_community(converted, original, tmp_path):
    """By default the keys, shapes, dtypes and config block are those mlx-community publishes."""
    path = converted("4bit")
    community = mlx_community_4bit(original, tmp_path / "community")
    ours, theirs = stored(path), stored(community)
    assert sorted(ours) == sorted(theirs)
    for key in ours:
        assert (ours[key].shape, ours[key].dtype) == (theirs[key].shape, theirs[key].dtype), key
    assert json.loads((path / "config.json").read_text())["quantization"] == MLX_COMMUNITY_BLOCK
    # Same recipe from the same bf16 weights: the same packed tensors.
    np.testing.assert_array_equal(
        np.array(ours["model.layers.0.mlp.up_proj.weight"]),
        np.array(theirs["model.layers.0.mlp.up_proj.weight"]),
    )
    # And our loader reads both to the same model.
    assert_same_params(load(path).net, load(community).net)


def test_float32_and_float16_dtypes(original, tmp_path, reference):
    for dtype, mx_dtype in (("float32", mx.float32), ("float16", mx.float16)):
        dst = tmp_path / dtype
        convert_checkpoint(original, dst, bits=8, dtype=dtype)
        tensors = stored(dst)
        assert tensors["model.norm.weight"].dtype == mx_dtype
        assert tensors["model.layers.0.mlp.up_proj.scales"].dtype == mx_dtype
        assert tensors["model.layers.0.mlp.up_proj.weight"].dtype == mx.uint32
        assert cosine(prompt_logits(load(dst)), reference[1]) > 0.999


def test_group_size_that_does_not_divide(original, tmp_path, capsys):
    # The tiny preset's 64-wide layers cannot use 128-wide groups: they stay float and are listed.
    dst = tmp_path / "g128"
    rc, out, _ = cli(capsys, original, "-o", dst, "--bits", "4", "--encoder-bits", "8", "--group-size", "128")
    assert rc == 0
    assert "left unquantized (input width not a multiple of 128)" in out
    config = json.loads((dst / "config.json").read_text())
    block = config["quantization"]
    assert block["group_size"] == 128 and block["model.layers.0.self_attn.q_proj"] is False
    assert block["audio_tower.layers.0.fc1"] is False
    assert block["audio_tower.layers.0.fc2"] == {"group_size": 128, "bits": 8}  # 128 wide: quantized
    net = load(dst).net
    assert not isinstance(net.model.layers[0].self_attn.q_proj, nn.QuantizedLinear)
    assert type(net.model.embed_tokens) is nn.Embedding
    down = net.model.layers[0].mlp.down_proj  # input width 128
    assert isinstance(down, nn.QuantizedLinear) and (down.bits, down.group_size) == (4, 128)
    assert (
        isinstance(net.audio_tower.layers[0].fc2, nn.QuantizedLinear)
        and net.audio_tower.layers[0].fc2.bits == 8
    )


def test_sharded_output(original, tmp_path, converted):
    dst = tmp_path / "sharded"
    result = convert_checkpoint(original, dst, bits=4, max_shard_bytes=1_500_000)
    files = sorted(p.name for p in dst.glob("*.safetensors"))
    n = len(files)
    assert n > 2 and files == [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    assert sorted(result.files) == files
    index = json.loads((dst / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == files
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in stored(dst).values())
    single = converted("4bit")
    assert_same_tensors(stored(dst), stored(single))
    assert_same_params(load(dst).net, load(single).net)


# --------------------------------------------------------------------------------------------------
# Source layouts
# --------------------------------------------------------------------------------------------------


def test_mlx_community_source(original, tmp_path, converted):
    source = mlx_layout(original, tmp_path / "mlx-src")
    dst = tmp_path / "from-mlx"
    result = convert_checkpoint(source, dst, bits=4)
    assert result.source_layout == "mlx"
    # Same weights in another layout: byte-identical tensors to converting the release.
    assert_same_tensors(stored(dst), stored(converted("4bit")))


def test_quantized_source_is_refused(original, tmp_path, capsys):
    source = mlx_community_4bit(original, tmp_path / "community")
    dst = tmp_path / "requant"
    rc, _, err = cli(capsys, source, "-o", dst, "--bits", "8")
    assert rc == 2
    assert "already quantized (4-bit)" in err and len(err.strip().splitlines()) == 1
    assert not dst.exists() and leftovers(tmp_path) == []


@pytest.mark.parametrize("preset", ["tiny", "aligner-tiny"])
def test_transformers_native_source(preset, checkpoints, tmp_path):
    """An -hf repository converts to exactly what its release converts to, config in the release layout."""
    release, hf = checkpoints(preset), checkpoints(preset, "hf")
    ours, theirs = tmp_path / "from-hf", tmp_path / "from-release"
    result = convert_checkpoint(hf, ours, bits=4)
    convert_checkpoint(release, theirs, bits=4)
    assert result.source_layout == "hf" and result.forced_aligner == (preset == "aligner-tiny")
    assert_same_tensors(stored(ours), stored(theirs))

    config = json.loads((ours / "config.json").read_text())
    release_config = json.loads((release / "config.json").read_text())
    assert "audio_config" not in config and config["model_type"] == "qwen3_asr"
    assert config["architectures"] == release_config["architectures"]
    assert config["support_languages"] == release_config["support_languages"]
    thinker, release_thinker = config["thinker_config"], release_config["thinker_config"]
    assert thinker["model_type"] == release_thinker["model_type"]
    assert thinker["text_config"]["rope_theta"] == 1000000
    assert thinker["text_config"]["rope_scaling"]["mrope_section"] == [24, 20, 20]
    for key in ("classify_num", "audio_token_id"):
        assert thinker.get(key) == release_thinker.get(key)
    for key in ("timestamp_token_id", "timestamp_segment_time"):
        assert config.get(key) == release_config.get(key)
    assert "id2label" not in config  # the -hf classifier's 5000 labels do not travel
    # -hf repositories ship no preprocessor config; the conversion carries the release's.
    preprocessor = json.loads((ours / "preprocessor_config.json").read_text())
    assert preprocessor == json.loads((release / "preprocessor_config.json").read_text())

    a, b = load(ours), load(theirs)
    assert a.config.audio_config == b.config.audio_config and a.config.text_config == b.config.text_config
    assert a.kind == b.kind
    assert_same_params(a.net, b.net)


@pytest.mark.parametrize("layout", ["release", "hf"])
def test_forced_aligner_converts(checkpoints, tmp_path, layout, measurements):
    source = checkpoints("aligner-tiny", layout)
    float_ref = load(checkpoints("aligner-tiny"))
    assert float_ref.kind == "aligner"

    dst = tmp_path / "aligner-8bit"  # as mlx-community publishes the aligner
    result = convert_checkpoint(source, dst, bits=8)
    assert result.forced_aligner and result.quantized["lm_head"] == 8
    config = json.loads((dst / "config.json").read_text())
    assert config["thinker_config"]["classify_num"] == 5000
    assert config["thinker_config"]["model_type"] == "qwen3_forced_aligner"
    assert config["model_type"] == "qwen3_asr"  # as the release: only the thinker says aligner
    assert stored(dst)["lm_head.weight"].shape == (5000, 64 * 8 // 32)

    asr = load(dst)
    assert asr.kind == "aligner" and asr.config.classify_num == 5000
    head = asr.net.lm_head
    assert isinstance(head, nn.QuantizedLinear) and (head.bits, head.group_size) == (8, 64)
    assert type(asr.net.audio_tower.layers[0].fc1) is nn.Linear  # as mlx-audio's aligner conversions
    logits = prompt_logits(asr)
    assert logits.shape[-1] == 5000
    cos = cosine(logits, prompt_logits(float_ref))
    measurements.append(f"convert forced aligner ({layout} layout) 8-bit: logits cosine {cos:.5f}")
    assert cos > 0.99

    plain = tmp_path / "aligner-bf16"
    convert_checkpoint(source, plain)
    assert_same_params(load(plain).net, float_ref.net)


# --------------------------------------------------------------------------------------------------
# Destination handling and failures
# --------------------------------------------------------------------------------------------------


def test_existing_destination_refused_then_forced(original, tmp_path, capsys):
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "README.md").write_text("precious")
    rc, _, err = cli(capsys, original, "-o", dst, "--bits", "8")
    assert rc == 2 and "exists; use --overwrite" in err  # a usage error, as mlxasr's
    assert (dst / "README.md").read_text() == "precious"

    rc, out, _ = cli(capsys, original, "-o", dst, "--bits", "8", "--overwrite")  # as every command says it
    assert rc == 0 and "converted" in out
    assert not (dst / "README.md").exists() and (dst / "config.json").is_file()
    assert json.loads((dst / "config.json").read_text())["quantization"]["bits"] == 8
    assert leftovers(tmp_path) == []
    load(dst)


def test_overwrite_is_the_option_and_force_its_alias(capsys):
    """`--overwrite`, as mlxasr, align and live call it; `--force`, its old name, still works."""
    from mlx_qwen3asr.cli.convert import build_parser

    parser = build_parser("mlxasr convert")
    assert parser.parse_args(["src", "-o", "dst", "--overwrite"]).overwrite is True
    assert parser.parse_args(["src", "-o", "dst", "--force"]).overwrite is True
    assert parser.parse_args(["src", "-o", "dst"]).overwrite is False
    text = " ".join(parser.format_help().split())
    assert "--overwrite, --force replace DST" in text and "--force is the same" in text


def test_force_keeps_old_destination_when_conversion_fails(original, tmp_path, capsys):
    broken = copy_checkpoint(original, tmp_path / "broken")
    data = (broken / "model.safetensors").read_bytes()
    (broken / "model.safetensors").write_bytes(data[: len(data) // 2])
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "README.md").write_text("precious")
    rc, _, _ = cli(capsys, broken, "-o", dst, "--force")
    assert rc == 2 and (dst / "README.md").read_text() == "precious"  # an unusable source: a usage error
    assert leftovers(tmp_path) == []


def test_a_failure_while_writing_exits_1(original, tmp_path, capsys, monkeypatch):
    import errno

    from mlx_qwen3asr.checkpoints import convert as conversion

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(conversion, "write_weights", full_disk)
    dst = tmp_path / "dst"
    dst.mkdir()
    (dst / "README.md").write_text("precious")
    rc, out, err = cli(capsys, original, "-o", dst, "--force")
    assert rc == 1 and out == "" and "No space left on device" in err.splitlines()[-1]
    assert (dst / "README.md").read_text() == "precious"
    assert leftovers(tmp_path) == []


def _missing_config(path: Path) -> None:
    (path / "config.json").unlink()


def _other_model(path: Path) -> None:
    (path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 768}))


def _other_audio_model(path: Path) -> None:
    config = json.loads((path / "config.json").read_text())
    flat = {**config.pop("thinker_config"), "model_type": "qwen2_audio"}
    (path / "config.json").write_text(json.dumps(flat))


def _truncated(path: Path) -> None:
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])


def _missing_weight(path: Path) -> None:
    tensors = dict(mx.load(str(path / "model.safetensors")))
    del tensors["thinker.model.layers.1.mlp.up_proj.weight"]
    mx.save_safetensors(str(path / "model.safetensors"), tensors)


def _no_weights(path: Path) -> None:
    (path / "model.safetensors").unlink()


def _bad_json(path: Path) -> None:
    (path / "config.json").write_text("{not json")


def _edit_text_config(key: str, value) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        config = json.loads((path / "config.json").read_text())
        config["thinker_config"]["text_config"][key] = value
        (path / "config.json").write_text(json.dumps(config))

    return edit


BAD_SOURCES = {
    "missing-config": (_missing_config, "no config.json"),
    "other-model-type": (_other_model, "not a Qwen3-ASR checkpoint"),
    "other-audio-model": (_other_audio_model, "not a Qwen3-ASR checkpoint"),
    "truncated-safetensors": (_truncated, "model.safetensors"),
    "missing-weight": (_missing_weight, "missing weight(s): model.layers.1.mlp.up_proj.weight"),
    "no-weights": (_no_weights, "no *.safetensors"),
    "unreadable-config": (_bad_json, "config.json: unreadable"),
    "more-layers-than-weights": (
        _edit_text_config("num_hidden_layers", 3),
        "config.json: text_config.num_hidden_layers is 3 but the weights hold 2 decoder layers",
    ),
    "zero-width": (
        _edit_text_config("hidden_size", 0),
        "config.json: text_config.hidden_size is 0; it must be between 1 and 65536",
    ),
    "string-size": (
        _edit_text_config("vocab_size", "151936"),
        "config.json: text_config.vocab_size is '151936', not an integer",
    ),
}


@pytest.mark.parametrize("case", list(BAD_SOURCES))
def test_bad_source_leaves_nothing(case, original, tmp_path, capsys):
    damage, message = BAD_SOURCES[case]
    source = copy_checkpoint(original, tmp_path / "src")
    damage(source)
    out_root = tmp_path / "out"
    dst = out_root / "nested" / "dst"  # missing parents are created, then removed again
    rc, out, err = cli(capsys, source, "-o", dst, "--bits", "4")
    assert rc == 2 and out == ""  # an unusable source is a usage error, as for mlxasr
    lines = err.strip().splitlines()
    assert lines[-1].startswith("mlxasr-convert: error: ") and message in lines[-1]
    assert not out_root.exists()
    assert leftovers(tmp_path) == []


def test_nonexistent_source(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, _, err = cli(capsys, "no/such/dir/here", "-o", tmp_path / "dst")
    assert rc == 2 and "not a Hugging Face repo id" in err
    assert not (tmp_path / "dst").exists()


def test_destination_is_source(original, tmp_path, capsys):
    source = copy_checkpoint(original, tmp_path / "src")
    rc, _, err = cli(capsys, source, "-o", source, "--bits", "4", "--force")
    assert rc == 2 and "is (or contains) the source" in err
    assert (source / "model.safetensors").read_bytes() == (original / "model.safetensors").read_bytes()


def test_api_validates_options(original, tmp_path):
    with pytest.raises(ConvertError, match="bits must be one of 4, 8"):
        convert_checkpoint(original, tmp_path / "a", bits=3)
    with pytest.raises(ConvertError, match="--encoder-bits needs --bits"):
        convert_checkpoint(original, tmp_path / "b", encoder_bits=8)
    with pytest.raises(ConvertError, match="group size must be one of"):
        convert_checkpoint(original, tmp_path / "c", bits=4, group_size=48)
    with pytest.raises(ConvertError, match="unknown dtype"):
        convert_checkpoint(original, tmp_path / "d", dtype="int8")
    assert sorted(os.listdir(tmp_path)) == []
    path = convert_checkpoint(original, tmp_path / "e", bits=8, encoder_bits=16).path
    assert (
        path == tmp_path / "e" and json.loads((path / "config.json").read_text())["quantization"]["bits"] == 8
    )


def test_cli_subprocess(original, tmp_path):
    dst = tmp_path / "sub"
    run = [sys.executable, "-m", "mlx_qwen3asr.cli.convert", str(original), "-o", str(dst), "--bits", "8"]
    proc = subprocess.run(run, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"-> {dst}" in proc.stdout and "15 at 8 bits" in proc.stdout
    assert "read by: mlx_qwen3asr, mlx-audio and mlx-qwen3-asr" in proc.stdout
    assert isinstance(load(dst).net.model.layers[0].mlp.up_proj, nn.QuantizedLinear)

    again = subprocess.run(run, capture_output=True, text=True, cwd=REPO_ROOT, timeout=300)
    assert again.returncode == 2
    assert (
        again.stderr.strip().splitlines()[-1]
        == f"mlxasr-convert: error: {dst} exists; use --overwrite to replace it"
    )


@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_aligner_conversions_align(checkpoints, tmp_path, bits):
    source = checkpoints("aligner-tiny")
    dst = convert_checkpoint(source, tmp_path / f"aligner-{bits}bit", bits=bits).path
    quantized, plain = load(dst), load(convert_checkpoint(source, tmp_path / "bf16").path)
    text = "So the first thing I want to talk about today is the budget."
    wav = signal(6.0, seed=3)
    words = mlx_qwen3asr.align(quantized, wav, text, "English")
    reference = mlx_qwen3asr.align(plain, wav, text, "English")
    assert [w.text for w in words] == [w.text for w in reference] == text.split()
    assert all(0.0 <= w.start <= w.end <= 6.0 for w in words)
    assert all(a.start <= b.start for a, b in zip(words, words[1:]))
    moved = sum(abs(a.start - b.start) > 0.08 or abs(a.end - b.end) > 0.08 for a, b in zip(words, reference))
    if bits == 8:
        assert moved <= len(words) // 2


def test_unreachable_hub_exits_as_mlxasr_does(tmp_path):
    """`mlxasr convert`, `mlxasr-convert` and `mlxasr` give the same status for a hub out of reach."""
    import socket

    import soundfile as sf

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens: connections are refused at once
    (tmp_path / "hub").mkdir()
    env = {
        **os.environ,
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_HUB_OFFLINE": "0",
    }
    sf.write(tmp_path / "talk.wav", np.zeros(16000, dtype=np.float32), 16000)
    commands = {
        "mlxasr": ["mlx_qwen3asr.cli.main", str(tmp_path / "talk.wav"), "--no-vad", "--model", "acme/absent"],
        "mlxasr convert": ["mlx_qwen3asr.cli.main", "convert", "acme/absent", "-o", str(tmp_path / "a")],
        "mlxasr-convert": ["mlx_qwen3asr.cli.convert", "acme/absent", "-o", str(tmp_path / "b")],
    }
    status = {}
    for name, args in commands.items():
        proc = subprocess.run(
            [sys.executable, "-m", *args], env=env, capture_output=True, text=True, cwd=REPO_ROOT, timeout=120
        )
        status[name] = proc.returncode
        assert "cannot reach the Hugging Face hub" in proc.stderr, (name, proc.stderr)
    assert status == {"mlxasr": 2, "mlxasr convert": 2, "mlxasr-convert": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hub", "talk.wav"]


def test_convert_subcommand_help(capsys):
    from mlx_qwen3asr.cli.main import main as mlxasr

    assert mlxasr(["convert", "--help"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: mlxasr convert") and "--bits" in text
    assert "exit status" in text and "Hugging Face hub unreachable" in text


# --------------------------------------------------------------------------------------------------
# Killed runs, destinations that are no checkpoint folder, unwritable destinations
# --------------------------------------------------------------------------------------------------

# A conversion that stops for good once its output is written, before it is checked and renamed.
STALLED = """
import sys, time
import mlx_qwen3asr.checkpoints.convert as conversion
conversion.verify_output = lambda out: time.sleep(600)
from mlx_qwen3asr.cli.convert import main
sys.exit(main(sys.argv[1:]))
"""


def partials(folder: Path, name: str) -> list[Path]:
    return sorted(folder.glob(f".{name}.mlxasr-*.partial"))


def stalled_conversion(source: Path, dst: Path) -> tuple[subprocess.Popen, Path]:
    """A conversion into dst that stalls with its temporary folder written; the process and the folder."""
    import time

    proc = subprocess.Popen(
        [sys.executable, "-c", STALLED, str(source), "-o", str(dst)],
        cwd=REPO_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        found = [p for p in partials(dst.parent, dst.name) if (p / "config.json").is_file()]
        if found:
            return proc, found[0]
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    pytest.fail(f"the conversion into {dst} wrote no temporary folder (status {proc.returncode})")


def age(path: Path, seconds: float) -> None:
    """Make a folder and what it holds look last written `seconds` ago."""
    import time

    when = time.time() - seconds
    for p in [*path.iterdir(), path]:
        os.utime(p, (when, when), follow_symlinks=False)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def test_a_killed_conversions_folder_is_removed_by_the_next_run_and_a_live_runs_is_kept(
    original, tmp_path, capsys
):
    import signal

    live, live_folder = stalled_conversion(original, tmp_path / "live")
    try:
        killed, killed_folder = stalled_conversion(original, tmp_path / "killed")
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=60)
        assert killed_folder.is_dir() and f".mlxasr-{killed.pid}-" in killed_folder.name
        # Both look long untouched: only whether their process lives tells them apart.
        age(killed_folder, 300)
        age(live_folder, 300)

        rc, out, err = cli(capsys, original, "-o", tmp_path / "next", "--bits", "8")
        assert rc == 0, err
        assert not killed_folder.exists()
        assert f"removed 1 folder(s) left by killed conversions: {killed_folder.name}" in err
        assert live_folder.is_dir() and (live_folder / "config.json").is_file()
        assert live.poll() is None
        assert leftovers(tmp_path) == [live_folder.name]
    finally:
        live.kill()
        live.wait(timeout=60)


def test_only_stale_temporary_folders_of_this_machine_are_cleared(tmp_path):
    from mlx_qwen3asr.checkpoints import convert as conversion
    from mlx_qwen3asr.runtime import atomic

    host, gone = atomic.host_tag(), dead_pid()
    other_host = "0" * 8 if host != "0" * 8 else "1" * 8

    def folder(name: str, pid: int, kind: str, machine: str = host) -> Path:
        path = tmp_path / f".{name}.mlxasr-{pid}-{machine}-0a1b2c3d.{kind}"
        path.mkdir()
        (path / "config.json").write_text("{}")
        age(path, 300)
        return path

    stale = folder("a", gone, "partial")
    mine = folder("b", os.getpid(), "partial")  # a live run: this one
    elsewhere = folder("c", gone, "partial", other_host)  # another machine's run sharing the folder
    recent = folder("d", gone, "partial")
    age(recent, 5)  # written to a moment ago
    replaced = folder("e", gone, "old")  # its replacement is in place: removed
    (tmp_path / "e").mkdir()
    half_replaced = folder("f", gone, "old")  # killed between the two renames: put back
    older = tmp_path / ".g.abcd1234.partial"  # an unknown name: not ours to judge
    older.mkdir()

    removed, restored = conversion.remove_stale_folders(tmp_path)
    assert sorted(removed) == sorted([stale, replaced])
    assert restored == [tmp_path / "f"] and (tmp_path / "f" / "config.json").is_file()
    assert not half_replaced.exists()
    for kept in (mine, elsewhere, recent, older):
        assert kept.is_dir()


@pytest.mark.parametrize("where", [".", "..", "/"])
def test_a_destination_that_names_no_folder_is_a_usage_error(where, original, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "notes.txt").write_text("mine")
    monkeypatch.chdir(work)
    before = sorted(os.listdir(tmp_path)), sorted(os.listdir(work))
    rc, out, err = cli(capsys, original, "-o", where, "--force")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"mlxasr-convert: error: destination {where!r} names no folder of its own; give the folder to "
        "create, such as ./qwen3-asr-4bit"
    ]
    assert (sorted(os.listdir(tmp_path)), sorted(os.listdir(work))) == before


def test_force_replaces_only_a_checkpoint_folder(original, tmp_path, capsys):
    dst = tmp_path / "models"
    dst.mkdir()
    (dst / "config.json").write_text("{}")
    (dst / "notes.txt").write_text("precious")
    (dst / "runs").mkdir()
    before = sorted(p.name for p in dst.iterdir())
    rc, out, err = cli(capsys, original, "-o", dst, "--bits", "8", "--force")
    assert rc == 2 and out == ""
    assert err.splitlines() == [
        f"mlxasr-convert: error: {dst} is not a checkpoint folder (it holds notes.txt, runs/); --overwrite "
        "replaces only a checkpoint folder (config.json, safetensors, tokenizer files): choose another "
        "destination"
    ]
    assert sorted(p.name for p in dst.iterdir()) == before and (dst / "notes.txt").read_text() == "precious"
    assert leftovers(tmp_path) == []

    # A checkpoint as a hub download leaves it (README, .gitattributes, the .cache folder) is replaced.
    hub = copy_checkpoint(original, tmp_path / "hub")
    (hub / "README.md").write_text("model card")
    (hub / ".gitattributes").write_text("*.safetensors filter=lfs")
    (hub / ".cache" / "huggingface").mkdir(parents=True)
    rc, out, err = cli(capsys, original, "-o", hub, "--bits", "8", "--force")
    assert rc == 0, err
    assert not (hub / "README.md").exists() and not (hub / ".cache").exists()
    assert json.loads((hub / "config.json").read_text())["quantization"]["bits"] == 8


def test_an_unwritable_destination_is_one_line(original, tmp_path, capsys, monkeypatch):
    import errno

    from mlx_qwen3asr.checkpoints import convert as conversion

    locked = tmp_path / "read-only"
    locked.mkdir()
    real_mkdir = os.mkdir

    def read_only_mkdir(path, *args, **kwargs):
        # Root may write anywhere whatever the mode; refuse as a read-only file system does.
        if locked in Path(os.fsdecode(path)).parents:
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only_mkdir)
    for dst in (locked / "out", locked / "deeper" / "out"):
        rc, out, err = cli(capsys, original, "-o", dst, "--bits", "8")
        assert rc == 2 and out == ""  # before the source is read, as mlxasr's unwritable output folders
        assert err.splitlines() == [
            f"mlxasr-convert: error: cannot write {dst}: {locked} does not take new folders "
            "(Read-only file system)"
        ]
        assert list(locked.iterdir()) == []

    # A file system that turns read-only during the conversion: status 1, still one line.
    monkeypatch.setattr(os, "mkdir", real_mkdir)

    def read_only(tensors, out, max_bytes):
        raise OSError(errno.EROFS, "Read-only file system", str(out / "model.safetensors"))

    monkeypatch.setattr(conversion, "write_weights", read_only)
    dst = tmp_path / "later"
    rc, out, err = cli(capsys, original, "-o", dst, "--bits", "8")
    assert rc == 1 and out == ""
    assert err.splitlines()[-1] == f"mlxasr-convert: error: cannot write {dst} (Read-only file system)"
    assert "Errno" not in err and not dst.exists() and leftovers(tmp_path) == []
