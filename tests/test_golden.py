"""The parity tests' golden data (tests/golden.py, tools/make_golden.py): present for every real-shape
case, served only while it matches its checkpoint, inputs, reference code and libraries."""

from __future__ import annotations

import shutil

import golden
import pytest
from reference import OfficialAligner, OfficialReference, cosine, max_abs, test_signal


def test_the_golden_files_cover_every_real_shape_case():
    """A real-shape case added to the parity tests without `python tools/make_golden.py` fails here,
    rather than running the official model unnoticed."""
    wanted = golden.cases()
    assert {c["preset"] for c in wanted} == set(golden.PRESETS)
    for case in wanted:
        found = golden.Store(case["preset"], None).find(case)
        assert found is not None, (
            f"no golden data for {case['preset']} {case['name']}: run `{golden.TOOL}` and commit tests/golden/"
        )
        path, meta = found
        assert {"checkpoint", "versions", "source", "inputs"} <= set(meta), path
        assert set(meta["versions"]) == set(golden.VERSIONS), path
    for preset in golden.PRESETS:
        for path, meta in golden.Store(preset, None).entries:
            assert any(golden.matches(c, meta) for c in wanted if c["preset"] == preset), (
                f"{path} belongs to no case of the parity tests: run `{golden.TOOL}`"
            )


def test_the_golden_files_stay_small():
    total = sum(p.stat().st_size for p in golden.GOLDEN.rglob("*.npz"))
    assert 0 < total < 8e6


WAV = test_signal(1.0, seed=3)
STEPS = 4


@pytest.fixture(scope="module")
def tiny_golden(checkpoints, tmp_path_factory):
    """Golden data made by tests/golden.py for a tiny checkpoint (as tools/make_golden.py makes it for
    the real shapes), and the live official run it stands for."""
    folder = tmp_path_factory.mktemp("golden")
    ref = OfficialReference(checkpoints("tiny"))
    case = {"preset": "tiny", "kind": "run", "name": "run", "wav": WAV, "context": "", "language": None}
    meta, arrays, _ = golden.make(ref, {**case, "steps": STEPS})
    golden.write(folder / "run.npz", meta, arrays)
    meta, arrays, _ = golden.make(ref, {**case, "kind": "encode", "name": "encode", "windowed": False})
    golden.write(folder / "encode.npz", meta, arrays)
    live = ref._run(WAV, "", None, STEPS)
    return folder, live, ref._encode(live.mel, False)


def served_by(checkpoints, folder) -> OfficialReference:
    ref = OfficialReference(checkpoints("tiny"))
    ref.golden = golden.Store("tiny", ref.checkpoint, folder)
    return ref


def test_valid_golden_data_gives_the_official_run_without_the_official_model(checkpoints, tiny_golden):
    folder, live, unwindowed = tiny_golden
    ref = served_by(checkpoints, folder)
    run = ref.run(WAV, steps=STEPS)
    encoded = ref.encode(run.mel, windowed=False)
    assert "model" not in vars(ref)  # the official model was never loaded
    assert run.input_ids == live.input_ids and run.greedy_ids == live.greedy_ids
    assert max_abs(run.mel, live.mel) <= 1e-6
    assert cosine(run.encoder, live.encoder) > 0.9999999
    assert run.step_logits.shape == live.step_logits.shape
    assert min(cosine(a, b) for a, b in zip(run.step_logits, live.step_logits)) > 0.9999999
    assert max_abs(run.prefill_logits, live.prefill_logits) <= 1e-3
    assert cosine(encoded, unwindowed) > 0.9999999


def tampered(folder, tmp_path, name, change):
    out = tmp_path / "tampered"
    shutil.copytree(folder, out)
    path = out / name
    meta, arrays = golden.read_meta(path), golden.read_arrays(path)
    change(meta)
    golden.write(path, meta, arrays)
    return out


def _set(field, value):
    def change(meta):
        meta[field] = value

    return change


def _steps(meta):
    meta["inputs"]["steps"] += 1


@pytest.mark.parametrize(
    "change",
    [
        _set("checkpoint", "0" * 24),  # made from other weights
        _set("versions", {"torch": "0.0", "transformers": "0.0", "qwen-asr": "0.0"}),
        _set("source", "0" * 24),  # made by other reference code
        _steps,  # made for other inputs
    ],
    ids=["checkpoint", "versions", "source", "inputs"],
)
def test_stale_golden_data_is_refused_and_the_official_model_runs(checkpoints, tiny_golden, tmp_path, change):
    folder, live, _ = tiny_golden
    ref = served_by(checkpoints, tampered(folder, tmp_path, "run.npz", change))
    with pytest.warns(golden.GoldenStale, match="make_golden.py"):
        assert ref.golden.run(ref, WAV, "", None, STEPS) is None
    with pytest.warns(golden.GoldenStale):
        run = ref.run(WAV, steps=STEPS)  # the official model's (or its disk cache's) run
    assert run.greedy_ids == live.greedy_ids
    assert max_abs(run.step_logits, live.step_logits) <= 1e-4


def test_a_stale_encoder_entry_is_refused(checkpoints, tiny_golden, tmp_path):
    folder, live, _ = tiny_golden
    ref = served_by(checkpoints, tampered(folder, tmp_path, "encode.npz", _set("checkpoint", "0" * 24)))
    with pytest.warns(golden.GoldenStale):
        assert ref.golden.encode(live.mel, windowed=False) is None
    with pytest.warns(golden.GoldenStale):  # nor is there any for the windowed output
        assert ref.golden.encode(live.mel, windowed=True) is None


def test_aligner_golden_data_is_served_while_valid_and_refused_when_stale(checkpoints, tmp_path):
    path = checkpoints("aligner-tiny")
    words = "so the first thing i want to talk about".split()
    live = OfficialAligner(path)
    case = {"preset": "aligner-tiny", "kind": "align", "name": "a", "wav": WAV, "words": words}
    meta, arrays, _ = golden.make(live, {**case, "qwen_split": False})
    golden.write(tmp_path / "align.npz", meta, arrays)
    ids, classes, logits = live.run(WAV, words)

    served = OfficialAligner(path)
    served.golden = golden.Store("aligner-tiny", path, tmp_path)
    got = served.run(WAV, words)
    assert "model" not in vars(served)
    assert got[0] == ids and got[1].tolist() == classes.tolist() and max_abs(got[2], logits) <= 1e-4

    meta["checkpoint"] = "0" * 24
    golden.write(tmp_path / "align.npz", meta, arrays)
    stale = OfficialAligner(path)
    stale.golden = golden.Store("aligner-tiny", path, tmp_path)
    with pytest.warns(golden.GoldenStale, match="another aligner-tiny checkpoint"):
        assert stale.golden.align(stale, WAV, words, False) is None
    with pytest.warns(golden.GoldenStale, match="no file"):  # the other split has no golden data
        assert served.golden.align(served, WAV, words, True) is None
