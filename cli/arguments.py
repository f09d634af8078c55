"""The `mlxasr` command line: its options, their ranges and defaults, its help and exit statuses."""

from __future__ import annotations

import argparse
from pathlib import Path

from mlx_qwen3asr import __version__
from mlx_qwen3asr.cli.diarizing import add_diarization
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    MODEL_ENV,
    add_batch_size,
    add_formats,
    add_model,
    add_speech_detection,
    add_word_timing,
    int_in,
    moot,
    number_in,
    span,
)
from mlx_qwen3asr.cli.stdio import STDIN
from mlx_qwen3asr.cli.watch import WATCH_INTERVAL, WATCH_INTERVAL_RANGE
from mlx_qwen3asr.outputs.cue_types import CueOptions
from mlx_qwen3asr.outputs.render import HIGHLIGHT_STYLES
from mlx_qwen3asr.pipeline.inputs import DEFAULT_MAX_SEGMENT_SECONDS
from mlx_qwen3asr.runtime.device import tuning

__all__ = ["build_parser", "refuse_moot"]

# Limits of the numeric options. A segment must hold at least one 100-frame (1 s) mel chunk; at
# 1200 s (the official pipeline's longest input) its audio tokens and token budget still fit well
# inside the decoder's 65536 positions.
SEGMENT_SECONDS_RANGE = (1.0, 1200.0)
CUE_SECONDS_RANGE = (CueOptions.min_duration, 3600.0)
LINE_WIDTH_RANGE = (10, 1000)
LINE_COUNT_RANGE = (1, 20)
PAUSE_SECONDS_RANGE = (0.05, 10.0)
CUE_GAP_RANGE = (0.0, 1.0)
CPS_RANGE = (1.0, 100.0)
WORDS_PER_LINE_RANGE = (1, 100)

DESCRIPTION = """\
Transcribe audio and video files with Qwen3-ASR on MLX. Folders are searched recursively
(hidden files skipped). Each output goes beside its input, named like the input without its
extension ("talk.m4a" -> "talk.srt"), or under --output-dir: each folder argument under its own
name mirroring its tree ("rec/a/b.wav" -> "DIR/rec/a/b.srt"), each file argument at the top.
Files whose outputs all exist are skipped, so an interrupted run resumes."""

EPILOG = f"""\
commands (each with its own --help):
  mlxasr PATH ...                  transcribe files and folders (the default)
  mlxasr align AUDIO --text FILE   time a transcript or subtitles you already have
  mlxasr live [-]                  live transcription of the microphone or standard input
  mlxasr convert SRC -o DST        convert a checkpoint to MLX, optionally quantized
  mlxasr serve                     run the transcription server (OpenAI-compatible API)
  A first argument align, convert, live or serve always names the command: to transcribe a
  file or folder of that name, write it as ./serve (./align, ./convert, ./live).

standard input:
  PATH - reads audio from standard input (ffmpeg ... -f wav - | mlxasr - --srt): without -o its one
  format's text goes to standard output; with -o it is written as DIR/stdin.<format>, the only way
  to give - with other PATHs.

examples:
  mlxasr ./recordings --srt
  mlxasr talk.m4a interview.wav -f srt,vtt,json -o subtitles/
  mlxasr ./lectures --txt --language en --context-file names.txt
  mlxasr meeting.m4a --diarize --srt --rttm --speaker-names "Ana,Bo"

existing outputs:
  An existing output file is never replaced unless --overwrite is given (or --watch sees its input
  change). A file whose requested outputs all exist is skipped (said so if the input is newer than
  them); one with some of them missing is transcribed and only the missing ones are written, the
  others are kept and named.
  An output that appears while its file is being transcribed is kept too. A run with --overwrite
  marks each file to replace with a hidden ".NAME.mlxasr-redo" beside its outputs until it has: if
  it is stopped, a rerun without --overwrite redoes the marked files and skips the finished ones.

watching folders (--watch):
  mlxasr ./inbox --srt --watch does the run above, then looks at ./inbox every second
  (--watch-interval) and transcribes each new audio file once its size and time are unchanged over
  two looks (a file still being copied in is not read), with the model kept loaded; a file is never
  transcribed twice. One that changes after it was handled is transcribed again and its outputs
  replaced; one that failed waits until it changes. Ctrl-C or SIGTERM ends the watch.

exit status:
  {EXIT_OK}    every file was transcribed, or skipped because its outputs exist
  {EXIT_FAILED}    some input failed (missing path, unreadable or undecodable file, FIFO or device,
       output folder not writable, output name too long or taken by a folder, its speakers could
       not be told apart with --diarize: no outputs, so a rerun redoes it); the other files
       were still processed, the summary lists the failures
  {EXIT_USAGE}    usage error (bad option, unknown --language, unreadable --context-file, none of
       the PATHs exists, files of two PATHs with the same output path), no output folder can be
       written, the model could not be loaded, or it is a forced aligner rather than a speech
       recognition model, --diarize without its extra or its model files; nothing is written
  {EXIT_INTERRUPTED}  interrupted with Ctrl-C: finished files are kept, no partial or temporary files
       are left, and rerunning without --overwrite resumes ({EXIT_TERMINATED} for SIGTERM)

The model is loaded only when there is something to transcribe; the default model can be set
with the {MODEL_ENV} environment variable."""


