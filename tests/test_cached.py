"""The tests' disk cache (tests/cached.py): keyed by everything that makes an entry, built once, whole."""

from __future__ import annotations

import multiprocessing
import os
import time

import cached
import numpy as np
import pytest


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cached, "CACHE", tmp_path / "cache")
    return tmp_path / "cache"


def test_a_key_changes_with_any_input_a_file_or_a_folder_s_content(tmp_path):
    tool = tmp_path / "tool.py"
    tool.write_text("print(1)\n")
    data = tmp_path / "published"
    (data / "sub").mkdir(parents=True)
    (data / "sub" / "config.json").write_text("{}")
    first = cached.key_of(tool, data, "tiny", 0, np.zeros(3))
    assert first == cached.key_of(tool, data, "tiny", 0, np.zeros(3))
    assert first != cached.key_of(tool, data, "tiny", 1, np.zeros(3))
    assert first != cached.key_of(tool, data, "tiny", 0, np.ones(3))
    assert first != cached.key_of(tool, data, "tiny", 0, np.zeros(3, np.float32))
    tool.write_text("print(2)\n")
    second = cached.key_of(tool, data, "tiny", 0, np.zeros(3))
    assert second != first
    (data / "sub" / "config.json").write_text('{"a": 1}')
    assert cached.key_of(tool, data, "tiny", 0, np.zeros(3)) not in (first, second)
    (data / "sub" / "config.json").rename(data / "sub" / "other.json")
    assert len({first, second, cached.key_of(tool, data, "tiny", 0, np.zeros(3))}) == 3


def test_an_entry_is_built_once_and_then_read(cache):
    calls = []

    def build(folder):
        calls.append(folder)
        (folder / "weights").write_text("w")

    one = cached.entry("checkpoints", "tiny-release", "k1", build)
    two = cached.entry("checkpoints", "tiny-release", "k1", build)
    assert one == two and (one / "weights").read_text() == "w" and len(calls) == 1
    assert cached.entry("checkpoints", "tiny-release", "k2", build) != one and len(calls) == 2
    kept = cached.arrays("official", "run", "k", lambda: {"x": np.arange(4), "y": np.ones((2, 2))})
    again = cached.arrays("official", "run", "k", lambda: pytest.fail("computed twice"))
    assert again["x"].tolist() == [0, 1, 2, 3] and kept["y"].shape == again["y"].shape == (2, 2)


def test_a_failed_build_leaves_nothing_and_is_built_again(cache):
    def broken(folder):
        (folder / "half").write_text("x")
        raise RuntimeError("killed half way")

    with pytest.raises(RuntimeError):
        cached.entry("checkpoints", "tiny-release", "k", broken)
    assert not any(p.is_dir() for p in (cache / "checkpoints").iterdir())
    got = cached.entry("checkpoints", "tiny-release", "k", lambda f: (f / "whole").write_text("y"))
    assert sorted(p.name for p in got.iterdir()) == ["whole"]


def _build_slowly(root, out):
    cached.CACHE = root

    def build(folder):
        with open(out, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.5)
        (folder / "done").write_text("1")

    cached.entry("checkpoints", "0.6b-release", "k", build)


def test_two_processes_at_once_build_an_entry_once(cache, tmp_path):
    out = tmp_path / "builds.txt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_build_slowly, args=(cache, out)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert len(out.read_text().split()) == 1


def test_unused_entries_of_a_label_go_when_it_is_built_again(cache):
    old = cached.entry("checkpoints", "tiny-release", "old", lambda f: None)
    other = cached.entry("checkpoints", "tiny-hf", "old", lambda f: None)
    past = time.time() - cached.STALE_SECONDS - 60
    os.utime(old, (past, past))
    os.utime(other, (past, past))
    new = cached.entry("checkpoints", "tiny-release", "new", lambda f: None)
    assert new.is_dir() and not old.exists() and other.exists()
