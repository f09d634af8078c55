"""`mlxasr align`: time a transcript the user already has.

mlxasr align talk.wav --text talk.txt --srt
mlxasr align talk.wav --text corrected.srt --srt --vtt -o out/

The text is a plain transcript (.txt, or any other name: its paragraphs, separated by blank lines, are
kept as paragraphs) or a subtitle file (.srt, .vtt: its timings are ignored, each cue's text is kept and
stays a cue of its own, split further only where a cue breaks the subtitle limits). Its words are timed
by the forced aligner (long audio in pieces, mlx_qwen3asr.pipeline.retime) and written as `mlxasr`
writes a transcription: the same outputs, cue rules and no-clobber rules (existing outputs are kept
unless --overwrite).
"""

from __future__ import annotations

import argparse
import html
import os
import re
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import not_regular_reason, read_audio
from mlx_qwen3asr.cli.diarizing import (
    Diarization,
    DiarizeQueue,
    Unavailable,
    add_diarization,
    check_diarization,
    turn_warnings,
)
from mlx_qwen3asr.cli.diarizing import failure as diarize_failure
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.loading import load_in_order
from mlx_qwen3asr.cli.options import (
    ALIGNER_ENV,
    DEFAULT_ALIGNER,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RTTM,
    add_dtype,
    add_formats,
    add_speech_detection,
    check_vad,
    chosen_formats,
    moot,
    vad_options,
)
from mlx_qwen3asr.cli.plan import remove_created
from mlx_qwen3asr.cli.stdio import Say
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputFile,
    OutputClash,
    TranscribeOptions,
    existing_outputs,
    output_problem,
    plan_jobs,
    prepare_output_folder,
    write_outputs,
)
from mlx_qwen3asr.pipeline.alignment import aligner_languages
from mlx_qwen3asr.pipeline.retime import PIECE_SECONDS, TranscriptTooLong, retime_transcript
from mlx_qwen3asr.text.languages import guess_text_language, resolve_language
from mlx_qwen3asr.text.words import is_cjk, split_items

__all__ = ["AlignError", "build_parser", "main", "read_blocks"]

PROG = "mlxasr align"
# A transcript larger than this is no transcript of one recording.
MAX_TEXT_BYTES = 16 * 1024 * 1024

DESCRIPTION = """\
Time the words of a transcript you already have with the forced aligner, and write subtitles or JSON
with word times. The text is a plain transcript (its paragraphs kept) or an .srt/.vtt subtitle file:
its timings are ignored and each cue's text is re-timed, keeping the cues as cues (a cue too long for
the subtitle limits is split further). Long audio is cut at quiet points into pieces the aligner takes
(at most 180 s), and the words are shared out among them."""

EPILOG = f"""\
examples:
  mlxasr align talk.wav --text talk.txt --srt
  mlxasr align talk.m4a --text corrected.srt --srt --vtt -o out/
  mlxasr align interview.wav --text interview.txt --json --language de

Outputs are named after the audio ("talk.wav" -> "talk.srt"), beside it or under -o DIR. An existing
output is kept unless --overwrite is given; an output may not replace the --text file.

exit status:
  {EXIT_OK}    the outputs were written, or kept because they exist
  {EXIT_FAILED}    the audio could not be decoded, the transcript is far longer than the audio can
       hold (nothing aligned), its speakers could not be told apart (--diarize), or an output
       could not be written
  {EXIT_USAGE}    usage error (bad option, missing audio or text file, unreadable or empty text, a
       language the aligner does not know, an output that would replace the text), the output
       folder cannot be created or written (checked before the audio is decoded), the aligner
       could not be loaded or is a speech recognition model, or --diarize has not its extra or its
       model files; nothing is written
  {EXIT_INTERRUPTED}  interrupted with Ctrl-C, nothing is written ({EXIT_TERMINATED} for SIGTERM)

The aligner defaults to ${ALIGNER_ENV} or {DEFAULT_ALIGNER}."""


