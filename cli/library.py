"""mlxasr library: the transcript library from the command line, and the library options of other commands.

    mlxasr library list                     the transcripts, newest first
    mlxasr library search TEXT              the segments TEXT finds, with their times
    mlxasr library export ID -f docx        a transcript in a format of the library's export
    mlxasr library import DIR...            the JSON outputs of earlier runs (and their audio where found)

The library is the folder --library names, else $MLXASR_LIBRARY, else the user's data folder.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from mlx_qwen3asr.cli.options import EXIT_OK, EXIT_USAGE, number_in
from mlx_qwen3asr.cli.signals import raise_if_stopped
from mlx_qwen3asr.cli.stdio import problem_line
from mlx_qwen3asr.library.export import EXPORT_FORMATS, ExportError, export
from mlx_qwen3asr.library.jobs import claim_jobs
from mlx_qwen3asr.library.search import SearchError, search
from mlx_qwen3asr.library.store import Library, LibraryError, default_folder
from mlx_qwen3asr.outputs.finding import is_audio_name
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.atomic import atomic_write_bytes
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["add_library_options", "filing", "main", "open_library"]

EXIT_FAILED = 1
DEFAULT_MAX_JOB_UPLOAD_MB = 2048.0


def add_library_options(p: argparse.ArgumentParser) -> None:
    """The server's library options: where it keeps jobs and transcripts, or that it keeps none."""
    g = p.add_argument_group("transcript library")
    where = g.add_mutually_exclusive_group()
    where.add_argument(
        "--library",
        metavar="DIR",
        help="the library folder the server's jobs file their transcripts in "
        "(default: $MLXASR_LIBRARY, else the user's data folder)",
    )
    where.add_argument(
        "--no-library", action="store_true", help="keep nothing: no jobs, no transcripts (/v1/jobs is absent)"
    )
    g.add_argument(
        "--max-job-upload-mb",
        type=number_in((0.001, 1024.0 * 1024), "MB"),
        default=DEFAULT_MAX_JOB_UPLOAD_MB,
        metavar="MB",
        help=f"the largest recording a job may upload (default: {DEFAULT_MAX_JOB_UPLOAD_MB:g})",
    )


def open_library(
    args: argparse.Namespace, error: Callable[[str], None], *, jobs: bool = False
) -> Library | int | None:
    """The library the options name (None with --no-library), or EXIT_USAGE after one error line. jobs:
    it will run the library's jobs (a server), which another process must not be doing already."""
    if getattr(args, "no_library", False):
        return None
    folder = Path(args.library) if getattr(args, "library", None) else default_folder()
    try:
        library = Library(folder)
    except (LibraryError, OSError) as e:
        error(f"cannot open the library {folder}: {one_line(e)}")
        return EXIT_USAGE
    if jobs:
        try:
            claim_jobs(library.folder).close()  # checked now, before the models load; taken when serving
        except (LibraryError, OSError) as e:
            library.close()
            error(one_line(e))
            return EXIT_USAGE
    return library


def filing(
    args: argparse.Namespace, options: Any, error: Callable[[str], None]
) -> Callable[[Any, Any], None] | int | None:
    """For a folder run with --library [DIR]: what files each finished file's transcript, and its audio,
    in the library (None without --library; EXIT_USAGE after one error line when the library cannot be
    opened). A file that cannot be filed gets one error line; its outputs are written all the same."""
    if getattr(args, "library", None) is None:
        return None
    folder = Path(args.library) if args.library else default_folder()
    try:
        Library(folder).close()  # refused now, before anything is transcribed, if it cannot be opened
    except (LibraryError, OSError) as e:
        error(f"cannot open the library {folder}: {one_line(e)}")
        return EXIT_USAGE

    def file_in(job: Any, res: Any) -> None:
        audio = Path(job.source or job.path)
        try:
            with Library(folder) as library:
                library.add(
                    res.transcription.to_dict(),
                    title=job.path.stem if job.source is None else "stdin",
                    audio=audio if audio.is_file() else None,
                    model=getattr(args, "model", None),
                    options=options.to_dict() if hasattr(options, "to_dict") else None,
                )
        except (LibraryError, OSError) as e:
            error(f"{job.path}: not filed in the library {folder}: {one_line(e)}")

    return file_in


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mlxasr library", description="The transcript library.")
    p.add_argument(
        "--library",
        metavar="DIR",
        help="the library folder (default: $MLXASR_LIBRARY, else the user's data folder)",
    )
    # --library may come after the action too (mlxasr library search TEXT --library DIR).
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--library", metavar="DIR", default=argparse.SUPPRESS, help="the library folder")
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    add = functools.partial(sub.add_parser, parents=[where])
    ls = add("list", help="the transcripts, newest first")
    ls.add_argument("--limit", type=int, default=50)
    s = add("search", help='the segments a text finds (FTS5 syntax: words, "phrases", OR, NOT)')
    s.add_argument("text")
    s.add_argument("--limit", type=int, default=20)
    e = add("export", help="a transcript in one of the export formats")
    e.add_argument("id")
    e.add_argument("-f", "--format", choices=EXPORT_FORMATS, default="txt")
    e.add_argument("-o", "--output", metavar="FILE", help="where to write it (default: standard output)")
    i = add("import", help="the JSON outputs of earlier runs, with their audio where found")
    i.add_argument("paths", nargs="+", metavar="DIR")
    return p


