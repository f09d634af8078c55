"""Batch transcription of files and folders: finding inputs, naming outputs, resuming, writing.

The pieces are independent of any user interface; the `mlxasr` command drives them.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .audio import AUDIO_EXTENSIONS, SAMPLE_RATE
from .decode import not_regular_reason, probe_seconds
from .result import Transcription
from .scheduler import DEFAULT_MAX_SEGMENT_SECONDS
from .subtitles import Cue, CueOptions, build_cues
from .writers import FORMATS, atomic_write_files, probe_folder, remove_stale_temporaries, render

__all__ = [
    "InputError",
    "InputFile",
    "Job",
    "JobResult",
    "TranscribeOptions",
    "estimate_duration",
    "existing_outputs",
    "find_inputs",
    "is_audio_name",
    "is_silent",
    "is_up_to_date",
    "outputs_older_than_input",
    "output_stem",
    "plan_jobs",
    "prepare_output_folder",
    "probe_duration",
    "remove_stale_temporaries",
    "write_outputs",
]

# Peak below which a file is treated as silence (-80 dBFS): nothing to transcribe.
SILENCE_PEAK = 1e-4
# Bytes per second assumed for a compressed file whose length cannot be read cheaply (128 kbit/s).
_ASSUMED_BYTES_PER_SECOND = 16_000


@dataclass(frozen=True)
class InputFile:
    path: Path  # as found: the argument, or the folder argument joined with the relative path
    root: Path | None = None  # the folder argument it was found under; None when named directly

    @property
    def relative(self) -> Path:
        """Path under its folder argument (just the name for a file named directly)."""
        return self.path.relative_to(self.root) if self.root is not None else Path(self.path.name)


@dataclass(frozen=True)
class InputError:
    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def is_audio_name(name: str) -> bool:
    """Whether a file name has an audio or video extension that load_audio handles (any case)."""
    ext = os.path.splitext(name)[1]
    return ext[1:].lower() in AUDIO_EXTENSIONS


def _reason(e: OSError) -> str:
    if isinstance(e, FileNotFoundError):
        return "no such file or directory"
    if isinstance(e, PermissionError):
        return "permission denied"
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    return (e.strerror or str(e)).lower()


def _stat_reason(path: str | os.PathLike[str], e: OSError) -> str:
    """Why stat failed: a symbolic link loop and a link to nothing are told apart."""
    if e.errno == errno.ELOOP:
        return "symbolic link loop"
    if isinstance(e, FileNotFoundError) and os.path.islink(path):
        return "broken symbolic link"
    return _reason(e)


class _Finder:
    def __init__(self) -> None:
        self.files: list[InputFile] = []
        self.errors: list[InputError] = []
        self.seen_files: set[tuple[int, int]] = set()
        # Real identities of walked folders: a symlink loop or a folder reached twice is walked once.
        self.seen_dirs: set[tuple[int, int]] = set()

    def add_file(self, path: Path, st: os.stat_result, root: Path | None) -> None:
        key = (st.st_dev, st.st_ino)
        if key not in self.seen_files:
            self.seen_files.add(key)
            self.files.append(InputFile(path, root))

    def walk(self, folder: Path, root: Path) -> None:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as e:
            self.errors.append(InputError(str(folder), f"cannot read folder ({_reason(e)})"))
            return
        for entry in entries:
            if entry.name.startswith("."):
                continue
            path = folder / entry.name
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                try:
                    st = entry.stat()
                except OSError as e:
                    self.errors.append(InputError(str(path), _reason(e)))
                    continue
                if (st.st_dev, st.st_ino) not in self.seen_dirs:
                    self.seen_dirs.add((st.st_dev, st.st_ino))
                    self.walk(path, root)
            elif is_audio_name(entry.name):
                try:
                    st = entry.stat()
                except OSError as e:
                    self.errors.append(InputError(str(path), _stat_reason(path, e)))
                    continue
                if stat.S_ISREG(st.st_mode):
                    self.add_file(path, st, root)
                else:
                    # A FIFO would block whoever opens it; devices and sockets are no recordings.
                    self.errors.append(InputError(str(path), not_regular_reason(st.st_mode)))

    def add_argument(self, arg: str | os.PathLike[str]) -> None:
        path = Path(arg)
        try:
            st = os.stat(path)
        except OSError as e:
            self.errors.append(InputError(os.fspath(arg), _stat_reason(path, e)))
            return
        if stat.S_ISDIR(st.st_mode):
            if (st.st_dev, st.st_ino) not in self.seen_dirs:
                self.seen_dirs.add((st.st_dev, st.st_ino))
                self.walk(path, path)
        elif stat.S_ISREG(st.st_mode):
            # Named explicitly: attempted whatever its extension, and fails cleanly if it is not audio.
            self.add_file(path, st, None)
        else:
            # Never opened: reading a FIFO nobody writes to would block the whole run.
            self.errors.append(InputError(os.fspath(arg), not_regular_reason(st.st_mode)))


def find_inputs(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[InputFile], list[InputError]]:
    """Audio and video files under the given files and folders, in argument order, folders walked
    recursively in sorted name order.

    Hidden files and folders (leading dot) are skipped inside folders; a file reached twice (named
    twice, through a link, inside two arguments) is listed once. Paths that do not exist or cannot be
    read come back as errors, and so do FIFOs, sockets and devices named as arguments or carrying an
    audio extension inside a folder (they are never opened); other files without an audio extension
    inside folders are passed over.
    """
    finder = _Finder()
    for arg in paths:
        finder.add_argument(arg)
    return finder.files, finder.errors


def output_stem(name: str) -> str:
    """An input's file name without its audio extension ("meeting.2024.01.m4a" -> "meeting.2024.01").

    A name without an audio extension is kept whole, so an output never replaces its input.
    """
    base, ext = os.path.splitext(name)
    return base if base and ext[1:].lower() in AUDIO_EXTENSIONS else name


@dataclass
class Job:
    input: InputFile
    outputs: dict[str, Path]  # format -> output path, in FORMATS order

    @property
    def path(self) -> Path:
        return self.input.path


def _key(path: Path) -> str:
    # Case-insensitive, so names that differ only in case do not collide on macOS volumes.
    return os.path.normcase(os.path.abspath(path)).casefold()


def plan_jobs(
    inputs: Sequence[InputFile],
    formats: Iterable[str],
    output_dir: str | os.PathLike[str] | None = None,
) -> list[Job]:
    """Output paths for each input: beside it, or under output_dir mirroring the tree below the folder
    argument it came from. Two inputs that would share an output name keep their extension
    ("a.wav.srt", "a.mp3.srt"); if that still collides, a counter is added ("a (2).srt").
    """
    requested = set(formats)
    fmts = [f for f in FORMATS if f in requested]
    unknown = requested - set(FORMATS)
    if unknown:
        raise ValueError(f"unknown output format(s) {', '.join(sorted(unknown))}: use {', '.join(FORMATS)}")
    out_root = Path(output_dir) if output_dir is not None else None
    folders = [inp.path.parent if out_root is None else out_root / inp.relative.parent for inp in inputs]
    taken_by_inputs = {_key(inp.path) for inp in inputs}

    def paths(folder: Path, stem: str) -> list[Path]:
        return [folder / f"{stem}.{fmt}" for fmt in fmts]

    stems = [output_stem(inp.path.name) for inp in inputs]
    groups: dict[str, list[int]] = {}
    for i, (folder, stem) in enumerate(zip(folders, stems)):
        groups.setdefault(_key(folder / stem), []).append(i)
    for members in groups.values():
        names = [inputs[i].path.name for i in members]
        # Keeping the extension only helps when the full names differ ("a.wav", "a.mp3").
        if len(members) > 1 and len({n.casefold() for n in names}) == len(names):
            for i, name in zip(members, names):
                stems[i] = name

    used: set[str] = set(taken_by_inputs)
    jobs: list[Job] = []
    for inp, folder, stem in zip(inputs, folders, stems):
        candidate, n = stem, 1
        while any(_key(p) in used for p in paths(folder, candidate)):
            n += 1
            candidate = f"{stem} ({n})"
        chosen = paths(folder, candidate)
        used.update(_key(p) for p in chosen)
        jobs.append(Job(inp, dict(zip(fmts, chosen))))
    return jobs


def existing_outputs(job: Job) -> list[str]:
    """The formats of job whose output path is taken (by a file, a folder, a link even if broken)."""
    return [fmt for fmt, path in job.outputs.items() if os.path.lexists(path)]


def _stats(job: Job) -> tuple[int, list[os.stat_result | None]] | None:
    """The input's modification time and each output's stat (None where it cannot be read);
    None when the input itself cannot be read."""
    try:
        source = os.stat(job.path).st_mtime_ns
    except OSError:
        return None
    outs: list[os.stat_result | None] = []
    for out in job.outputs.values():
        try:
            outs.append(os.stat(out))
        except OSError:
            outs.append(None)
    return source, outs


def outputs_older_than_input(job: Job) -> bool:
    """Whether some existing output was last modified before the input was."""
    found = _stats(job)
    if found is None:
        return False
    source, outs = found
    return any(st is not None and st.st_mtime_ns < source for st in outs)


def is_up_to_date(job: Job) -> bool:
    """Whether every output exists and was modified after the input."""
    found = _stats(job)
    if found is None:
        return False
    source, outs = found
    return bool(outs) and all(
        st is not None and stat.S_ISREG(st.st_mode) and st.st_mtime_ns > source for st in outs
    )


def probe_duration(path: str | os.PathLike[str]) -> float | None:
    """Duration in seconds from the file header, for formats libsndfile reads; None otherwise.

    Only regular files are opened (a FIFO would block), and decoder chatter is held back.
    """
    return probe_seconds(path)


def estimate_duration(path: str | os.PathLike[str]) -> float:
    """probe_duration, or a guess from the file size at a typical compressed bit rate; 0 if unreadable."""
    seconds = probe_duration(path)
    if seconds is not None:
        return seconds
    try:
        st = os.stat(path)
    except OSError:
        return 0.0
    return st.st_size / _ASSUMED_BYTES_PER_SECOND if stat.S_ISREG(st.st_mode) else 0.0


def is_silent(wav) -> bool:
    """No sample reaches SILENCE_PEAK: digital silence or close to it.

    `wav` is an array or a decoded signal (decode.Signal, read block by block).
    """
    if hasattr(wav, "peak"):
        return len(wav) == 0 or wav.peak() < SILENCE_PEAK
    # max and min avoid the full-size temporary that abs() would allocate for long files.
    return wav.size == 0 or max(float(np.max(wav)), -float(np.min(wav))) < SILENCE_PEAK


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    context: str = ""
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS
    cues: CueOptions = field(default_factory=CueOptions)
    word_timestamps: bool = False
    aligner: str | None = None  # the aligner used, when words were timed
    highlight_words: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The options as recorded in JSON output."""
        return {
            "language": self.language,
            "context": self.context,
            "max_segment_seconds": self.max_segment_seconds,
            "max_line_width": self.cues.max_width,
            "max_line_count": self.cues.max_lines,
            "max_cue_seconds": self.cues.max_duration,
            "word_timestamps": self.word_timestamps,
            "aligner": self.aligner,
            "highlight_words": self.highlight_words,
            "max_words_per_line": self.cues.max_words_per_line,
            "pause_seconds": self.cues.pause,
            "min_cue_gap": self.cues.min_gap,
            "max_chars_per_second": self.cues.max_cps,
        }


