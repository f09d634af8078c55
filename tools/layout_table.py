"""Every published checkpoint layout, loaded and run: does each load as it really is, and decode alike?

    python tools/layout_table.py --preset 0.6b --peer-python peers-venv/bin/python --json layouts.json

For one preset (random weights, tools/make_checkpoint.py) this writes the release layout (sharded for
1.7b, as released), the `-hf` layout, the forced aligner in both layouts, our conversions (default
4-bit and 8-bit, the mixed 4-bit decoder / 8-bit encoder recipe) and, given the peer environment,
mlx-audio's own conversions (`python -m mlx_audio.convert --model-domain stt`, 4-bit, 8-bit, bf16).
Each one is loaded by mlx_qwen3asr; the ASR ones decode one clip greedily (EOS ignored, a fixed
number of steps) and their ids are compared with the release layout's and, for quantized ones, with
mlx-audio's conversion of the same bits; the aligners must be refused for transcription. With
`--peer-python`, our default conversions are also run in mlx-audio and moona3k's mlx-qwen3-asr
(tools/peer_read.py), whose output for the clip is shown.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# isort: off
# mlx_qwen3asr goes first: it preloads OpenBLAS, which MLX's CPU matmul only picks up if loaded before it.
import mlx_qwen3asr  # noqa: E402
import mlx.core as mx  # noqa: E402

# isort: on
import numpy as np  # noqa: E402

from mlx_qwen3asr.audio.features import log_mel_spectrogram  # noqa: E402
from mlx_qwen3asr.checkpoints.convert import convert_checkpoint  # noqa: E402
from mlx_qwen3asr.checkpoints.loading import read_checkpoint  # noqa: E402
from mlx_qwen3asr.model.encoder import encoder_batch  # noqa: E402
from mlx_qwen3asr.model.generate import greedy_generate  # noqa: E402
from tools.make_checkpoint import write_checkpoint  # noqa: E402
from tools.prompts import build_prompt_ids  # noqa: E402

ALIGNER_PRESET = {"tiny": "aligner-tiny", "0.6b": "aligner", "1.7b": "aligner"}
# name -> (convert_checkpoint keyword arguments, bits of the mlx-audio conversion it matches)
OUR_CONVERSIONS = {
    "ours 4-bit (default)": ({"bits": 4}, 4),
    "ours 8-bit (default)": ({"bits": 8}, 8),
    "ours mixed 4-bit + 8-bit encoder": ({"bits": 4, "encoder_bits": 8}, None),
}
MLX_AUDIO_CONVERSIONS = {
    "mlx-audio 4-bit": ["-q", "--q-bits", "4"],
    "mlx-audio 8-bit": ["-q", "--q-bits", "8"],
    "mlx-audio bf16": ["--dtype", "bfloat16"],
}


def clip(seconds: float = 5.0, seed: int = 7) -> np.ndarray:
    """Speech-like audio: noise under a syllable-rate envelope over a wandering tone."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    envelope = 0.5 + 0.5 * np.sin(2 * np.pi * 4.0 * t)
    tone = np.sin(2 * np.pi * (180 + 40 * np.sin(2 * np.pi * 0.5 * t)) * t)
    return (0.3 * envelope * (0.6 * tone + 0.4 * rng.standard_normal(t.size))).astype(np.float32)


def greedy_ids(model: mlx_qwen3asr.ASRModel, wav: np.ndarray, steps: int) -> list[int]:
    """`steps` greedy ids for the clip's default prompt, EOS ignored (random weights rarely stop)."""
    features = model.net.audio_tower(encoder_batch([log_mel_spectrogram(wav)], model.config.audio_config))
    prompt = build_prompt_ids(model.tokenizer, features.shape[0])
    return greedy_generate(model.net, prompt, features, steps, frozenset()).tokens


@dataclass
class Row:
    name: str
    path: str
    layout: str = ""
    files: str = ""
    loads: str = ""
    kind: str = ""
    load_s: float = 0.0
    transcribe: str = ""  # "yes", or why not
    ids_vs_release: str = ""
    ids_vs_mlx_audio: str = ""
    peers: dict = field(default_factory=dict)


def build(preset: str, work: Path, peer_python: str | None, log=print) -> dict[str, tuple[Path, int | None]]:
    """Write every layout of the preset into `work`: name -> (path, bits of the matching mlx-audio one)."""
    made: dict[str, tuple[Path, int | None]] = {}
    aligner = ALIGNER_PRESET[preset]

    def add(name: str, path: Path, bits: int | None = None) -> None:
        log(f"built {name}: {path}")
        made[name] = (path, bits)

    release = write_checkpoint(work / f"{preset}-release", preset, layout="release")
    add(f"{preset} release", release)
    add(f"{preset}-hf", write_checkpoint(work / f"{preset}-hf", preset, layout="hf"))
    add(f"{aligner} release", write_checkpoint(work / f"{aligner}-release", aligner, layout="release"))
    add(f"{aligner}-hf", write_checkpoint(work / f"{aligner}-hf", aligner, layout="hf"))
    for name, (options, bits) in OUR_CONVERSIONS.items():
        add(name, convert_checkpoint(release, work / name.replace(" ", "_"), **options).path, bits)
    if peer_python:
        for name, flags in MLX_AUDIO_CONVERSIONS.items():
            dst = work / name.replace(" ", "_")
            cmd = [peer_python, "-m", "mlx_audio.convert", "--model-domain", "stt", "--hf-path", str(release)]
            proc = subprocess.run([*cmd, "--mlx-path", str(dst), *flags], capture_output=True, text=True)
            if proc.returncode != 0:
                raise RuntimeError(f"{name} failed: {proc.stderr.strip()[-500:]}")
            add(name, dst)
    return made


