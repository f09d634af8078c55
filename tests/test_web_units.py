"""The page's pure JavaScript modules (time formats, the word being spoken, the timing of edited text,
speaker colours) under Node's own test runner: tests/web/*.test.mjs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
NODE = shutil.which("node")


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed (apt-get install nodejs)")
def test_the_page_modules_pass_their_node_tests():
    files = sorted(str(p) for p in (HERE / "web").glob("*.test.mjs"))
    assert files
    run = subprocess.run([NODE, "--test", *files], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    passed = [line for line in run.stdout.splitlines() if line.startswith("# pass ")]
    assert passed and int(passed[0].split()[-1]) >= 7, run.stdout[-2000:]
