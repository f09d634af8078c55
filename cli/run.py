"""A folder run of `mlxasr`: the options checked, the inputs found and planned, the model (and aligner)
loaded only when there is something to transcribe, every file transcribed in shared batches and its
outputs written as soon as it is done; one file failing never ends the others, and an interruption
keeps what is finished."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import estimate_duration
from mlx_qwen3asr.audio.signal import is_silent
from mlx_qwen3asr.cli.diarizing import (
    Diarization,
    DiarizeQueue,
    Outcome,
    SpeakerPairs,
    Unavailable,
    check_diarization,
    diarizer_source,
    turn_warnings,
)
from mlx_qwen3asr.cli.diarizing import failure as diarize_failure
from mlx_qwen3asr.cli.loading import load_in_order, untimed
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RTTM,
    check_vad,
    chosen_formats,
    moot,
    vad_options,
)
from mlx_qwen3asr.cli.plan import (
    dry_run,
    path_list,
    plan_file,
    prepare_folders,
    remove_created,
    use_overwrite,
)
from mlx_qwen3asr.cli.reporter import Reporter, Summary, printable
from mlx_qwen3asr.cli.signals import Terminated
from mlx_qwen3asr.cli.stdio import STDIN, STDIN_NAME, StdinInput, problem_line, spill_stdin, stdin_problem
from mlx_qwen3asr.outputs.cue_types import CueOptions
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputFile,
    OutputClash,
    TranscribeOptions,
    clear_redo,
    find_inputs,
    mark_redo,
    output_problem,
    plan_jobs,
    redo_pending,
    write_outputs,
)
from mlx_qwen3asr.pipeline.result import InputResult
from mlx_qwen3asr.pipeline.transcribe import transcribe_stream
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.text.context import ContextError, check_context, read_context_file
from mlx_qwen3asr.text.languages import resolve_language

__all__ = ["run"]


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if RTTM in chosen_formats(args, None):  # speaker turns are what diarization gives
        args.diarize = True
    problem = stdin_problem(args.paths, chosen_formats(args), args.output_dir)
    if problem is not None:
        parser.error(f"argument PATH: {problem}")
    if STDIN not in args.paths:
        return _run(parser, args, out, err, None)
    stdin = StdinInput.make(args.output_dir)
    try:
        return _run(parser, args, out, err, stdin)
    finally:
        stdin.remove()


def _run(
    parser: argparse.ArgumentParser,
    args: argparse.Namespace,
    out: TextIO,
    err: TextIO,
    stdin: StdinInput | None,
) -> int:
    started = time.monotonic()
    # Checks that need neither the model nor any audio come first.
    try:
        language = resolve_language(args.language)
    except ValueError as e:
        parser.error(f"argument --language: {e}")
    context = args.context or ""
    if args.context_file is not None:
        try:
            context = read_context_file(args.context_file)  # bounded in bytes and, for a pipe, in time
        except ContextError as e:
            parser.error(f"argument --context-file: {printable(str(args.context_file))}: {e}")
    if args.output_dir is not None and args.output_dir.exists() and not args.output_dir.is_dir():
        parser.error(f"argument -o/--output-dir: {printable(str(args.output_dir))} is not a folder")
    formats = chosen_formats(args)
    cue_options = CueOptions(
        max_width=args.max_line_width,
        max_lines=args.max_line_count,
        max_duration=args.max_cue_seconds,
        pause=args.pause_seconds,
        min_gap=args.min_cue_gap,
        max_cps=args.max_chars_per_second,
        max_words_per_line=args.max_words_per_line,
    )
    subtitles = bool({"srt", "vtt"} & set(formats))
    _refuse_moot(parser, args, subtitles)
    if args.word_timestamps is None:
        # Timing words matters for subtitles, not for a transcript; speakers change between words.
        args.word_timestamps = subtitles or args.diarize
    check_vad(parser, args)
    try:
        diarization = check_diarization(parser, args)
    except Unavailable as e:  # before anything is planned or loaded
        print(problem_line("mlxasr", "error", printable(one_line(str(e)))), file=err)
        return EXIT_USAGE
    if args.highlight_words and subtitles and not args.word_timestamps:
        parser.error("argument --highlight-words: needs word timing, which --no-word-timestamps turns off")
    # Cue options shape SRT and VTT only; the style matters only with --highlight-words.
    highlight = args.highlight_style if args.highlight_words and subtitles else None
    options = TranscribeOptions(
        language=language,
        context=context,
        max_segment_seconds=args.max_segment_seconds,
        cues=cue_options,
        word_timestamps=args.word_timestamps,
        highlight_words=highlight,
        vad=vad_options(args),
        speaker_format=None if diarization is None else diarization.speaker_format,
    )

    transcript = out
    if stdin is not None and stdin.to_stdout:
        out = err  # standard output carries the transcript alone
    report = Reporter(out, err, quiet=args.quiet, verbose=args.verbose)
    summary = Summary()
    paths = [p for p in args.paths if p != STDIN]
    inputs, input_errors = find_inputs(paths)
    for problem in input_errors:
        report.error(str(problem))
        summary.failed.append((problem.path, problem.reason))
    if stdin is None and not any(os.path.lexists(p) for p in paths):
        return EXIT_USAGE
    if not inputs and not input_errors and stdin is None:  # a refused input has had its own line
        report.warning("no audio or video files found in " + ", ".join(map(str, paths)))
    stdin_input = InputFile(Path(STDIN_NAME))
    if stdin is not None:
        inputs.append(stdin_input)

    output_dir = stdin.folder if stdin is not None and stdin.to_stdout else args.output_dir
    try:
        jobs = plan_jobs(inputs, formats, output_dir)
    except OutputClash as e:
        parser.error(printable(str(e)))
    plans = [plan_file(job, args.overwrite) for job in jobs]
    if args.dry_run:
        return dry_run(plans, len(input_errors), report, out)

    for plan in plans:
        if plan.problem is not None:
            summary.failed.append((str(plan.job.path), plan.problem))
            report.error(f"{plan.job.path}: {plan.problem}")
    plans = [plan for plan in plans if plan.problem is None]
    todo = [plan.job for plan in plans if not plan.skip]
    skipped = [plan for plan in plans if plan.skip]
    summary.skipped = len(skipped)
    if skipped:
        report.info(f"skipping {len(skipped)} file(s) whose outputs exist (--overwrite replaces them)")
        for plan in skipped:
            if plan.stale:
                report.info(
                    f"skipped {plan.job.path}: its outputs exist but are older than it; use --overwrite"
                )
            elif args.verbose:
                report.info(f"  skipped {plan.job.path}")

    redone = [plan for plan in plans if plan.redo]
    if redone:
        report.info(f"redoing {len(redone)} file(s) that an interrupted run with --overwrite left unfinished")

    status = EXIT_OK
    resumable = True  # a rerun without --overwrite picks up where this run stops
    todo = _read_stdin(todo, stdin_input, stdin, report, summary)
    if todo:
        created: list[Path] = []
        todo, writable = prepare_folders(todo, report, summary, created)
        if not writable:
            remove_created(created)
            report.error("no output folder can be written; nothing was transcribed")
            return EXIT_USAGE
        marked: list[FileJob] = []  # marks this run set (not those an earlier run left)
        if args.overwrite:  # until a file's outputs are replaced, a rerun without --overwrite redoes it
            replacing = {id(plan.job) for plan in plans if plan.replace}
            marked = [job for job in todo if id(job) in replacing and not redo_pending(job)]
            resumable = all([mark_redo(job) for job in todo if id(job) in replacing])
        try:
            status = _transcribe_all(todo, args, options, report, summary, diarization)
        except KeyboardInterrupt:
            status = EXIT_INTERRUPTED
        except Terminated:
            status = EXIT_TERMINATED
        finally:
            report.stop()
        if status == EXIT_USAGE:  # stopped before any file was transcribed: leave things as they were
            for job in marked:
                clear_redo(job)
            remove_created(created)
            return status
    summary.interrupted = status in (EXIT_INTERRUPTED, EXIT_TERMINATED)
    summary.remaining = len(todo) - summary.processed
    summary.wall_seconds = time.monotonic() - started
    if summary.interrupted:
        if not args.overwrite:
            resume = "rerun to resume"
        elif resumable:
            resume = "rerun without --overwrite to resume (files finished in this run are up to date)"
        else:
            resume = "rerun with --overwrite to redo them all"
        report.write(err, f"mlxasr: interrupted; finished files are kept, {resume}")
    report.summary(summary)
    if stdin is not None and stdin.to_stdout and summary.done:
        _print_transcript(next(iter(jobs[-1].outputs.values())), transcript)
    if summary.interrupted:
        return status
    return EXIT_FAILED if summary.failed else EXIT_OK


def _refuse_moot(parser: argparse.ArgumentParser, args: argparse.Namespace, subtitles: bool) -> None:
    """Usage errors (options.moot) for options that others make moot: --aligner with
    --no-word-timestamps, a subtitle cue option without --srt or --vtt, --highlight-style without
    --highlight-words (--vad-threshold and the speaker options are checked with their kind)."""
    if args.word_timestamps is False and args.aligner is not None:
        moot(parser, "--aligner", "with --no-word-timestamps (words are not timed)")
    if not subtitles and args.cue_options_given:
        moot(parser, args.cue_options_given[0], "without --srt or --vtt (only subtitles are cut into cues)")
    if "--highlight-style" in args.cue_options_given and not args.highlight_words:
        moot(parser, "--highlight-style", "without --highlight-words")


def _transcribe_all(
    todo: list[FileJob],
    args: argparse.Namespace,
    options: TranscribeOptions,
    report: Reporter,
    summary: Summary,
    diarization: Diarization | None = None,
) -> int:
    t0 = time.monotonic()

    def context_fits(model) -> bool:
        try:
            if options.context:  # length and control tokens need the tokenizer
                check_context(model.tokenizer, options.context)
        except ContextError as e:
            where = f"--context-file {args.context_file}" if args.context_file is not None else "--context"
            report.error(f"{where}: {e}")
            return False
        return True

    loaded = load_in_order(
        args,
        report,
        diarization=diarization,
        aligner=untimed(chosen_formats(args)) if options.word_timestamps else None,
        model_loaded=context_fits,
    )
    if loaded is None:
        return EXIT_USAGE
    diarizer, model, aligner = loaded.diarizer, loaded.model, None
    if loaded.aligner is not None:
        aligner = loaded.aligner.model
        options = replace(options, aligner=None if aligner is None else loaded.aligner.source)
    loaded_seconds = time.monotonic() - t0

    estimates = [estimate_duration(j.audio) for j in todo]
    # With speakers told apart, each file is diarized on a worker thread while the engine transcribes;
    # the bar counts both passes, and a file is finished when both are.
    speakers = None
    if diarizer is not None:
        # Diarized only where speech detection finds speech, as transcription is (--no-vad: all of it).
        speakers = DiarizeQueue(diarizer, diarization.options, vad=options.vad or None)
        for index, job in enumerate(todo):
            speakers.submit(index, job.audio, estimates[index])
    report.start(estimates, stages=2 if speakers is not None else 1)
    report.batch_started(
        len(todo),
        args.batch_size,
        loaded_seconds=loaded_seconds,
        aligner=options.aligner,
        diarizer=diarizer_source(args.diarizer) or "the default diarizer" if speakers is not None else None,
    )
    started = time.monotonic()

    def settle(res: InputResult, outcome: Outcome | None) -> None:
        job = todo[res.index]
        reason = _finish_one(job, res, args, options, report, summary, diarization, outcome)
        summary.processed += 1
        seconds = None if reason is not None else res.transcription.duration
        if reason is not None:
            summary.failed.append((str(job.path), reason))
            report.error(f"{job.path}: {reason}")
        else:
            summary.done += 1
            summary.audio_seconds += seconds
            summary.work_seconds = time.monotonic() - started
        # Failed files take their place in the count as visibly as finished ones.
        report.file_finished(summary.processed, len(todo), res.index, seconds, job.path)

    pairs = SpeakerPairs(speakers, report.progress, report.diarizing) if speakers is not None else None
    stream = transcribe_stream(
        model,
        [j.audio for j in todo],
        language=options.language,
        context=options.context,
        max_segment_seconds=options.max_segment_seconds,
        batch_size=args.batch_size,  # None: each batch sized from its segments and the free memory
        skip=is_silent,  # silent audio is not sent to the model (it would only invent text)
        vad=options.vad or False,
        on_segment=lambda index, seg: report.segment(seg, todo[index].path if len(todo) > 1 else None),
        on_progress=report.progress if pairs is None else pairs.progress,
        aligner=aligner,
    )
    try:
        for res in stream:
            if pairs is None:
                settle(res, None)
                continue
            for done, outcome in pairs.add(res):
                settle(done, outcome)
        if pairs is not None:
            for done, outcome in pairs.rest():
                settle(done, outcome)
    finally:
        stream.close()
        if pairs is not None:
            pairs.close()  # after Ctrl-C the file being diarized is not waited for
    return EXIT_OK


def _read_stdin(
    todo: list[FileJob], stdin_input: InputFile, stdin: StdinInput | None, report: Reporter, summary: Summary
) -> list[FileJob]:
    """Copy standard input to its temporary file when it is to be transcribed; the jobs left to do."""
    job = next((j for j in todo if j.input is stdin_input), None)
    if job is None or stdin is None:
        return todo
    try:
        job.source = spill_stdin(stdin.folder)
        reason = None if job.source.stat().st_size else "nothing was written to standard input"
    except OSError as e:
        reason = f"cannot copy standard input to {stdin.folder} ({(e.strerror or str(e)).lower()})"
    if reason is None:
        return todo
    summary.failed.append((str(job.path), reason))
    report.error(f"{job.path}: {reason}")
    return [j for j in todo if j is not job]


def _print_transcript(path: Path, out: TextIO) -> None:
    """Write an output written for standard output there, as it is."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return
    out.write(text)
    out.flush()


