"""The package is pure Python: no compiled code, a py3-none-any wheel, nothing to build at install."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
COMPILED = {".c", ".cc", ".cpp", ".h", ".pyx", ".so", ".pyd", ".metal", ".cu"}


def test_no_compiled_sources_in_the_package():
    tracked = subprocess.run(
        ["git", "ls-files", "mlx_qwen3asr", "cli"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    files = (
        tracked.stdout.split()
        if tracked.returncode == 0
        else [str(p) for p in REPO.glob("mlx_qwen3asr/**/*")]
    )
    assert files
    assert [f for f in files if Path(f).suffix in COMPILED] == []
    assert not (REPO / "setup.py").exists()
    assert "ext-modules" not in (REPO / "pyproject.toml").read_text()


def test_the_wheel_is_py3_none_any(tmp_path):
    import shutil

    leftover = REPO / "build"
    had_build = leftover.exists()
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(REPO), "-w", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not had_build:  # setuptools builds in the source tree: leave it as it was
        shutil.rmtree(leftover, ignore_errors=True)
    assert build.returncode == 0, build.stderr[-2000:]
    wheels = list(tmp_path.glob("*.whl"))
    assert [w.name.endswith("-py3-none-any.whl") for w in wheels] == [True]
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
    assert "mlx_qwen3asr/model/decoder.py" in names and "mlx_qwen3asr/cli/main.py" in names
    # The web page ships as package data, every file of it.
    web = REPO / "mlx_qwen3asr" / "serve" / "web"
    page = sorted(f"mlx_qwen3asr/serve/web/{p.name}" for p in web.iterdir() if p.is_file())
    assert "mlx_qwen3asr/serve/web/index.html" in page and len(page) >= 8
    assert [n for n in page if n not in names] == []
    assert [n for n in names if Path(n).suffix in COMPILED] == []
