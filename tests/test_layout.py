"""The package's layering, read from its source: each folder imports only from itself and the folders below.

The flow is file -> samples -> pieces -> features -> encoder -> decoder -> text -> words -> cues -> files:

    runtime       settings and default dtype, the CPU process setup, crash-safe files and folders
    audio         reading files, features, speech detection, cutting
    text          languages, prompts and output parsing, aligner items, their spans and times
    model         configuration, MLX modules, prefill, the decoding batch, greedy decoding
    checkpoints   hub, tokenizer, layouts, loading, conversion
    pipeline      inputs, scheduler, word timing, engine, transcribe()
    diarize       speaker turns (speakrs) and who spoke each word and segment
    outputs       cues, rendering, folder runs (finding inputs, naming, resuming, writing)
    library       the transcript library: SQLite store, search, revisions, jobs, exports
    serve         the HTTP server
    (package)     mlx_qwen3asr/__init__.py, the public API
    cli           the commands

Imports inside functions count too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "mlx_qwen3asr"
LAYERS = [
    "runtime",
    "audio",
    "text",
    "model",
    "checkpoints",
    "pipeline",
    "diarize",
    "outputs",
    "library",
    "serve",
    "",
    "cli",
]


def _module_files() -> dict[str, Path]:
    """Module name -> source file, for the package and the cli folder (installed as mlx_qwen3asr.cli)."""
    files = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "cli" in path.relative_to(PACKAGE).parts:  # a link to ../cli in some checkouts
            continue
        parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        files[".".join(["mlx_qwen3asr", *parts])] = path
    for path in sorted((ROOT / "cli").glob("*.py")):
        name = "mlx_qwen3asr.cli" + ("" if path.stem == "__init__" else f".{path.stem}")
        files[name] = path
    return files


MODULES = _module_files()


def _package_of(name: str, path: Path) -> str:
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def _resolve(target: str, modules: dict[str, Path]) -> str:
    """The module an imported name lives in: `a.b.c` is module `a.b.c`, or attribute `c` of module `a.b`."""
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target


def imports_of(name: str, modules: dict[str, Path] = MODULES) -> set[str]:
    """The package modules `name` imports, anywhere in its file."""
    path = modules[name]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = _package_of(name, path)
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            targets = [f"{module}.{alias.name}" for alias in node.names]
        for target in targets:
            if target.startswith("mlx_qwen3asr"):
                resolved = _resolve(target, modules)
                if resolved and resolved != name:
                    found.add(resolved)
    return found


def layer_of(name: str) -> int:
    parts = name.split(".")
    return LAYERS.index(parts[1] if len(parts) > 1 else "")


def layering_problems(modules: dict[str, Path] = MODULES) -> list[str]:
    problems = []
    for name in modules:
        for imported in sorted(imports_of(name, modules)):
            if layer_of(imported) > layer_of(name):
                problems.append(f"{name} imports {imported}, a layer above it")
    return problems


def cycles(modules: dict[str, Path] = MODULES) -> list[list[str]]:
    """Import cycles between modules (a package's __init__ importing its own modules is not one)."""
    graph = {
        name: {m for m in imports_of(name, modules) if not name.startswith(m + ".") and m != "mlx_qwen3asr"}
        for name in modules
    }
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                found.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)
    return found


def test_every_module_is_in_a_known_layer():
    for name in MODULES:
        assert layer_of(name) >= 0, name
    assert {name.split(".")[1] for name in MODULES if name.count(".")} == set(LAYERS) - {""}


def test_no_folder_imports_one_above_it():
    assert layering_problems() == []


def test_no_import_cycles():
    assert cycles() == []


def test_only_the_commands_import_the_public_api_module():
    users = [
        name
        for name in MODULES
        if "mlx_qwen3asr" in imports_of(name) and not name.startswith("mlx_qwen3asr.cli")
    ]
    assert users == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from mlx_qwen3asr.pipeline.transcribe import transcribe\n", "a layer above it"),
        ("def later():\n    from ..pipeline import scheduler\n", "a layer above it"),
        ("from mlx_qwen3asr.runtime.device import tuning\n", None),
    ],
)
def test_the_check_sees_upward_imports_even_inside_functions(tmp_path, source, problem):
    fake = tmp_path / "reader.py"
    fake.write_text(source)
    modules = dict(MODULES)
    modules["mlx_qwen3asr.audio.reader"] = fake
    found = [p for p in layering_problems(modules) if p.startswith("mlx_qwen3asr.audio.reader ")]
    if problem is None:
        assert found == []
    else:
        assert len(found) == 1 and problem in found[0]


def test_the_check_sees_a_cycle(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from mlx_qwen3asr.audio import b\n")
    b.write_text("def f():\n    from . import a\n")
    modules = {"mlx_qwen3asr.audio.a": a, "mlx_qwen3asr.audio.b": b}
    assert cycles(modules) == [["mlx_qwen3asr.audio.a", "mlx_qwen3asr.audio.b", "mlx_qwen3asr.audio.a"]]
