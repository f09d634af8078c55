"""The output files of an `mlxasr live` session, written after each commit.

After a commit only what its segments add is written (outputs.appending: new paragraphs, cues and
segments appended to the files), so that a commit at hour three costs what one at minute one does;
the session's last write writes each file whole, as `mlxasr` writes a file's outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.signal import Signal
from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.options import EXIT_FAILED
from mlx_qwen3asr.outputs.appending import GrowingOutputs, OutputFailed
from mlx_qwen3asr.outputs.folder import FileJob, TranscribeOptions, write_outputs
from mlx_qwen3asr.outputs.render import FORMATS
from mlx_qwen3asr.pipeline.result import Transcription, main_language
from mlx_qwen3asr.text.output import join_texts


class LiveOutputs:
    """The session's output files: the committed segments appended after each commit, and each file
    written whole at the end."""

    def __init__(self, job: FileJob | None, options: TranscribeOptions, model_name: str) -> None:
        self.job = job
        self.options = options
        self.model_name = model_name
        self.written: list[Path] = []
        # The outputs, grown by appends after each commit; with a format that cannot grow (none
        # today), every file is rewritten whole after each commit instead.
        self._growing = None
        if job is not None:
            growing = {fmt: path for fmt, path in job.outputs.items() if fmt in FORMATS}
            self._growing = GrowingOutputs(growing, options, model=model_name, source=str(job.path))
            self._rest = {fmt: path for fmt, path in job.outputs.items() if fmt not in FORMATS}

    def write(
        self,
        transcriber: Any,
        audio: Signal,
        language: str | None,
        warnings: Sequence[str] = (),
        *,
        final: bool = False,
    ) -> None:
        """Write the committed segments (and, with speech detection, the speech regions taken).
        `transcriber` is what holds the session's committed `segments` (append-only) and `speech`;
        final: the session's last write, which writes each file whole (before it, only what the
        segments committed since the last write add is written)."""
        if self.job is None:
            return
        if not final and not self._rest:
            try:
                self._growing.write(
                    transcriber.segments, audio, len(audio) / SAMPLE_RATE, warnings, language=language
                )
            except OutputFailed as e:
                raise LiveError(str(e), EXIT_FAILED) from None
            self.written = list(self.job.outputs.values())
            return
        segments = transcriber.segments
        lang = main_language(segments) if segments else (language or "")
        result = Transcription(
            text=join_texts([s.text for s in segments], lang or language),
            language=lang,
            segments=list(segments),
            duration=len(audio) / SAMPLE_RATE,
            warnings=list(warnings),
            speech=list(transcriber.speech) if self.options.vad is not None else None,
        )
        try:
            done = write_outputs(
                self.job, result, audio, self.options, model_name=self.model_name, overwrite=True
            )
        except OSError as e:
            path = self._named(e)
            if path is None:  # a full disk fails the write of the data, which names no file
                done, path, e = self._write_alone(result, audio, e)
            if path is not None:
                raise LiveError(
                    f"cannot write output {path} ({(e.strerror or str(e)).lower()})", EXIT_FAILED
                ) from None
        self.written = done.written

    def _named(self, e: OSError) -> Path | None:
        """The output an error names, or None (it names no file, or a temporary one)."""
        names = {str(p): p for p in self.job.outputs.values()}
        return next(
            (names[str(f)] for f in (e.filename2, e.filename) if f is not None and str(f) in names), None
        )

    def _write_alone(self, result: Transcription, audio: Signal, error: OSError):
        """Write the outputs one at a time to find the one that cannot be written: (the last write's
        result, that output or None when each was written after all, its error)."""
        done = None
        for fmt, path in self.job.outputs.items():
            try:
                done = write_outputs(
                    replace(self.job, outputs={fmt: path}),
                    result,
                    audio,
                    self.options,
                    model_name=self.model_name,
                    overwrite=True,
                )
            except OSError as e:
                return done, path, e
        done.written = list(self.job.outputs.values())
        return done, None, error


__all__ = ["LiveOutputs"]
