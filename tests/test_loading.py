"""Every checkpoint layout loads to the same model; a checkpoint that does not match fails by name."""

from __future__ import annotations

import gc
import json
import shutil
import subprocess
import sys
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from logits import prefill_logits
from mlx.utils import tree_flatten

import mlx_qwen3asr
from mlx_qwen3asr.checkpoints import loading
from mlx_qwen3asr.checkpoints.convert import convert_checkpoint
from mlx_qwen3asr.checkpoints.loading import ModelLoadError, resolve_model_path
from mlx_qwen3asr.model.encoder import encoder_batch
from mlx_qwen3asr.model.qwen3asr import Qwen3ASR

CONVS = ("conv2d1", "conv2d2", "conv2d3")
QUANT = {"group_size": 64, "bits": 4, "mode": "affine"}
MIXED_LAYER = "model.layers.0.mlp.down_proj"


def load(path) -> mlx_qwen3asr.ASRModel:
    return mlx_qwen3asr.load(path, dtype="float32")


def release_tensors(path: Path) -> dict[str, mx.array]:
    tensors: dict[str, mx.array] = {}
    for file in sorted(path.glob("*.safetensors")):
        tensors.update(mx.load(str(file)))
    return tensors


def as_np(x: mx.array) -> np.ndarray:
    return np.array(x.astype(mx.float32))


def copy_checkpoint(src: Path, dst: Path, skip=lambda name: False) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for file in src.iterdir():
        if not skip(file.name):
            shutil.copyfile(file, dst / file.name)
    return dst


def resave(path: Path, edit) -> None:
    """Rewrite a single-file checkpoint's weights through `edit(dict)`."""
    file = path / "model.safetensors"
    tensors = dict(mx.load(str(file)))
    edit(tensors)
    mx.eval(tensors)
    mx.save_safetensors(str(file), tensors, metadata={"format": "pt"})


def outputs(asr: mlx_qwen3asr.ASRModel) -> tuple[np.ndarray, np.ndarray]:
    """Audio features and prompt logits of a fixed input: exercises the convs, both stacks and the head."""
    cfg = asr.config
    rng = np.random.default_rng(1)
    mel = rng.standard_normal((cfg.audio_config.num_mel_bins, 230)).astype(np.float32)
    features = asr.net.audio_tower(encoder_batch([mel], cfg.audio_config))
    ids = [872, 198, cfg.audio_start_token_id] + [cfg.audio_token_id] * features.shape[0]
    ids += [cfg.audio_end_token_id, 198, 1000, 2000, 3000]
    logits = prefill_logits(asr.net, ids, features)
    return np.array(features), np.array(logits)


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    pa, pb = dict(tree_flatten(a.parameters())), dict(tree_flatten(b.parameters()))
    assert sorted(pa) == sorted(pb)
    for key in pa:
        np.testing.assert_array_equal(np.array(pa[key]), np.array(pb[key]), err_msg=key)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.fixture(scope="module")
def original(checkpoints) -> Path:
    return checkpoints("tiny")


@pytest.fixture(scope="module")
def reference(original):
    asr = load(original)
    return asr, outputs(asr)


def write_mlx_layout(src: Path, dst: Path) -> Path:
    """An mlx-audio style conversion: prefix stripped, OHWI convs, no tied head, original config."""
    copy_checkpoint(src, dst, skip=lambda name: name.endswith(".safetensors"))
    weights = {}
    for key, value in release_tensors(src).items():
        key = key.removeprefix("thinker.")
        if key.startswith("audio_tower.conv2d") and key.endswith(".weight"):
            value = value.transpose(0, 2, 3, 1)
        weights[key] = value
    del weights["lm_head.weight"]
    mx.eval(weights)
    mx.save_safetensors(str(dst / "model.safetensors"), weights)
    return dst


def write_quantized(src: Path, dst: Path, overrides: dict[str, dict] | None = None) -> nn.Module:
    """Quantize the text stack as mlx-audio does and save it; returns the in-memory quantized net."""
    overrides = overrides or {}
    net = load(src).net

    def predicate(path, module):
        if not (path.startswith("model.") and hasattr(module, "to_quantized")):
            return False
        return overrides.get(path, True)

    nn.quantize(net, group_size=QUANT["group_size"], bits=QUANT["bits"], class_predicate=predicate)
    mx.eval(net.parameters())
    copy_checkpoint(src, dst, skip=lambda name: name.endswith(".safetensors"))
    mx.save_safetensors(str(dst / "model.safetensors"), dict(tree_flatten(net.parameters())))
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {**QUANT, **overrides}
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return net


