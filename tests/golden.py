"""Golden data: the official implementation's outputs on the real-shape random-weight checkpoints
(presets `0.6b` and `aligner`), committed under tests/golden/ so that the parity tests compare against
them without loading or running the official model (about 17 s to load it, and 17 s to 3 min a case,
on every fresh clone). `python tools/make_golden.py` writes them from tests/reference.py's official
runs; the tiny presets always run the official code live.

What a file keeps is what reconstructs the reference's result exactly, kept small: the prompt ids and
greedy ids as they are; the input of the official LM head (the final hidden state after the final
norm) at each position whose logits are compared, from which the logits are recomputed as
hidden @ head.T with the checkpoint's own head weight (float32 numpy); the encoder output as float16
(the tests judge it by cosine, which that rounding does not move at their threshold); the aligner's
timestamp classes as they are and its head's input rows. The mel features and prompt ids come from the
official processor, which is cheap and runs live; the file's fingerprint of the mel and its ids must
match what the processor gives now.

A file records what makes it valid: the inputs (the wav's bytes hash, steps, context, language, words),
a hash of the checkpoint's files (weights included; computed once per checkpoint and process), the
reference's library versions, and a hash of the source of the reference functions that compute the
result. Anything different (a newer torch, a changed checkpoint tool, a changed reference method) makes
the data stale: a GoldenStale warning says so and which tool regenerates it, and the official model
runs instead, as without golden data. Stale data is never compared against.
"""

from __future__ import annotations

import functools
import inspect
import json
import warnings
from pathlib import Path

import cached
import numpy as np

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "golden"
PRESETS = ("0.6b", "aligner")  # the real-shape presets that the parity tests run
TOOL = "python tools/make_golden.py"
VERSIONS = ("torch", "transformers", "qwen-asr")
HEAD = "thinker.lm_head.weight"


class GoldenStale(UserWarning):
    """Golden data that no longer matches its checkpoint, inputs, reference or libraries."""


# --- what identifies a result ----------------------------------------------------------------------


@functools.cache
def checkpoint_hash(path: Path) -> str:
    """A hash of every file of a checkpoint folder (relative path and bytes), the weights included."""
    return cached.key_of(Path(path).resolve())


def versions() -> dict[str, str]:
    return dict(cached.versions(*VERSIONS))


def _sources(kind: str) -> list:
    import official
    import reference

    ref, aligner = reference.OfficialReference, reference.OfficialAligner
    shared = [official.official_module, reference._backend, reference._official_model, reference._processor]
    if kind == "run":
        return [
            *shared,
            ref.__dict__["model"].func,
            ref.__dict__["processor"].func,
            ref.prompt_text,
            ref.inputs,
            ref.features,
            ref.windowed,
            ref._run,
            capture_run,
        ]
    if kind == "encode":
        return [*shared, ref.__dict__["model"].func, ref.windowed, ref._encode, capture_encode]
    if kind == "align":
        return [
            *shared,
            aligner.__dict__["model"].func,
            aligner.__dict__["processor"].func,
            aligner.__dict__["qwen_split_processor"].func,
            aligner.inputs,
            aligner.windowed,
            aligner._run,
            capture_align,
            f"TIMESTAMP={aligner.TIMESTAMP}",
        ]
    raise ValueError(kind)


def source_hash(kind: str) -> str:
    """A hash of the source of the reference functions that compute a result of this kind."""
    return cached.key_of([s if isinstance(s, str) else inspect.getsource(s) for s in _sources(kind)])


def digest(mel: np.ndarray) -> dict:
    """A fingerprint of a mel spectrogram: its shape, norm and 8 seeded random projections. Two mels
    whose digests agree within `same_mel`'s tolerance differ by rounding at most."""
    d = np.asarray(mel, dtype=np.float64).ravel()
    projections = np.random.default_rng(0).standard_normal((8, d.size)) @ d
    return {"shape": list(np.shape(mel)), "norm": float(np.linalg.norm(d)), "proj": projections.tolist()}


def same_mel(a: dict, b: dict) -> bool:
    if a["shape"] != b["shape"]:
        return False
    scale = max(a["norm"], b["norm"], 1e-30)
    worst = float(np.max(np.abs(np.subtract(a["proj"], b["proj"])))) / scale
    return abs(a["norm"] - b["norm"]) <= 1e-6 * scale and worst <= 1e-5