def refuse_moot(parser: argparse.ArgumentParser, args: argparse.Namespace, subtitles: bool) -> None:
    """Usage errors (options.moot) for options that others make moot: --aligner with
    --no-word-timestamps, a subtitle cue option without --srt or --vtt, --highlight-style without
    --highlight-words, --watch-interval without --watch (--vad-threshold and the speaker options are
    checked with their kind)."""
    if args.word_timestamps is False and args.aligner is not None:
        moot(parser, "--aligner", "with --no-word-timestamps (words are not timed)")
    if not subtitles and args.cue_options_given:
        moot(parser, args.cue_options_given[0], "without --srt or --vtt (only subtitles are cut into cues)")
    if "--highlight-style" in args.cue_options_given and not args.highlight_words:
        moot(parser, "--highlight-style", "without --highlight-words")
    if args.watch_interval is not None and not args.watch:
        moot(parser, "--watch-interval", "without --watch")


class _CueOption(argparse.Action):
    """Stores a subtitle cue option's value and records that the user gave it (args.cue_options_given,
    by option name), so that a run writing no subtitles can say it is ignored."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        given = list(getattr(namespace, "cue_options_given", None) or [])
        name = self.option_strings[-1]
        if name not in given:
            given.append(name)
        namespace.cue_options_given = given


def build_parser() -> argparse.ArgumentParser:
    """The mlxasr argument parser."""
    # The first screen of --help holds what most runs use; the other groups follow, each titled.
    p = argparse.ArgumentParser(
        prog="mlxasr",
        usage="%(prog)s [options] PATH [PATH ...]\n       %(prog)s {align,convert,live,serve} ... (see below)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        add_help=False,
    )
    common = p.add_argument_group("common options (without a format option, a .txt transcript is written)")
    common.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help=f"audio or video files and folders; {STDIN} reads audio from standard input (see 'standard "
        "input' below)",
    )
    common.add_argument("-h", "--help", action="help", help="show this help and exit")
    p.set_defaults(cue_options_given=[])
    add_formats(
        common,
        {
            "txt": "plain-text transcript, one paragraph per segment",
            "srt": "SubRip subtitles",
            "vtt": "WebVTT subtitles",
            "json": "text, language, segments with flags, cues, model and options",
            "rttm": "who spoke when, in RTTM (turns on --diarize)",
        },
    )
    common.add_argument(
        "-o",
        "--output-dir",
        type=Path,
        metavar="DIR",
        help="write outputs under DIR, folders mirrored (default: beside the inputs)",
    )
    common.add_argument(
        "--overwrite",
        action="store_true",
        help="replace existing outputs (default: keep them, skip done files)",
    )
    model = p.add_argument_group("model and word timing")
    add_model(common, dtype_group=model)
    common.add_argument(
        "--language",
        metavar="L",
        help="force the language, by name or code (English, en, zh, ...); default: detect per segment",
    )
    talk = common.add_mutually_exclusive_group()
    talk.add_argument("-q", "--quiet", action="store_true", help="print nothing but errors")
    talk.add_argument(
        "-v", "--verbose", action="store_true", help="print each segment's text as it is recognised"
    )
    common.add_argument("--version", action="version", version=f"mlxasr {__version__}")

    out = p.add_argument_group("more output")
    once = out.add_mutually_exclusive_group()
    once.add_argument("--dry-run", action="store_true", help="list what would be done, and do nothing")
    once.add_argument(
        "--watch",
        action="store_true",
        help="after the first pass, keep polling the PATHs and transcribe each new or changed audio file "
        "once it has stopped growing, the model kept loaded; Ctrl-C stops",
    )
    out.add_argument(
        "--library",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="also file each transcript, with its audio, in the transcript library (DIR; default: "
        "$MLXASR_LIBRARY, else the user's data folder); see mlxasr library",
    )
    out.add_argument(
        "--watch-interval",
        type=number_in(WATCH_INTERVAL_RANGE),
        default=None,
        metavar="S",
        help=f"seconds between two looks with --watch; a file is taken once it is unchanged over two looks "
        f"({span(WATCH_INTERVAL_RANGE)}; default: {WATCH_INTERVAL:g})",
    )

    add_word_timing(model)

    add_diarization(p.add_argument_group("speakers (who said what)"))

    rec = p.add_argument_group("recognition")
    ctx = rec.add_mutually_exclusive_group()
    ctx.add_argument(
        "--context",
        "--initial-prompt",
        dest="context",
        metavar="TEXT",
        help="text that biases recognition: names, terms, topic (--initial-prompt, as whisper calls it, is the same)",
    )
    ctx.add_argument("--context-file", type=Path, metavar="F", help="read the --context text from a file")
    rec.add_argument(
        "--max-segment-seconds",
        type=number_in(SEGMENT_SECONDS_RANGE),
        default=DEFAULT_MAX_SEGMENT_SECONDS,
        metavar="S",
        help=f"longest piece of audio given to the model at once, cut at the quietest point "
        f"({span(SEGMENT_SECONDS_RANGE)}; default: {DEFAULT_MAX_SEGMENT_SECONDS:g})",
    )
    add_speech_detection(rec)
    add_batch_size(rec, "from one long file or from several files", f", at most {tuning().max_batch}")

    cues = p.add_argument_group("subtitle cues (SRT and VTT only; an error without them)")
    defaults = CueOptions()
    cues.add_argument(
        "--max-line-width",
        action=_CueOption,
        type=int_in(LINE_WIDTH_RANGE),
        default=defaults.max_width,
        metavar="N",
        help=f"display cells per line; CJK characters count two ({span(LINE_WIDTH_RANGE)}; "
        f"default: {defaults.max_width})",
    )
    cues.add_argument(
        "--max-line-count",
        action=_CueOption,
        type=int_in(LINE_COUNT_RANGE),
        default=defaults.max_lines,
        metavar="N",
        help=f"lines per cue ({span(LINE_COUNT_RANGE)}; default: {defaults.max_lines})",
    )
    cues.add_argument(
        "--max-cue-seconds",
        action=_CueOption,
        type=number_in(CUE_SECONDS_RANGE),
        default=defaults.max_duration,
        metavar="S",
        help=f"longest time a cue stays on screen, where the text can be split ({span(CUE_SECONDS_RANGE)}; "
        f"default: {defaults.max_duration:g})",
    )
    cues.add_argument(
        "--highlight-words",
        action=_CueOption,
        nargs=0,
        const=True,
        default=False,
        help="show which word is being spoken (needs word timing), in the --highlight-style",
    )
    cues.add_argument(
        "--highlight-style",
        action=_CueOption,
        choices=HIGHLIGHT_STYLES,
        default=HIGHLIGHT_STYLES[0],
        help="underline (the default, as whisper does) repeats the cue once per word with that word in "
        "<u>...</u>, in SRT and VTT; karaoke tags each word's time in VTT (<00:00:01.000>) for players that "
        "colour the words said, and underlines in SRT",
    )
    cues.add_argument(
        "--max-words-per-line",
        action=_CueOption,
        type=int_in(WORDS_PER_LINE_RANGE),
        default=None,
        metavar="N",
        help=f"words per subtitle line at most, with word timing ({span(WORDS_PER_LINE_RANGE)}; default: no limit)",
    )
    cues.add_argument(
        "--pause-seconds",
        action=_CueOption,
        type=number_in(PAUSE_SECONDS_RANGE),
        default=defaults.pause,
        metavar="S",
        help=f"a pause between words this long ends a cue ({span(PAUSE_SECONDS_RANGE)}; default: {defaults.pause:g})",
    )
    cues.add_argument(
        "--min-cue-gap",
        action=_CueOption,
        type=number_in(CUE_GAP_RANGE),
        default=defaults.min_gap,
        metavar="S",
        help=f"time between two cues at least, with word timing ({span(CUE_GAP_RANGE)}; default: {defaults.min_gap:g})",
    )
    cues.add_argument(
        "--max-chars-per-second",
        action=_CueOption,
        type=number_in(CPS_RANGE, "characters per second"),
        default=defaults.max_cps,
        metavar="N",
        help=f"reading speed a cue keeps to where the text allows ({span(CPS_RANGE)}; default: {defaults.max_cps:g})",
    )
    return p
