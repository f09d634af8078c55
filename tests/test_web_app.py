"""`mlxasr app`: the server on a free loopback port with the library, the page's address printed and
opened in the default browser (webbrowser, which follows $BROWSER: here a script that records what it
was asked to open)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx


def app(checkpoints, tmp_path, *extra: str, browser: bool = True) -> tuple[subprocess.Popen, dict]:
    opened = tmp_path / "opened.txt"
    script = tmp_path / "browser.py"
    script.write_text(f"import sys\nopen({str(opened)!r}, 'a').write(sys.argv[1] + '\\n')\n")
    env = {k: v for k, v in os.environ.items() if k not in ("MLXASR_API_KEY", "DISPLAY", "WAYLAND_DISPLAY")}
    env.update(HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"), MLXASR_LIBRARY=str(tmp_path / "library"))
    if browser:
        env["BROWSER"] = f"{sys.executable} {script} %s"
    else:
        env.pop("BROWSER", None)
    command = [
        sys.executable,
        "-m",
        "mlx_qwen3asr.cli.main",
        "app",
        "--model",
        str(checkpoints("tiny")),
        "--no-aligner",
    ]
    proc = subprocess.Popen(
        [*command, *extra], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    return proc, {"opened": opened}


def test_app_serves_the_page_on_a_free_port_prints_it_and_opens_it(checkpoints, tmp_path):
    proc, files = app(checkpoints, tmp_path)
    try:
        line = proc.stdout.readline()
        found = re.fullmatch(r"the page: (http://127\.0\.0\.1:(\d+)/)\n", line)
        assert found, line + proc.stderr.read() if proc.poll() is not None else line
        url, port = found.group(1), int(found.group(2))
        assert port not in (0, 8000)
        deadline = time.monotonic() + 30
        while not files["opened"].exists() or not files["opened"].read_text():
            assert time.monotonic() < deadline, "the browser was never asked to open the page"
            time.sleep(0.05)
        assert files["opened"].read_text() == url + "\n"
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and "<title>mlx-qwen3asr</title>" in page.text
        health = httpx.get(url + "health", timeout=30).json()
        assert health["library"] is True  # the page keeps its transcripts
        assert (tmp_path / "library" / "library.sqlite3").is_file()
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 130


def test_app_without_a_display_or_with_no_browser_prints_the_address_only(checkpoints, tmp_path):
    for extra, browser in (((), False), (("--no-browser",), True)):
        proc, files = app(checkpoints, tmp_path, *extra, browser=browser)
        try:
            line = proc.stdout.readline()
            assert line.startswith("the page: http://127.0.0.1:"), line
            url = line.split()[-1]
            assert httpx.get(url, timeout=30).status_code == 200
            time.sleep(0.5)
            assert not files["opened"].exists()
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 143
            err = proc.stderr.read()
        if not browser:
            assert f"no display to open a browser on: open {url} yourself" in err


def test_app_keeps_its_transcripts_so_no_library_is_a_usage_error(checkpoints, tmp_path):
    proc, _ = app(checkpoints, tmp_path, "--no-library")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert (
        err.strip().splitlines()[-1].endswith("--no-library: the page keeps its transcripts in the library")
    )
