"""Transcription jobs that outlive the server: each job's audio is kept in the library until its transcript
is filed, so a job interrupted by a crash or a stop runs again when the library is opened next.

A JobRunner takes jobs (Library.add_job: the audio and the options), runs at most `max_running` of them at
once on the shared Engine (their segments share its batch with every other request), and files each
finished transcription in the library (Library.finish_job: the transcript and the job's end in one
transaction). A job's status: queued, running, done, failed or cancelled; its progress (0-1) is how much
of its audio has been transcribed. A failure ends its job alone, with one line.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from mlx_qwen3asr.audio.features import AudioError
from mlx_qwen3asr.audio.files import AudioTooLong
from mlx_qwen3asr.audio.signal import ArraySignal
from mlx_qwen3asr.library.store import Library, LibraryError
from mlx_qwen3asr.pipeline.engine import Engine, JobCancelled
from mlx_qwen3asr.pipeline.result import Transcription
from mlx_qwen3asr.runtime.messages import one_line

__all__ = ["FINISHED", "JobOptions", "JobRunner", "STATUSES", "claim_jobs"]

log = logging.getLogger(__name__)

STATUSES = ("queued", "running", "done", "failed", "cancelled")
FINISHED = frozenset({"done", "failed", "cancelled"})
# A running job's progress is written to the library at most this often (it is kept in memory meanwhile).
PROGRESS_SECONDS = 0.5


@dataclass(frozen=True)
class JobOptions:
    """What a job asks for: the options of /v1/audio/transcriptions and of the library's jobs."""

    language: str | None = None  # canonical name, or None to detect
    context: str = ""
    word_timestamps: bool = False
    diarize: bool = False
    num_speakers: int | None = None
    speaker_names: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["speaker_names"] = list(self.speaker_names)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobOptions:
        return cls(
            language=d.get("language"),
            context=str(d.get("context") or ""),
            word_timestamps=bool(d.get("word_timestamps")),
            diarize=bool(d.get("diarize")),
            num_speakers=d.get("num_speakers"),
            speaker_names=tuple(d.get("speaker_names") or ()),
        )


def name_speakers(result: Transcription, names: tuple[str, ...]) -> Transcription:
    """The speakers' labels replaced by names, in order of first appearance (a name per speaker; extra
    names are unused, speakers beyond the names keep their labels)."""
    rename = {label: name for label, name in zip(result.speakers, names) if name}
    if not rename:
        return result
    for seg in result.segments:
        if seg.speaker in rename:
            seg.speaker = rename[seg.speaker]
        for w in seg.words:
            if w.speaker in rename:
                w.speaker = rename[w.speaker]
    result.speakers = [rename.get(s, s) for s in result.speakers]
    return result


class _Stop(Exception):
    """The runner is closing: the job stays unfinished, to run again when the library is opened next."""


