"""Outputs of a transcript that grows by segments (a live session), each write adding only what the
new segments add.

Every write appends the new segments' paragraphs (TXT), cues (SRT, WebVTT) or segments (JSON) to the
files, so that its cost does not grow with the transcript: the cue numbering, the last cue's end and
speaker and the counts the JSON's closing fields need are kept, and the cues are built from the new
segments alone (their energy read from their own audio, outputs.cues.FrameEnergy).

A file is appended to in one write of the new bytes, synced; a write that fails (a full disk, an
interrupt) is undone by cutting the file back to what it held, so that a file always holds what one
write left in it: a valid document with every segment written. A file that is missing or changed
since (or a transcript that is not the one written, grown) is written whole again, atomically, as is
each file the first time.

While it grows, the JSON document is {"partial": true, "model", "options", "source", "segments": [...]},
then "language", "duration", "truncated", "repetitive", "audio_truncated", "header_duration" and
"warnings": the segments are written as in the finished document, and only the closing fields after
them are rewritten. The finished document (outputs.render.render_json, with the text, the cues and the
speech regions) is written once at the end, by outputs.folder.write_outputs.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.outputs.cues import build_cues
from mlx_qwen3asr.outputs.folder import TranscribeOptions, file_warnings
from mlx_qwen3asr.outputs.render import (
    DEFAULT_SPEAKER_FORMAT,
    FORMATS,
    segment_json,
    srt_blocks,
    txt_paragraphs,
    vtt_blocks,
)
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.atomic import atomic_write_files

__all__ = ["GrowingFile", "GrowingOutputs", "OutputFailed"]

_sync = getattr(os, "fdatasync", os.fsync)


class OutputFailed(Exception):
    """An output file that could not be written: its path and why (an OSError's reason, in lower case)."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path = path
        self.reason = (error.strerror or str(error)).lower()
        super().__init__(f"cannot write output {path} ({self.reason})")


class GrowingFile:
    """A file written whole once, then by replacing its last bytes (its tail) with more.

    size is what the file holds as last written, None when that is not known (not written yet, or a
    write failed and could not be undone): the next write must then be whole.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.size: int | None = None
        self.tail = b""  # the bytes at the end that the next extend replaces
        self._id: tuple[int, int] | None = None

    def replace(self, data: bytes, tail: bytes = b"") -> None:
        """Write the file whole, atomically (complete, or as it was); data ends with tail."""
        self.size = None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_files({self.path: data})
        st = os.stat(self.path)
        self.size, self.tail, self._id = len(data), tail, (st.st_dev, st.st_ino)

    def intact(self) -> bool:
        """The file is as last written (same file, same length)."""
        if self.size is None:
            return False
        try:
            st = os.stat(self.path)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) == self._id and st.st_size == self.size

    def extend(self, data: bytes, tail: bytes = b"") -> bool:
        """Put data in place of the file's tail, in one write, and sync; data ends with the new tail.
        A write that fails is undone (the file cut back to what it held) and its error raised.
        False: the file is not as last written, and nothing was written."""
        if self.size is None:
            return False
        if data == self.tail:
            return self.intact()  # nothing changes
        try:
            fd = os.open(self.path, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))
        except FileNotFoundError:
            return False
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self._id or st.st_size != self.size:
                return False
            size, old_tail = self.size, self.tail
            at = size - len(old_tail)
            self.size = None  # until written or undone
            try:
                _write_at(fd, data, at)
                if at + len(data) < size:
                    os.ftruncate(fd, at + len(data))
                _sync(fd)
            except BaseException:
                # Cut what was added first (that frees room on a full disk), then put the old tail back.
                try:
                    os.ftruncate(fd, size)
                    _write_at(fd, old_tail, at)
                except OSError:
                    pass
                else:
                    self.size = size
                raise
            self.size, self.tail = at + len(data), tail
            return True
        finally:
            os.close(fd)


def _write_at(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, at)
        view, at = view[written:], at + written


def _indented(doc: Any, spaces: int) -> str:
    """doc as indented JSON, each line `spaces` further in (JSON text holds no raw line break)."""
    return json.dumps(doc, ensure_ascii=False, indent=2).replace("\n", "\n" + " " * spaces)


def _members(doc: Mapping[str, Any]) -> str:
    """The members of a JSON object as render_json writes them (two spaces in), without the braces."""
    return json.dumps(doc, ensure_ascii=False, indent=2)[2:-2] if doc else ""


class GrowingOutputs:
    """The output files (format -> path: FORMATS) of a transcript that grows by segments.

    write(segments, audio, duration) is given the whole, append-only list of segments each time and
    writes only those after the ones written before (see the module docstring).
    """

    def __init__(
        self,
        outputs: Mapping[str, Path],
        options: TranscribeOptions,
        *,
        model: str | None,
        source: str,
    ) -> None:
        unknown = set(outputs) - set(FORMATS)
        if unknown:
            raise ValueError(f"no growing output for {', '.join(sorted(unknown))}")
        self.files = {fmt: GrowingFile(Path(path)) for fmt, path in outputs.items()}
        self.options = options
        self.speaker_format = options.speaker_format or DEFAULT_SPEAKER_FORMAT
        # A file name that is not valid UTF-8 carries surrogate escapes, which JSON text cannot hold.
        self.source = source.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        self.model = model
        self._start()

    def _start(self) -> None:
        """Nothing written yet: the next write is whole."""
        self.done = 0  # segments written
        self.last: Any = None  # the last of them
        self.cue_end = 0.0  # seconds: where the last cue written ends
        self.srt_blocks = self.vtt_blocks = self.paragraphs = 0
        self.cue_speaker: str | None = None  # the speaker of the last cue with one
        self.text_speaker: str | None = None  # the speaker of the last paragraph with one
        self.languages: Counter[str] = Counter()  # seconds of each language (main_language)
        self.flagged: list[Any] = []  # segments that ran into a loop or the token limit

    def _continues(self, segments: Sequence[Any]) -> bool:
        """segments are those written, and maybe more."""
        return len(segments) >= self.done and (self.done == 0 or segments[self.done - 1] is self.last)

    def write(
        self,
        segments: Sequence[Any],
        audio: Any,
        duration: float,
        warnings: Sequence[str] = (),
        *,
        language: str | None = None,
    ) -> None:
        """Add segments[done:] to the files (all of it, whole, where a file or the list is not as last
        written). audio: the transcript's audio (an array or a Signal, read by range) for the cues of
        segments without timed words; duration: its length in seconds; warnings: the JSON's, with
        those file_warnings adds; language: the JSON's language while there is no segment.
        Raises OutputFailed naming the first file that could not be written; the files written before
        it hold the new segments, it and those after it do not."""
        whole = not self._continues(segments) or not all(f.intact() for f in self.files.values())
        if whole:
            self._start()
        new = list(segments[self.done :])
        data = self._pieces(new, audio, duration, warnings, language)
        self.done, self.last = len(segments), (segments[-1] if segments else None)
        for fmt, file in self.files.items():
            head, body, tail = data[fmt]
            try:
                if whole:
                    file.replace(head + body + tail, tail)
                elif not file.extend(body + tail, tail):
                    # Changed behind our back since the check: every file is written whole.
                    self._failed()
                    return self.write(segments, audio, duration, warnings, language=language)
            except OSError as e:
                self._failed()
                raise OutputFailed(file.path, e) from None
            except BaseException:
                self._failed()
                raise

    def _failed(self) -> None:
        """After a failed write: every file is written whole next time."""
        for file in self.files.values():
            file.size = None

    # --- the documents --------------------------------------------------------------------------

    def _pieces(
        self, new: list[Any], audio: Any, duration: float, warnings: Sequence[str], language: str | None
    ) -> dict[str, tuple[bytes, bytes, bytes]]:
        """For each format: (its head, what the new segments add, its tail), as UTF-8; the counts kept
        move past the new segments."""
        cues = []
        if {"srt", "vtt"} & set(self.files):
            cues = build_cues(
                new,
                audio,
                sample_rate=SAMPLE_RATE,
                options=self.options.cues,
                duration=duration,
                after=self.cue_end,
            )
        out: dict[str, tuple[str, str, str]] = {}
        for fmt in self.files:
            if fmt == "txt":
                paragraphs = txt_paragraphs(
                    new, speaker_format=self.speaker_format, speaker=self.text_speaker
                )
                body = "\n\n".join(paragraphs) + "\n" if paragraphs else ""
                out[fmt] = ("", ("\n" if self.paragraphs and body else "") + body, "")
                self.paragraphs += len(paragraphs)
            elif fmt == "srt":
                blocks = srt_blocks(
                    cues,
                    highlight_words=self.options.highlight_words,
                    speaker_format=self.speaker_format,
                    first=self.srt_blocks + 1,
                    speaker=self.cue_speaker,
                )
                out[fmt] = ("", "".join(blocks), "")
                self.srt_blocks += len(blocks)
            elif fmt == "vtt":
                blocks = vtt_blocks(cues, highlight_words=self.options.highlight_words)
                body = "\n".join(blocks)
                out[fmt] = ("WEBVTT\n\n", ("\n" if self.vtt_blocks and body else "") + body, "")
                self.vtt_blocks += len(blocks)
            else:
                out[fmt] = self._json(new, duration, warnings, language)
        if cues:
            self.cue_end = cues[-1].end
        self.cue_speaker = next(
            (c.speaker for c in reversed(cues) if c.speaker is not None), self.cue_speaker
        )
        spoken = [s for s in new if txt_paragraphs([s])]
        self.text_speaker = next(
            (s.speaker for s in reversed(spoken) if getattr(s, "speaker", None) is not None),
            self.text_speaker,
        )
        return {fmt: tuple(part.encode("utf-8") for part in parts) for fmt, parts in out.items()}

    def _json(
        self, new: list[Any], duration: float, warnings: Sequence[str], language: str | None
    ) -> tuple[str, str, str]:
        """The growing JSON document: (its head, the new segments, its closing fields)."""
        head = {
            "partial": True,
            "model": self.model,
            "options": self.options.to_dict(),
            "source": self.source,
        }
        items = [_indented(segment_json(s), 4) for s in new]
        body = "".join(("," if self.done or k else "") + "\n    " + item for k, item in enumerate(items))
        for s in new:
            if s.language:
                self.languages[s.language] += s.end - s.start
            if s.truncated or s.repetitive:
                self.flagged.append(s)
        told = Transcription(text="", language="", segments=self.flagged, warnings=list(warnings))
        tail = {
            # As the finished document's: the language spoken longest (main_language).
            "language": (
                (self.languages.most_common(1)[0][0] if self.languages else "")
                if self.done or new
                else (language or "")
            ),
            "duration": duration,
            "truncated": any(s.truncated for s in self.flagged),
            "repetitive": any(s.repetitive for s in self.flagged),
            "audio_truncated": False,
            "header_duration": None,
            "warnings": file_warnings(told),
        }
        return (
            "{\n" + _members(head) + ',\n  "segments": [',
            body,
            "\n  ],\n" + _members(tail) + "\n}\n",
        )
