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
from mlx_qwen3asr.cli.arguments import chosen_formats
from mlx_qwen3asr.cli.models import load_aligner, load_model
from mlx_qwen3asr.cli.options import (
    ALIGNER_ENV,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    check_vad,
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
from mlx_qwen3asr.cli.reporter import Reporter, Summary, duration, printable
from mlx_qwen3asr.cli.signals import Terminated
from mlx_qwen3asr.outputs.cue_types import CueOptions
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    OutputClash,
    TranscribeOptions,
    find_inputs,
    output_problem,
    plan_jobs,
    write_outputs,
)
from mlx_qwen3asr.pipeline.scheduler import InputResult, transcribe_stream
from mlx_qwen3asr.runtime.messages import one_line
from mlx_qwen3asr.text.context import ContextError, check_context, read_context_file
from mlx_qwen3asr.text.languages import resolve_language

__all__ = ["run"]


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
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
    if args.word_timestamps is None:  # timing words matters for subtitles, not for a transcript
        args.word_timestamps = bool({"srt", "vtt"} & set(formats))
    check_vad(parser, args)
    if args.highlight_words and not args.word_timestamps:
        parser.error("argument --highlight-words: needs word timing (drop --no-word-timestamps)")
    options = TranscribeOptions(
        language=language,
        context=context,
        max_segment_seconds=args.max_segment_seconds,
        cues=cue_options,
        word_timestamps=args.word_timestamps,
        highlight_words=args.highlight_words,
        vad=vad_options(args),
    )

    report = Reporter(out, err, quiet=args.quiet, verbose=args.verbose)
    summary = Summary()
    inputs, input_errors = find_inputs(args.paths)
    for problem in input_errors:
        report.error(str(problem))
        summary.failed.append((problem.path, problem.reason))
    if not any(os.path.lexists(p) for p in args.paths):
        return EXIT_USAGE
    if not inputs and not input_errors:  # a refused input has had its own line
        report.warning("no audio or video files found in " + ", ".join(map(str, args.paths)))

    try:
        jobs = plan_jobs(inputs, formats, args.output_dir)
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

    status = EXIT_OK
    if todo:
        created: list[Path] = []
        todo, writable = prepare_folders(todo, report, summary, created)
        if not writable:
            remove_created(created)
            report.error("no output folder can be written; nothing was transcribed")
            return EXIT_USAGE
        try:
            status = _transcribe_all(todo, args, options, report, summary)
        except KeyboardInterrupt:
            status = EXIT_INTERRUPTED
        except Terminated:
            status = EXIT_TERMINATED
        finally:
            report.stop()
        if status == EXIT_USAGE:
            remove_created(created)
            return status
    summary.interrupted = status in (EXIT_INTERRUPTED, EXIT_TERMINATED)
    summary.remaining = len(todo) - summary.processed
    summary.wall_seconds = time.monotonic() - started
    if summary.interrupted:
        report.write(err, "mlxasr: interrupted; finished files are kept, rerun to resume")
    report.summary(summary)
    if summary.interrupted:
        return status
    return EXIT_FAILED if summary.failed else EXIT_OK


def _transcribe_all(
    todo: list[FileJob],
    args: argparse.Namespace,
    options: TranscribeOptions,
    report: Reporter,
    summary: Summary,
) -> int:
    t0 = time.monotonic()
    model = load_model(args.model, args.dtype, report)
    if model is None:  # missing, unreadable, mismatched or wrong-kind checkpoints stop the run here
        return EXIT_USAGE
    try:
        if options.context:
            check_context(model.tokenizer, options.context)  # length and control tokens need the tokenizer
    except ContextError as e:
        where = f"--context-file {args.context_file}" if args.context_file is not None else "--context"
        report.error(f"{where}: {e}")
        return EXIT_USAGE
    aligner = None
    if options.word_timestamps:
        loaded = load_aligner(
            args.aligner,
            args.dtype,
            report,
            instead="cue times are estimated from the text instead "
            f"(name an aligner with --aligner or ${ALIGNER_ENV}, or pass --no-word-timestamps)",
        )
        if loaded.stop:
            return EXIT_USAGE
        aligner = loaded.model
        options = replace(options, aligner=None if aligner is None else loaded.source)
    timing = f", words timed by {options.aligner}" if options.aligner else ""
    report.info(f"loaded in {time.monotonic() - t0:.1f} s; transcribing {len(todo)} file(s){timing}")

    estimates = [estimate_duration(j.path) for j in todo]
    report.start(estimates)
    report.batch_started(len(todo), args.batch_size)
    started = time.monotonic()
    stream = transcribe_stream(
        model,
        [j.path for j in todo],
        language=options.language,
        context=options.context,
        max_segment_seconds=options.max_segment_seconds,
        batch_size=args.batch_size,  # None: each batch sized from its segments and the free memory
        skip=is_silent,  # silent audio is not sent to the model (it would only invent text)
        vad=options.vad or False,
        on_segment=lambda index, seg: report.segment(seg, todo[index].path if len(todo) > 1 else None),
        aligner=aligner,
    )
    try:
        for res in stream:
            job = todo[res.index]
            reason = _finish_one(job, res, args, options, report, summary)
            summary.processed += 1
            seconds = None if reason is not None else res.transcription.duration
            report.file_finished(summary.processed, len(todo), estimates[res.index], seconds)
            if reason is not None:
                summary.failed.append((str(job.path), reason))
                report.error(f"{job.path}: {reason}")
                continue
            summary.done += 1
            summary.audio_seconds += seconds
            summary.work_seconds = time.monotonic() - started
            report.info(f"[{summary.processed}/{len(todo)}] done {job.path}: {duration(seconds)} of audio")
    finally:
        stream.close()
    return EXIT_OK


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
) -> str | None:
    """Write one transcribed file's outputs; returns why the file failed, or None."""
    if res.error is not None:
        return _failure(res.error)
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
            overwrite=args.overwrite,
        )
    except Exception as e:  # a failure in one file must not end the batch
        return _failure(e)
    # A folder or other non-regular file that appeared in an output's place at the last moment is no
    # output kept: the file has no transcript there.
    taken = next((p for p in written.kept if not os.path.isfile(p)), None)
    if taken is not None:
        return f"output {taken} is not a regular file"
    if written.kept:
        summary.kept += len(written.kept)
        report.info(f"kept existing {path_list(written.kept)} ({use_overwrite(written.kept)})")
    warnings = []
    if written.silent:
        warnings.append("silent audio, nothing to transcribe; the outputs are empty")
    flagged = [s for s in written.transcription.segments if s.truncated or s.repetitive]
    if flagged:
        warnings.append(
            f"{len(flagged)} segment(s) ran into a loop or the token limit; "
            "their text may be incomplete (flagged in JSON output)"
        )
    # What decoding noticed about the file (e.g. audio shorter than its header states).
    warnings.extend(str(w) for w in getattr(res.transcription, "warnings", None) or [])
    for warning in warnings:
        report.warning(f"{job.path}: {warning}")
    summary.warned += bool(warnings)
    if args.verbose and written.written:
        report.info("  wrote " + path_list(written.written))
    return None
