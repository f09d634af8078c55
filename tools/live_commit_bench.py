"""The cost of writing `mlxasr live`'s outputs after a commit, early and late in a long session: it
should not grow with the session.

    python tools/live_commit_bench.py --hours 2 --repeats 7 --json commits.json

A session of speech is made up (no model): segments of 5 to 15 s with a pause of up to 1.5 s between,
about 2.5 words a second, and the session's audio kept in a temporary file as `mlxasr live` keeps it
(a FileSignal; a tone and noise that swell and fade). LiveOutputs (cli/live_outputs.py) writes TXT,
SRT, WebVTT and JSON; each commit adds one segment, and the audio has grown to where it ends. The
commits after minute 5 and after the last hour's end less a few are timed on the wall clock (the
median of --repeats commits of one segment each; the session before them is committed in one go),
once with words timed by the aligner ("words") and once without ("estimated": cues placed by the
audio's energy). Besides the time, each commit's audio samples read and bytes written are counted.

"before" is the code of --before (by default the revision before outputs/appending.py was added):
its cli/live_outputs.py and outputs/cues.py, loaded from git; "after" is the working tree's. The last
write of the session (final=True, which writes every file whole) is timed once for each.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from mlx_qwen3asr.audio.features import SAMPLE_RATE  # noqa: E402
from mlx_qwen3asr.audio.signal import FileSignal, Signal  # noqa: E402
from mlx_qwen3asr.outputs import appending, folder  # noqa: E402
from mlx_qwen3asr.outputs.finding import InputFile  # noqa: E402
from mlx_qwen3asr.outputs.folder import FileJob, TranscribeOptions  # noqa: E402
from mlx_qwen3asr.pipeline.result import Segment, Word  # noqa: E402
from mlx_qwen3asr.runtime import atomic  # noqa: E402

FORMATS = ("txt", "srt", "vtt", "json")
WORDS = (
    "so the plan for today is simple, we read the numbers first. then we talk about what they mean "
    "for the next quarter and whether anything changes. right? okay, let's start."
).split()


def make_segments(
    timed: bool,
    *,
    seconds: float = float("inf"),
    count: int | None = None,
    seed: int = 0,
    start: float = 0.5,
    words: list[str] = WORDS,
) -> list[Segment]:
    """Segments of 5 to 15 s of speech (a pause of 0.2 to 1.5 s between) from `start`, until `seconds`
    or `count` of them, their words drawn from `words` (spread over each segment when timed)."""
    rng = np.random.default_rng(seed)
    out, t = [], start
    while count is None or len(out) < count:
        length = float(rng.uniform(5.0, 15.0))
        if t + length > seconds:
            break
        n = max(1, int(length * 2.5))
        picked = [words[int(i)] for i in rng.integers(0, len(words), n)]
        text = " ".join(picked)
        seg = Segment(round(t, 3), round(t + length, 3), text, "English")
        if timed:
            timing, pos, step = [], 0, length / n
            for k, w in enumerate(picked):
                at = text.index(w, pos)
                pos = at + len(w)
                timing.append(Word(w, round(t + k * step, 3), round(t + (k + 0.8) * step, 3), at, pos))
            seg.timing, seg.words = "aligned", timing
        out.append(seg)
        t += length + float(rng.uniform(0.2, 1.5))
    return out


def spill(seconds: float) -> tuple[object, int]:
    """The session's audio in an unnamed temporary file, as `mlxasr live` keeps it."""
    file = tempfile.TemporaryFile()
    total = int(seconds * SAMPLE_RATE)
    block = 60 * SAMPLE_RATE
    for start in range(0, total, block):
        n = np.arange(start, min(start + block, total))
        loud = 0.3 * (1 + np.sin(2 * np.pi * n / (SAMPLE_RATE * 1.7)))
        noise = ((n * 2654435761) % 1000) / 1000.0 - 0.5
        file.write(
            (loud * (0.5 * np.sin(2 * np.pi * 220 * n / SAMPLE_RATE) + 0.2 * noise)).astype("<f4").tobytes()
        )
    file.flush()
    return file, total


class Counted(Signal):
    """The first num_samples of the spilled audio (what a session has heard so far), counting reads."""

    def __init__(self, signal: FileSignal, num_samples: int, counter: list[int]) -> None:
        self.signal, self.num_samples, self.counter = signal, num_samples, counter

    def read(self, start: int, stop: int) -> np.ndarray:
        x = self.signal.read(start, min(stop, self.num_samples))
        self.counter[0] += x.shape[0]
        return x


def load_before(rev: str) -> tuple[type, object]:
    """LiveOutputs and build_cues of revision rev (their modules loaded from git)."""
    loaded = {}
    for name, path in (("cues", "mlx_qwen3asr/outputs/cues.py"), ("live_outputs", "cli/live_outputs.py")):
        source = subprocess.run(
            ["git", "show", f"{rev}:{path}"], cwd=REPO, check=True, capture_output=True, text=True
        ).stdout
        module = types.ModuleType(f"before_{name}")
        module.__file__ = f"<{rev}:{path}>"
        exec(compile(source, module.__file__, "exec"), module.__dict__)
        loaded[name] = module
    return loaded["live_outputs"].LiveOutputs, loaded["cues"].build_cues


def default_before() -> str:
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", "mlx_qwen3asr/outputs/appending.py"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return f"{added[-1]}^" if added else "HEAD"


