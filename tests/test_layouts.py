"""Test checkpoints are the published ones; every published layout loads as it is; conversions are mlx-community's.

The published metadata (config, tokenizer and template files, weight names and shapes of the release,
the -hf repositories and mlx-community's conversions) lies in tools/published/real-checkpoints in the
repository. tools/make_checkpoint.py builds every test checkpoint from it; these tests hold the tool to
it, at the real sizes too (names and shapes only: no real-size weights are written here).
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from reference import test_signal

import mlx_qwen3asr
from mlx_qwen3asr.checkpoints.convert import make_recipe, plan_conversion, source_of
from mlx_qwen3asr.checkpoints.layouts import normalize
from mlx_qwen3asr.checkpoints.loading import checkpoint_from
from mlx_qwen3asr.cli.main import main as mlxasr
from mlx_qwen3asr.model.config import ConfigError, ModelConfig
from tools.layout_table import build, evaluate
from tools.make_checkpoint import (
    DEFAULT_METADATA_DIR,
    DEFAULT_TOKENIZER_DIR,
    HF_TOKENIZER,
    PRESETS,
    TINY_AUDIO,
    TINY_TEXT,
    shard_plan,
    weight_specs,
    write_checkpoint,
)

META = DEFAULT_METADATA_DIR
NAMES = META / "weight-names"
COMMUNITY = META / "mlx-community-as-written-by-mlx-audio-0.6.2"
DTYPES = {mx.bfloat16: "bfloat16", mx.uint32: "uint32", mx.float32: "float32"}


def published_tensors(file: str) -> dict[str, tuple[tuple[int, ...], str]]:
    out = {}
    for line in (NAMES / file).read_text().splitlines():
        name, shape, dtype = line.split("\t")
        out[name] = (tuple(int(s) for s in shape.strip("[]").split(",")), dtype)
    return out


def read_json(path: Path):
    return json.loads(path.read_text(encoding="utf-8"))


def changed_leaves(a, b, prefix: str = "") -> set[str]:
    """Dotted paths where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: set[str] = set()
        for key in set(a) | set(b):
            out |= changed_leaves(a.get(key), b.get(key), f"{prefix}{key}.")
        return out
    return set() if a == b else {prefix.rstrip(".")}


def stored(path: Path) -> dict[str, mx.array]:
    tensors: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(mx.load(str(file)))
    return tensors


# --------------------------------------------------------------------------------------------------
# The tool writes what was published
# --------------------------------------------------------------------------------------------------

SPEC_CASES = [
    ("0.6b", "release", "Qwen3-ASR-0.6B.release.txt"),
    ("1.7b", "release", "Qwen3-ASR-1.7B.release.txt"),
    ("aligner", "release", "Qwen3-ForcedAligner-0.6B.release.txt"),
    ("0.6b", "hf", "Qwen3-ASR-0.6B-hf.txt"),
    ("aligner", "hf", "Qwen3-ForcedAligner-0.6B-hf.txt"),
]


@pytest.mark.parametrize(("preset", "layout", "file"), SPEC_CASES)
def test_presets_store_the_published_tensors(preset, layout, file):
    published = published_tensors(file)
    assert {dtype for _, dtype in published.values()} == {"bfloat16"}
    assert weight_specs(preset, layout) == {name: shape for name, (shape, _) in published.items()}


@pytest.mark.parametrize("preset", ["tiny", "aligner-tiny"])
@pytest.mark.parametrize("layout", ["release", "hf"])
def test_tiny_checkpoints_store_their_specs(checkpoints, preset, layout):
    tensors = stored(checkpoints(preset, layout))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == weight_specs(preset, layout)
    assert {v.dtype for v in tensors.values()} == {mx.bfloat16}


@pytest.mark.parametrize("preset", ["tiny", "aligner-tiny"])
def test_release_metadata_is_the_published(checkpoints, preset):
    path, published = checkpoints(preset), META / PRESETS[preset].release
    for name in ("generation_config.json", "preprocessor_config.json", "tokenizer_config.json"):
        assert (path / name).read_bytes() == (published / name).read_bytes(), name
    for name in ("chat_template.json", "configuration.json"):
        assert (path / name).read_bytes() == (published / name).read_bytes(), name
    for name in ("vocab.json", "merges.txt"):
        assert (path / name).read_bytes() == (DEFAULT_TOKENIZER_DIR / name).read_bytes(), name
    config, real = read_json(path / "config.json"), read_json(published / "config.json")
    sizes = {f"thinker_config.audio_config.{k}" for k in TINY_AUDIO}
    sizes |= {f"thinker_config.text_config.{k}" for k in TINY_TEXT}
    changed = changed_leaves(config, real)
    assert changed and changed <= sizes  # only sizes differ
    assert config["transformers_version"] == "4.57.6" and "tie_word_embeddings" not in config
    assert config["thinker_config"]["model_type"] == (
        "qwen3_forced_aligner" if "aligner" in preset else "qwen3_asr"
    )


