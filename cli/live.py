"""`mlxasr live`: live transcription on the terminal.

mlxasr live                                   the microphone (needs the sounddevice package)
ffmpeg -i talk.m4a -f wav - | mlxasr live -   a WAV stream, or raw 16-bit PCM, on standard input
mlxasr live --input talk.m4a --realtime       a file played at speaking pace

The audio goes through mlx_qwen3asr.pipeline.streaming.StreamingTranscriber: the transcript is revised
every chunk and committed at pauses, so each step costs about the same at minute 1 and hour 3. On a
terminal the committed text is printed as it commits and the words still being revised are shown
dimmed below it; otherwise each committed segment is printed as "[start --> end] text". Outputs (TXT,
SRT, WebVTT, JSON) are rewritten crash-safely after each commit, so they always hold every committed
segment; Ctrl-C finishes the last words, writes them and exits with status 130. Speech detection is
on as for files (--no-vad turns it off): silence and noise never reach the model, and text is
committed where the speech pauses.
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

from mlx_qwen3asr.audio.features import SAMPLE_RATE
from mlx_qwen3asr.audio.vad import VadUnavailable
from mlx_qwen3asr.cli.exits import stopped
from mlx_qwen3asr.cli.live_display import Display, segment_line
from mlx_qwen3asr.cli.live_error import LiveError
from mlx_qwen3asr.cli.live_outputs import LiveOutputs
from mlx_qwen3asr.cli.live_plan import MICROPHONE_NAME, STDIN_NAME, outputs_lock, plan_outputs
from mlx_qwen3asr.cli.live_sources import STDIN, WavStream, open_source, stdin_is_terminal, stdin_ready
from mlx_qwen3asr.cli.live_stop import Stop
from mlx_qwen3asr.cli.loading import load_in_order, untimed
from mlx_qwen3asr.cli.models import load_model
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    add_formats,
    add_model,
    add_speech_detection,
    add_word_timing,
    check_vad,
    int_in,
    moot,
    number_in,
    span,
    vad_options,
)
from mlx_qwen3asr.cli.stdio import Say
from mlx_qwen3asr.outputs.folder import FileJob, TranscribeOptions
from mlx_qwen3asr.pipeline.live_session import AudioKeepError, LiveSession
from mlx_qwen3asr.pipeline.memory import wired_limit
from mlx_qwen3asr.pipeline.streaming import DEFAULT_MAX_WINDOW_SECONDS, StreamingTranscriber, StreamUpdate
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.text.languages import resolve_language

__all__ = ["LiveError", "StreamUpdate", "WavStream", "build_parser", "main", "segment_line"]

PROG = "mlxasr live"

CHUNK_SECONDS_RANGE = (0.1, 30.0)
WINDOW_SECONDS_RANGE = (3.0, 600.0)
NEW_TOKENS_RANGE = (1, 100_000)
# Audio handed to the transcriber at a time: small enough that a stream read or a played file keeps
# pace with speech, large enough not to cost a step per block.
BLOCK_SECONDS = 0.1
READ_BYTES = 1 << 15

EPILOG = f"""\
sources:
  mlxasr live                      the default microphone (pip install 'mlx-qwen3asr[live]')
  mlxasr live -                    standard input: a WAV stream (any PCM or float encoding, rate and
                                   channel count), or else raw 16-bit little-endian mono PCM at
                                   --sample-rate (16000 Hz by default); its end ends the session
  mlxasr live --input FILE         any audio or video file mlxasr reads, as fast as it goes, or at
                                   speaking pace with --realtime

examples:
  ffmpeg -loglevel error -i talk.m4a -f wav - | mlxasr live - --srt --name talk
  arecord -q -f S16_LE -r 16000 -c 1 | mlxasr live - --txt -o notes/
  mlxasr live --input lecture.mp3 --realtime --language en

outputs:
  With a format option (--txt, --srt, --vtt, --json), -o DIR or --name NAME, the committed segments
  are written to DIR/NAME.txt, DIR/NAME.srt, ... (TXT when no format is named) and rewritten after
  each commit, each file replaced whole. -o is the output folder, as for mlxasr (default: beside the
  --input file); NAME defaults to the --input file's name without its extension, to "stdin" for
  standard input and to "microphone" (an audio or output extension given with it is dropped:
  --name talk.wav writes talk.txt). Outputs of standard input or the microphone need -o DIR or
  --name NAME (then in the current folder). Existing outputs are refused before the model loads
  unless --overwrite is given. With SRT or VTT (or --word-timestamps) the words of each
  committed segment are timed by the forced aligner, so cues break between words; an aligner that
  cannot be had gives one line and estimated cue times.

