"""Other MLX tools read our conversions, and we read theirs: checked against the real peers.

Runs where the bench-only peer environment exists (mlx-audio 0.6.2 and moona3k's mlx-qwen3-asr 0.4.4, as
tools/peers.py uses it): `peers-venv/` in the repository, or the python named by $MLXASR_PEER_PYTHON.
The package's own environment never installs the peers.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
import soundfile as sf

import mlx_qwen3asr
from tools.layout_table import build, clip, greedy_ids

REPO = Path(__file__).resolve().parents[1]
PEER_PYTHON = os.environ.get("MLXASR_PEER_PYTHON") or str(REPO / "peers-venv" / "bin" / "python")

pytestmark = pytest.mark.skipif(
    not Path(PEER_PYTHON).is_file(), reason=f"no peer environment at {PEER_PYTHON} (see tools/peers.py)"
)


def peer_read(peer: str, model: Path, audio: Path) -> dict:
    cmd = [PEER_PYTHON, str(REPO / "tools" / "peer_read.py"), "--peer", peer, "--model", str(model)]
    proc = subprocess.run([*cmd, "--audio", str(audio)], capture_output=True, text=True, timeout=600)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def tensors(path: Path) -> dict[str, np.ndarray]:
    out = {}
    for file in sorted(path.glob("*.safetensors")):
        for key, value in mx.load(str(file)).items():
            out[key] = np.array(value.astype(mx.float32) if value.dtype == mx.bfloat16 else value)
    return out


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    work = tmp_path_factory.mktemp("peer-layouts")
    paths = {name: path for name, (path, _) in build("tiny", work, PEER_PYTHON, log=lambda _: None).items()}
    audio = work / "clip.wav"
    sf.write(audio, clip(), 16000)
    return paths, audio


@pytest.mark.parametrize("bits", [4, 8])
def test_our_default_conversion_is_what_mlx_audio_writes(made, bits):
    paths, _ = made
    ours, theirs = paths[f"ours {bits}-bit (default)"], paths[f"mlx-audio {bits}-bit"]
    a, b = tensors(ours), tensors(theirs)
    assert sorted(a) == sorted(b)
    for key in a:
        assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert json.loads((ours / "config.json").read_text()) == json.loads((theirs / "config.json").read_text())


@pytest.mark.parametrize("name", ["mlx-audio 4-bit", "mlx-audio 8-bit", "mlx-audio bf16"])
def test_mlx_audio_conversions_load_and_decode_in_ours(made, name):
    paths, _ = made
    model = mlx_qwen3asr.load(paths[name], dtype="float32")
    assert model.kind == "asr"
    ids = greedy_ids(model, clip(), 16)
    if name == "mlx-audio bf16":  # the release's own numbers: the release's ids
        release = mlx_qwen3asr.load(paths["tiny release"], dtype="float32")
        assert ids == greedy_ids(release, clip(), 16)
    else:
        ours = mlx_qwen3asr.load(paths[name.replace("mlx-audio", "ours") + " (default)"], dtype="float32")
        assert ids == greedy_ids(ours, clip(), 16)


@pytest.mark.parametrize("peer", ["mlx-audio", "moona3k"])
@pytest.mark.parametrize("bits", [4, 8])
def test_peers_run_our_default_conversions_like_their_own(made, peer, bits):
    paths, audio = made
    ours = peer_read(peer, paths[f"ours {bits}-bit (default)"], audio)
    theirs = peer_read(peer, paths[f"mlx-audio {bits}-bit"], audio)
    assert ours["ok"], ours
    assert ours["text"] and ours["text"] == theirs["text"]


def test_mixed_recipe_is_read_by_moona3k_not_mlx_audio(made):
    paths, audio = made
    mixed = paths["ours mixed 4-bit + 8-bit encoder"]
    assert peer_read("moona3k", mixed, audio)["ok"]
    report = peer_read("mlx-audio", mixed, audio)
    assert not report["ok"] and "matmul" in report["error"]


@pytest.mark.parametrize("peer", ["mlx-audio", "moona3k"])
def test_peers_read_our_aligner_conversion(made, tmp_path, peer):
    from mlx_qwen3asr.checkpoints.convert import convert_checkpoint

    paths, audio = made
    ours = convert_checkpoint(paths["aligner-tiny release"], tmp_path / "aligner-8bit", bits=8).path
    report = peer_read(peer, ours, audio)
    assert report["ok"], report
    assert [w[0] for w in report["words"]] == ["hello", "there", "general", "kenobi"]