# --------------------------------------------------------------------------------------------------
# Layouts
# --------------------------------------------------------------------------------------------------


def test_release_layout_single_file(original, reference):
    asr, _ = reference
    tensors = release_tensors(original)
    assert [f.name for f in original.glob("*.safetensors")] == ["model.safetensors"]
    assert asr.dtype == mx.float32
    net = asr.net
    np.testing.assert_array_equal(
        np.array(net.model.embed_tokens.weight), as_np(tensors["thinker.model.embed_tokens.weight"])
    )
    np.testing.assert_array_equal(
        np.array(net.model.layers[1].self_attn.k_proj.weight),
        as_np(tensors["thinker.model.layers.1.self_attn.k_proj.weight"]),
    )
    for conv in CONVS:
        oihw = as_np(tensors[f"thinker.audio_tower.{conv}.weight"])
        np.testing.assert_array_equal(
            np.array(getattr(net.audio_tower, conv).weight), oihw.transpose(0, 2, 3, 1)
        )
    # Every tensor but the tied head copy landed somewhere.
    params = dict(tree_flatten(net.parameters()))
    assert sorted(params) == sorted(
        k.removeprefix("thinker.") for k in tensors if k != "thinker.lm_head.weight"
    )
    assert all(v.dtype == mx.float32 for v in params.values())

    # Tied head: no lm_head module, logits are the embedding's dot products.
    assert asr.config.text_config.tie_word_embeddings
    assert "lm_head" not in net
    hidden = mx.random.normal((1, 3, asr.config.text_config.hidden_size), key=mx.random.key(0))
    expected = np.array(hidden[0]) @ np.array(net.model.embed_tokens.weight).T
    np.testing.assert_allclose(np.array(net.logits(hidden)[0]), expected, rtol=1e-4, atol=1e-4)
    assert asr.tokenizer is not None and asr.path == original


