import json
import subprocess
import sys
from pathlib import Path

from tasks import cli
from tasks.core import storage


def test_stage_corpus_runs_then_skips(tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    argv = ["stage-corpus", "--source", str(source), "--ingest-date", "2026-11-30", "--store",
            str(tmp_path / "store"), "--quiet"]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["skipped"] is False and first["stats"]["rows_written"] == 2
    assert storage.exists(first["manifest"])
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is True
    assert cli.main([*argv, "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is False


def test_bad_parameters_exit_2_naming_each(tmp_path, capsys):
    assert cli.main(["stage-corpus", "--source", "x", "--ingest-date", "soon", "--max-chars", "0"]) == 2
    err = capsys.readouterr().err
    assert "ingest_date" in err and "max_chars" in err


def test_bad_input_exits_1_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    store = tmp_path / "store"
    assert cli.main(["stage-corpus", "--source", str(bad), "--ingest-date", "2026-11-30",
                     "--store", str(store)]) == 1
    assert f"file://{bad}: not valid UTF-8" in capsys.readouterr().err
    assert not store.exists() or storage.list_uris(storage.to_uri(str(store))) == []


def test_installed_entry_point_has_a_help_per_stage():
    hpd = Path(sys.executable).parent / "hpd"
    out = subprocess.run([hpd, "stage-corpus", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--ingest-date" in out and "--shard-rows" in out and "--force" in out