class JobRunner:
    """Runs the library's jobs on an Engine.

    read_audio: decodes a file as mlx_qwen3asr.audio.files.read_audio does (path, max seconds) -> Decoded.
    diarize: (audio, seconds, result, num_speakers) -> the result with its speakers, or None when this
    runner cannot diarize (a job asking for it then fails with one line). model_id: recorded with each
    transcript. on_change: called with a job's id whenever its state changes (from the job's thread).
    """

    def __init__(
        self,
        library: Library,
        engine: Engine,
        *,
        read_audio: Callable[[str, float], Any],
        model_id: str | None = None,
        max_audio_seconds: float = 4 * 3600.0,
        diarize: Callable[[Any, float, Transcription, int | None], Transcription] | None = None,
        max_running: int = 2,
        on_change: Callable[[str], None] | None = None,
    ) -> None:
        self.library, self.engine, self.read_audio = library, engine, read_audio
        self.model_id, self.max_audio_seconds = model_id, float(max_audio_seconds)
        self.diarize, self.on_change = diarize, on_change
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._lock = threading.Lock()
        self._progress: dict[str, float] = {}
        self._engine_jobs: dict[str, Any] = {}
        self._cancelled: set[str] = set()
        self._closed = threading.Event()
        self._threads = [
            threading.Thread(target=self._work, name=f"mlxasr-library-job-{i}", daemon=True)
            for i in range(max(1, int(max_running)))
        ]
        self._started = False
        self._claim = claim_jobs(library.folder)  # before anything runs: one runner per library

    # -- callers' side ---------------------------------------------------------------------------

    def start(self) -> int:
        """Queue the jobs left unfinished (by a crash or a stop) and start working; returns how many."""
        left = self.library.unfinished_jobs()
        for job in left:
            self.library.set_job(job["id"], status="queued", progress=0.0)
            self._queue.put(job["id"])
        if left:
            log.info("%d unfinished job(s) from before run again", len(left))
        if not self._started:
            self._started = True
            for t in self._threads:
                t.start()
        return len(left)

    def submit(self, audio: Path, *, title: str, options: JobOptions, move_audio: bool = True) -> str:
        """Keep audio in the library as a new job's and queue it; returns the job's id."""
        if self._closed.is_set():
            raise RuntimeError("the job runner is closed")
        job_id = self.library.add_job(
            title=title, options=options.to_dict(), audio=audio, move_audio=move_audio
        )
        self._queue.put(job_id)
        self._changed(job_id)
        return job_id

    def state(self, job_id: str) -> dict[str, Any] | None:
        """The job as the library has it, with its progress as of now."""
        job = self.library.job(job_id)
        if job is None:
            return None
        with self._lock:
            if job_id in self._progress and job.get("status") == "running":
                job["progress"] = round(self._progress[job_id], 4)
        return job

    def cancel(self, job_id: str) -> dict[str, Any] | None:
        """Cancel a job that is queued or running (one that has finished stays as it is); returns its state,
        or None for an unknown id."""
        job = self.library.job(job_id)
        if job is None:
            return None
        if job["status"] in FINISHED:
            return job
        with self._lock:
            self._cancelled.add(job_id)
            running = self._engine_jobs.get(job_id)
        if running is not None:
            running.cancel()
        self.library.set_job(job_id, status="cancelled", error=None)
        self._changed(job_id)
        return self.state(job_id)

    def close(self, timeout: float = 10.0) -> None:
        """Stop: running jobs are left unfinished (they run again when the library is opened next)."""
        self._closed.set()
        with self._lock:
            running = list(self._engine_jobs.values())
        for job in running:
            with contextlib.suppress(Exception):
                job.cancel()
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + timeout
        for t in self._threads:
            if t.is_alive():
                t.join(max(0.0, deadline - time.monotonic()))
        if self._claim is not None:
            self._claim.close()  # the lock goes with it
            self._claim = None

    # -- the jobs' threads -----------------------------------------------------------------------

    def _changed(self, job_id: str) -> None:
        if self.on_change is not None:
            with contextlib.suppress(Exception):
                self.on_change(job_id)

    def _work(self) -> None:
        while True:
            job_id = self._queue.get()
            if job_id is None or self._closed.is_set():
                return
            try:
                self._run(job_id)
            except _Stop:
                log.info("job %s left unfinished: the server is stopping", job_id)
            except Exception as e:  # one job's failure ends that job alone
                if job_id in self._cancelled:
                    continue
                log.error("job %s failed", job_id, exc_info=(type(e), e, e.__traceback__))
                with contextlib.suppress(Exception):
                    self.library.set_job(
                        job_id, status="failed", error=_reason(e, self.library.job_audio(job_id))
                    )
                self._changed(job_id)
            finally:
                with self._lock:
                    self._engine_jobs.pop(job_id, None)
                    self._progress.pop(job_id, None)

    def _run(self, job_id: str) -> None:
        job = self.library.job(job_id)
        if job is None or job["status"] in FINISHED or job_id in self._cancelled:
            return
        options = JobOptions.from_dict(job.get("options") or {})
        path = self.library.job_audio(job_id)
        if path is None:
            raise FileNotFoundError("its audio is gone from the library")
        self.library.set_job(job_id, status="running", progress=0.0, error=None)
        self._changed(job_id)
        decoded = self.read_audio(str(path), self.max_audio_seconds)
        signal, seconds = decoded.signal, decoded.seconds
        in_memory = isinstance(signal, ArraySignal)
        audio: Any = signal.samples() if in_memory else str(path)
        if not in_memory:
            signal.close()
        if options.diarize and self.diarize is None:
            raise RuntimeError(
                "speaker diarization is not available on this server (start it with --diarize)"
            )
        running = self.engine.submit(
            audio,
            language=options.language,
            context=options.context,
            word_timestamps=options.word_timestamps or (options.diarize and self.engine.aligner is not None),
            seconds=seconds,
        )
        with self._lock:
            self._engine_jobs[job_id] = running
            cancelled = job_id in self._cancelled
        if cancelled or self._closed.is_set():
            running.cancel()
        written = time.monotonic()
        for seg in running.segments():
            progress = min(1.0, max(0.0, seg.end / seconds)) if seconds > 0 else 0.0
            with self._lock:
                self._progress[job_id] = progress
            if time.monotonic() - written >= PROGRESS_SECONDS:
                written = time.monotonic()
                self.library.set_job(job_id, progress=progress)
                self._changed(job_id)
        try:
            result = running.result()
        except JobCancelled:
            if job_id in self._cancelled:
                return
            raise _Stop() from None
        with contextlib.suppress(Exception):
            res = running.input_result
            if res is not None and res.wav is not None:
                res.wav.close()
        if options.diarize:
            assert self.diarize is not None
            result = self.diarize(audio, seconds, result, options.num_speakers)
        if options.speaker_names:
            result = name_speakers(result, options.speaker_names)
        if job_id in self._cancelled or self._closed.is_set():
            if self._closed.is_set() and job_id not in self._cancelled:
                raise _Stop()
            return
        self.library.set_job(job_id, progress=1.0)
        transcript_id = self.library.finish_job(
            job_id,
            result.to_dict(),
            title=job.get("title") or "",
            model=self.model_id,
            options=options.to_dict(),
        )
        log.info("job %s done: transcript %s", job_id, transcript_id)
        self._changed(job_id)