def test_sharded_layout_matches_single_file(tmp_path, reference):
    from tools.make_checkpoint import write_checkpoint

    path = write_checkpoint(tmp_path / "sharded", "tiny", seed=0, shard_mb=5)
    shards = sorted(path.glob("*.safetensors"))
    assert len(shards) > 2
    assert not (path / "model.safetensors").exists()
    index = json.loads((path / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [f.name for f in shards]

    asr = load(path)
    ref_asr, (ref_features, ref_logits) = reference
    assert_same_params(asr.net, ref_asr.net)
    features, logits = outputs(asr)
    np.testing.assert_array_equal(features, ref_features)
    np.testing.assert_array_equal(logits, ref_logits)


def test_untied_head(tmp_path, reference):
    from tools.make_checkpoint import write_checkpoint

    path = write_checkpoint(tmp_path / "untied", "tiny", seed=0, tie_word_embeddings=False)
    asr = load(path)
    assert not asr.config.text_config.tie_word_embeddings
    assert "lm_head" in asr.net
    head = as_np(mx.load(str(path / "model.safetensors"))["thinker.lm_head.weight"])
    np.testing.assert_array_equal(np.array(asr.net.lm_head.weight), head)
    assert not np.array_equal(head, np.array(asr.net.model.embed_tokens.weight))
    # The logits come from the separate head, so they differ from the tied model's.
    _, logits = outputs(asr)
    _, ref_logits = reference[1]
    assert logits.shape == ref_logits.shape
    assert not np.allclose(logits, ref_logits)


def test_transformers_native_layout(checkpoints, reference):
    """The -hf repositories load as published: their config, weight names and tokenizer.json."""
    path = checkpoints("tiny", "hf")
    stored = mx.load(str(path / "model.safetensors"))
    assert "model.language_model.embed_tokens.weight" in stored and "lm_head.weight" not in stored
    assert "model.multi_modal_projector.linear_1.weight" in stored
    assert not (path / "vocab.json").exists() and (path / "tokenizer.json").is_file()
    assert "thinker_config" not in json.loads((path / "config.json").read_text())

    asr = load(path)
    ref_asr, (ref_features, ref_logits) = reference
    assert asr.kind == "asr"
    assert asr.config.text_config == ref_asr.config.text_config
    assert asr.config.audio_config == ref_asr.config.audio_config
    assert asr.config.audio_token_id == ref_asr.config.audio_token_id
    assert_same_params(asr.net, ref_asr.net)
    features, logits = outputs(asr)
    np.testing.assert_array_equal(features, ref_features)
    np.testing.assert_array_equal(logits, ref_logits)
    assert asr.tokenizer.vocab_size == ref_asr.tokenizer.vocab_size


@pytest.mark.parametrize("layout", ["release", "hf"])
def test_forced_aligner_loads_in_both_layouts(checkpoints, layout):
    path = checkpoints("aligner-tiny", layout)
    asr = load(path)
    assert asr.kind == "aligner" and asr.config.is_forced_aligner
    assert asr.config.classify_num == 5000 and asr.config.text_config.vocab_size == 152064
    assert asr.config.timestamp_token_id == 151705 and asr.config.timestamp_segment_time == 80
    assert asr.tokenizer.token_to_id("<timestamp>") == 151705
    assert asr.net.lm_head.weight.shape == (5000, 64)
    if layout == "hf":
        release = load(checkpoints("aligner-tiny"))
        assert_same_params(asr.net, release.net)
        np.testing.assert_array_equal(outputs(asr)[1], outputs(release)[1])
    assert outputs(asr)[1].shape[-1] == 5000


def test_mlx_converted_layout(tmp_path, original, reference):
    path = write_mlx_layout(original, tmp_path / "mlx")
    stored = mx.load(str(path / "model.safetensors"))
    assert "lm_head.weight" not in stored and not any(k.startswith("thinker.") for k in stored)
    assert stored["audio_tower.conv2d2.weight"].shape[1:3] == (3, 3)

    asr = load(path)
    ref_asr, (ref_features, ref_logits) = reference
    assert "lm_head" not in asr.net
    assert_same_params(asr.net, ref_asr.net)
    features, logits = outputs(asr)
    np.testing.assert_allclose(features, ref_features, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(logits, ref_logits, rtol=1e-5, atol=1e-5)


def test_mlx_quantized_layout(tmp_path, original, reference, measurements):
    path = tmp_path / "mlx-4bit"
    quantized = write_quantized(original, path)
    asr = load(path)
    net = asr.net
    assert asr.config.quantization == QUANT

    q_proj = net.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj, nn.QuantizedLinear) and (q_proj.bits, q_proj.group_size) == (4, 64)
    assert isinstance(net.model.layers[1].mlp.down_proj, nn.QuantizedLinear)
    assert isinstance(net.model.embed_tokens, nn.QuantizedEmbedding)
    assert "lm_head" not in net
    tower = net.audio_tower
    for layer in (tower.layers[0].self_attn.q_proj, tower.layers[-1].fc2, tower.proj1, tower.conv_out):
        assert type(layer) is nn.Linear
    assert_same_params(net, quantized)

    features, logits = outputs(asr)
    _, mem_logits = outputs(mlx_qwen3asr.ASRModel(quantized, asr.config, asr.tokenizer, path, mx.float32))
    np.testing.assert_allclose(logits, mem_logits, rtol=1e-5, atol=1e-5)

    ref_features, ref_logits = reference[1]
    np.testing.assert_array_equal(features, ref_features)  # the audio tower stays float
    cos = cosine(logits, ref_logits)
    measurements.append(f"4-bit tiny checkpoint vs float: logits cosine {cos:.4f}")
    assert cos > 0.95


def test_mlx_quantized_mixed_recipe(tmp_path, original, reference, measurements):
    path = tmp_path / "mlx-mixed"
    overrides = {MIXED_LAYER: {"group_size": 64, "bits": 8}}
    quantized = write_quantized(original, path, overrides)
    assert json.loads((path / "config.json").read_text())["quantization"][MIXED_LAYER]["bits"] == 8

    asr = load(path)
    layer0 = asr.net.model.layers[0].mlp
    assert isinstance(layer0.down_proj, nn.QuantizedLinear) and layer0.down_proj.bits == 8
    assert layer0.up_proj.bits == 4 and asr.net.model.layers[1].mlp.down_proj.bits == 4
    assert_same_params(asr.net, quantized)
    _, logits = outputs(asr)
    cos = cosine(logits, reference[1][1])
    measurements.append(f"4-bit with 8-bit {MIXED_LAYER} vs float: logits cosine {cos:.4f}")
    assert cos > 0.95


def test_quantized_recipe_mismatch_fails(tmp_path, original):
    # Weights stored at 8 bits but declared 4: the packed shapes disagree and the loader says where.
    path = tmp_path / "mlx-wrong-bits"
    write_quantized(original, path, {MIXED_LAYER: {"group_size": 64, "bits": 8}})
    config = json.loads((path / "config.json").read_text())
    del config["quantization"][MIXED_LAYER]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=rf"{MIXED_LAYER}\.weight \("):
        load(path)


# --------------------------------------------------------------------------------------------------
# Failures
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def broken(tmp_path, original):
    return copy_checkpoint(original, tmp_path / "broken")


def test_missing_weight_is_named(broken):
    resave(broken, lambda w: w.pop("thinker.model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ModelLoadError) as err:
        load(broken)
    assert "missing weight(s): model.layers.1.mlp.up_proj.weight" in str(err.value)
    assert str(broken) in str(err.value)


def test_extra_weight_is_named(broken):
    def add(w):
        w["thinker.model.layers.0.extra.weight"] = mx.zeros((4, 4), dtype=mx.bfloat16)

    resave(broken, add)
    with pytest.raises(ModelLoadError) as err:
        load(broken)
    assert "unexpected weight(s): model.layers.0.extra.weight" in str(err.value)
    assert "missing" not in str(err.value)


def test_misshaped_weight_is_named(broken):
    def cut(w):
        w["thinker.model.layers.0.mlp.gate_proj.weight"] = w["thinker.model.layers.0.mlp.gate_proj.weight"][
            :-1
        ]

    resave(broken, cut)
    with pytest.raises(ModelLoadError) as err:
        load(broken)
    msg = str(err.value)
    assert "model.layers.0.mlp.gate_proj.weight" in msg
    assert "(127, 64)" in msg and "(128, 64)" in msg


def test_missing_config(broken):
    (broken / "config.json").unlink()
    with pytest.raises(ModelLoadError, match="no config.json"):
        load(broken)


def test_no_weights(broken):
    (broken / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match=r"no \*\.safetensors"):
        load(broken)


def test_index_names_missing_shard(tmp_path):
    from tools.make_checkpoint import write_checkpoint

    path = write_checkpoint(tmp_path / "sharded", "tiny", seed=0, shard_mb=5)
    shard = sorted(path.glob("*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(ModelLoadError, match=rf"missing: {shard.name}"):
        load(path)


def test_truncated_weights_name_the_file(broken):
    file = broken / "model.safetensors"
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError) as err:
        load(broken)
    assert str(file) in str(err.value)


@pytest.mark.parametrize("where", ["absolute", "nested"])
def test_nonexistent_path(tmp_path, where, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = str(tmp_path / "nope") if where == "absolute" else "no/such/dir"
    with pytest.raises(ModelLoadError, match="no such directory, and not a Hugging Face repo id"):
        load(name)


def test_file_instead_of_directory(original):
    with pytest.raises(ModelLoadError, match="not a directory"):
        load(original / "config.json")


# --------------------------------------------------------------------------------------------------
# config.json against the weights, before any module is built
# --------------------------------------------------------------------------------------------------

REPO_ROOT = Path(__file__).resolve().parents[1]
MISSING = object()


@pytest.fixture(scope="module")
def every_layout(checkpoints, tmp_path_factory) -> dict[str, Path]:
    """One tiny checkpoint of each published layout: the release, -hf and mlx-community's, ASR and aligner."""
    base = tmp_path_factory.mktemp("community")
    return {
        "release": checkpoints("tiny"),
        "hf": checkpoints("tiny", "hf"),
        "mlx-community": convert_checkpoint(checkpoints("tiny"), base / "asr-4bit", bits=4).path,
        "aligner release": checkpoints("aligner-tiny"),
        "aligner hf": checkpoints("aligner-tiny", "hf"),
        "aligner mlx-community": convert_checkpoint(
            checkpoints("aligner-tiny"), base / "al-8bit", bits=8
        ).path,
    }


def with_config(src: Path, dst: Path, section: str, key: str, value) -> Path:
    """`src` with one field of config.json's audio_config or text_config changed (weights linked, not copied)."""
    dst.mkdir(parents=True)
    for file in src.iterdir():
        if file.name != "config.json":
            (dst / file.name).symlink_to(file)
    config = json.loads((src / "config.json").read_text())
    sections = config.get("thinker_config", config)[section]
    if value is MISSING:
        del sections[key]
    else:
        sections[key] = value
    (dst / "config.json").write_text(json.dumps(config))
    return dst


# (section, field, value, what the error says after "config.json: ")
BAD_CONFIGS = {
    "more decoder layers than stored": (
        "text_config", "num_hidden_layers", 3,
        "text_config.num_hidden_layers is 3 but the weights hold 2 decoder layers",
    ),
    "fewer decoder layers than stored": (
        "text_config", "num_hidden_layers", 1,
        "text_config.num_hidden_layers is 1 but the weights hold 2 decoder layers",
    ),
    "more encoder layers than stored": (
        "audio_config", "encoder_layers", 300,
        "audio_config.encoder_layers is 300 but the weights hold 2 encoder layers",
    ),
    "absurd layer count": (
        "text_config", "num_hidden_layers", 1_000_000,
        "text_config.num_hidden_layers is 1000000; it must be between 1 and 512",
    ),
    "zero width": ("text_config", "hidden_size", 0, "text_config.hidden_size is 0; it must be between 1 and 65536"),
    "negative vocabulary": (
        "text_config", "vocab_size", -1, "text_config.vocab_size is -1; it must be between 1 and 4194304"
    ),
    "absurd width": (
        "audio_config", "d_model", 10**9, "audio_config.d_model is 1000000000; it must be between 1 and 65536"
    ),
    "vocabulary the weights do not hold": (
        "text_config", "vocab_size", 200_000,
        "text_config.vocab_size is 200000 but the weights hold model.embed_tokens.weight (",
    ),
    "head count the weights do not hold": (
        "text_config", "num_attention_heads", 8,
        "text_config.num_attention_heads is 8 (128 rows of head_dim 16) but the weights hold "
        "model.layers.0.self_attn.q_proj.weight (64, ",
    ),
    "encoder heads that do not divide": (
        "audio_config", "encoder_attention_heads", 5,
        "audio_config.encoder_attention_heads (5) does not divide audio_config.d_model (64)",
    ),
    "key/value heads that do not divide": (
        "text_config", "num_key_value_heads", 3,
        "text_config.num_key_value_heads (3) does not divide text_config.num_attention_heads (4)",
    ),
    "string size": ("text_config", "num_hidden_layers", "2", "text_config.num_hidden_layers is '2', not an integer"),
    "float size": ("audio_config", "encoder_ffn_dim", 128.0, "audio_config.encoder_ffn_dim is 128.0, not an integer"),
    "missing size": ("text_config", "head_dim", MISSING, "text_config.head_dim is missing"),
    "zero window": ("audio_config", "n_window", 0, "audio_config.n_window is 0; it must be between 1 and 1024"),
    "string epsilon": (
        "text_config", "rms_norm_eps", "small", "text_config.rms_norm_eps is 'small', not a positive number"
    ),
}  # fmt: skip


class NotBuilt(Qwen3ASR):
    def __init__(self, config):
        raise AssertionError("a module tree was built from a config.json that does not fit its weights")


@pytest.mark.parametrize("layout", ["release", "hf", "mlx-community", "aligner release", "aligner hf",
                                    "aligner mlx-community"])  # fmt: skip
@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_sizes_are_named_before_any_module_is_built(
    every_layout, layout, case, tmp_path, monkeypatch
):
    section, key, value, message = BAD_CONFIGS[case]
    path = with_config(every_layout[layout], tmp_path / "edited", section, key, value)
    monkeypatch.setattr(loading, "Qwen3ASR", NotBuilt)
    with pytest.raises(ModelLoadError) as err:
        load(path)
    assert str(err.value).startswith(f"{path}: config.json: {message}")
    assert "\n" not in str(err.value)


# Runs mlxasr and mlxasr-convert on each edited checkpoint under a 4 GB address-space limit, and reports
# their exit statuses, standard error and the process's peak resident memory.
CHILD = """
import contextlib, io, json, resource, sys
limit = 4 * 2**30
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
from mlx_qwen3asr.cli.convert import main as convert
from mlx_qwen3asr.cli.main import main as mlxasr
jobs = json.loads(sys.argv[1])
results = []
for model, audio, out in jobs:
    row = []
    for run, argv in ((mlxasr, [audio, "--txt", "--model", model, "-o", out]), (convert, [model, "-o", out + "-mlx"])):
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                rc = run(argv)
            except BaseException as e:
                rc = repr(e)
        row.append([rc, err.getvalue()])
    results.append(row)
# This process's own peak: on Linux ru_maxrss keeps the parent's peak across fork and exec (a large test
# run would fail the bound), /proc's VmHWM does not.
try:
    peak = [int(ln.split()[1]) << 10 for ln in open("/proc/self/status") if ln.startswith("VmHWM")][0]
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # bytes on macOS
print(json.dumps({"results": results, "peak": peak}))
"""


def test_absurd_config_sizes_fail_in_little_memory(every_layout, tmp_path):
    import soundfile as sf
    from reference import test_signal

    audio = tmp_path / "talk.wav"
    sf.write(audio, test_signal(1.0), 16000)
    jobs, expected = [], []
    for i, (layout, src) in enumerate(every_layout.items()):
        for j, (section, key, value, message) in enumerate(
            [BAD_CONFIGS["absurd layer count"], BAD_CONFIGS["absurd width"]]
        ):
            path = with_config(src, tmp_path / f"{i}-{j}", section, key, value)
            jobs.append([str(path), str(audio), str(tmp_path / f"out-{i}-{j}")])
            expected.append((layout, path, message))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(jobs)],
        capture_output=True, text=True, timeout=300, cwd=REPO_ROOT,
    )  # fmt: skip
    assert child.returncode == 0, child.stderr[-2000:]
    report = json.loads(child.stdout.strip().splitlines()[-1])
    for (layout, path, message), ((asr_rc, asr_err), (convert_rc, convert_err)) in zip(
        expected, report["results"], strict=True
    ):
        errors = [line for line in asr_err.splitlines() if line.startswith("mlxasr: error:")]
        assert asr_rc == 2 and errors == [f"mlxasr: error: model {path}: config.json: {message}"], (
            layout,
            asr_err,
        )
        assert convert_rc == 2, (layout, convert_rc, convert_err)
        assert convert_err.splitlines()[-1] == f"mlxasr-convert: error: {path}: config.json: {message}", (
            layout
        )
    assert report["peak"] < 2**30, report["peak"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("out")) == []


# --------------------------------------------------------------------------------------------------
# Hugging Face cache
# --------------------------------------------------------------------------------------------------


@pytest.fixture
def hub_cache(tmp_path, monkeypatch, original):
    import huggingface_hub.constants as hf_constants

    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = cache / "models--acme--tiny-asr"
    snapshot = copy_checkpoint(original, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads both at import time.
    monkeypatch.setattr(hf_constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_repo_id_from_hub_cache(hub_cache, reference, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no local acme/tiny-asr directory
    assert resolve_model_path("acme/tiny-asr") == hub_cache
    asr = load("acme/tiny-asr")
    assert asr.path == hub_cache
    ref_asr, (_, ref_logits) = reference
    assert_same_params(asr.net, ref_asr.net)
    np.testing.assert_array_equal(outputs(asr)[1], ref_logits)


def test_unknown_repo_offline(hub_cache, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        ModelLoadError, match="acme/no-such-model: not in the local Hugging Face cache, and HF_HUB"
    ):
        load("acme/no-such-model")


# --------------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------------


def test_load_does_not_duplicate_weights(original):
    gc.collect()
    mx.clear_cache()
    base = mx.get_active_memory()
    mx.reset_peak_memory()
    asr = load(original)
    peak = mx.get_peak_memory() - base
    nbytes = sum(v.nbytes for _, v in tree_flatten(asr.net.parameters()))
    # bf16 source plus its float32 copy is ~1.5x; random init or the tied head copy would push past 2x.
    assert peak < 2.0 * nbytes, (peak, nbytes)