def weight_files(path: Path) -> str:
    files = sorted(p.name for p in path.glob("*.safetensors"))
    index = "+ index" if (path / "model.safetensors.index.json").is_file() else ""
    return f"{len(files)} file(s) {index}".strip()


def evaluate(made: dict[str, tuple[Path, int | None]], steps: int, wav: np.ndarray, log=print) -> list[Row]:
    rows: list[Row] = []
    ids: dict[str, list[int]] = {}
    release_name = next(iter(made))
    for name, (path, _) in made.items():
        row = Row(name=name, path=str(path), files=weight_files(path))
        t0 = time.perf_counter()
        try:
            model = mlx_qwen3asr.load(path, dtype="float32")
        except mlx_qwen3asr.ModelLoadError as e:
            row.loads = f"no: {e}"
            rows.append(row)
            continue
        row.load_s = round(time.perf_counter() - t0, 2)
        row.layout = read_checkpoint(path).layout
        row.loads, row.kind = "yes", model.kind
        try:
            mlx_qwen3asr.transcribe(model, wav[:16000])
            row.transcribe = "yes"
            ids[name] = greedy_ids(model, wav, steps)
        except mlx_qwen3asr.WrongModelError as e:
            row.transcribe = "refused: " + str(e).split(": ", 1)[1].split(";")[0]
        del model
        gc.collect()
        mx.clear_cache()
        rows.append(row)
        log(f"{name}: loads {row.loads}, {row.kind}, transcribe {row.transcribe}")
    for row in rows:
        if row.name not in ids:
            continue
        same = sum(a == b for a, b in zip(ids[row.name], ids[release_name]))
        row.ids_vs_release = f"{same}/{steps}" + (" identical" if ids[row.name] == ids[release_name] else "")
        bits = made[row.name][1]
        twin = {4: "mlx-audio 4-bit", 8: "mlx-audio 8-bit"}.get(bits or 0)
        if twin in ids:
            row.ids_vs_mlx_audio = "identical" if ids[row.name] == ids[twin] else "differ"
    return rows


def run_peers(rows: list[Row], peer_python: str, wav_path: Path, log=print) -> None:
    for row in rows:
        if not row.name.startswith("ours") and not row.name.startswith("mlx-audio"):
            continue
        for peer in ("mlx-audio", "moona3k"):
            cmd = [peer_python, str(REPO / "tools" / "peer_read.py"), "--peer", peer, "--model", row.path]
            proc = subprocess.run([*cmd, "--audio", str(wav_path)], capture_output=True, text=True)
            try:
                report = json.loads(proc.stdout.strip().splitlines()[-1])
            except (IndexError, ValueError):
                report = {"ok": False, "error": proc.stderr.strip()[-300:]}
            row.peers[peer] = report.get("text") if report.get("ok") else "fails: " + report.get("error", "")
            log(f"{row.name} in {peer}: {row.peers[peer]}")


def markdown(rows: list[Row], preset: str, steps: int) -> str:
    out = [
        f"Preset `{preset}`, random weights; greedy ids: {steps} steps on a 5 s clip, float32 compute.",
        "",
        "| checkpoint | layout | weights | loads | kind | transcribe | greedy ids vs release "
        "| vs mlx-audio's same bits | load s |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        out.append(
            f"| {r.name} | {r.layout} | {r.files} | {r.loads} | {r.kind} | {r.transcribe} | "
            f"{r.ids_vs_release or '-'} | {r.ids_vs_mlx_audio or '-'} | {r.load_s:.2f} |"
        )
    peers = [r for r in rows if r.peers]
    if peers:
        out += [
            "",
            "| checkpoint | mlx-audio 0.6.2 output | mlx-qwen3-asr 0.4.4 output |",
            "| --- | --- | --- |",
        ]
        for r in peers:
            cells = [str(r.peers.get(p, "")).replace("|", "\\|")[:120] for p in ("mlx-audio", "moona3k")]
            out.append(f"| {r.name} | {cells[0]} | {cells[1]} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(ALIGNER_PRESET), default="tiny")
    ap.add_argument("--steps", type=int, default=32, help="greedy steps compared per checkpoint")
    ap.add_argument("--work", default=None, help="directory for the checkpoints (default: a temporary one)")
    ap.add_argument("--peer-python", default=None, help="python of the peer environment (tools/peers.py)")
    ap.add_argument(
        "--no-peer-runs",
        action="store_true",
        help="with --peer-python, only build mlx-audio's conversions; do not run the peers on our checkpoints",
    )
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="layouts-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        made = build(args.preset, work, args.peer_python)
        wav = clip()
        rows = evaluate(made, args.steps, wav)
        if args.peer_python and not args.no_peer_runs:
            import soundfile as sf

            wav_path = work / "clip.wav"
            sf.write(wav_path, wav, 16000)
            run_peers(rows, args.peer_python, wav_path)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    table = markdown(rows, args.preset, args.steps)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in rows], indent=2, ensure_ascii=False) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