def _error(line: str) -> None:
    print(problem_line("mlxasr library", "error", one_line(line)), file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60:02d}:{s % 60:02d}"


def _json_outputs(paths: Sequence[str]) -> Iterator[Path]:
    for raw in paths:
        path = Path(raw)
        if path.is_file():
            yield path
        elif path.is_dir():
            yield from sorted(p for p in path.rglob("*.json") if p.is_file())
        else:
            _error(f"{raw}: no such file or folder")


def _audio_beside(doc: dict[str, Any], json_path: Path) -> Path | None:
    """The audio a JSON output was made from: its recorded source where it still exists, else an audio
    file of the same stem beside it."""
    source = doc.get("source")
    if isinstance(source, str) and source:
        candidate = Path(source)
        if not candidate.is_absolute():
            candidate = json_path.parent / candidate
        if candidate.is_file():
            return candidate
    for sibling in sorted(json_path.parent.glob(json_path.stem + ".*")):
        if sibling != json_path and sibling.is_file() and is_audio_name(sibling.name):
            return sibling
    return None


def _import(library: Library, paths: Sequence[str]) -> int:
    added = failed = 0
    for path in _json_outputs(paths):
        raise_if_stopped()  # a Ctrl-C whose exception a finalizer dropped stops before the next file
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(doc, dict) or not isinstance(doc.get("segments"), list):
                raise ValueError("not a transcript (no segments)")
            result = Transcription.from_dict(doc)
        except (OSError, ValueError, TypeError, KeyError) as e:
            _error(f"{path}: skipped: {one_line(e)}")
            failed += 1
            continue
        audio = _audio_beside(doc, path)
        try:
            tid = library.add(
                result.to_dict(),
                title=path.stem,
                audio=audio,
                model=doc.get("model") if isinstance(doc.get("model"), str) else None,
                options=doc.get("options") if isinstance(doc.get("options"), dict) else None,
            )
        except (OSError, LibraryError) as e:
            _error(f"{path}: not imported: {one_line(e)}")
            failed += 1
            continue
        added += 1
        print(f"{tid}  {path}" + ("" if audio else "  (no audio found)"), flush=True)
    print(f"imported {added} transcript(s)" + (f", {failed} skipped" if failed else ""), file=sys.stderr)
    return EXIT_OK if not failed else EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --help, or a usage error argparse has said
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    library = open_library(args, _error)
    if isinstance(library, int) or library is None:
        return EXIT_USAGE
    try:
        if args.action == "list":
            items, total = library.list(limit=max(1, args.limit))
            for t in items:
                print(f"{t['id']}  {_clock(t.get('duration') or 0)}  {t['title']}")
            print(f"{total} transcript(s)", file=sys.stderr)
            return EXIT_OK
        if args.action == "search":
            try:
                hits = search(library, args.text, limit=max(1, args.limit))
            except SearchError as e:
                _error(one_line(e))
                return EXIT_USAGE
            for h in hits:
                snippet = h["snippet"].replace("<mark>", "[").replace("</mark>", "]")
                print(f"{h['transcript_id']}  {_clock(h['start'])}  {h['title']}: {snippet}")
            if not hits:
                print("no transcript says that", file=sys.stderr)
            return EXIT_OK
        if args.action == "export":
            stored = library.get(args.id) if args.id.isalnum() else None
            if stored is None:
                _error(f"no transcript {args.id!r} in the library")
                return EXIT_USAGE
            try:
                out = export(
                    Transcription.from_dict(stored),
                    args.format,
                    title=stored.get("title"),
                    model=stored.get("model"),
                    options=stored.get("options") or {},
                )
            except ExportError as e:
                _error(one_line(e))
                return EXIT_USAGE
            if args.output:
                atomic_write_bytes(args.output, out.data)
            elif args.format == "docx":
                _error("a DOCX document is binary: write it to a file with -o FILE")
                return EXIT_USAGE
            else:
                sys.stdout.buffer.write(out.data)
                sys.stdout.flush()
            return EXIT_OK
        return _import(library, args.paths)
    finally:
        library.close()


if __name__ == "__main__":
    sys.exit(main())