def claim_jobs(folder: Path) -> Any:
    """An exclusive lock on the library's jobs (jobs.lock in its folder), held until closed: two servers on
    one library would both run its unfinished jobs. Raises LibraryError when another process holds it.
    The system drops the lock when the process ends, however it ends."""
    import fcntl

    handle = open(folder / "jobs.lock", "a+b")  # noqa: SIM115 - held open for the runner's life
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        raise LibraryError(
            f"the library {folder} is in use by another server (its jobs run there); "
            "give this one another --library, or --no-library"
        ) from None
    return handle


def _reason(e: BaseException, path: Path | None = None) -> str:
    """One line saying why a job failed, without the library's paths or tracebacks."""
    text = _why(e)
    if path is not None:
        for secret in (str(path), str(path.parent), path.name):
            text = text.replace(secret, "the job's audio")
    return text


def _why(e: BaseException) -> str:
    if isinstance(e, AudioTooLong):
        return "the audio is longer than this server transcribes"
    if isinstance(e, AudioError):
        return f"the file could not be read as audio: {one_line(e.reason)}"
    if isinstance(e, OSError) and e.errno == errno.ENOSPC:
        return "no room to keep the transcript: the library's disk is full"
    if isinstance(e, (RuntimeError, FileNotFoundError, ValueError)):
        return one_line(str(e))
    return "transcription failed (internal error; see the server log)"
