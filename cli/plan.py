"""What a folder run will do, decided before the model is loaded: for each input, transcribe it, skip it
(its outputs exist) or fail it (its outputs cannot be written); the --dry-run listing of that; and the
output folders made ready, our temporary files left by a killed run cleaned out of them, and standard
input copied to the file it is read from."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from mlx_qwen3asr.cli.options import EXIT_FAILED, EXIT_OK
from mlx_qwen3asr.cli.reporter import Reporter, Summary
from mlx_qwen3asr.cli.stdio import StdinInput, spill_stdin
from mlx_qwen3asr.outputs.folder import (
    FileJob,
    InputFile,
    existing_outputs,
    output_problem,
    outputs_older_than_input,
    prepare_output_folder,
    redo_pending,
    remove_stale_temporaries,
)

__all__ = [
    "Plan",
    "dry_run",
    "path_list",
    "plan_file",
    "prepare_folders",
    "read_stdin",
    "remove_created",
    "use_overwrite",
]


@dataclass
class Plan:
    """What a run does with one input, decided before the model is loaded."""

    job: FileJob
    keep: list[Path]  # existing outputs, left as they are
    skip: bool = False  # every requested output exists: not transcribed
    stale: bool = False  # skipped although the input changed after some of its outputs
    replace: list[Path] = field(default_factory=list)  # existing outputs replaced (--overwrite)
    problem: str | None = None  # why its outputs cannot be written: the file fails, untranscribed
    redo: bool = False  # an interrupted --overwrite run left it to redo: its outputs are replaced


def plan_file(job: FileJob, overwrite: bool) -> Plan:
    """What to do with job, from the outputs that exist (all kept unless overwrite, or unless a run with
    --overwrite was stopped before it had replaced them)."""
    problem = output_problem(job)
    if problem is not None:
        return Plan(job, [], problem=problem)
    existing = [job.outputs[fmt] for fmt in existing_outputs(job)]
    if overwrite:
        return Plan(job, [], replace=existing)
    if existing and redo_pending(job):
        return Plan(job, [], replace=existing, redo=True)
    skip = len(existing) == len(job.outputs)
    return Plan(job, existing, skip, skip and outputs_older_than_input(job))


def path_list(items: Sequence[Path]) -> str:
    """Paths as a message lists them: "a.srt, a.vtt"."""
    return ", ".join(str(p) for p in items)


def use_overwrite(paths: Sequence[Path]) -> str:
    """The hint that --overwrite replaces existing outputs."""
    return f"use --overwrite to replace {'it' if len(paths) == 1 else 'them'}"


def dry_run(plans: list[Plan], input_errors: int, report: Reporter, out: TextIO) -> int:
    """List what a run would do, and its exit status (EXIT_FAILED if some input would fail)."""
    kept = 0
    for plan in plans:
        job = plan.job
        if plan.problem is not None:
            report.write(out, f"fail: {job.path}: {plan.problem}")
            continue
        if plan.skip:
            why = "outputs exist but are older than it; use --overwrite" if plan.stale else "outputs exist"
            report.write(out, f"skip ({why}): {job.path} -> {path_list(list(job.outputs.values()))}")
            continue
        written = [p for p in job.outputs.values() if p not in plan.keep]
        line = f"transcribe: {job.path} -> {path_list(written)}"
        if plan.keep:
            kept += len(plan.keep)
            line += f"; keeping existing {path_list(plan.keep)} ({use_overwrite(plan.keep)})"
        if plan.replace:
            line += f"; replacing existing {path_list(plan.replace)}"
            if plan.redo:
                line += " (an interrupted run with --overwrite left it to redo)"
        report.write(out, line)
    todo = sum(not plan.skip and plan.problem is None for plan in plans)
    failed = input_errors + sum(plan.problem is not None for plan in plans)
    skipped = sum(plan.skip for plan in plans)
    line = f"dry run: {todo} to transcribe, {skipped} skipped, {failed} failed"
    if kept:
        line += f", {kept} existing output(s) kept"
    report.write(out, line)
    return EXIT_FAILED if failed else EXIT_OK


def prepare_folders(
    todo: list[FileJob], report: Reporter, summary: Summary, created: list[Path]
) -> tuple[list[FileJob], bool]:
    """Create and probe every folder the files to transcribe will be written to, and clean our stale
    temporary files out of them. Files whose folder cannot be written fail here, before the model is
    loaded. Returns the files left, and whether any folder could be written at all."""
    folders = list(dict.fromkeys(p.parent for job in todo for p in job.outputs.values()))
    problems: dict[Path, str] = {}
    for folder in folders:
        reason = prepare_output_folder(folder, created)
        if reason is not None:
            problems[folder] = reason
            continue
        for stale in remove_stale_temporaries(folder):
            report.info(f"removed {stale}, a temporary file left by an interrupted run")
    ready = []
    for job in todo:
        reason = next((problems[p.parent] for p in job.outputs.values() if p.parent in problems), None)
        # Looked at again now that the folders exist: one made for other files may take an output's name.
        reason = reason or output_problem(job)
        if reason is None:
            ready.append(job)
        else:
            summary.failed.append((str(job.path), reason))
            report.error(f"{job.path}: {reason}")
    return ready, len(problems) < len(folders)


def remove_created(created: list[Path]) -> None:
    """Remove the folders this run made, and nothing was written to (it stopped before any output)."""
    for folder in reversed(created):
        with contextlib.suppress(OSError):
            folder.rmdir()


def read_stdin(
    todo: list[FileJob], stdin_input: InputFile, stdin: StdinInput | None, report: Reporter, summary: Summary
) -> list[FileJob]:
    """Copy standard input to its temporary file when it is to be transcribed; the jobs left to do (its
    job fails, with one line, when nothing came or the copy cannot be made)."""
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
