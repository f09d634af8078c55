"""Batch transcription of files and folders: finding inputs, naming outputs, resuming, writing.

The pieces are independent of any user interface; the `mlxasr` command drives them.
"""

from __future__ import annotations

import errno
import os
import stat
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS, SAMPLE_RATE
from mlx_qwen3asr.audio.files import not_regular_reason
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.outputs.cues import Cue, CueOptions, build_cues
from mlx_qwen3asr.outputs.render import FORMATS, SPEAKER_FORMATS, render
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.atomic import (
    atomic_write_bytes,
    atomic_write_files,
    name_max,
    probe_folder,
    remove_stale_temporaries,
    temp_name,
)

__all__ = [
    "REDO_SUFFIX",
    "InputError",
    "InputFile",
    "FileJob",
    "FileResult",
    "OutputClash",
    "TranscribeOptions",
    "existing_outputs",
    "file_warnings",
    "find_inputs",
    "clear_redo",
    "mark_redo",
    "redo_marker",
    "redo_pending",
    "is_audio_name",
    "is_up_to_date",
    "mirror_name",
    "output_problem",
    "outputs_older_than_input",
    "output_stem",
    "plan_jobs",
    "prepare_output_folder",
    "remove_stale_temporaries",
    "write_outputs",
]

# The longest path the system takes, with its terminating NUL (PATH_MAX of Linux; macOS takes 1024).
_PATH_MAX = 1024 if sys.platform == "darwin" else 4096


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


def _preference(inp: InputFile) -> tuple[bool, int, bytes]:
    # A file reached several ways is listed where it sorts first: found in a folder before named on
    # its own, by the outermost folder argument (longest path below it), then by path.
    return inp.root is None, -len(inp.relative.parts), os.fsencode(inp.path)


