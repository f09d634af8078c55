"""Checkpoints from the Hugging Face hub: a complete cached copy first, the network under a watchdog after.

A repo id already downloaded in full is used from the cache without any network request, so a run
starts offline and never waits on the hub. Otherwise huggingface_hub fetches it in a child process
that reports progress: a socket read that returns data, a change in the size of the repo's downloaded
files, a step of a progress bar. When none comes for $MLXASR_HUB_TIMEOUT seconds the child is killed
and the fetch fails. Timeouts set on the requests could not guarantee that: huggingface_hub passes its
own (`timeout=None` on 2.x's repository lookup, a 10 s read timeout with retries on 0.x's downloads),
and a hub that accepts the connection but never answers, or sends headers and then stalls, would hang
the run. A slow hub is not a silent one: bytes arriving, at any rate, keep the fetch alive. Killing
the child also ends its download threads and releases its file locks, which threads abandoned in this
process would hold. Every failure becomes one HubError line that says what to do.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# What a snapshot download needs: weights, configs, tokenizer and templates.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.jinja"]
# Seconds the hub may send nothing before the fetch fails ($MLXASR_HUB_TIMEOUT).
READ_TIMEOUT = 60.0
TIMEOUT_ENV = "MLXASR_HUB_TIMEOUT"
# Seconds the fetching process may take to start (import huggingface_hub) before the fetch fails.
START_TIMEOUT = 60.0
# How often the fetching process looks for progress.
POLL_SECONDS = 0.1

# Run in the fetching process: this file, loaded by its path so that the package (and MLX) is not
# imported, then fetch_worker() with the request.
_WORKER = (
    "import importlib.util, sys\n"
    "spec = importlib.util.spec_from_file_location('_mlxasr_hub_fetch', sys.argv[1])\n"
    "module = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(module)\n"
    "module.fetch_worker(sys.argv[2])\n"
)


# How every message ends that a local checkpoint would avoid; a command adds its option (`--model PATH`).
LOCAL_FOLDER = "give a local checkpoint folder"


class HubError(Exception):
    """The repo could not be found in the cache nor fetched; the message says why and what to do.

    short: the reason alone, in a few words, for a line that says itself what to do instead (the
    default aligner out of reach: words are then not timed)."""

    def __init__(self, message: str, short: str | None = None) -> None:
        super().__init__(message)
        self.short = short or message


def read_timeout() -> float:
    value = os.environ.get(TIMEOUT_ENV)
    try:
        seconds = float(value) if value else READ_TIMEOUT
    except ValueError:
        return READ_TIMEOUT
    return seconds if seconds > 0 else READ_TIMEOUT


def is_complete(path: Path) -> bool:
    """Whether a snapshot folder holds a config, a tokenizer and every weight file it names."""
    if not (path / "config.json").is_file():
        return False
    if not ((path / "tokenizer.json").is_file() or (path / "vocab.json").is_file()):
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return bool(shards) and all((path / name).is_file() for name in shards)
    return any(path.glob("*.safetensors"))


def cached_snapshot(repo: str) -> Path | None:
    """The repo's complete snapshot in the local cache, or None; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        path = Path(snapshot_download(repo, allow_patterns=HUB_PATTERNS, local_files_only=True))
    except Exception:  # not cached, or cached in part
        return None
    return path if is_complete(path) else None


def snapshot(repo: str) -> Path:
    """A local folder with the repo's checkpoint: from the cache when complete, else downloaded."""
    cached = cached_snapshot(repo)
    if cached is not None:
        return cached
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise HubError(
            f"{repo}: not in the local Hugging Face cache, and HF_HUB_OFFLINE is set; "
            f"download it once with the network on, or {LOCAL_FOLDER}",
            "not cached, HF_HUB_OFFLINE set",
        )
    request = {"repo": repo, "cache_dir": str(constants.HF_HUB_CACHE), "endpoint": constants.ENDPOINT}
    result = _fetch(request, read_timeout())
    if "path" in result:
        return Path(result["path"])
    chain = result.get("error") or [["Exception", "no result"]]
    raise HubError(f"{repo}: {_reason(chain)}", _short_reason(chain))


def _silent(seconds: float) -> str:
    return (
        f"the Hugging Face hub did not answer within {seconds:g} s; check the network, set "
        f"{TIMEOUT_ENV} to wait longer, or {LOCAL_FOLDER}"
    )


def _silent_short(seconds: float) -> str:
    return f"not cached, hub silent for {seconds:g} s"


def _fetch(request: dict, timeout: float) -> dict:
    """Run fetch_worker in a child process; its result, or HubError once it sends nothing for `timeout`."""
    import queue
    import subprocess
    import threading

    repo = request["repo"]
    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(Path(__file__).resolve()), json.dumps(request)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
    except OSError as e:
        raise HubError(f"{repo}: cannot start the download ({e})", "not cached, download cannot start") from e
    lines: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()

    def read() -> None:
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        started = False
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                if started:
                    raise HubError(f"{repo}: {_silent(timeout)}", _silent_short(timeout)) from None
                raise HubError(
                    f"{repo}: the download did not start within {START_TIMEOUT:g} s",
                    "not cached, download did not start",
                ) from None
            if line is None:
                raise HubError(
                    f"{repo}: the download stopped (exit status {proc.wait()})",
                    "not cached, download stopped",
                )
            if line.startswith(b"result "):
                return json.loads(line[len(b"result ") :])
            started = True  # progress: the clock starts again
            deadline = time.monotonic() + timeout
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        proc.stdin.close()
        proc.stdout.close()


