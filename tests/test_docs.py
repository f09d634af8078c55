"""The README stays what a new user needs first, and what it shows is what the commands do: its setup
and test commands are the ones CI runs, every option and subcommand it names exists, and every page it
links to is in the repository."""

from __future__ import annotations

import re
from pathlib import Path

from mlx_qwen3asr.cli.main import main

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
# What a first read should cost: the peers' READMEs are 3 to 15 KB.
MAX_README_LINES = 220
MAX_README_BYTES = 16_000


def _fenced(text: str) -> list[str]:
    """The lines of the README's code blocks."""
    return [line for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S) for line in block.splitlines()]


def test_readme_is_short():
    assert len(README.splitlines()) <= MAX_README_LINES
    assert len(README.encode()) <= MAX_README_BYTES


def test_readme_links_point_at_files_in_the_repository():
    links = re.findall(r"\]\((?!https?://)([^)#]+)", README) + re.findall(r'<img src="([^"]+)"', README)
    assert "docs/images/web-reader.png" in links
    assert "docs/cli.md" in links and "docs/development.md" in links
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing


def test_readme_setup_and_test_commands_are_what_ci_runs():
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    code = _fenced(README)
    assert code[:1] == ["pip install . && mlxasr ./recordings --srt"]
    test = "python -m pytest -n auto --dist loadfile"
    install = code[code.index(test) - 1]
    assert (
        install == 'pip install -e ".[test,diarize]" && pip install --no-deps qwen-asr==0.0.6 mlx-lm==0.32.2'
    )
    # The same packages; CI leaves byte-compiling to the first import (--no-compile).
    assert 'python -m pip install -q --no-compile -e ".[test,diarize]"' in ci
    assert 'python -m pip install -q --no-compile --no-deps "qwen-asr==0.0.6" "mlx-lm==0.32.2"' in ci
    assert f"\n{test}\n" in ci


def _help(argv: list[str], capsys) -> str:
    capsys.readouterr()
    assert main(argv) == 0
    return capsys.readouterr().out


def _options_named(text: str) -> set[str]:
    """The long options a text names, leaving out those of other programs (pip, pytest, the tools/ scripts)."""
    text = re.sub(r"(pip|pytest|tools/\S+\.py)[^`\n]*", "", text)
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", text))


def test_every_option_the_readme_names_exists(capsys):
    commands = {
        "": [],
        "serve": ["serve"],
        "convert": ["convert"],
        "align": ["align"],
        "live": ["live"],
        "library": ["library"],
        "app": ["app"],
    }
    known = {name: _options_named(_help([*argv, "--help"], capsys)) for name, argv in commands.items()}
    sections = re.split(r"\n## ", README)
    unknown = []
    for section in sections:
        title = section.splitlines()[0]
        command = next(
            (c for c in ("serve", "convert", "align", "live", "library", "app") if f"mlxasr {c}" in title), ""
        )
        for option in _options_named(section):
            if option not in known[command] and option not in known[""]:
                unknown.append((title, option))
    assert not unknown


def test_every_subcommand_the_readme_names_has_help(capsys):
    named = set(re.findall(r"`mlxasr (serve|convert|align|live|library|app)\b", README))
    assert named == {"serve", "convert", "align", "live", "library", "app"}
    for command in named:
        assert "usage:" in _help([command, "--help"], capsys)
