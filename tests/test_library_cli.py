"""The library from the command line: `mlxasr DIR --library` files each transcript with its audio, `mlxasr
library` lists, searches, exports and imports; bad input gets one line and the rest carries on."""

from __future__ import annotations

import json
from pathlib import Path

import docx
import pytest
import srt
from scripted import script_batches, short_budgets, through_cli
from test_cli import drop_a_ctrl_c, write_audio

from mlx_qwen3asr.cli.main import main
from mlx_qwen3asr.library.store import Library

SAID = "We agreed on the budget for the new library building."


@pytest.fixture(scope="module")
def ckpt(checkpoints) -> str:
    return str(checkpoints("tiny"))


@pytest.fixture(autouse=True)
def _scripted(monkeypatch, ckpt):
    import mlx_qwen3asr

    tokenizer = mlx_qwen3asr.load(ckpt).tokenizer
    forced = tokenizer.token_to_id("<asr_text>")

    def say(prompt):
        return tokenizer.encode(SAID if forced in prompt else f"language English<asr_text>{SAID}")

    through_cli(monkeypatch, short_budgets(batch=script_batches(say).batch))


def test_a_folder_run_files_each_transcript_with_its_audio_once(tmp_path, ckpt, capsys):
    rec = tmp_path / "rec"
    first, second = write_audio(rec / "one.wav", 2.0, 1), write_audio(rec / "sub" / "two.wav", 3.0, 2)
    lib = tmp_path / "lib"
    args = [str(rec), "--txt", "--json", "--no-vad", "--model", ckpt, "--library", str(lib)]
    assert main(args) == 0
    with Library(lib) as library:
        items, total = library.list()
        assert total == 2 and sorted(t["title"] for t in items) == ["one", "two"]
        for t in items:
            stored = library.get(t["id"])
            assert SAID in stored["text"] and stored["segments"][0]["id"] == 0
            kept = library.audio_path(t["id"])
            source = first if t["title"] == "one" else second
            assert kept is not None and kept.read_bytes() == source.read_bytes()
    assert (rec / "one.txt").is_file()
    # A rerun finds everything done: nothing transcribed, nothing filed twice.
    assert main(args) == 0
    with Library(lib) as library:
        assert library.list()[1] == 2
    capsys.readouterr()

    # list, search, export
    assert main(["library", "--library", str(lib), "list"]) == 0
    listed = capsys.readouterr().out
    assert "one" in listed and "two" in listed
    assert main(["library", "search", "budget", "--library", str(lib)]) == 0
    hits = capsys.readouterr().out.splitlines()
    assert len(hits) == 2 and all("[budget]" in h for h in hits)
    tid = hits[0].split()[0]
    out = tmp_path / "t.srt"
    assert main(["library", "--library", str(lib), "export", tid, "-f", "srt", "-o", str(out)]) == 0
    assert SAID.split()[0] in " ".join(s.content for s in srt.parse(out.read_text(encoding="utf-8")))
    doc = tmp_path / "t.docx"
    assert main(["library", "--library", str(lib), "export", tid, "-f", "docx", "-o", str(doc)]) == 0
    assert any("budget" in p.text for p in docx.Document(doc).paragraphs)
    assert main(["library", "--library", str(lib), "export", tid, "-f", "docx"]) == 2
    assert main(["library", "--library", str(lib), "export", "../../etc/passwd"]) == 2
    assert main(["library", "--library", str(lib), "search", '"unclosed']) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("mlxasr library: error: ") for line in err)


def test_import_adds_earlier_json_outputs_with_their_audio_and_skips_bad_files(tmp_path, ckpt, capsys):
    rec = tmp_path / "rec"
    wav = write_audio(rec / "talk.wav", 2.0, 3)
    assert main([str(rec), "--json", "--no-vad", "--model", ckpt]) == 0
    (rec / "broken.json").write_text("{ not json", encoding="utf-8")
    (rec / "other.json").write_text(json.dumps({"hello": 1}), encoding="utf-8")
    lib = tmp_path / "lib"
    capsys.readouterr()
    assert main(["library", "--library", str(lib), "import", str(rec)]) == 1
    cap = capsys.readouterr()
    assert len([line for line in cap.err.splitlines() if ": skipped: " in line]) == 2
    assert cap.err.strip().endswith("imported 1 transcript(s), 2 skipped")
    with Library(lib) as library:
        (item,), total = library.list()
        assert total == 1 and item["title"] == "talk"
        assert library.audio_path(item["id"]).read_bytes() == wav.read_bytes()
        assert SAID in library.get(item["id"])["text"]


def test_a_ctrl_c_that_a_finalizer_drops_still_stops_an_import(tmp_path, ckpt, capsys, monkeypatch):
    rec = tmp_path / "rec"
    for i in range(3):
        write_audio(rec / f"talk{i}.wav", 1.0, i)
    assert main([str(rec), "--json", "--no-vad", "--model", ckpt]) == 0
    real_add = Library.add

    def add(self, *args, **kwargs):
        tid = real_add(self, *args, **kwargs)
        drop_a_ctrl_c()
        return tid

    monkeypatch.setattr(Library, "add", add)
    lib = tmp_path / "lib"
    capsys.readouterr()
    assert main(["library", "--library", str(lib), "import", str(rec)]) == 130
    err = capsys.readouterr().err
    assert "mlxasr library: interrupted" in err and "Exception ignored" not in err, err
    with Library(lib) as library:
        assert library.list()[1] == 1


def test_a_library_that_cannot_be_opened_stops_the_run_before_any_transcription(tmp_path, ckpt, capsys):
    rec = tmp_path / "rec"
    write_audio(rec / "one.wav", 1.0, 4)
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("x")
    assert main([str(rec), "--txt", "--no-vad", "--model", ckpt, "--library", str(blocker)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(blocker) in err[0]
    assert not (rec / "one.txt").exists()
    newer = tmp_path / "newer"
    with Library(newer) as library:
        with library.transaction() as conn:
            conn.execute("PRAGMA user_version = 999")
    assert main(["library", "--library", str(newer), "list"]) == 2
    assert "newer" in capsys.readouterr().err


def test_the_default_library_is_the_environment_s_folder(tmp_path, ckpt, monkeypatch):
    monkeypatch.setenv("MLXASR_LIBRARY", str(tmp_path / "env-lib"))
    rec = tmp_path / "rec"
    write_audio(rec / "one.wav", 1.0, 5)
    assert main([str(rec), "--txt", "--no-vad", "--model", ckpt, "--library"]) == 0
    with Library(Path(tmp_path / "env-lib")) as library:
        assert library.list()[1] == 1
