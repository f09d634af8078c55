"""The web page's tests in a real browser: Playwright for Python driving the system's Chromium (Debian's
`chromium` package; Playwright's own browser downloads are never used), against `mlxasr serve` run as a
command on random-weight checkpoints with a library in the test's folder.

Every page a test opens records each request it makes: none may leave the machine (`page` checks it
when the test ends). The tests skip, saying why, only where Chromium or Playwright is not installed.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest

CHROMIUM = Path(os.environ.get("MLXASR_TEST_CHROMIUM", "/usr/lib/chromium/chromium"))


def _missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "Playwright for Python is not installed (pip install playwright; never `playwright install`)"
    if not CHROMIUM.is_file():
        return f"no Chromium at {CHROMIUM} (apt-get install chromium fonts-noto-cjk)"
    return None


MISSING = _missing()
needs_browser = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


@dataclass
class Served:
    """`mlxasr serve` running as a command."""

    proc: subprocess.Popen
    url: str
    lines: list[str]
    library: Path
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)

    def log(self) -> str:
        return "".join(self.lines[-40:])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


def serve(
    checkpoints, folder: Path, *extra: str, key: str | None = None, port: int = 0, library: Path | None = None
) -> Served:
    """Start `mlxasr serve` on the tiny preset with the tiny aligner and a library in `folder`; returns
    once it listens."""
    library = library or folder / "library"
    env = {k: v for k, v in os.environ.items() if k != "MLXASR_API_KEY"}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(folder / "hf"))
    if key is not None:
        env["MLXASR_API_KEY"] = key
    args = (
        "--model",
        str(checkpoints("tiny")),
        "--aligner",
        str(checkpoints("aligner-tiny")),
        "--port",
        str(port),
        *(("--library", str(library)) if "--no-library" not in extra else ()),
        *extra,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlx_qwen3asr.cli.main", "serve", *args],
        cwd=folder,
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 120
    assert proc.stderr is not None
    for line in proc.stderr:
        lines.append(line)
        if line.startswith("listening on "):
            break
        assert time.monotonic() < deadline, "".join(lines)
    found = re.match(r"listening on (http://\S+)", lines[-1]) if lines else None
    assert found, "".join(lines)
    threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True).start()
    return Served(proc, found.group(1), lines, library, args, env)


@contextlib.contextmanager
def running(checkpoints, folder: Path, *extra: str, **kwargs) -> Iterator[Served]:
    """serve(...), stopped on the way out."""
    server = serve(checkpoints, folder, *extra, **kwargs)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def chromium(*args: str) -> Iterator[object]:
    """The system's Chromium under Playwright (headless), with extra command-line args."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=list(args))
        try:
            yield browser
        finally:
            browser.close()


class Requests:
    """Every request pages of a context make: none may go anywhere but the server (or data:, blob:)."""

    def __init__(self, context, server_url: str) -> None:
        self.urls: list[str] = []
        self.origin = urlsplit(server_url)
        context.on("request", lambda r: self.urls.append(r.url))

    def outside(self) -> list[str]:
        out = []
        for url in self.urls:
            parts = urlsplit(url)
            if parts.scheme in ("data", "blob"):
                continue
            if parts.hostname != self.origin.hostname or parts.port != self.origin.port:
                out.append(url)
        return out


@contextlib.contextmanager
def opened(browser, url: str, *, width: int = 1280, height: int = 860, **context_args) -> Iterator[object]:
    """A page of a fresh context (its own sessionStorage) at url, once the page says it is ready; on the
    way out, no request may have left the server and no script error may have happened."""
    context = browser.new_context(
        viewport={"width": width, "height": height}, accept_downloads=True, **context_args
    )
    requests = Requests(context, url)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(url)
        yield page
        assert requests.outside() == []
        assert errors == []
    finally:
        context.close()


def ready(page, timeout: float = 30_000) -> None:
    page.wait_for_selector("body[data-ready=true]", timeout=timeout)


def until(check, timeout: float = 30.0, every: float = 0.05) -> None:
    """Wait until check() is true (asked of the server from here, not by the page)."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(every)
