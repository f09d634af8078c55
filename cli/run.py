"""A folder run of `mlxasr`: the options checked, the inputs found and planned, the model (and aligner)
loaded only when there is something to transcribe, every file transcribed in shared batches and its
outputs written as soon as it is done; one file failing never ends the others, and an interruption
keeps what is finished."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import estimate_duration
from mlx_qwen3asr.audio.signal import is_silent
from mlx_qwen3asr.cli.arguments import refuse_moot
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
from mlx_qwen3asr.cli.exits import status_of
from mlx_qwen3asr.cli.library import filing
from mlx_qwen3asr.cli.loading import Loaded, load_in_order, untimed
from mlx_qwen3asr.cli.options import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_USAGE,
    RTTM,
    check_vad,
    chosen_formats,
    vad_options,
)
from mlx_qwen3asr.cli.plan import (
    dry_run,
    path_list,
    plan_file,
    prepare_folders,
    read_stdin,
    remove_created,
    use_overwrite,
)
from mlx_qwen3asr.cli.reporter import Reporter, Summary, printable
from mlx_qwen3asr.cli.signals import raise_if_stopped
from mlx_qwen3asr.cli.stdio import (
    STDIN,
    STDIN_NAME,
    StdinInput,
    print_transcript,
    problem_line,
    stdin_problem,
)
from mlx_qwen3asr.cli.watch import Watch
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

__all__ = ["Finished", "Session", "run"]


def run(parser: argparse.ArgumentParser, args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if RTTM in chosen_formats(args, None):  # speaker turns are what diarization gives
        args.diarize = True
    if args.watch and STDIN in args.paths:
        parser.error(f"argument --watch: standard input ({STDIN}) cannot be watched; give folders or files")
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
    refuse_moot(parser, args, subtitles)
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
    watch = Watch.of(args, paths, formats, report, summary) if args.watch else None
    if watch is not None:  # their state before the first pass reads them
        watch.start(inputs, input_errors)
    for problem in input_errors:
        report.error(str(problem))
        summary.failed.append((problem.path, problem.reason))
    if stdin is None and not any(os.path.lexists(p) for p in paths):
        return EXIT_USAGE
    if not inputs and not input_errors and stdin is None and watch is None:  # a refused input: its own line
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
    todo = read_stdin(todo, stdin_input, stdin, report, summary)
    file_in = filing(args, options, report.error)
    if isinstance(file_in, int):
        return file_in
    session = Session(
        args, options, report, summary, diarization, finished=file_in, watching=watch is not None
    )
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
        status = status_of(lambda: session.transcribe(todo))
        if status == EXIT_USAGE:  # stopped before any file was transcribed: leave things as they were
            for job in marked:
                clear_redo(job)
            remove_created(created)
            return status
    if watch is not None and status == EXIT_OK:
        status = status_of(lambda: watch.run(session.transcribe))
        if status == EXIT_USAGE:  # the models could not be loaded for the first file to transcribe
            return status
    summary.interrupted = status in (EXIT_INTERRUPTED, EXIT_TERMINATED)
    summary.remaining = session.handed - summary.processed
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
        print_transcript(next(iter(jobs[-1].outputs.values())), transcript)
    if summary.interrupted:
        return status
    return EXIT_FAILED if summary.failed else EXIT_OK


# What runs after a file's outputs are written, with its job and its result (Session.finished).
Finished = Callable[[FileJob, InputResult], None]


class Session:
    """A run's models, loaded for its first file to transcribe and kept for every later pass (--watch
    brings more files). Each transcribe() transcribes files in shared batches and writes each one's
    outputs as soon as it is done; then finished(job, result), where given, is told of it.

    watching: a file that is gone when it fails was removed before it could be read; it is dropped
    without an error (the watch saw it, a rerun would not)."""

    def __init__(
        self,
        args: argparse.Namespace,
        options: TranscribeOptions,
        report: Reporter,
        summary: Summary,
        diarization: Diarization | None = None,
        *,
        finished: Finished | None = None,
        watching: bool = False,
    ) -> None:
        self.args, self.options, self.report, self.summary = args, options, report, summary
        self.diarization, self.finished, self.watching = diarization, finished, watching
        self.loaded: Loaded | None = None
        self.handed = 0  # files handed to transcribe(), over every pass

    def _load(self) -> bool:
        """Load the diarizer, model and aligner (load_in_order); False once the error is said."""
        args, options, report = self.args, self.options, self.report

        def context_fits(model) -> bool:
            try:
                if options.context:  # length and control tokens need the tokenizer
                    check_context(model.tokenizer, options.context)
            except ContextError as e:
                where = (
                    f"--context-file {args.context_file}" if args.context_file is not None else "--context"
                )
                report.error(f"{where}: {e}")
                return False
            return True

        self.loaded = load_in_order(
            args,
            report,
            diarization=self.diarization,
            aligner=untimed(chosen_formats(args)) if options.word_timestamps else None,
            model_loaded=context_fits,
        )
        if self.loaded is None:
            return False
        if self.loaded.aligner is not None:
            aligner = self.loaded.aligner
            self.options = replace(options, aligner=None if aligner.model is None else aligner.source)
        return True

    def transcribe(self, todo: list[FileJob]) -> int:
        """Transcribe todo and write each file's outputs; EXIT_OK, or EXIT_USAGE when the models could
        not be loaded (said on one line). The progress bar is gone when it returns."""
        try:
            return self._transcribe(todo)
        finally:
            self.report.stop()

    def _transcribe(self, todo: list[FileJob]) -> int:
        args, report, summary = self.args, self.report, self.summary
        self.handed += len(todo)  # a stop while the models load leaves them all unfinished
        loaded_seconds = None
        if self.loaded is None:
            t0 = time.monotonic()
            if not self._load():
                return EXIT_USAGE
            loaded_seconds = time.monotonic() - t0
        loaded, options, diarization = self.loaded, self.options, self.diarization
        aligner = None if loaded.aligner is None else loaded.aligner.model

        estimates = [estimate_duration(j.audio) for j in todo]
        # With speakers told apart, each file is diarized on a worker thread while the engine transcribes;
        # the bar counts both passes, and a file is finished when both are.
        speakers = None
        if loaded.diarizer is not None:
            # Diarized only where speech detection finds speech, as transcription is (--no-vad: all of it).
            speakers = DiarizeQueue(loaded.diarizer, diarization.options, vad=options.vad or None)
            for index, job in enumerate(todo):
                speakers.submit(index, job.audio, estimates[index])
        report.start(estimates, stages=2 if speakers is not None else 1)
        if loaded_seconds is not None:  # once, for the pass that loaded the models
            report.batch_started(
                len(todo),
                args.batch_size,
                loaded_seconds=loaded_seconds,
                aligner=options.aligner,
                diarizer=diarizer_source(args.diarizer) or "the default diarizer"
                if speakers is not None
                else None,
            )
        started = time.monotonic() - summary.work_seconds  # the speed counts every pass's work

        def settle(res: InputResult, outcome: Outcome | None) -> None:
            job = todo[res.index]
            reason = _finish_one(job, res, args, options, report, summary, diarization, outcome)
            if reason is not None and self.watching and not os.path.lexists(job.path):
                self.handed -= 1  # removed before it was read: dropped without an error
                return
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
            report.file_finished(summary.processed, self.handed, res.index, seconds, job.path)
            if reason is None and self.finished is not None:
                self.finished(job, res)

        pairs = SpeakerPairs(speakers, report.progress, report.diarizing) if speakers is not None else None
        stream = transcribe_stream(
            loaded.model,
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
                raise_if_stopped()  # a Ctrl-C whose exception a finalizer dropped stops before the next file
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