def _write_error(e: OSError) -> str:
    where = f" in {Path(e.filename).parent}" if e.filename else ""
    return f"cannot write output{where} ({(e.strerror or str(e)).lower()})"


def _failure(e: BaseException) -> str:
    if isinstance(e, AudioError):
        return e.reason
    if isinstance(e, OSError):
        return _write_error(e)
    return f"{type(e).__name__}: {one_line(str(e))}"


def _finish_one(
    job: FileJob,
    res: InputResult,
    args: argparse.Namespace,
    options: TranscribeOptions,
    report: Reporter,
    summary: Summary,
    diarization: Diarization | None = None,
    outcome: Outcome | None = None,
) -> str | None:
    """Write one transcribed file's outputs, with the speakers of outcome when it was diarized; returns
    why the file failed, or None. A file whose diarization failed is not written (a rerun redoes it)."""
    if res.error is not None:
        return _failure(res.error)
    if outcome is not None and outcome.error is not None:
        return diarize_failure(outcome.error)
    if diarization is not None and outcome is not None:
        try:
            res.transcription = diarization.assign(res.transcription, outcome.turns)
        except Exception as e:
            return diarize_failure(e)
        # What the diarizer noticed (a speaker count it could not reach) is the file's warning too.
        res.transcription.warnings.extend(turn_warnings(outcome.turns))
    problem = output_problem(job)  # what took an output's name while the file was transcribed
    if problem is not None:
        return problem
    try:
        written = write_outputs(
            job,
            res.transcription,
            res.wav,
            options,
            model_name=args.model,
            silent=res.skipped,
            overwrite=args.overwrite or redo_pending(job),
        )
    except Exception as e:  # a failure in one file must not end the batch
        return _failure(e)
    clear_redo(job)
    # A folder or other non-regular file that appeared in an output's place at the last moment is no
    # output kept: the file has no transcript there.
    taken = next((p for p in written.kept if not os.path.isfile(p)), None)
    if taken is not None:
        return f"output {taken} is not a regular file"
    if written.kept:
        summary.kept += len(written.kept)
        report.info(f"kept existing {path_list(written.kept)} ({use_overwrite(written.kept)})")
    warnings = written.warnings  # exactly the JSON output's "warnings" (outputs.folder.file_warnings)
    for warning in warnings:
        report.warning(f"{job.path}: {warning}")
    summary.warned += bool(warnings)
    if args.verbose and written.written:
        report.info("  wrote " + path_list(written.written))
    return None