exit status:
  {EXIT_OK}    the source ended and the outputs were written
  {EXIT_FAILED}    the audio could not be read (a damaged stream, a file that does not decode), or an
       output could not be written; what was committed before is written
  {EXIT_USAGE}    usage error (bad option, existing outputs, no microphone or no sounddevice), or the
       model could not be loaded; nothing is written
  {EXIT_INTERRUPTED}  Ctrl-C: the last words are finished and the outputs written ({EXIT_TERMINATED} for SIGTERM)"""


def build_parser() -> argparse.ArgumentParser:
    """The `mlxasr live` argument parser."""
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Transcribe live audio on the terminal: the microphone, a stream on standard input,\n"
        "or a file played at speaking pace.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "source",
        nargs="?",
        metavar="-",
        help="read the audio from standard input (default: the microphone)",
    )
    p.add_argument("--input", "-i", metavar="FILE", help="transcribe an audio or video file as a live stream")
    p.add_argument(
        "--realtime",
        action="store_true",
        help="with --input: send the file's audio at speaking pace (default: as fast as it goes)",
    )
    p.add_argument(
        "--sample-rate",
        type=int,
        default=SAMPLE_RATE,
        metavar="HZ",
        help=f"rate of raw PCM on standard input (default: {SAMPLE_RATE}; a WAV stream states its own)",
    )
    model = p.add_argument_group("model")
    add_model(model)
    model.add_argument(
        "--language", metavar="L", help="force the language, by name or code (default: detect)"
    )
    model.add_argument(
        "--context",
        "--initial-prompt",
        dest="context",
        default="",
        metavar="TEXT",
        help="context for the model: names, terms, the topic",
    )
    model.add_argument(
        "--chunk-seconds",
        type=number_in(CHUNK_SECONDS_RANGE),
        default=2.0,
        metavar="S",
        help=f"audio per update ({span(CHUNK_SECONDS_RANGE)}; default: 2)",
    )
    model.add_argument(
        "--max-window-seconds",
        type=number_in(WINDOW_SECONDS_RANGE),
        default=DEFAULT_MAX_WINDOW_SECONDS,
        metavar="S",
        help=f"most audio since the last commit: text is committed at a pause past half of it, and at a cut "
        f"once it is reached ({span(WINDOW_SECONDS_RANGE)}; default: {DEFAULT_MAX_WINDOW_SECONDS:g}); at least "
        "twice --chunk-seconds plus 1",
    )
    model.add_argument(
        "--max-new-tokens",
        type=int_in(NEW_TOKENS_RANGE),
        default=None,
        metavar="N",
        help="most tokens one update may write, language header included (default: 32 plus 12.5 a "
        "second of the audio decoded); a lower one bounds the time a runaway output costs",
    )
    add_word_timing(model)
    add_speech_detection(model)
    out = p.add_argument_group("output")
    add_formats(
        out,
        {
            "txt": "plain-text transcript",
            "srt": "SubRip subtitles",
            "vtt": "WebVTT subtitles",
            "json": "text, segments, cues and options",
        },
        lists=False,
    )
    out.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write the outputs in DIR, as mlxasr does (default: beside the --input file; standard input "
        "and the microphone need -o DIR or --name NAME)",
    )
    out.add_argument(
        "--name",
        metavar="NAME",
        help=f"the outputs' name: DIR/NAME.txt, DIR/NAME.srt, ... (default: the --input file's name without "
        f"its extension; {STDIN_NAME} for standard input; {MICROPHONE_NAME} for the microphone)",
    )
    out.add_argument("--overwrite", action="store_true", help="replace existing outputs")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    return p


# --- the session ----------------------------------------------------------------------------------


def _session(args: argparse.Namespace, say: Say, stop: Stop) -> int:
    if args.source is not None and args.source != STDIN:
        raise LiveError(
            f"{args.source!r}: the only source argument is - (standard input); a file goes with --input"
        )
    if args.sample_rate != SAMPLE_RATE and args.source != STDIN:
        raise LiveError("--sample-rate is the rate of raw PCM on standard input: use it with -")
    if args.source == STDIN and stdin_is_terminal():  # typed text would be read as PCM
        raise LiveError(f"{STDIN} reads audio from standard input, which is a terminal; pipe audio in")
    try:
        language = resolve_language(args.language)
    except ValueError as e:
        raise LiveError(f"--language: {e}") from None
    least = 2 * args.chunk_seconds + 1.0  # the two chunks still revised, plus a second to commit
    if args.max_window_seconds < least:
        raise LiveError(
            f"--max-window-seconds {args.max_window_seconds:g}: must be at least {least:g} "
            f"with --chunk-seconds {args.chunk_seconds:g}"
        )
    job = plan_outputs(args)
    with outputs_lock(job), contextlib.ExitStack() as cleanup:
        return _run_session(args, say, stop, job, language, cleanup)


def _run_session(
    args: argparse.Namespace,
    say: Say,
    stop: Stop,
    job: FileJob | None,
    language: str | None,
    cleanup: contextlib.ExitStack,
) -> int:
    # Until the session starts nothing is written: a stop ends the command at once.
    stop.waiting = True
    try:
        if args.source == STDIN and not stdin_ready():
            # Nothing is there yet (the stream may start much later): say so, and load the model
            # meanwhile rather than once the first bytes come.
            say.info("waiting for audio on standard input")
            model = load_model(args.model, args.dtype, say)
            name, blocks, drain = open_source(args, stop, say, cleanup)
        else:
            name, blocks, drain = open_source(args, stop, say, cleanup)
            model = load_model(args.model, args.dtype, say)
    finally:
        stop.waiting = False
    if model is None:
        return EXIT_USAGE
    cleanup.enter_context(wired_limit(model))  # on Metal: weights and caches resident for the session
    vad = vad_options(args)
    try:
        transcriber = StreamingTranscriber(
            model,
            language=language,
            context=args.context,
            chunk_seconds=args.chunk_seconds,
            max_window_seconds=args.max_window_seconds,
            max_new_tokens=args.max_new_tokens,
            vad=vad,
        )
    except (ValueError, VadUnavailable) as e:
        raise LiveError(one_line(e)) from None
    aligner, aligner_source = None, None
    timed = args.word_timestamps
    if timed is None:  # timing words matters for subtitles, not for a transcript
        timed = job is not None and bool({"srt", "vtt"} & set(job.outputs))
    if job is not None and timed:
        # The model is loaded already, beside the source (load_in_order's order).
        loaded = load_in_order(args, say, model=False, aligner=untimed(job.outputs))
        if loaded is None:
            return EXIT_USAGE
        aligner = loaded.aligner.model
        aligner_source = loaded.aligner.source if aligner is not None else None
    options = TranscribeOptions(
        language=language,
        context=args.context,
        max_segment_seconds=args.max_window_seconds,
        word_timestamps=aligner is not None,
        aligner=aligner_source,
        vad=vad,
    )
    outputs = LiveOutputs(job, options, args.model)
    session = LiveSession(
        transcriber,
        keep_audio=job is not None,
        aligner=aligner,
        language=language,
        warn=say.warning,
        vad=vad is not None,
    )
    failure = _stream(session, outputs, name, blocks, drain, language, args.quiet, say, stop)
    if outputs.written:
        say.info(f"wrote {', '.join(map(str, outputs.written))}")
    if failure is not None:
        raise failure
    if stop.signum == signal.SIGTERM:
        say.info("terminated; the outputs hold everything transcribed")
        return EXIT_TERMINATED
    if stop.signum is not None:
        say.info("interrupted; the outputs hold everything transcribed")
        return EXIT_INTERRUPTED
    return EXIT_OK


def _stream(session, outputs, name, blocks, drain, language, quiet, say, stop) -> LiveError | None:
    """The source's blocks through the session, shown and written as they commit, then its end: the
    failure that ended the source early, if any (what came before is written)."""
    audio = session.audio
    display = Display(quiet)
    failure: LiveError | None = None
    try:
        if name == MICROPHONE_NAME:
            say.info("listening; Ctrl-C ends the session")
        try:
            for block in stop.blocks(blocks, drain):
                for update in session.feed(block):
                    display.update(update, session.committed_before(update))
                    if update.committed:
                        outputs.write(session, audio.signal(), language)
        except AudioKeepError as e:
            failure = LiveError(str(e), EXIT_FAILED)
        except LiveError as e:
            failure = e
        if audio.count == 0 and failure is None and stop.signum is None:
            failure = LiveError(f"{name}: no audio samples", EXIT_FAILED)
        if audio.count or session.segments:
            final = session.finish()
            display.update(final, session.committed_before(final))
            warnings = session.warnings()
            for line in warnings:
                say.warning(line)
            outputs.write(session, audio.signal(), language, warnings, final=True)
    finally:
        display.close()
        session.close()
    return failure


def main(argv: Sequence[str] | None = None) -> int:
    """Run `mlxasr live` with the given arguments (default: sys.argv[2:]); returns the exit status."""
    return stopped(
        PROG, lambda: _main(sys.argv[2:] if argv is None else list(argv)), errors=LiveError, on_error=_said
    )


def _said(e: LiveError) -> int:
    Say(PROG, False).error(str(e), e.label)
    return e.status


def _main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    check_vad(parser, args)
    if args.word_timestamps is False and args.aligner is not None:
        moot(parser, "--aligner", "with --no-word-timestamps (words are not timed)")
    say = Say(PROG, args.quiet)
    stop = Stop()
    in_main = threading.current_thread() is threading.main_thread()
    old = {}
    if in_main:
        old = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return _session(args, say, stop)
    finally:
        if in_main and stop.signum is None:
            for sig, handler in old.items():
                signal.signal(sig, handler)
