"""Time speaker diarization (mlx_qwen3asr.diarize, speakrs) per hour of audio on this machine.

    python tools/diarize_bench.py                          # 2 minutes of speech, the random preset
    python tools/diarize_bench.py --model models/diarizer --minutes 10 --json bench.json
    python tools/diarize_bench.py --folder 8 --asr checkpoints/random-0.6b   # its share of a folder run

The sound: espeak-ng sentences, two voices taking turns with pauses of 0.3 to 1.5 s (a noise burst
instead of speech where espeak-ng is missing). The diarizer runs once to warm up on 15 s, then on the
whole sound `--repeat` times; the figures are the median run: seconds per audio hour, the real-time
factor, and the time assign_speakers takes to give an hour-long transcript (10,000 aligned words) its
speakers from that many turns.

Without --model the diarizer is the `diarizer` preset of tools/make_checkpoint.py: the real models'
shapes with random weights, so the time is the real pipeline's work, not its accuracy; its segmentation
marks speech nearly everywhere, so every 10 s window gets the embeddings of its local speakers (the most
work the pipeline does). speakrs's CPU mode runs the segmentation on 10 s windows every second and a
ResNet34 embedding per window and local speaker, so the time grows with the audio's length, not its
content, beyond that.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from make_checkpoint import write_diarizer
from sounds import RATE, SENTENCES, espeak, trimmed

from mlx_qwen3asr.diarize import Turn, assign_speakers, load_diarizer
from mlx_qwen3asr.pipeline.result import Segment, Transcription, Word

VOICES = ("en", "en-us+f3")


def sound(minutes: float, seed: int = 0) -> tuple[np.ndarray, bool]:
    """Two voices taking turns for `minutes`; False where espeak-ng is missing (noise bursts instead)."""
    rng = np.random.default_rng(seed)
    english = [text for lang, text in SENTENCES if lang.startswith("en")]
    spoken = shutil.which("espeak-ng") is not None
    lines = []
    for k, text in enumerate(english * 2):
        if spoken:
            lines.append(trimmed(espeak(VOICES[k % 2], text)))
        else:
            lines.append((0.1 * rng.standard_normal(int(rng.uniform(2.0, 4.0) * RATE))).astype(np.float32))
    parts, total, k = [], 0, 0
    while total < minutes * 60 * RATE:
        gap = np.zeros(int(rng.uniform(0.3, 1.5) * RATE), np.float32)
        for piece in (gap, lines[k % len(lines)]):
            parts.append(piece)
            total += piece.size
        k += 1
    return np.concatenate(parts)[: int(minutes * 60 * RATE)], spoken


def hour_transcript(
    words: int = 10_000, turns: int = 2_000, seed: int = 0
) -> tuple[Transcription, list[Turn]]:
    """An hour of aligned words in 30 s segments, and turns of two speakers alternating."""
    rng = np.random.default_rng(seed)
    per = 3600.0 / words
    segments, seg_words, text, start = [], [], "", 0.0
    for k in range(words):
        t = k * per
        token = f"w{k}"
        at = len(text) + (1 if text else 0)
        text = f"{text} {token}" if text else token
        seg_words.append(Word(token, t, t + 0.8 * per, at, at + len(token)))
        if t + per - start >= 30.0 or k + 1 == words:
            segments.append(Segment(start, t + per, text, "English", timing="aligned", words=seg_words))
            seg_words, text, start = [], "", t + per
    cuts = np.sort(rng.uniform(0, 3600, turns - 1))
    bounds = [0.0, *cuts.tolist(), 3600.0]
    out = [Turn(a, b, k % 2) for k, (a, b) in enumerate(zip(bounds, bounds[1:]))]
    return Transcription("", "English", segments, duration=3600.0), out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model", default=None, help="a diarizer model folder (default: the random `diarizer` preset)"
    )
    ap.add_argument("--minutes", type=float, default=2.0, help="length of the sound (default 2)")
    ap.add_argument("--repeat", type=int, default=3, help="timed runs (default 3; the median is reported)")
    ap.add_argument(
        "--folder",
        type=int,
        default=0,
        help="also time `mlxasr FOLDER --txt` on this many files of --folder-seconds each, with and "
        "without --diarize: diarization's share of a folder run (0: skip)",
    )
    ap.add_argument("--folder-seconds", type=float, default=20.0)
    ap.add_argument(
        "--asr", default=None, help="the ASR checkpoint of --folder (default: the random 0.6b preset)"
    )
    ap.add_argument("--json", default=None, help="write the figures to this file too")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or str(write_diarizer(Path(tmp) / "diarizer"))
        t0 = time.perf_counter()
        diarizer = load_diarizer(folder)
        load_seconds = time.perf_counter() - t0
        audio, spoken = sound(args.minutes)
        seconds = audio.size / RATE
        diarizer(audio[: 15 * RATE])  # warm-up
        runs, turns = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            turns = diarizer(audio)
            runs.append(time.perf_counter() - t0)
    took = statistics.median(runs)

    transcript, hour_turns = hour_transcript()
    t0 = time.perf_counter()
    assigned = assign_speakers(transcript, hour_turns)
    merge_seconds = time.perf_counter() - t0

    import speakrs

    figures = {
        "model": args.model or "random `diarizer` preset (tools/make_checkpoint.py)",
        "speakrs": speakrs.__version__,
        "mode": "CPU",
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or platform.system()}",
        "audio_seconds": round(seconds, 1),
        "sound": "espeak-ng, two voices" if spoken else "noise bursts (no espeak-ng)",
        "load_seconds": round(load_seconds, 2),
        "runs_seconds": [round(r, 2) for r in runs],
        "seconds_per_audio_hour": round(took / seconds * 3600, 1),
        "realtime_factor": round(took / seconds, 4),
        "turns": len(turns),
        "speakers": turns.speaker_count,
        "assign_speakers_hour_seconds": round(merge_seconds, 3),
        "assign_speakers_segments": len(assigned.segments),
    }
    print(
        f"diarizer: {figures['model']}, speakrs {figures['speakrs']} ({figures['mode']}), {figures['machine']}"
    )
    print(f"sound: {seconds:.0f} s, {figures['sound']}; loading took {load_seconds:.2f} s")
    print(f"runs: {', '.join(f'{r:.2f} s' for r in runs)}")
    print(
        f"{figures['seconds_per_audio_hour']:.0f} s per audio hour "
        f"({figures['realtime_factor']:.3f}x real time), {len(turns)} turns, {turns.speaker_count} speakers"
    )
    print(
        f"assign_speakers on an hour's transcript (10,000 words, {len(hour_turns)} turns): "
        f"{merge_seconds:.3f} s, {len(assigned.segments)} segments"
    )
    if args.folder:
        figures["folder"] = folder_run(args)
        f = figures["folder"]
        print(
            f"mlxasr on {args.folder} files x {args.folder_seconds:g} s: {f['without_s']:.1f} s without "
            f"--diarize, {f['with_s']:.1f} s with it (diarization alone {f['diarize_alone_s']:.1f} s); "
            f"diarization adds {f['added_share']:.0%} to the run, {f['overlap_share']:.0%} of its own time hidden"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def folder_run(args: argparse.Namespace) -> dict:
    """`mlxasr FOLDER --txt` with and without --diarize (the same files, fresh outputs each time), and
    the diarizer alone on the same files: how much of its time the run hides behind transcription."""
    import soundfile as sf

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        asr = args.asr
        if asr is None:
            from make_checkpoint import write_checkpoint

            asr = str(write_checkpoint(tmp / "asr", "0.6b", seed=0))
        diarizer_dir = args.model or str(write_diarizer(tmp / "diarizer"))
        inputs = tmp / "in"
        inputs.mkdir()
        audio, _ = sound(args.folder * args.folder_seconds / 60, seed=1)
        step = int(args.folder_seconds * RATE)
        for k in range(args.folder):
            sf.write(inputs / f"talk-{k:02d}.wav", audio[k * step : (k + 1) * step], RATE)
        diarizer = load_diarizer(diarizer_dir)
        t0 = time.perf_counter()
        for k in range(args.folder):
            diarizer(audio[k * step : (k + 1) * step])
        alone = time.perf_counter() - t0

        def run(name: str, extra: list[str]) -> float:
            cmd = [sys.executable, "-m", "mlx_qwen3asr.cli.main", str(inputs), "--txt", "-q"]
            cmd += ["-o", str(tmp / name), "--model", asr, "--no-word-timestamps", *extra]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, timeout=7200)
            return time.perf_counter() - t0

        without = run("plain", [])
        with_it = run("speakers", ["--diarize", "--diarizer", diarizer_dir])
    return {
        "files": args.folder,
        "seconds_each": args.folder_seconds,
        "without_s": round(without, 2),
        "with_s": round(with_it, 2),
        "diarize_alone_s": round(alone, 2),
        "added_share": round((with_it - without) / with_it, 3),
        "overlap_share": round(max(0.0, without + alone - with_it) / alone, 3),
    }


if __name__ == "__main__":
    sys.exit(main())