def run(live_outputs: type, segments, audio: FileSignal, at_seconds: list[float], repeats: int, out: Path):
    """Times of the commits after each of at_seconds (and the final write), with samples read and
    bytes written per commit."""
    written = [0]
    whole, part = atomic._write_temp, appending._write_at

    def counted_whole(path, data):
        written[0] += len(data)
        return whole(path, data)

    def counted_part(fd, data, at):
        written[0] += len(data)
        return part(fd, data, at)

    atomic._write_temp, appending._write_at = counted_whole, counted_part
    try:
        # The same input for every run: the JSON names it.
        job = FileJob(InputFile(out.parent / "stdin"), {fmt: out / f"talk.{fmt}" for fmt in FORMATS})
        timed = bool(segments[0].words)
        options = TranscribeOptions(word_timestamps=timed, aligner="bench" if timed else None)
        outputs = live_outputs(job, options, "bench")
        source = types.SimpleNamespace(segments=[], speech=[])
        read = [0]
        results = []
        for at in at_seconds:
            first = next(k for k, s in enumerate(segments) if s.end > at)
            if first > len(source.segments):  # the session up to there, in one commit
                source.segments.extend(segments[len(source.segments) : first])
                outputs.write(source, Counted(audio, int(source.segments[-1].end * SAMPLE_RATE), read), None)
            times, reads, sizes = [], [], []
            for seg in segments[first : first + repeats]:
                source.segments.append(seg)
                heard = Counted(audio, int((seg.end + 0.3) * SAMPLE_RATE), read)
                read[0] = written[0] = 0
                start = time.perf_counter()
                outputs.write(source, heard, None)
                times.append(time.perf_counter() - start)
                reads.append(read[0])
                sizes.append(written[0])
            results.append(
                {
                    "at_seconds": at,
                    "segments_before": first,
                    "median_ms": 1000 * statistics.median(times),
                    "min_ms": 1000 * min(times),
                    "max_ms": 1000 * max(times),
                    "samples_read": statistics.median(reads),
                    "bytes_written": statistics.median(sizes),
                }
            )
        heard = Counted(audio, int((source.segments[-1].end + 0.3) * SAMPLE_RATE), read)
        read[0] = written[0] = 0
        start = time.perf_counter()
        outputs.write(source, heard, None, final=True)
        final = {
            "segments": len(source.segments),
            "ms": 1000 * (time.perf_counter() - start),
            "samples_read": read[0],
            "bytes_written": written[0],
        }
        return results, final
    finally:
        atomic._write_temp, appending._write_at = whole, part


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=float, default=2.0, help="the session's length (default 2)")
    ap.add_argument("--early-minutes", type=float, default=5.0, help="the early commits (default 5)")
    ap.add_argument("--repeats", type=int, default=7, help="commits timed at each point (default 7)")
    ap.add_argument("--before", default=None, help="the revision to compare with (default: see above)")
    ap.add_argument("--only", choices=("before", "after"), help="time one of them")
    ap.add_argument(
        "--no-sync",
        action="store_true",
        help="leave out syncing the files to the disk (both codes sync every file after each commit): "
        "the work of the commit alone",
    )
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args(argv)

    from mlx_qwen3asr.cli.live_outputs import LiveOutputs

    if args.no_sync:
        os.fsync = appending._sync = lambda fd: None

    seconds = args.hours * 3600
    file, total = spill(seconds + 1)
    audio = FileSignal(file, total, 1.0)
    rev = args.before or default_before()
    before_outputs, before_cues = load_before(rev)
    report = {"hours": args.hours, "before": rev, "synced": not args.no_sync, "runs": []}
    scratch = tempfile.mkdtemp(prefix="live-commit-bench-")
    for timing in ("words", "estimated"):
        segments = make_segments(timing == "words", seconds=seconds)
        late = segments[-args.repeats - 1].start - 1.0
        points = [args.early_minutes * 60, late]
        for which in ("before", "after"):
            if args.only not in (None, which):
                continue
            current = folder.build_cues
            if which == "before":
                folder.build_cues = before_cues  # write_outputs' cues, as that revision built them
            out = Path(tempfile.mkdtemp(prefix=f"{which}-", dir=scratch))
            try:
                results, final = run(
                    before_outputs if which == "before" else LiveOutputs,
                    segments,
                    audio,
                    points,
                    args.repeats,
                    out,
                )
            finally:
                folder.build_cues = current
            final["files"] = {p.name: p.read_bytes() for p in sorted(out.iterdir())}
            report["runs"].append({"timing": timing, "code": which, "commits": results, "final": final})
            for r in results:
                print(
                    f"{timing:9s} {which:6s} commit at {r['at_seconds'] / 60:7.1f} min "
                    f"({r['segments_before']:4d} segments before): median {r['median_ms']:8.2f} ms "
                    f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}), "
                    f"{r['samples_read'] / SAMPLE_RATE:8.1f} s of audio read, {r['bytes_written']:9.0f} bytes written",
                    flush=True,
                )
            print(
                f"{timing:9s} {which:6s} last write ({final['segments']} segments): {final['ms']:.0f} ms, "
                f"{final['samples_read'] / SAMPLE_RATE:.1f} s of audio read, {final['bytes_written']} bytes written",
                flush=True,
            )
        done = [r for r in report["runs"] if r["timing"] == timing]
        if len(done) == 2:
            same = done[0]["final"]["files"] == done[1]["final"]["files"]
            report["final_files_identical_" + timing] = same
            print(f"{timing:9s} the last write's files of before and after are identical: {same}")
        for r in done:
            r["final"]["files"] = sorted(r["final"]["files"])
    audio.close()
    shutil.rmtree(scratch)
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
