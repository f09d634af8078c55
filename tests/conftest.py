from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# Several test processes share the machine's cores (pytest -n N): each one's matrix-product threads
# (OpenBLAS's, torch's, and those of the diarizer's library, speakrs, which reads MATMUL_NUM_THREADS) get
# its share of the cores rather than all of them, so that one process's waiting threads never spin on a
# core another needs (the diarizer's tests ran 6 times slower beside the others). Set before those
# libraries load: they read it once.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MATMUL_NUM_THREADS"):
        os.environ.setdefault(_name, str(max(1, (os.cpu_count() or 1) // _WORKERS)))


# The suite starts hundreds of Python processes (its workers, the commands it runs, the diarizer's worker,
# the reference's imports). Where PYTHONDONTWRITEBYTECODE is set (as some containers set it), each of them
# would compile every module it imports from source, every time: about 1 s of CPU for an mlxasr command,
# 10-20 s for torch and transformers. The suite keeps that bytecode in its own folder of the test cache
# instead (PYTHONPYCACHEPREFIX: nothing is written beside any source file), for this process and every
# process it starts. Set before pytest-xdist starts its workers.
if os.environ.pop("PYTHONDONTWRITEBYTECODE", None):
    import cached  # the test cache's folder (tests/cached.py)

    if not os.environ.get("PYTHONPYCACHEPREFIX"):
        os.environ["PYTHONPYCACHEPREFIX"] = str(cached.CACHE.resolve() / "pycache")
    sys.pycache_prefix = os.environ["PYTHONPYCACHEPREFIX"]
    sys.dont_write_bytecode = False


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker more than the cores. Many tests wait part of their time (on a server, a
    child process, a deadline, a hub that stalls by design), and a third worker on two cores computes
    while one of them waits."""
    return (os.cpu_count() or 1) + 1


# Imported before any test module imports mlx: the package loads OpenBLAS for MLX's CPU backend only
# if it comes first (mlx_qwen3asr.runtime.cpu); otherwise every MLX product runs on the slow bundled BLAS.
import mlx_qwen3asr  # noqa: E402

mlx_qwen3asr.tune_malloc()  # as the commands do

# The vocabulary travels with the repository (tools/published/), so a fresh clone runs the tests.
TOKENIZER_DIR = Path(__file__).resolve().parents[1] / "tools" / "published" / "tokenizer"


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The real Qwen3-ASR vocabulary (vocab.json, merges.txt, tokenizer_config.json, chat_template.json)."""
    required = ("vocab.json", "merges.txt", "tokenizer_config.json", "chat_template.json")
    missing = [name for name in required if not (TOKENIZER_DIR / name).is_file()]
    if missing:
        pytest.fail(
            f"tokenizer data missing: {TOKENIZER_DIR} lacks {', '.join(missing)} "
            "(tools/published/tokenizer is part of the repository)"
        )
    return TOKENIZER_DIR


REPO_ROOT = Path(__file__).resolve().parents[1]
# Tests build their checkpoints with the repository's own tool (tools/make_checkpoint.py).
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

# Figures the parity tests measured, printed once at the end of the run.
MEASUREMENTS: list[str] = []


@pytest.fixture(scope="session")
def measurements() -> list[str]:
    return MEASUREMENTS


def pytest_terminal_summary(terminalreporter):
    if MEASUREMENTS:
        terminalreporter.section("measured parity figures")
        for line in MEASUREMENTS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def checkpoints(tokenizer_dir):
    """Random-weight checkpoints exactly as published (tools/make_checkpoint.py), built once per preset
    and layout and kept on disk (tests/cached.py) under a key of the tool's source, the published
    metadata and vocabulary, the preset, layout and seed, and the numpy and safetensors versions: the
    run's workers, and later runs, share them. Never modify one in place: copy it first."""
    import cached

    made: dict[tuple[str, str], Path] = {}

    def get(preset: str, layout: str = "release") -> Path:
        if (preset, layout) not in made:
            made[preset, layout] = cached.checkpoint(preset, layout)
        return made[preset, layout]

    return get


@pytest.fixture(scope="session", autouse=True)
def _test_aligner(checkpoints):
    """mlxasr times words with a forced aligner when it writes subtitles; the default one is a hub
    download, so the tests name a random-weight aligner of the published layout instead."""
    import os

    os.environ["MLXASR_ALIGNER"] = str(checkpoints("aligner-tiny"))
    yield
    os.environ.pop("MLXASR_ALIGNER", None)


# The files that take longest (the real-shape parity cases, live sessions through the command) go
# first: pytest-xdist hands out whole files (--dist loadfile) in collection order, so a long file
# collected last would leave one worker running it alone at the end.
LONGEST_FIRST = (
    "test_parity.py",
    "test_align.py",
    "test_live.py",
    "test_streaming.py",
    "test_batching.py",
    "test_cli.py",
    "test_tokenizer.py",
)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="module", autouse=True)
def _free_memory_between_files():
    """What a test file's models leave in MLX's buffer cache goes back to the system before the next
    file: a worker that ran the real-shape parity cases would otherwise hold gigabytes it no longer
    uses, beside the other worker's."""
    yield
    import gc

    import mlx.core as mx

    gc.collect()
    mx.clear_cache()


@pytest.fixture(scope="session", autouse=True)
def _library_in_a_temporary_folder(tmp_path_factory):
    """Commands that keep a transcript library (mlxasr serve, --library) keep it in the run's temporary
    folder, never in the user's data folder."""
    os.environ["MLXASR_LIBRARY"] = str(tmp_path_factory.mktemp("library"))
    yield
    os.environ.pop("MLXASR_LIBRARY", None)
