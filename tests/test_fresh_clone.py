"""A clone of the repository with nothing beside it builds its test checkpoints and runs its tests.

Everything the tests read (the vocabulary, merges and published checkpoint metadata) is part of the
repository under tools/published/; nothing may be read from a folder next to the clone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _tracked_files() -> list[str]:
    if not (REPO / ".git").exists() or shutil.which("git") is None:
        pytest.fail("the fresh-clone test needs the repository's git metadata and git")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [name for name in out.decode().split("\0") if name]


@pytest.fixture(scope="module")
def lone_clone(tmp_path_factory) -> Path:
    """The repository's files (tracked or not ignored, as a clone of the working tree would have them),
    two folders deep in an empty temporary folder, so that no `../shared` exists beside it."""
    root = tmp_path_factory.mktemp("alone") / "nothing-beside" / "repo"
    for name in _tracked_files():
        src = REPO / name
        if not src.is_file():
            continue  # deleted in the working tree
        dst = root / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
    assert not (root.parents[1] / "shared").exists()
    return root


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(cwd)  # the clone's own package, not the one installed from REPO
    env.pop("MLXASR_ALIGNER", None)
    env.pop("MLXASR_TEST_CACHE", None)  # the clone builds its own, in its own .test-cache/
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_the_published_metadata_and_vocabulary_are_in_the_repository():
    tracked = set(_tracked_files())
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.json"):
        assert f"tools/published/tokenizer/{name}" in tracked
    for folder in ("Qwen3-ASR-0.6B", "Qwen3-ForcedAligner-0.6B"):
        assert f"tools/published/real-checkpoints/{folder}/config.json" in tracked


def test_a_lone_clone_makes_checkpoints_from_its_own_files(lone_clone, tmp_path):
    out = tmp_path / "tiny"
    done = _run([sys.executable, "tools/make_checkpoint.py", "--preset", "tiny", "-o", str(out)], lone_clone)
    assert done.returncode == 0, done.stderr
    assert (out / "config.json").is_file() and (out / "vocab.json").is_file()
    assert (out / "merges.txt").stat().st_size == (
        lone_clone / "tools/published/tokenizer/merges.txt"
    ).stat().st_size


def test_a_lone_clone_runs_its_tests(lone_clone):
    """Tests that read what only the repository may hold: the vocabulary, and checkpoints built from the
    published metadata in both layouts (compared with that metadata)."""
    done = _run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_tokenizer.py",
            "tests/test_layouts.py",
            "-k",
            "known_ids or metadata_is_the_published",
        ],
        lone_clone,
    )
    tail = (done.stdout + done.stderr)[-3000:]
    assert done.returncode == 0, tail
    last = done.stdout.splitlines()[-1]
    assert " passed" in last and int(last.split()[0]) >= 17 and "error" not in last, tail
    assert (lone_clone / ".test-cache" / "checkpoints").is_dir()  # built there, from the clone's files