@dataclass
class JobResult:
    transcription: Transcription
    cues: list[Cue]
    silent: bool = False
    written: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # outputs that existed and were left as they are


def write_outputs(
    job: Job,
    result: Transcription,
    wav: np.ndarray,
    options: TranscribeOptions,
    *,
    model_name: str | None = None,
    silent: bool = False,
    overwrite: bool = True,
) -> JobResult:
    """Write a transcribed file's outputs atomically (each complete, or none on failure).

    overwrite=False: an output that exists, or appears while the others are written, is never
    replaced; it is listed in JobResult.kept and only the missing outputs are written.
    Raises OSError when an output cannot be written; no output is left half-written.
    """
    result.source = str(job.path)
    cues = build_cues(result.segments, wav, sample_rate=SAMPLE_RATE, options=options.cues)
    taken = set() if overwrite else set(existing_outputs(job))
    documents = {
        path: render(
            fmt,
            result,
            cues,
            model=model_name,
            options=options.to_dict(),
            highlight_words=options.highlight_words,
        )
        for fmt, path in job.outputs.items()
        if fmt not in taken
    }
    for folder in {p.parent for p in documents}:
        folder.mkdir(parents=True, exist_ok=True)
    raced = atomic_write_files(documents, replace=overwrite)
    kept = [path for fmt, path in job.outputs.items() if fmt in taken or path in raced]
    written = [path for path in documents if path not in raced]
    return JobResult(result, cues, silent, written, kept)


def prepare_output_folder(folder: str | os.PathLike[str], created: list[Path] | None = None) -> str | None:
    """Create an output folder (and its parents) and check that files can be made in it.

    Returns None when it is ready, else why not, as a phrase ("cannot write output in out (read-only
    file system)"). Folders this made are appended to created, parents first.
    """
    folder = Path(folder)
    missing = []
    probe = folder
    while not os.path.lexists(probe) and probe != probe.parent:
        missing.append(probe)
        probe = probe.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        return f"cannot create output folder {folder} (a file is in the way)"
    except OSError as e:
        return f"cannot create output folder {folder} ({_reason(e)})"
    finally:
        if created is not None:
            created.extend(p for p in reversed(missing) if p.is_dir())
    try:
        probe_folder(folder)
    except NotADirectoryError:
        return f"cannot create output folder {folder} (a file is in the way)"
    except OSError as e:
        return f"cannot write output in {folder} ({_reason(e)})"
    return None
