"""Every ``hpd`` command, given bad input, fails in one line that names it, exit 1 (bad input) or 2 (bad
parameters), and never with a traceback: one case a command, the commands read from the parser itself, so a new
command fails this test until it has its case. The cases run ``tasks.cli.main`` in this process, on an empty store
beside a file that is not a store (the battery of ``tests/test_bad_input.py`` covers each trust rule in depth)."""

from __future__ import annotations

import argparse
import traceback
from pathlib import Path

import pytest

from tasks import cli

DAY = ("--ingest-date", "2026-11-30")


def _cases(store: str, folder: Path) -> dict[str, tuple[tuple[str, ...], int, str]]:
    """Each command's bad input: (argv, exit code, what the one line must name)."""
    missing = str(folder / "missing.txt")
    return {
        "stage-corpus": (("stage-corpus", "--store", store, "--source", missing, *DAY), 1, missing),
        "augment": (("augment", "--store", store, *DAY), 1, "no sentences staged for ingest_date=2026-11-30"),
        "encode-teacher": (("encode-teacher", "--store", store, *DAY), 1, "no sentences staged"),
        "fit-pca": (("fit-pca", "--store", store), 1, "no teacher embeddings"),
        "distill": (("distill", "--store", store), 1, "no PCA run 'k128-uncentered'"),
        "validate": (("validate", "--store", store, "--model-run", "nope"), 1, "no published distill run 'nope'"),
        "build-index": (("build-index", "--store", store), 1, "no promoted model"),
        "quality": (("quality", "--store", store, *DAY), 1, "nothing staged for ingest_date=2026-11-30"),
        "drift": (("drift", "--store", store, *DAY), 1, "no promoted model"),
        "gc": (("gc", "--store", store, "--retention-hours", "-1"), 2, "--retention-hours"),
        "search": (("search", "a query", "--store", store, "--local"), 1, "no index promoted yet"),
        "serve": (("serve", "--store", store, "--port", "70000"), 2, "--port"),
        "demo": (("demo", "--store", store, "--source", missing), 1, missing),
        "lineage": (("lineage", "--store", store), 1, "nothing is promoted"),
        "runs": (("runs", "compare", "a", "b", "--store", store), 1, "no such model run"),
        "completion": (("completion", "tcsh"), 2, "tcsh"),
    }


def _commands() -> set[str]:
    """The parser's subcommands."""
    parser = cli.build_parser()
    (commands,) = (a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return set(commands.choices)


def test_every_command_has_a_bad_input_case(tmp_path):
    assert set(_cases("file:///store", tmp_path)) == _commands()


@pytest.mark.parametrize("command", sorted(_commands()))
def test_bad_input_is_one_line_naming_it_never_a_traceback(command, tmp_path, capsys):
    store = (tmp_path / "store").as_uri()
    argv, code, named = _cases(store, tmp_path)[command]
    try:
        exited = cli.main(list(argv))
    except SystemExit as exit_:  # argparse refuses a parameter by exiting
        exited = exit_.code
    except Exception:  # noqa: BLE001 - what the console script would print as a traceback
        pytest.fail(f"hpd {' '.join(argv)} raised:\n{traceback.format_exc()}")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(("hpd: error:", "hpd ", "usage:"))]
    assert exited == code, err
    assert "Traceback" not in err and named in err, err
    assert any(line.startswith("hpd: error:") or "error:" in line for line in lines), err


@pytest.mark.parametrize(
    "argv",
    [
        ("encode-teacher", "--teacher", "https://someone:topsecret@models.example/x", *DAY),
        ("stage-corpus", "--source", "s3://someone:topsecret@bucket/{day}/", *DAY),
    ],
    ids=["teacher", "source"],
)
def test_credentials_in_a_flag_never_reach_the_error_or_the_log(argv, tmp_path, capsys, caplog):
    """A flag that quotes a URI with credentials: the one line names it without them, and so does every log line."""
    store = (tmp_path / "store").as_uri()
    if argv[0] == "encode-teacher":
        raw = tmp_path / "raw.txt"
        raw.write_text("one sentence\nanother one\n")
        assert cli.main(["stage-corpus", "--store", store, "--source", str(raw), *DAY, "--quiet"]) == 0
    assert cli.main([*argv, "--store", store]) in (1, 2)
    err = capsys.readouterr().err
    assert "hpd: error:" in err and "topsecret" not in err, err
    assert all("topsecret" not in record.getMessage() for record in caplog.records)


def test_the_cli_log_filter_removes_credentials_from_any_line():
    import logging

    record = logging.LogRecord("tasks.x", logging.INFO, __file__, 1, "reading %s", ("s3://key:topsecret@b/x",), None)
    assert cli._Redacting().filter(record) and record.getMessage() == "reading s3://b/x"
