"""Batch transcription of files and folders: finding inputs (finding.py), naming outputs (naming.py),
resuming (resume.py), and here the options recorded, the warnings told and the writing of a file's
outputs, each complete or untouched (runtime/atomic.py). Every name of those modules is importable
from here too.

The pieces are independent of any user interface; the `mlxasr` command drives them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.vad import VadOptions
from mlx_qwen3asr.outputs.cues import Cue, CueOptions, build_cues
from mlx_qwen3asr.outputs.finding import InputError, InputFile, _reason, find_inputs, is_audio_name
from mlx_qwen3asr.outputs.naming import (
    FileJob,
    OutputClash,
    existing_outputs,
    mirror_name,
    output_problem,
    output_stem,
    plan_jobs,
)
from mlx_qwen3asr.outputs.render import render
from mlx_qwen3asr.outputs.resume import (
    REDO_SUFFIX,
    clear_redo,
    is_up_to_date,
    mark_redo,
    outputs_older_than_input,
    redo_marker,
    redo_pending,
)
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.atomic import atomic_write_files, probe_folder, remove_stale_temporaries

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