@pytest.mark.parametrize("preset", ["tiny", "aligner-tiny"])
def test_hf_metadata_is_the_published(checkpoints, preset):
    path = checkpoints(preset, "hf")
    assert sorted(p.name for p in path.iterdir()) == [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config, real = read_json(path / "config.json"), read_json(META / PRESETS[preset].hf / "config.json")
    sizes = {f"audio_config.{k}" for k in TINY_AUDIO} | {f"text_config.{k}" for k in TINY_TEXT}
    changed = changed_leaves(config, real)
    assert changed and changed <= sizes
    tokenizer_config = META / HF_TOKENIZER / "tokenizer_config.json"
    assert (path / "tokenizer_config.json").read_bytes() == tokenizer_config.read_bytes()
    tokenizer, base = read_json(path / "tokenizer.json"), read_json(META / HF_TOKENIZER / "tokenizer.json")
    if preset == "tiny":
        assert (path / "tokenizer.json").read_bytes() == (META / HF_TOKENIZER / "tokenizer.json").read_bytes()
    else:  # the aligner's adds <timestamp>, as its release tokenizer_config declares it
        extra = [t for t in tokenizer["added_tokens"] if t not in base["added_tokens"]]
        assert [(t["id"], t["content"], t["special"]) for t in extra] == [(151705, "<timestamp>", False)]
        assert {k: v for k, v in tokenizer.items() if k != "added_tokens"} == {
            k: v for k, v in base.items() if k != "added_tokens"
        }


@pytest.mark.parametrize("preset", ["0.6b", "1.7b", "aligner"])
def test_hf_configs_are_read_through_the_release_layout(preset):
    """The -hf config's rules (sections at the top level, rope_parameters, the top-level tie flag, the
    aligner's class count) are applied once, by the layouts; the model config reads the release's layout."""
    release = read_json(META / PRESETS[preset].release / "config.json")
    hf = read_json(META / PRESETS[preset].hf / "config.json")
    _, rewritten, _ = normalize(hf, {})
    assert ModelConfig.from_dict(rewritten) == ModelConfig.from_dict(release)
    with pytest.raises(ConfigError, match="no thinker_config"):
        ModelConfig.from_dict(hf)


def test_1_7b_is_sharded_as_released():
    index = read_json(META / "Qwen3-ASR-1.7B" / "model.safetensors.index.json.RECONSTRUCTED")
    names = [(name, 0) for name in weight_specs("1.7b")]
    plan = shard_plan("1.7b", META, None, names)
    assert plan == index["weight_map"]
    assert sorted(set(plan.values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]


def test_sharded_write_has_an_index_naming_every_shard(tmp_path):
    path = write_checkpoint(tmp_path / "sharded", "aligner-tiny", shard_mb=4)
    index = read_json(path / "model.safetensors.index.json")
    files = sorted(p.name for p in path.glob("*.safetensors"))
    assert len(files) > 2 and sorted(set(index["weight_map"].values())) == files
    assert set(index["weight_map"]) == set(weight_specs("aligner-tiny"))
    assert index["metadata"]["total_size"] == sum(v.nbytes for v in stored(path).values())


# --------------------------------------------------------------------------------------------------
# Conversions of the published shapes are what mlx-audio writes (names, shapes, dtypes and config)
# --------------------------------------------------------------------------------------------------

COMMUNITY_CASES = [
    ("0.6b", 4, "asr-0.6b-4bit"),
    ("0.6b", 8, "asr-0.6b-8bit"),
    ("0.6b", None, "asr-0.6b-bf16"),
    ("1.7b", 4, "asr-1.7b-4bit"),
    ("aligner", 8, "aligner-0.6b-8bit"),
]


def planned(preset: str, layout: str, bits: int | None, encoder_bits: int | None = None):
    """Our conversion of the published layout, planned on lazy zeros of the published shapes."""
    folder = PRESETS[preset].release if layout == "release" else PRESETS[preset].hf
    raw = read_json(META / folder / "config.json")
    weights = {name: mx.zeros(shape, mx.bfloat16) for name, shape in weight_specs(preset, layout).items()}
    recipe = make_recipe(bits, encoder_bits=encoder_bits)
    return plan_conversion(source_of(checkpoint_from(Path(folder), raw, weights)), recipe)


@pytest.mark.parametrize(("preset", "bits", "name"), COMMUNITY_CASES)
@pytest.mark.parametrize("layout", ["release", "hf"])
def test_default_conversions_are_mlx_communitys(preset, bits, name, layout):
    plan = planned(preset, layout, bits)
    got = {k: (tuple(v.shape), DTYPES[v.dtype]) for k, v in plan.tensors.items()}
    assert got == published_tensors(f"mlx-community-{name}.mlx-audio-0.6.2.txt")
    community = read_json(COMMUNITY / f"{name}.config.json")
    if layout == "release":
        assert plan.config == community  # the release config plus the block, as mlx-audio writes it
    else:
        assert plan.config.get("quantization") == community.get("quantization")
        assert ModelConfig.from_dict(plan.config) == ModelConfig.from_dict(community)
        assert plan.config["support_languages"] == community["support_languages"]


def test_mixed_recipe_quantizes_the_encoder_and_says_who_reads_it():
    default = planned("0.6b", "release", 4)
    assert not any(k.startswith("audio_tower.") and k.endswith(".scales") for k in default.tensors)
    mixed = planned("0.6b", "release", 4, encoder_bits=8)
    packed = {k for k in mixed.tensors if k.startswith("audio_tower.") and k.endswith(".scales")}
    assert len(packed) == 18 * 6 + 3  # every encoder linear, conv_out and the projector
    assert mixed.config["quantization"]["audio_tower.layers.0.fc1"] == {"group_size": 64, "bits": 8}
    assert "not mlx-audio" in make_recipe(4, encoder_bits=8).readers
    assert make_recipe(4).readers == make_recipe(8).readers == "mlx_qwen3asr, mlx-audio and mlx-qwen3-asr"


# --------------------------------------------------------------------------------------------------
# Every layout loads and decodes alike; the wrong kind of model is refused
# --------------------------------------------------------------------------------------------------


def test_every_layout_loads_and_decodes_like_the_release(tmp_path):
    rows = {
        r.name: r for r in evaluate(build("tiny", tmp_path, None, log=lambda _: None), 16, test_signal(4.0))
    }
    assert all(r.loads == "yes" for r in rows.values())
    assert rows["tiny release"].layout == "release" and rows["tiny-hf"].layout == "hf"
    assert rows["tiny-hf"].ids_vs_release == "16/16 identical"
    for name in ("aligner-tiny release", "aligner-tiny-hf"):
        assert rows[name].kind == "aligner" and rows[name].transcribe.startswith("refused")
    for name in ("ours 4-bit (default)", "ours 8-bit (default)", "ours mixed 4-bit + 8-bit encoder"):
        assert rows[name].layout == "mlx" and rows[name].transcribe == "yes" and rows[name].ids_vs_release


def test_transcribing_with_the_aligner_is_refused(checkpoints):
    path = checkpoints("aligner-tiny", "hf")
    aligner = mlx_qwen3asr.load(path)
    with pytest.raises(mlx_qwen3asr.WrongModelError, match="Qwen3-ForcedAligner word-timing model") as err:
        mlx_qwen3asr.transcribe(aligner, test_signal(1.0))
    assert str(err.value).startswith(f"{path}: ") and "Qwen3-ASR checkpoint" in str(err.value)
    with pytest.raises(mlx_qwen3asr.WrongModelError):
        next(mlx_qwen3asr.transcribe_stream(aligner, [test_signal(1.0)]))


def test_aligning_with_an_asr_model_is_refused(checkpoints):
    path = checkpoints("tiny", "hf")
    asr = mlx_qwen3asr.load(path)
    mlx_qwen3asr.require_kind(asr, "asr")
    with pytest.raises(mlx_qwen3asr.WrongModelError, match="speech recognition model") as err:
        mlx_qwen3asr.require_kind(asr, "aligner")
    assert str(err.value).startswith(f"{path}: ") and "Qwen3-ForcedAligner checkpoint" in str(err.value)


def test_cli_refuses_the_aligner_and_writes_nothing(checkpoints, tmp_path, capsys):
    import soundfile as sf

    sf.write(tmp_path / "talk.wav", test_signal(2.0), 16000)
    model = checkpoints("aligner-tiny")
    rc = mlxasr([str(tmp_path), "--srt", "--json", "--model", str(model)])
    _, err = capsys.readouterr()
    assert rc == 2
    errors = [line for line in err.splitlines() if line.startswith("mlxasr: error:")]
    assert errors == [
        f"mlxasr: error: model {model}: this is a Qwen3-ForcedAligner word-timing model; transcription needs a "
        "Qwen3-ASR checkpoint (e.g. Qwen/Qwen3-ASR-0.6B)"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["talk.wav"]


def test_not_a_qwen3_asr_checkpoint_is_named(tmp_path):
    path = tmp_path / "whisper"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"model_type": "whisper", "d_model": 384}))
    with pytest.raises(
        mlx_qwen3asr.ModelLoadError, match=r"not a Qwen3-ASR checkpoint \(model_type 'whisper'\)"
    ):
        mlx_qwen3asr.load(path)


def test_aligner_in_both_layouts_gives_the_same_logits(checkpoints):
    from logits import prefill_logits

    from mlx_qwen3asr.model.encoder import encoder_batch

    logits = []
    for layout in ("release", "hf"):
        model = mlx_qwen3asr.load(checkpoints("aligner-tiny", layout), dtype="float32")
        mel = np.random.default_rng(0).standard_normal((128, 250)).astype(np.float32)
        features = model.net.audio_tower(encoder_batch([mel], model.config.audio_config))
        ids = [151669] + [151676] * features.shape[0] + [151670, 9707, 151705, 151705]
        logits.append(np.array(prefill_logits(model.net, ids, features)))
    assert logits[0].shape[-1] == 5000
    np.testing.assert_array_equal(logits[0], logits[1])