def run_inputs(wav: np.ndarray, context: str, language: str | None, steps: int) -> dict:
    return {"wav": cached.key_of(wav), "context": context, "language": language, "steps": steps}


def align_inputs(wav: np.ndarray, words: list[str], qwen_split: bool) -> dict:
    return {"wav": cached.key_of(wav), "words": list(words), "qwen_split": bool(qwen_split)}


# --- files -----------------------------------------------------------------------------------------


def write(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, meta=np.array(json.dumps(meta, sort_keys=True)), **arrays)


def read_meta(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as data:
        return json.loads(str(data["meta"]))


def read_arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files if k != "meta"}


# --- the cases the parity tests run on the real shapes ---------------------------------------------


def cases(presets=PRESETS) -> list[dict]:
    """Every official result that tests/test_parity.py and tests/test_align.py ask of a real-shape
    preset, with its inputs: what tools/make_golden.py writes and what tests/test_golden.py requires."""
    import test_align
    import test_parity

    found = []
    for preset in (p for p in test_parity.PRESETS if p in presets):
        for seconds in test_parity.SECONDS:
            found.append(
                {
                    "preset": preset,
                    "kind": "run",
                    "name": f"run-{seconds:g}s",
                    "wav": test_parity.signal(seconds),
                    "context": "",
                    "language": None,
                    "steps": test_parity.GREEDY_STEPS,
                }
            )
        seconds = test_parity.WINDOW_SECONDS
        found.append(
            {
                "preset": preset,
                "kind": "encode",
                "name": f"encode-unwindowed-{seconds:g}s",
                "wav": test_parity.signal(seconds),
                "context": "",
                "language": None,
                "windowed": False,
            }
        )
    for preset, seconds in test_align.CASES:
        if preset in presets:
            found.append(
                {
                    "preset": preset,
                    "kind": "align",
                    "name": f"align-{seconds:g}s",
                    "wav": test_align.signal(seconds),
                    "words": test_align.words_for(seconds),
                    "qwen_split": False,
                }
            )
    return found


def case_inputs(case: dict) -> dict:
    """The inputs a golden file of this case records (an encode case: those of the run whose mel it
    takes, and the window flag; its mel digest is added when it is made)."""
    if case["kind"] == "run":
        return run_inputs(case["wav"], case["context"], case["language"], case["steps"])
    if case["kind"] == "encode":
        return {"wav": cached.key_of(case["wav"]), "windowed": case["windowed"]}
    return align_inputs(case["wav"], case["words"], case["qwen_split"])


def matches(case: dict, meta: dict) -> bool:
    """Whether a golden file is this case's (by its inputs alone)."""
    if meta["kind"] != case["kind"]:
        return False
    recorded = {k: v for k, v in meta["inputs"].items() if k != "mel"}
    return recorded == json.loads(json.dumps(case_inputs(case)))


# --- making golden data from the official model ----------------------------------------------------


def capture_run(ref, wav: np.ndarray, context: str, language: str | None, steps: int):
    """The official run, with the LM head's input at the last position of each of its calls (the
    prefill, then each greedy step): the rows whose logits the run keeps."""
    rows = []
    hook = ref.model.thinker.lm_head.register_forward_hook(
        lambda module, args, output: rows.append(args[0][0, -1].detach().float().numpy().copy())
    )
    try:
        run = ref._run(wav, context, language, steps)
    finally:
        hook.remove()
    return run, np.stack(rows)


def capture_encode(ref, mel: np.ndarray, windowed: bool) -> np.ndarray:
    return ref._encode(mel, windowed)


def capture_align(aligner, wav: np.ndarray, words: list[str], qwen_split: bool):
    """The official aligner's run, with its head's input rows at the timestamp positions."""
    rows = []
    hook = aligner.model.thinker.lm_head.register_forward_hook(
        lambda module, args, output: rows.append(args[0][0].detach().float().numpy().copy())
    )
    try:
        ids, classes, logits = aligner._run(wav, words, qwen_split)
    finally:
        hook.remove()
    (hidden,) = rows
    return ids, classes, logits, hidden[np.array(ids) == aligner.TIMESTAMP]