def fetch_worker(request: str) -> None:
    """The fetching process: snapshot_download, with a `progress` line on stdout whenever bytes arrived or
    the download grew, then one `result` line (the path, or the exception chain). Ctrl-C and the end of
    the parent (its pipe on stdin closing) end it; its own stdout goes to stderr."""
    import signal
    import threading

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent kills it
    if sys.path and sys.path[0] in ("", "."):
        del sys.path[0]  # the working folder must not shadow huggingface_hub
    args = json.loads(request)
    report_fd = os.dup(1)
    os.dup2(2, 1)
    lock = threading.Lock()

    def send(line: str) -> None:
        with lock:
            os.write(report_fd, line.encode() + b"\n")

    def exit_with_parent() -> None:
        sys.stdin.buffer.read()
        os._exit(1)

    threading.Thread(target=exit_with_parent, daemon=True).start()
    from huggingface_hub import snapshot_download

    received = _count_progress()
    folder = Path(args["cache_dir"]) / ("models--" + args["repo"].replace("/", "--"))

    def watch() -> None:
        last = None
        while True:
            state = (received[0], _download_size(folder))
            if state != last:
                send("progress")
                last = state
            time.sleep(POLL_SECONDS)

    threading.Thread(target=watch, daemon=True).start()
    try:
        path = snapshot_download(
            args["repo"], allow_patterns=HUB_PATTERNS, cache_dir=args["cache_dir"], endpoint=args["endpoint"]
        )
        result = {"path": str(path)}
    except BaseException as e:
        result = {"error": [[type(x).__name__, " ".join(str(x).split())] for x in _chain(e)]}
    send("result " + json.dumps(result))
    os._exit(0)  # download threads still blocked on a socket must not hold the process


def _count_progress() -> list[int]:
    """A counter of socket reads that returned data and of progress bars advancing, in every thread of
    this process (the fetching one): hf_xet downloads outside Python's sockets and reports its bytes on
    huggingface_hub's progress bars."""
    import socket
    import ssl

    counter = [0]

    def counted(read):
        def wrapper(self, *args, **kwargs):
            data = read(self, *args, **kwargs)
            if data:
                counter[0] += 1
            return data

        return wrapper

    # Plain sockets read with recv/recv_into; TLS sockets decrypt with read, which their recv calls.
    for cls, names in ((socket.socket, ("recv", "recv_into")), (ssl.SSLSocket, ("read",))):
        for name in names:
            setattr(cls, name, counted(getattr(cls, name)))
    try:
        from tqdm.std import tqdm  # every progress bar of huggingface_hub derives from it
    except ImportError:
        return counter
    update = tqdm.update

    def counted_update(self, n=1):
        if n:
            counter[0] += 1
        return update(self, n)

    tqdm.update = counted_update
    return counter


def _download_size(folder: Path) -> int:
    """Bytes in the repo's cached blobs, partial downloads included: what downloads outside Python's
    sockets (hf_xet) have written."""
    total = 0
    try:
        with os.scandir(folder / "blobs") as entries:
            for entry in entries:
                try:
                    total += entry.stat(follow_symlinks=False).st_size
                except OSError:
                    pass
    except OSError:
        pass
    return total


def _chain(e: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    while e is not None and e not in out:
        out.append(e)
        e = e.__cause__ or e.__context__
    return out


def _reason(chain: list[list[str]]) -> str:
    """One line from the fetch's exception chain, as [type name, message] pairs, outermost first."""
    name, text = chain[0]
    if any("Timeout" in n or "timed out" in t.lower() for n, t in chain):
        return f"a request to the Hugging Face hub timed out; check the network, or {LOCAL_FOLDER}"
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "no such repository on the Hugging Face hub, or it needs a login (huggingface-cli login)"
    if name in ("LocalEntryNotFoundError", "ConnectionError", "OfflineModeIsEnabled"):
        return (
            "cannot reach the Hugging Face hub and no complete copy is cached; check the network, "
            f"or {LOCAL_FOLDER}"
        )
    return f"cannot fetch from the Hugging Face hub ({name}: {text[:300]})"


def _short_reason(chain: list[list[str]]) -> str:
    """_reason in a few words, without the advice."""
    name = chain[0][0]
    if any("Timeout" in n or "timed out" in t.lower() for n, t in chain):
        return "not cached, hub request timed out"
    if name in ("RepositoryNotFoundError", "GatedRepoError"):
        return "not on the hub (or it needs a login)"
    if name in ("LocalEntryNotFoundError", "ConnectionError", "OfflineModeIsEnabled"):
        return "not cached, hub unreachable"
    return f"not cached, hub failed ({name})"