class AlignError(Exception):
    """A problem that stops the command: one line, and the exit status it ends with."""

    def __init__(self, message: str, status: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.status = status


def build_parser() -> argparse.ArgumentParser:
    """The `mlxasr align` argument parser."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("audio", metavar="AUDIO", help="the audio or video file the text is spoken in")
    p.add_argument(
        "--text",
        "-t",
        required=True,
        type=Path,
        metavar="FILE",
        help="the transcript: plain text, or .srt/.vtt subtitles whose cue texts are re-timed (UTF-8)",
    )
    out = p.add_argument_group("output (without a format option, SRT subtitles are written)")
    add_formats(
        out,
        {
            "txt": "plain-text transcript",
            "srt": "SubRip subtitles",
            "vtt": "WebVTT subtitles",
            "json": "text, segments with word times, cues, aligner and options",
            "rttm": "who spoke when, in RTTM (turns on --diarize)",
        },
    )
    out.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write the outputs in DIR (default: beside the audio)",
    )
    out.add_argument(
        "--overwrite", action="store_true", help="replace existing outputs (without it they are kept)"
    )
    model = p.add_argument_group("aligner")
    model.add_argument(
        "--aligner",
        default=None,
        metavar="A",
        help=f"forced aligner checkpoint folder or repo id (default: ${ALIGNER_ENV} or {DEFAULT_ALIGNER})",
    )
    add_dtype(model)
    model.add_argument(
        "--language",
        metavar="L",
        help="the language of the text, by name or code (default: guessed from its script: Japanese with "
        "kana, Korean with Hangul, Chinese with Han characters, else English); it decides how words are "
        "cut (Japanese and Korean differ) and must be one the aligner knows",
    )
    speakers = p.add_argument_group("speakers (who said what)")
    add_diarization(speakers)
    add_speech_detection(
        speakers,
        "with --diarize: speech detection (Silero VAD) finds where someone speaks and only that is "
        "diarized (default: on; --no-vad diarizes all the audio)",
    )
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


# --- reading the text -------------------------------------------------------------------------------

_TAG = re.compile(r"<[^<>]*>|\{\\[^{}]*\}")  # <i>, </b>, <c.yellow>, <v Name>, <00:01.000>, {\an8}
_BLOCKS = re.compile(r"\n[ \t]*\n")
# A cue's timing line: SRT "00:00:01,000 --> 00:00:02,500" (some write "."), VTT "01.000 --> 02.500"
# with hours optional and cue settings after it.
_TIME = r"(?:\d+:)?\d{1,2}:\d{2}[,.]\d{1,3}"
_TIMING = re.compile(rf"[ \t]*{_TIME}[ \t]*-->[ \t]*{_TIME}(?:[ \t].*)?")
_NO_CUES = "no subtitle cues found (no line with a timing such as 00:00:01,000 --> 00:00:02,000)"


def _join_lines(lines: Sequence[str]) -> str:
    """The lines of a cue or paragraph as one line: a space between them, none between CJK ideographs."""
    out = ""
    for line in (" ".join(line.split()) for line in lines):
        if not line:
            continue
        if out and not (is_cjk(out[-1]) and is_cjk(line[0])):
            out += " "
        out += line
    return out


def _cue_texts(text: str, vtt: bool, name: str) -> list[str]:
    """The text of every cue. A line with `-->` that is no timing (two times) is an AlignError naming
    it: the file is damaged or no subtitle file, and its text would be read wrongly."""
    blocks: list[tuple[int, list[str]]] = []  # the number of each block's first line, and its lines
    current: list[str] = []
    first = 1
    for number, line in enumerate([*text.split("\n"), ""], 1):
        if line.strip(" \t"):
            first = first if current else number
            current.append(line)
        elif current:  # a blank line ends a block
            blocks.append((first, current))
            current = []
    cues = []
    for first, lines in blocks:
        timing = next((i for i, line in enumerate(lines) if "-->" in line), None)
        if timing is None:  # WEBVTT header, NOTE, STYLE and REGION blocks, stray lines
            continue
        if not _TIMING.fullmatch(lines[timing]):
            shown = " ".join(lines[timing].split())
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise AlignError(
                f"{name}: line {first + timing}: {shown!r} is no cue timing (such as 00:00:01,000 --> "
                "00:00:02,000); not a valid subtitle file"
            )
        body = [_TAG.sub("", line) for line in lines[timing + 1 :]]
        if vtt:
            body = [html.unescape(line) for line in body]
        cues.append(_join_lines(body))
    return cues


def read_blocks(path: Path) -> tuple[list[str], str]:
    """The blocks of text to time, from a transcript (its paragraphs) or subtitles (its cue texts),
    and what they are ("paragraph" or "cue"). Raises AlignError naming the file and the reason."""
    name = f"--text {path}"
    st = _regular_file(path, name, "is a folder, not a text file")
    if st.st_size > MAX_TEXT_BYTES:
        raise AlignError(
            f"{name}: larger than {MAX_TEXT_BYTES // (1024 * 1024)} MB; no transcript is that long"
        )
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise AlignError(f"{name}: cannot read it ({(e.strerror or str(e)).lower()})") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise AlignError(f"{name}: not UTF-8 text (byte {e.start})") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    suffix = path.suffix.lower()
    if suffix in (".srt", ".vtt") or text.lstrip().startswith("WEBVTT"):
        vtt = suffix == ".vtt" or text.lstrip().startswith("WEBVTT")
        blocks, kind = _cue_texts(text, vtt, name), "cue"
        if not any(blocks) and text.strip():
            raise AlignError(f"{name}: {_NO_CUES}")
    else:
        blocks, kind = [_join_lines(b.split("\n")) for b in _BLOCKS.split(text)], "paragraph"
    blocks = [b for b in blocks if b]
    if not blocks:
        raise AlignError(f"{name}: the text is empty")
    return blocks, kind


# --- the command ------------------------------------------------------------------------------------


def _regular_file(path, name: str, folder: str) -> os.stat_result:
    """The stat of a regular file, or AlignError naming it (name) and why not (folder: for a folder)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise AlignError(f"{name}: no such file") from None
    except OSError as e:
        raise AlignError(f"{name}: cannot read it ({(e.strerror or str(e)).lower()})") from None
    if stat.S_ISDIR(st.st_mode):
        raise AlignError(f"{name}: {folder}")
    kind = not_regular_reason(st.st_mode)
    if kind is not None:
        raise AlignError(f"{name}: {kind}")
    return st


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.normcase(os.path.abspath(a)) == os.path.normcase(os.path.abspath(b))


def _align(args: argparse.Namespace, say: Say, diarization: Diarization | None = None) -> int:
    try:
        language = resolve_language(args.language)
    except ValueError as e:
        raise AlignError(f"--language: {e}") from None
    blocks, kind = read_blocks(args.text)
    if language is None:
        language = guess_text_language(" ".join(blocks))
    _regular_file(args.audio, args.audio, "is a folder; give one audio file")
    if args.output_dir is not None and args.output_dir.exists() and not args.output_dir.is_dir():
        raise AlignError(f"-o/--output-dir: {args.output_dir} is not a folder")
    try:
        (job,) = plan_jobs([InputFile(Path(args.audio))], chosen_formats(args, "srt"), args.output_dir)
    except OutputClash as e:  # one input: cannot happen, but it would be a usage error
        raise AlignError(str(e)) from None
    for path in job.outputs.values():
        if _same_file(path, args.text):
            raise AlignError(
                f"output {path} would replace the --text file; write the outputs elsewhere with -o DIR"
            )
    problem = output_problem(job)
    if problem is not None:
        raise AlignError(problem, EXIT_FAILED)
    taken = existing_outputs(job)
    if taken and not args.overwrite:
        names = ", ".join(str(job.outputs[f]) for f in taken)
        if len(taken) == len(job.outputs):
            say.info(f"kept existing {names}; nothing to do (--overwrite replaces them)")
            return EXIT_OK
        say.info(f"keeping existing {names} (--overwrite replaces them)")
    # The folder is made and probed before the audio is decoded or any model loads; one this made is
    # removed again when the command stops before writing in it.
    created: list[Path] = []
    try:
        folder = next(iter(job.outputs.values())).parent
        problem = prepare_output_folder(folder, created)
        if problem is not None:
            raise AlignError(problem)
        return _decode_and_align(args, say, diarization, job, blocks, kind, language)
    finally:
        remove_created(created)


def _decode_and_align(
    args: argparse.Namespace,
    say: Say,
    diarization: Diarization | None,
    job: FileJob,
    blocks: list[str],
    kind: str,
    language: str,
) -> int:
    try:
        decoded = read_audio(args.audio)
    except AudioError as e:
        raise AlignError(f"{args.audio}: {e.reason}", EXIT_FAILED) from None
    signal = decoded.signal
    speakers = None
    try:

        def diarize(diarizer) -> None:  # the audio is diarized on a worker thread while words are timed
            nonlocal speakers
            speakers = DiarizeQueue(
                diarizer, diarization.options, read=lambda samples: samples, vad=vad_options(args)
            )
            speakers.submit(0, signal.samples())

        loaded = load_in_order(
            args, say, diarization=diarization, model=False, required=True, diarizer_loaded=diarize
        )
        if loaded is None:
            raise AlignError("", EXIT_USAGE)  # said already
        aligner, source = loaded.aligner.model, loaded.aligner.source
        known = aligner_languages(aligner)
        if language not in known:
            raise AlignError(
                f"--language: {language} is not among the aligner's languages ({', '.join(known)})"
            )
        # The words as the aligner times them: Chinese and Japanese are cut without spaces.
        words = sum(len(split_items(block, language)) for block in blocks)
        say.info(f"timing {words} words in {len(blocks)} {kind}(s)")
        try:
            result = retime_transcript(aligner, signal, blocks, language)
        except TranscriptTooLong as e:
            raise AlignError(f"{args.audio}: {e}", EXIT_FAILED) from None
        result.warnings[:0] = decoded.warnings
        if decoded.truncated:
            result.header_duration = decoded.header_seconds
        if speakers is not None:
            outcome = speakers.outcome(0)
            try:
                if outcome.error is not None:
                    raise outcome.error
                result = diarization.assign(result, outcome.turns)
                result.warnings.extend(turn_warnings(outcome.turns))
            except Exception as e:
                raise AlignError(f"{args.audio}: {diarize_failure(e)}", EXIT_FAILED) from None
        options = TranscribeOptions(
            language=language,
            max_segment_seconds=PIECE_SECONDS,
            word_timestamps=True,
            aligner=source,
            speaker_format=None if diarization is None else diarization.speaker_format,
        )
        try:
            written = write_outputs(job, result, signal, options, model_name=source, overwrite=args.overwrite)
        except OSError as e:
            where = f" {e.filename}" if e.filename else ""
            raise AlignError(
                f"cannot write output{where} ({(e.strerror or str(e)).lower()})", EXIT_FAILED
            ) from None
    finally:
        if speakers is not None:
            speakers.close()  # after Ctrl-C the diarizer is not waited for
        signal.close()
    for warning in result.warnings:
        say.warning(f"{args.audio}: {warning}")
    if written.kept:
        say.info(f"kept existing {', '.join(map(str, written.kept))} (--overwrite replaces them)")
    if written.written:
        say.info(f"wrote {', '.join(map(str, written.written))}")
    return EXIT_OK


def main(argv: Sequence[str] | None = None) -> int:
    """Run `mlxasr align` with the given arguments (default: sys.argv[2:]); returns the exit status."""
    return stopped(
        PROG,
        lambda: _main(sys.argv[2:] if argv is None else list(argv)),
        after="; nothing was written",
        errors=AlignError,
        on_error=_said,
    )


def _said(e: AlignError) -> int:
    if str(e):  # an empty one was said already
        Say(PROG, False).error(str(e))
    return e.status


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    say = Say(PROG, args.quiet)
    if RTTM in chosen_formats(args, None):  # speaker turns are what diarization gives
        args.diarize = True
    try:
        check_vad(parser, args)
        diarization = check_diarization(parser, args)
        if diarization is None and (not args.vad or args.vad_threshold is not None):
            moot(parser, "--no-vad" if not args.vad else "--vad-threshold", "without --diarize")
    except Unavailable as e:
        say.error(str(e))
        return EXIT_USAGE
    return _align(args, say, diarization)
