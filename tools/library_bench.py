"""Time full-text search in a large transcript library (mlx_qwen3asr.library) on this machine.

    python tools/library_bench.py                              # 1000 hours, in a temporary folder
    python tools/library_bench.py --hours 5                    # a quick check
    python tools/library_bench.py --folder /tmp/lib1000 --keep # generate once ...
    python tools/library_bench.py --folder /tmp/lib1000        # ... then time it again, reusing it

The library: one transcript per hour of audio, a segment every 5 s (720 per hour) of 12 to 15 words.
Most segments are English-like text drawn from a generated vocabulary of 4000 words with Zipf
frequencies (so a few words are in most segments and most words are rare); 4% are Chinese, 3%
Japanese, and 3% carry accented words (café, élève, Über, ...). The rows are written straight into the
store's tables (transcripts, revisions, segments; the search index follows through its triggers) in
transactions of 20 transcripts, which is far faster than adding them one by one.

Then each query runs `--repeat` times through mlx_qwen3asr.library.search (20 hits, as a page of results
would show): a rare word, the most common word, a two-word phrase, a Chinese term of two characters
(shorter than a trigram: a scan of the segments' text) and of three, a Japanese term, and an accented
word in other capitals. The figures are the median and the slowest run in ms, the number of hits (count),
and the library's size on disk; also reading a one-hour transcript, listing, and editing one segment
(those edits, and the restore that undoes them, stay in that transcript's revisions).

With --folder naming a library this tool generated before (it leaves library_bench.json there), the
library is reused as it is and only timed.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from mlx_qwen3asr.library.search import count, search
from mlx_qwen3asr.library.store import Library

SEGMENT_SECONDS = 5.0
TRANSCRIPT_HOURS = 1.0
BATCH = 20  # transcripts per transaction
VOCABULARY = 4000
META = "library_bench.json"

_ONSETS = "b c d f g h j k l m n p r s t v w z br st tr pl".split()
_VOWELS = "a e i o u ai ea ou y".split()
_CODAS = ["", "", "n", "r", "s", "t", "l", "m", "nd", "st"]
_CHINESE = (
    "我们 今天 东京 北京 上海 时间 问题 工作 朋友 学校 老师 学生 公司 电话 因为 所以 但是 已经 可以 应该 非常 觉得 知道"
    " 喜欢 需要 开始 结束 会议 项目 东京塔 天气 晚上 早上 中午 吃饭 咖啡 音乐 电影 城市 地方 市场 经济"
).split()
_JAPANESE = (
    "東京 大阪 会議 今日 明日 タワー コーヒー 電車 駅 先生 学生 仕事 時間 天気 に は が を で 行きました 来ました です"
    " ます とても 少し 新しい 古い 映画"
).split()
_ACCENTED = "café élève naïve façade Über Straße Crème brûlée señor São Zürich déjà".split()


def vocabulary(rng: random.Random, size: int = VOCABULARY) -> list[str]:
    """`size` distinct made-up words of two or three syllables (the most frequent first)."""
    words: dict[str, None] = {}
    while len(words) < size:
        syllables = rng.choice((1, 2, 2, 3))
        word = "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(syllables)
        )
        if len(word) >= 3:
            words.setdefault(word, None)
    return list(words)


class Texts:
    """Segment texts: mostly vocabulary words with Zipf frequencies, some Chinese, Japanese, accented."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.words = vocabulary(random.Random(seed + 1))
        self.weights = [1.0 / (rank + 1) for rank in range(len(self.words))]
        self.cumulative: list[float] = []
        total = 0.0
        for w in self.weights:
            total += w
            self.cumulative.append(total)

    def english(self, n: int) -> str:
        picked = self.rng.choices(self.words, cum_weights=self.cumulative, k=n)
        picked[0] = picked[0].capitalize()
        return " ".join(picked) + self.rng.choice((".", ".", ".", "?", "!", ","))

    def segment(self) -> tuple[str, str]:
        """A segment's text and language."""
        n = self.rng.randint(12, 15)
        roll = self.rng.random()
        if roll < 0.04:
            return "".join(self.rng.choices(_CHINESE, k=n // 2 + 2)) + "。", "Chinese"
        if roll < 0.07:
            return "".join(self.rng.choices(_JAPANESE, k=n // 2 + 3)) + "。", "Japanese"
        text = self.english(n)
        if roll < 0.10:
            words = text.split()
            for _ in range(2):
                words[self.rng.randrange(len(words))] = self.rng.choice(_ACCENTED)
            text = " ".join(words)
        return text, "English"


def generate(library: Library, hours: float, seed: int) -> dict[str, Any]:
    """Write `hours` of transcripts into the library's tables; returns what was written and how fast."""
    texts = Texts(seed)
    transcripts = max(1, round(hours / TRANSCRIPT_HOURS))
    per = int(TRANSCRIPT_HOURS * 3600 / SEGMENT_SECONDS)
    t0 = time.perf_counter()
    segments_written = 0
    base = time.time() - transcripts * 3600
    for first in range(0, transcripts, BATCH):
        with library.transaction() as conn:
            for k in range(first, min(first + BATCH, transcripts)):
                tid = uuid.uuid4().hex[:12]
                segs = []
                for i in range(per):
                    text, language = texts.segment()
                    start = round(i * SEGMENT_SECONDS + texts.rng.uniform(0.0, 0.4), 3)
                    segs.append(
                        {
                            "start": start,
                            "end": round(start + SEGMENT_SECONDS - 0.5, 3),
                            "text": text,
                            "language": language,
                            "truncated": False,
                            "repetitive": False,
                            "timing": "estimated",
                            "words": [],
                            "avg_logprob": -0.25,
                            "no_speech_prob": 0.01,
                            "speaker": None,
                            "overlap": False,
                            "id": i,
                        }
                    )
                full = " ".join(s["text"] for s in segs)
                content = {
                    "text": full,
                    "language": "English",
                    "segments": segs,
                    "duration": TRANSCRIPT_HOURS * 3600,
                    "source": f"recording-{k:05d}.m4a",
                    "warnings": [],
                    "header_duration": None,
                    "speech": None,
                    "speakers": [],
                }
                created = base + k * 3600
                conn.execute(
                    "INSERT INTO transcripts (id, title, created, updated, revision, audio, source, duration,"
                    " language, model, options, segment_count, preview)"
                    " VALUES (?, ?, ?, ?, 1, NULL, ?, ?, 'English', 'bench', '{}', ?, ?)",
                    (
                        tid,
                        f"Recording {k}",
                        created,
                        created,
                        content["source"],
                        content["duration"],
                        per,
                        full[:200],
                    ),
                )
                conn.execute(
                    "INSERT INTO revisions (transcript_id, revision, created, title, summary, content)"
                    " VALUES (?, 1, ?, ?, 'added', ?)",
                    (
                        tid,
                        created,
                        f"Recording {k}",
                        json.dumps(content, ensure_ascii=False, separators=(",", ":")),
                    ),
                )
                conn.executemany(
                    'INSERT INTO segments (transcript_id, segment_id, start, "end", speaker, text)'
                    " VALUES (?, ?, ?, ?, NULL, ?)",
                    [(tid, s["id"], s["start"], s["end"], s["text"]) for s in segs],
                )
                segments_written += per
        done = min(first + BATCH, transcripts)
        rate = done / (time.perf_counter() - t0)
        print(f"\r  {done}/{transcripts} hours written ({rate:.1f} h/s)", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    words = texts.words
    return {
        "seed": seed,
        "hours": transcripts * TRANSCRIPT_HOURS,
        "build_seconds": round(time.perf_counter() - t0, 2),
        "queries": {
            "rare word": words[-1],
            "common word": words[0],
            "phrase": f'"{words[1]} {words[0]}"',
            "Chinese, 2 characters": "东京",
            "Chinese, 3 characters": "东京塔",
            "Japanese": "行きました",
            "accented word": "CAFÉ",
        },
    }


def with_operators(queries: dict[str, str]) -> dict[str, str]:
    """The generated queries and those built from them with several terms and FTS5 operators."""
    rare, common = queries["rare word"], queries["common word"]
    return {
        **queries,
        "rare and common word": f"{rare} {common}",
        "rare OR common": f"{rare} OR {common}",
        "rare NOT common": f"{rare} NOT {common}",
        "prefix": f"{common[:4]}*",
    }


def _ms(seconds: list[float]) -> dict[str, float]:
    return {"median_ms": round(statistics.median(seconds) * 1000, 2), "max_ms": round(max(seconds) * 1000, 2)}


def _timed(fn: Any, repeat: int) -> tuple[Any, list[float]]:
    runs, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        runs.append(time.perf_counter() - t0)
    return result, runs


def size_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.glob("library.sqlite3*") if p.is_file())


def measure(library: Library, queries: dict[str, str], repeat: int) -> dict[str, Any]:
    """Time each query (a page of 20 hits) and its count, and a few other operations."""
    results: dict[str, Any] = {}
    for kind, q in queries.items():
        hits, runs = _timed(lambda q=q: search(library, q, limit=20), repeat)
        total, count_runs = _timed(lambda q=q: count(library, q), max(1, repeat // 2))
        results[kind] = {"query": q, "hits": total, "shown": len(hits), **_ms(runs), "count": _ms(count_runs)}
        print(
            f"  {kind:24} {q:26} {total:>9} hits  {results[kind]['median_ms']:>9.1f} ms median"
            f"  {results[kind]['max_ms']:>9.1f} ms max",
            file=sys.stderr,
        )
    items, _ = library.list(limit=1)
    other: dict[str, Any] = {}
    _, runs = _timed(lambda: library.list(limit=50), repeat)
    other["list 50"] = _ms(runs)
    if items:
        tid = items[0]["id"]
        _, runs = _timed(lambda: library.get(tid), repeat)
        other["get a one-hour transcript"] = _ms(runs)
        text = library.get(tid)["segments"][3]["text"]
        edits = iter(range(repeat))
        _, runs = _timed(
            lambda: library.update(tid, segments={3: {"text": f"{text} edit{next(edits)}"}}), repeat
        )
        other["edit one segment"] = _ms(runs)
        library.restore(tid, 1)
    for name, figures in other.items():
        print(
            f"  {name:51} {figures['median_ms']:>9.1f} ms median  {figures['max_ms']:>9.1f} ms max",
            file=sys.stderr,
        )
    return {"queries": results, "operations": other}


def remove(folder: Path, *, whole: bool) -> None:
    """Remove the generated library: the whole folder when this run made it, else only what it wrote."""
    if whole:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in [*folder.glob("library.sqlite3*"), folder / META]:
        path.unlink(missing_ok=True)
    for sub in ("audio", "jobs"):
        shutil.rmtree(folder / sub, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--hours", type=float, default=1000.0, help="hours of transcripts to generate (default 1000)"
    )
    ap.add_argument(
        "--folder",
        default=None,
        help="the library folder (default: a temporary one); reused if generated before",
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated library (with --folder)")
    ap.add_argument("--repeat", type=int, default=5, help="runs of each query (default 5)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default=None, help="write the figures to this file too")
    args = ap.parse_args(argv)
    if args.hours <= 0 or args.repeat < 1:
        ap.error("--hours and --repeat must be positive")

    temporary = args.folder is None
    folder = Path(tempfile.mkdtemp(prefix="library-bench-")) if temporary else Path(args.folder)
    existed = not temporary and folder.exists()
    meta_path = folder / META
    reused = meta_path.is_file()
    try:
        with Library(folder) as library:
            if reused:
                meta = json.loads(meta_path.read_text(encoding="utf-8"))
                print(f"reusing the library in {folder} ({meta['hours']:g} hours)", file=sys.stderr)
            else:
                if library.list(limit=1)[1]:
                    ap.error(
                        f"{folder} holds a library this tool did not generate: give an empty or new folder"
                    )
                print(f"writing {args.hours:g} hours of transcripts into {folder}", file=sys.stderr)
                meta = generate(library, args.hours, args.seed)
                meta_path.write_text(json.dumps(meta, ensure_ascii=False, indent=2), encoding="utf-8")
            _, transcripts = library.list(limit=0)
            with library.reading() as conn:
                segments = conn.execute("SELECT count(*) FROM segments").fetchone()[0]
            figures = measure(library, with_operators(meta["queries"]), args.repeat)
        report = {
            "machine": platform.platform(),
            "python": platform.python_version(),
            "sqlite": __import__("sqlite3").sqlite_version,
            "folder": str(folder),
            "reused": reused,
            "hours": meta["hours"],
            "transcripts": transcripts,
            "segments": segments,
            "build_seconds": meta.get("build_seconds"),
            "size_mb": round(size_bytes(folder) / 1e6, 1),
            **figures,
        }
        print(
            f"{report['hours']:g} hours, {transcripts} transcripts, {segments} segments, {report['size_mb']} MB"
            + (f", written in {report['build_seconds']} s" if not reused else ""),
            file=sys.stderr,
        )
        if args.json:
            Path(args.json).write_text(
                json.dumps(report, ensure_ascii=False, indent=2) + "\n", encoding="utf-8"
            )
        else:
            print(json.dumps(report, ensure_ascii=False, indent=2))
    finally:
        if not reused and not args.keep:
            remove(folder, whole=not existed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