class _Finder:
    def __init__(self) -> None:
        # By real identity, in the order first reached; which way it is listed does not depend on the
        # order of the arguments (see _preference), so neither do its output names.
        self.files: dict[tuple[int, int], InputFile] = {}
        self.errors: list[InputError] = []
        # Real identities of the folders walked for the current argument: a symlink loop or a folder
        # reached twice is walked once.
        self.seen_dirs: set[tuple[int, int]] = set()

    def add_file(self, path: Path, st: os.stat_result, root: Path | None) -> None:
        key = (st.st_dev, st.st_ino)
        found = InputFile(path, root)
        if key not in self.files or _preference(found) < _preference(self.files[key]):
            self.files[key] = found

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
            # Every folder argument is walked whole, even one inside another: where its files are
            # listed must not depend on which argument came first.
            self.seen_dirs = {(st.st_dev, st.st_ino)}
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
    twice, through a link, inside two arguments) is listed once, whatever the order of the arguments:
    found in a folder rather than named on its own, under the outermost folder argument. Paths that do not exist or cannot be
    read come back as errors, and so do FIFOs, sockets and devices named as arguments or carrying an
    audio extension inside a folder (they are never opened); other files without an audio extension
    inside folders are passed over.
    """
    finder = _Finder()
    for arg in paths:
        finder.add_argument(arg)
    return list(finder.files.values()), finder.errors


def output_stem(name: str) -> str:
    """An input's file name without its audio extension ("meeting.2024.01.m4a" -> "meeting.2024.01").

    A name without an audio extension is kept whole, so an output never replaces its input.
    """
    base, ext = os.path.splitext(name)
    return base if base and ext[1:].lower() in AUDIO_EXTENSIONS else name


@dataclass
class FileJob:
    input: InputFile
    outputs: dict[str, Path]  # format -> output path, in FORMATS then SPEAKER_FORMATS order
    problem: str | None = None  # why the outputs cannot be written, found while planning
    # The file the audio is read from, when it is not the input's path (standard input, spilled to a
    # temporary file, is named "stdin"); None: the input's path.
    source: Path | None = None

    @property
    def path(self) -> Path:
        """The input as messages and outputs name it."""
        return self.input.path

    @property
    def audio(self) -> Path:
        """The file to read the audio from."""
        return self.source if self.source is not None else self.input.path


class OutputClash(ValueError):
    """Two inputs from different arguments would be written to the same output path."""


def _key(path: Path) -> str:
    # Case-insensitive, so names that differ only in case do not collide on macOS volumes.
    return os.path.normcase(os.path.abspath(path)).casefold()


def mirror_name(folder: str | os.PathLike[str]) -> str:
    """The name a folder argument is mirrored under in an output folder: its last component
    ("./recordings/" -> "recordings", "." -> the current folder's name; "" for the root)."""
    return os.path.basename(os.path.abspath(folder))


def _output_folder(inp: InputFile, out_root: Path | None) -> Path:
    if out_root is None:
        return inp.path.parent
    if inp.root is None:
        return out_root
    return out_root / mirror_name(inp.root) / inp.relative.parent


def plan_jobs(
    inputs: Sequence[InputFile],
    formats: Iterable[str],
    output_dir: str | os.PathLike[str] | None = None,
) -> list[FileJob]:
    """Output paths for each input: beside it, or under output_dir.

    Under output_dir, a file named as an argument is written at its top ("talk.m4a" -> "DIR/talk.txt")
    and a folder argument is mirrored under its own name ("rec/a/b.wav" from the argument "rec" ->
    "DIR/rec/a/b.txt"), so an output's path depends on its input and the argument that reached it,
    never on the order of the arguments. Two inputs that would share an output name keep their
    extension ("a.wav.srt", "a.mp3.srt"); if that still collides, a counter is added ("a (2).srt") to
    the later of two files found in the same folder argument, and OutputClash is raised for files of
    different arguments. A job whose output path another job needs as a folder carries a problem.
    """
    requested = set(formats)
    known = (*FORMATS, *SPEAKER_FORMATS)
    fmts = [f for f in known if f in requested]
    unknown = requested - set(known)
    if unknown:
        raise ValueError(f"unknown output format(s) {', '.join(sorted(unknown))}: use {', '.join(known)}")
    out_root = Path(output_dir) if output_dir is not None else None
    folders = [_output_folder(inp, out_root) for inp in inputs]
    taken_by_inputs = {_key(inp.path) for inp in inputs}

    def paths(folder: Path, stem: str) -> list[Path]:
        return [folder / f"{stem}.{fmt}" for fmt in fmts]

    def argument(inp: InputFile) -> Path:
        return inp.root if inp.root is not None else inp.path

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

    used: dict[str, int | None] = dict.fromkeys(taken_by_inputs)  # output key -> the input that has it
    chosen: dict[int, list[Path]] = {}
    # Names are handed out in path order, so that a counter never depends on the order of the arguments.
    for i in sorted(range(len(inputs)), key=lambda i: os.fsencode(inputs[i].path)):
        inp, folder, stem = inputs[i], folders[i], stems[i]
        candidate, n = stem, 1
        while True:
            owners = [used[k] for k in map(_key, paths(folder, candidate)) if k in used]
            if not owners:
                break
            other = next((inputs[j] for j in owners if j is not None), None)
            if n == 1 and other is not None and argument(other) != argument(inp):
                raise OutputClash(
                    f"{other.path} and {inp.path} would both be written to {paths(folder, candidate)[0]}"
                    + (" (give them different output folders)" if out_root is not None else "")
                )
            n += 1
            candidate = f"{stem} ({n})"
        chosen[i] = paths(folder, candidate)
        used.update((_key(p), i) for p in chosen[i])
    jobs = [FileJob(inp, dict(zip(fmts, chosen[i]))) for i, inp in enumerate(inputs)]
    if out_root is not None:
        # A mirrored folder named like another file's output ("a.txt/" beside "a.wav"): the folder
        # is made for the files below it, and the file whose output it takes fails.
        needed: dict[str, FileJob] = {}
        for job in jobs:
            for path in job.outputs.values():
                folder = path.parent
                while len(folder.parts) > len(out_root.parts):
                    needed.setdefault(_key(folder), job)
                    folder = folder.parent
        for job in jobs:
            for path in job.outputs.values():
                other = needed.get(_key(path))
                if other is not None and job.problem is None:
                    job.problem = f"output {path} is the folder that the outputs of {other.path} go to"
    return jobs


def existing_outputs(job: FileJob) -> list[str]:
    """The formats of job whose output path is taken (by a file, a folder, a link even if broken)."""
    return [fmt for fmt, path in job.outputs.items() if os.path.lexists(path)]


def _name_problem(path: Path, limit: int) -> str | None:
    """Why a file system taking names of limit bytes cannot take an output's name, or that of the
    temporary file it is written to first (see runtime.atomic.temp_name), or None."""
    size = len(os.fsencode(path.name))
    if size > limit:
        return f"output name {path.name} is too long ({size} bytes; the file system takes {limit})"
    temporary = temp_name(path.name, limit)
    if len(os.fsencode(temporary)) > limit:
        return f"output name {path.name} leaves no room for a temporary name ({limit} bytes at most)"
    if len(os.fsencode(os.path.join(path.parent, temporary))) >= _PATH_MAX:
        return f"output path {path} is too long (the system takes {_PATH_MAX - 1} bytes)"
    return None


def _taken_problem(path: Path) -> str | None:
    """Why an existing output path cannot hold an output (a folder, a FIFO, a broken link), or None."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return f"output {path} is a broken symbolic link" if os.path.islink(path) else None
    except OSError as e:
        if e.errno == errno.ELOOP:
            return f"output {path}: symbolic link loop"
        return None  # a folder that cannot be read or made is told by prepare_output_folder
    reason = not_regular_reason(st.st_mode)
    return None if reason is None else f"output {path} {reason}"


def output_problem(job: FileJob) -> str | None:
    """Why job's outputs cannot be written, or None: an output path that another file's outputs need
    as a folder, an output name too long for the file system (checked with the name of the temporary
    file each is written to first), or an output path taken by something that is not a regular file.

    Checked before the model is loaded, so that such a file fails at once rather than after it is
    transcribed, or is taken for done.
    """
    if job.problem is not None:
        return job.problem
    limits: dict[Path, int] = {}
    for path in job.outputs.values():
        if path.parent not in limits:
            limits[path.parent] = name_max(path.parent)
        reason = _name_problem(path, limits[path.parent]) or _taken_problem(path)
        if reason is not None:
            return reason
    return None


def _stats(job: FileJob) -> tuple[int, list[os.stat_result | None]] | None:
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


def outputs_older_than_input(job: FileJob) -> bool:
    """Whether some existing output was last modified before the input was."""
    found = _stats(job)
    if found is None:
        return False
    source, outs = found
    return any(st is not None and st.st_mtime_ns < source for st in outs)


def is_up_to_date(job: FileJob) -> bool:
    """Whether every output exists and was modified after the input."""
    found = _stats(job)
    if found is None:
        return False
    source, outs = found
    return bool(outs) and all(
        st is not None and stat.S_ISREG(st.st_mode) and st.st_mtime_ns > source for st in outs
    )


# A run told to replace a file's existing outputs (--overwrite) leaves ".<output stem>.mlxasr-redo"
# beside them until it has; a later run without --overwrite redoes such a file rather than skip it.
REDO_SUFFIX = ".mlxasr-redo"


def redo_marker(job: FileJob) -> Path | None:
    """Where job's redo marker goes (None for a job without outputs)."""
    first = next(iter(job.outputs.values()), None)
    if first is None:
        return None
    return first.parent / f".{os.path.splitext(first.name)[0]}{REDO_SUFFIX}"


def mark_redo(job: FileJob) -> bool:
    """Record that job's existing outputs are to be replaced; whether the record could be written."""
    marker = redo_marker(job)
    if marker is None:
        return False
    try:
        atomic_write_bytes(marker, b"")
    except OSError:
        return False
    return True


def clear_redo(job: FileJob) -> None:
    """Forget job's redo record (its outputs have been replaced)."""
    marker = redo_marker(job)
    if marker is not None:
        try:
            os.unlink(marker)
        except OSError:
            pass


def redo_pending(job: FileJob) -> bool:
    """Whether a run told to replace job's outputs stopped before it had."""
    marker = redo_marker(job)
    return marker is not None and os.path.isfile(marker)


@dataclass(frozen=True)
class TranscribeOptions:
    language: str | None = None
    context: str = ""
    max_segment_seconds: float = DEFAULT_MAX_SEGMENT_SECONDS
    cues: CueOptions = field(default_factory=CueOptions)
    word_timestamps: bool = False
    aligner: str | None = None  # the aligner used, when words were timed
    highlight_words: str | None = None  # a style of outputs.render.HIGHLIGHT_STYLES; None: off
    vad: VadOptions | None = None  # speech detection (None: off)
    # How TXT and SRT name the speaker where it changes, when speakers were told apart (None: the
    # writers' default, outputs.render.DEFAULT_SPEAKER_FORMAT).
    speaker_format: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The options as recorded in JSON output (speaker_format only when it is set)."""
        extra = {} if self.speaker_format is None else {"speaker_format": self.speaker_format}
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
            "vad": self.vad is not None,
            "vad_threshold": None if self.vad is None else self.vad.threshold,
            **extra,
        }


SILENT_WARNING = "silent audio, nothing to transcribe; the outputs are empty"


def file_warnings(result: Transcription, silent: bool = False) -> list[str]:
    """What a user is told about a transcribed file, one line each: silent audio, segments that ran
    into a loop or the token limit, then what decoding noticed about the audio (result.warnings).
    The JSON output's "warnings" is this list, and the command prints it."""
    warnings = [SILENT_WARNING] if silent else []
    flagged = sum(bool(s.truncated or s.repetitive) for s in result.segments)
    if flagged:
        warnings.append(
            f"{flagged} segment(s) ran into a loop or the token limit; "
            "their text may be incomplete (flagged in JSON output)"
        )
    warnings.extend(str(w) for w in getattr(result, "warnings", None) or [])
    return warnings


@dataclass
class FileResult:
    transcription: Transcription  # its warnings are file_warnings(): what the JSON output carries
    cues: list[Cue]
    silent: bool = False
    written: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # outputs that existed and were left as they are

    @property
    def warnings(self) -> list[str]:
        """The file's warnings, as its JSON output lists them."""
        return list(self.transcription.warnings)


def write_outputs(
    job: FileJob,
    result: Transcription,
    wav: np.ndarray,
    options: TranscribeOptions,
    *,
    model_name: str | None = None,
    silent: bool = False,
    overwrite: bool = True,
) -> FileResult:
    """Write a transcribed file's outputs atomically (each complete, or none on failure).

    overwrite=False: an output that exists, or appears while the others are written, is never
    replaced; it is listed in FileResult.kept and only the missing outputs are written. The JSON
    output's "warnings" and FileResult.warnings are file_warnings(result, silent).
    Raises OSError when an output cannot be written; no output is left half-written.
    """
    result.source = str(job.path)
    result = replace(result, warnings=file_warnings(result, silent))
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
            **({} if options.speaker_format is None else {"speaker_format": options.speaker_format}),
        )
        for fmt, path in job.outputs.items()
        if fmt not in taken
    }
    for folder in {p.parent for p in documents}:
        folder.mkdir(parents=True, exist_ok=True)
    raced = atomic_write_files(documents, replace=overwrite)
    kept = [path for fmt, path in job.outputs.items() if fmt in taken or path in raced]
    written = [path for path in documents if path not in raced]
    return FileResult(result, cues, silent, written, kept)


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
