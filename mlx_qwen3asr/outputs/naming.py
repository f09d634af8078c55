"""Naming a run's outputs: the output path of each input and format (beside it, or mirrored under an
output folder), names kept apart when inputs would share one, and the checks that an output can be
written there (name lengths with the temporary name, paths taken by something else)."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from mlx_qwen3asr.audio.features import AUDIO_EXTENSIONS
from mlx_qwen3asr.audio.files import not_regular_reason
from mlx_qwen3asr.outputs.finding import InputFile
from mlx_qwen3asr.outputs.render import FORMATS, SPEAKER_FORMATS
from mlx_qwen3asr.runtime.atomic import name_max, temp_name

__all__ = [
    "FileJob",
    "OutputClash",
    "existing_outputs",
    "mirror_name",
    "output_problem",
    "output_stem",
    "plan_jobs",
]

# The longest path the system takes, with its terminating NUL (PATH_MAX of Linux; macOS takes 1024).
_PATH_MAX = 1024 if sys.platform == "darwin" else 4096


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
