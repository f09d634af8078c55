"""What the tests build (random-weight checkpoints, the official implementation's outputs) kept on disk
between runs, and shared by the run's pytest-xdist workers, each under a key of everything that makes it.

A key is a hash of the inputs and of the code and data that turn them into the result: the tool's or
the reference's source, the published metadata, the preset and seed, the library versions. Anything
changed gives a new key, so nothing stale is ever read; a missing entry is built, under a lock that
makes a second worker (or a second run) wait for the first one's rather than build it again. An entry
appears whole or not at all (built in a temporary folder, then renamed into place: a run killed while
building leaves only its hidden temporary folder). Entries of a label unused for
a day are removed when the label is built again.

The cache lives in the repository's `.test-cache/` (ignored by git), or where MLXASR_TEST_CACHE says.
A fresh clone has none: it builds everything once, as CI does.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("MLXASR_TEST_CACHE") or REPO / ".test-cache")
STALE_SECONDS = 24 * 3600.0


def _hash_file(h, path: Path) -> None:
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)


def key_of(*parts) -> str:
    """A hash of these parts: strings, numbers, bytes, numpy arrays, files (their content) and folders
    (every file's relative path and content), lists and dicts of them."""
    h = hashlib.sha256()

    def add(part) -> None:
        if isinstance(part, Path):
            if part.is_dir():
                h.update(b"dir")
                for f in sorted(p for p in part.rglob("*") if p.is_file()):
                    h.update(str(f.relative_to(part)).encode())
                    _hash_file(h, f)
            else:
                h.update(b"file")
                _hash_file(h, part)
        elif isinstance(part, np.ndarray):
            h.update(f"array{part.dtype}{part.shape}".encode())
            h.update(np.ascontiguousarray(part).tobytes())
        elif isinstance(part, bytes):
            h.update(b"bytes" + part)
        elif isinstance(part, dict):
            h.update(b"dict")
            for k in sorted(part):
                add(str(k))
                add(part[k])
        elif isinstance(part, (list, tuple)):
            h.update(f"list{len(part)}".encode())
            for p in part:
                add(p)
        else:
            h.update(f"{type(part).__name__}:{part!r}".encode())
        h.update(b"\0")

    add(list(parts))
    return h.hexdigest()[:24]


@functools.cache
def versions(*names: str) -> dict[str, str]:
    """The installed versions of these distributions ('' for one that is not installed)."""
    found = {}
    for name in names:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = ""
    return found


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _touch(path: Path) -> None:
    with contextlib.suppress(OSError):
        os.utime(path)


def _drop_stale(kind: str, label: str, keep: Path) -> None:
    """Remove the other entries of this label that nobody used for a day (and temporary folders that a
    killed run left)."""
    now = time.time()
    for other in [*(CACHE / kind).glob(f"{label}.*"), *(CACHE / kind).glob(f".{label}.*")]:
        if other == keep or other.suffix == ".lock":
            continue
        with contextlib.suppress(OSError):
            if now - other.stat().st_mtime > STALE_SECONDS:
                (shutil.rmtree if other.is_dir() else os.unlink)(other)


def entry(kind: str, label: str, key: str, build: Callable[[Path], None]) -> Path:
    """The cached folder for (kind, label, key): built by build(folder) into an empty temporary folder
    the first time, then renamed into place; later calls (any process) get it as it is."""
    final = CACHE / kind / f"{label}.{key}"
    if final.is_dir():
        _touch(final)
        return final
    with _locked(CACHE / kind / f"{label}.{key}.lock"):
        if final.is_dir():
            _touch(final)
            return final
        work = CACHE / kind / f".{label}.{key}.{os.getpid()}"
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        try:
            build(work)
            os.rename(work, final)
        except BaseException:
            shutil.rmtree(work, ignore_errors=True)
            raise
    _drop_stale(kind, label, final)
    return final


def arrays(
    kind: str, label: str, key: str, compute: Callable[[], dict[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """compute()'s named arrays, kept as one .npz per key (computed once, under a lock)."""

    def build(folder: Path) -> None:
        np.savez(folder / "arrays.npz", **{k: np.asarray(v) for k, v in compute().items()})

    folder = entry(kind, label, key, build)
    with np.load(folder / "arrays.npz", allow_pickle=False) as data:
        return {k: data[k] for k in data.files}


def identity(path: Path) -> str:
    """What identifies a checkpoint folder's content: its cache key when it is a cached checkpoint,
    else a hash of its files."""
    path = Path(path)
    if path.parent == CACHE / "checkpoints":
        return path.name
    return key_of(path)


TOKENIZER_DIR = REPO / "tools" / "published" / "tokenizer"


def checkpoint(preset: str, layout: str = "release") -> Path:
    """The random-weight checkpoint of a preset and layout (tools/make_checkpoint.py, seed 0), built once
    and kept under a key of the tool's source, the published metadata and vocabulary, the preset,
    layout and seed, and the numpy and safetensors versions (tests/conftest.py's `checkpoints`)."""
    from tools.make_checkpoint import write_checkpoint

    sources = (REPO / "tools" / "make_checkpoint.py", REPO / "tools" / "published", TOKENIZER_DIR)
    tool = key_of(*sources, versions("numpy", "safetensors"))
    return entry(
        "checkpoints",
        f"{preset}-{layout}",
        key_of(tool, preset, layout, 0),
        lambda out: write_checkpoint(out, preset, seed=0, layout=layout, tokenizer_dir=TOKENIZER_DIR),
    )


def as_json(value) -> str:
    return json.dumps(value, sort_keys=True)


def main(argv: list[str] | None = None) -> int:
    """Build these checkpoints into the cache now (PRESET or PRESET:LAYOUT), as the tests would on first
    use: CI starts it while the test dependencies install, since the real-shape presets take most of a
    minute each."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python tests/cached.py", description=main.__doc__.splitlines()[0])
    parser.add_argument("checkpoints", nargs="+", metavar="PRESET[:LAYOUT]")
    args = parser.parse_args(argv)
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    import mlx_qwen3asr  # noqa: F401  (first, as the tests import it: it sets up MLX's CPU backend)

    for spec in args.checkpoints:
        preset, _, layout = spec.partition(":")
        started = time.perf_counter()
        path = checkpoint(preset, layout or "release")
        print(f"{path} ({time.perf_counter() - started:.1f} s)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