def _check_logits(what: str, rebuilt: np.ndarray, official: np.ndarray) -> str:
    from reference import cosine, max_abs

    assert rebuilt.shape == official.shape, (what, rebuilt.shape, official.shape)
    worst_cos = min(cosine(a, b) for a, b in zip(rebuilt, official))
    diff = max_abs(rebuilt, official)
    scale = float(np.max(np.abs(official)))
    if not (worst_cos > 0.9999999 and diff <= 1e-5 * max(scale, 1.0)):
        raise AssertionError(f"{what}: rebuilt logits differ: cos {worst_cos:.9f}, max-abs {diff:.2e}")
    return f"{what} rebuilt: worst cos {worst_cos:.9f}, max-abs {diff:.1e} (scale {scale:.1f})"


def _encoder16(what: str, encoder: np.ndarray) -> tuple[np.ndarray, str]:
    from reference import cosine, max_abs

    half = encoder.astype(np.float16)
    cos = cosine(half, encoder)
    if not (np.all(np.isfinite(half)) and cos > 0.9999999):
        raise AssertionError(f"{what}: the encoder output does not fit float16 (cos {cos:.9f})")
    return half, f"encoder as float16: cos {cos:.10f}, max-abs {max_abs(half, encoder):.1e}"


def make(ref, case: dict, checkpoint: str | None = None) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """(metadata, arrays, report lines) of one case, from the official model in `ref` (an
    OfficialReference, or an OfficialAligner for an align case), checked to rebuild what it computed."""
    head = head_weight(ref.checkpoint)
    meta = {
        "kind": case["kind"],
        "preset": case["preset"],
        "name": case["name"],
        "checkpoint": checkpoint or checkpoint_hash(ref.checkpoint),
        "versions": versions(),
        "source": source_hash(case["kind"]),
        "inputs": case_inputs(case),
    }
    what = f"{case['preset']} {case['name']}"
    if case["kind"] == "run":
        run, hidden = capture_run(ref, case["wav"], case["context"], case["language"], case["steps"])
        report = [_check_logits(what, hidden @ head.T, run.step_logits)]
        encoder, line = _encoder16(what, run.encoder)
        meta["mel"] = digest(run.mel)
        arrays = {
            "ids": np.array(run.input_ids, dtype=np.int64),
            "greedy_ids": np.array(run.greedy_ids, dtype=np.int64),
            "hidden": hidden.astype(np.float32),
            "encoder": encoder,
        }
        return meta, arrays, [*report, line]
    if case["kind"] == "encode":
        from reference import OfficialReference

        _, mel = OfficialReference.features(ref.inputs(case["wav"], case["context"], case["language"]))
        meta["inputs"]["mel"] = digest(mel)
        encoder, line = _encoder16(what, capture_encode(ref, mel, case["windowed"]))
        return meta, {"encoder": encoder}, [line]
    ids, classes, logits, hidden = capture_align(ref, case["wav"], case["words"], case["qwen_split"])
    report = [_check_logits(what, hidden @ head.T, logits)]
    argmax_equal = int(np.sum((hidden @ head.T).argmax(-1) == classes))
    report.append(f"{what}: rebuilt argmax equals the official class at {argmax_equal}/{len(classes)}")
    arrays = {
        "ids": np.array(ids, dtype=np.int64),
        "classes": np.asarray(classes, dtype=np.int64),
        "hidden": hidden.astype(np.float32),
    }
    return meta, arrays, report


# --- serving golden data ---------------------------------------------------------------------------


def head_weight(checkpoint: Path) -> np.ndarray:
    """The checkpoint's LM head weight (release layout) in float32."""
    import torch
    from safetensors import safe_open

    for path in sorted(Path(checkpoint).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            if HEAD in f.keys():
                return f.get_tensor(HEAD).to(torch.float32).numpy()
    raise KeyError(f"{checkpoint} has no {HEAD}")


class Store:
    """The golden files of one real-shape preset, served for one checkpoint; None from a lookup means
    the official model must run (no file for the case, or a stale one, with a GoldenStale warning)."""

    def __init__(self, preset: str, checkpoint: Path | None, folder: Path | None = None):
        self.preset = preset
        self.checkpoint = None if checkpoint is None else Path(checkpoint)
        self.folder = Path(folder) if folder is not None else GOLDEN / preset

    @functools.cached_property
    def entries(self) -> list[tuple[Path, dict]]:
        return [(path, read_meta(path)) for path in sorted(self.folder.glob("*.npz"))]

    @functools.cached_property
    def head(self) -> np.ndarray:
        return head_weight(self.checkpoint)

    def find(self, case: dict) -> tuple[Path, dict] | None:
        return next(((p, m) for p, m in self.entries if matches(case, m)), None)

    def _stale(self, what: str, reason: str) -> None:
        warnings.warn(
            f"golden data for {self.preset} {what} is stale ({reason}): the official model runs instead; "
            f"`{TOOL}` regenerates it",
            GoldenStale,
            stacklevel=3,
        )

    def _valid(self, what: str, path: Path | None, meta: dict | None, kind: str) -> bool:
        if meta is None:
            folder = self.folder
            if folder.is_relative_to(HERE.parent):
                folder = folder.relative_to(HERE.parent)
            self._stale(what, f"no file in {folder} for these inputs")
            return False
        if meta["versions"] != versions():
            self._stale(what, f"{path.name} was made with {meta['versions']}, this is {versions()}")
            return False
        if meta["source"] != source_hash(kind):
            self._stale(what, f"{path.name} was made by other tests/reference.py code")
            return False
        if meta["checkpoint"] != checkpoint_hash(self.checkpoint):
            self._stale(what, f"{path.name} was made from another {self.preset} checkpoint")
            return False
        return True

    def run(self, ref, wav, context: str, language: str | None, steps: int):
        """An official run (tests/reference.py's ReferenceRun) served from golden data, or None."""
        from reference import OfficialReference, ReferenceRun

        what = f"run of {len(wav) / 16000:g} s"
        case = {"kind": "run", "wav": wav, "context": context, "language": language, "steps": steps}
        path, meta = self.find(case) or (None, None)
        if not self._valid(what, path, meta, "run"):
            return None
        arrays = read_arrays(path)
        ids, mel = OfficialReference.features(ref.inputs(wav, context, language))
        if ids != arrays["ids"].tolist() or not same_mel(digest(mel), meta["mel"]):
            self._stale(what, f"the official processor's ids or mel differ from {path.name}'s")
            return None
        logits = arrays["hidden"] @ self.head.T
        return ReferenceRun(
            input_ids=ids,
            mel=mel,
            encoder=arrays["encoder"].astype(np.float32),
            prefill_logits=logits[0],
            step_logits=logits,
            greedy_ids=arrays["greedy_ids"].tolist(),
        )

    def encode(self, mel: np.ndarray, windowed: bool) -> np.ndarray | None:
        """The official encoder's output for this mel, or None."""
        fingerprint = digest(mel)
        what = f"{'windowed' if windowed else 'unwindowed'} encoder output of {mel.shape[1]} frames"
        path, meta = next(
            (
                (p, m)
                for p, m in self.entries
                if m["kind"] == "encode"
                and m["inputs"]["windowed"] == windowed
                and same_mel(m["inputs"]["mel"], fingerprint)
            ),
            (None, None),
        )
        if not self._valid(what, path, meta, "encode"):
            return None
        return read_arrays(path)["encoder"].astype(np.float32)

    def align(self, aligner, wav, words: list[str], qwen_split: bool):
        """(ids, classes, logits) of the official aligner served from golden data, or None."""
        what = f"alignment of {len(wav) / 16000:g} s"
        case = {"kind": "align", "wav": wav, "words": words, "qwen_split": qwen_split}
        path, meta = self.find(case) or (None, None)
        if not self._valid(what, path, meta, "align"):
            return None
        arrays = read_arrays(path)
        ids = aligner.inputs(wav, words, qwen_split)["input_ids"][0].tolist()
        if ids != arrays["ids"].tolist():
            self._stale(what, f"the official processor's ids differ from {path.name}'s")
            return None
        return ids, arrays["classes"], arrays["hidden"] @ self.head.T
