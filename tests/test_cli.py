import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import pytest

from tasks import cli, completion
from tasks.core import storage
from tasks.stages.registry import STAGES


def test_stage_corpus_runs_then_skips(tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    argv = [
        "stage-corpus",
        "--source",
        str(source),
        "--ingest-date",
        "2026-11-30",
        "--store",
        str(tmp_path / "store"),
        "--quiet",
    ]
    assert cli.main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["skipped"] is False and first["stats"]["rows_written"] == 2
    assert storage.exists(first["manifest"])
    assert cli.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is True
    assert cli.main([*argv, "--force"]) == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is False


def test_a_stage_logs_on_stderr_and_prints_only_its_summary_on_stdout(tmp_path):
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    hpd = Path(sys.executable).parent / "hpd"
    argv = [hpd, "stage-corpus", "--source", source, "--ingest-date", "2026-11-30", "--store", tmp_path / "store"]
    done = subprocess.run(argv, capture_output=True, text=True, check=True)
    summary = json.loads(done.stdout)
    assert summary["skipped"] is False
    run = "INFO tasks.core.manifest: stage_corpus ingest_date=2026-11-30: "
    assert re.search(
        rf"^\d{{4}}-\d\d-\d\d [\d:,]+ {run}started run \w+ in file://{tmp_path}/store; ", done.stderr, re.M
    )
    assert f"{run}running: no manifest at {summary['manifest']}\n" in done.stderr
    assert f"{run}published 1 object(s), 2 rows, " in done.stderr
    assert "\r" not in done.stderr  # no progress bar where stderr is no terminal


def test_bad_parameters_exit_2_naming_each(tmp_path, capsys):
    assert cli.main(["stage-corpus", "--source", "x", "--ingest-date", "soon", "--max-chars", "0"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpd: error: ") and "Params" not in err
    assert "--ingest-date: Input should be a valid date" in err and "(got 'soon')" in err
    assert "--max-chars: Input should be greater than 0 (got '0')" in err


def test_bad_input_exits_1_naming_it(tmp_path, capsys):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"\xff\xfe")
    store = tmp_path / "store"
    assert cli.main(["stage-corpus", "--source", str(bad), "--ingest-date", "2026-11-30", "--store", str(store)]) == 1
    assert f"file://{bad}: not valid UTF-8" in capsys.readouterr().err
    assert not store.exists() or storage.list_uris(storage.to_uri(str(store))) == []


@pytest.mark.parametrize(
    ("query", "problem"),
    [
        ("", "the query is empty"),
        ("  \t ", "the query is empty"),
        ("\x00\x1b", "the query is empty"),
        ("a dog\udcff", "the query is not valid UTF-8"),  # byte 0xff on a command line, as Python decodes it
    ],
)
def test_a_search_without_text_or_not_utf8_exits_1_saying_so(tmp_path, capsys, monkeypatch, query, problem):
    monkeypatch.setenv("HPD_SERVE_URL", "http://127.0.0.1:9")  # were a service asked, this one is down
    assert cli.main(["search", query, "--store", str(tmp_path / "store")]) == 1
    captured = capsys.readouterr()
    assert captured.err.startswith(f"hpd: error: {problem}") and captured.out == ""
    assert len(captured.err.splitlines()) == 1 and "Traceback" not in captured.err


def test_a_search_for_bytes_that_are_not_utf8_exits_1_from_the_command_line(tmp_path):
    hpd = Path(sys.executable).parent / "hpd"
    argv = [bytes(hpd), b"search", b"caf\xe9 \xff", b"--store", bytes(tmp_path / "store")]
    done = subprocess.run(argv, capture_output=True, timeout=120, env={**os.environ, "HPD_SERVE_URL": "off"})
    assert done.returncode == 1 and done.stdout == b""
    assert done.stderr.decode() == "hpd: error: the query is not valid UTF-8 text\n"


def test_installed_entry_point_has_a_help_per_stage():
    hpd = Path(sys.executable).parent / "hpd"
    out = subprocess.run([hpd, "stage-corpus", "--help"], capture_output=True, text=True, check=True).stdout
    assert "--ingest-date" in out and "--shard-rows" in out and "--force" in out


_HELP_PROBE = """
import argparse, contextlib, io, json, sys
from tasks import cli
parser = cli.build_parser()
(sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
helps = {}
for argv in [["--help"], *[[name, "--help"] for name in sub.choices]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            code = exc.code
        else:
            code = "no exit"
    helps[" ".join(argv)] = {"code": code, "chars": len(out.getvalue())}
print(json.dumps({"helps": helps, "heavy": sorted(m for m in ("torch", "transformers") if m in sys.modules)}))
"""


def test_help_of_every_command_imports_neither_torch_nor_transformers():
    run = subprocess.run([sys.executable, "-c", _HELP_PROBE], capture_output=True, text=True, check=True, timeout=120)
    report = json.loads(run.stdout.strip().splitlines()[-1])
    expected = {"--help"} | {f"{cli.command_name(stage)} --help" for stage in STAGES}
    assert expected <= set(report["helps"])
    for argv, result in report["helps"].items():
        assert result["code"] == 0 and result["chars"] > 100, argv
    assert report["heavy"] == []


def _timed(argv: list) -> tuple[float, str]:
    start = time.perf_counter()
    out = subprocess.run(argv, capture_output=True, text=True, check=True, timeout=60).stdout
    return time.perf_counter() - start, out


def test_help_answers_in_under_a_second():
    """Acceptance requirement: ``hpd --help`` and ``hpd <stage> --help`` take under 1 s (warm)."""
    hpd = Path(sys.executable).parent / "hpd"
    _timed([hpd, "--help"])  # warm-up: the first run pays for cold file caches
    for argv in ([hpd, "--help"], [hpd, "distill", "--help"]):
        times = []
        for _ in range(3):  # the best of three: a busy test machine's noise is not the CLI's time
            elapsed, out = _timed(argv)
            assert out.startswith("usage: hpd")
            times.append(elapsed)
            if elapsed < 1.0:
                break
        assert min(times) < 1.0, f"{' '.join(map(str, argv[1:]))}: " + ", ".join(f"{t:.2f} s" for t in times)


def test_help_shows_defaults_and_choices():
    hpd = Path(sys.executable).parent / "hpd"
    out = subprocess.run([hpd, "distill", "--help"], capture_output=True, text=True, check=True).stdout
    text = " ".join(out.split())  # argparse wraps lines at the terminal width
    assert "--init {ridge,pca,random}" in text and "(default: ridge)" in text
    assert "--amp {auto,off,bf16,fp16}" in text and "(default: auto)" in text
    assert "(default: 5)" in text  # epochs
    assert "--store STORE" in text and "(default: $HPD_STORE, else ./var/store)" in text
    assert "--batch-size BATCH_SIZE" in text and "--force" in text
    assert "--ingest-date" not in text  # each stage shows its own options
    top = " ".join(subprocess.run([hpd, "--help"], capture_output=True, text=True, check=True).stdout.split())
    for stage in STAGES:
        assert cli.command_name(stage) in top


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["validate", "--model-run", "../../../x/pwned"], "model_run"),
        (["build-index", "--model-run", "../x"], "model_run"),
        (["fit-pca", "--name", ".."], "name"),
        (["distill", "--name", "a/b"], "name"),
        (["distill", "--pca-name", ".."], "pca_name"),
        (["quality", "--ingest-date", "2026-11-30", "--pca-name", "../k"], "pca_name"),
        (["build-index", "--name", ".hidden"], "name"),
        (["fit-pca", "--name", "x\n"], "name"),
    ],
)
def test_path_like_names_exit_2_naming_the_field_and_write_nothing(tmp_path, capsys, argv, field):
    """Containment: a run, model run, PCA run or index name is one path segment; '..', '/' are refused
    as bad parameters before any stage touches the store."""
    store = tmp_path / "store"
    assert cli.main([*argv, "--store", str(store), "--quiet"]) == 2
    err = capsys.readouterr().err
    flag = "--" + field.replace("_", "-")
    assert f"{flag}: String should match pattern" in err and f"(got {argv[-1]!r})" in err
    assert not store.exists()
    assert list(tmp_path.iterdir()) == []  # nor anything beside it (where '../x' would lead)


def test_version_is_the_installed_package_version():
    hpd = Path(sys.executable).parent / "hpd"
    out = subprocess.run([hpd, "--version"], capture_output=True, text=True, check=True).stdout
    assert out == f"hpd {metadata.version('hpd-pipeline')}\n"


def test_every_command_and_option_has_help():
    missing = []
    for path, parser in completion.commands(cli.build_parser()).items():
        for action in parser._actions:
            names = "/".join(action.option_strings) or action.dest
            described = re.sub(r"\(default: [^)]*\)", "", action.help or "").strip()
            if not described or action.help == argparse.SUPPRESS:  # a default alone describes nothing
                missing.append(f"hpd {path.replace('/', ' ')} {names}")
            if isinstance(action, argparse._SubParsersAction):
                described = {choice.dest for choice in action._choices_actions if choice.help}
                missing += [f"hpd {path} {name} (no help)" for name in action.choices if name not in described]
    assert missing == []


def test_log_level_is_taken_before_or_after_the_command_and_is_no_stage_parameter(tmp_path, capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["--log-level", "debug", "runs", "list"]).log_level == "DEBUG"
    assert parser.parse_args(["runs", "list", "--log-level", "info"]).log_level == "INFO"
    assert not hasattr(parser.parse_args(["runs", "list"]), "log_level")
    source = tmp_path / "raw.txt"
    source.write_text("one\n")
    argv = ["stage-corpus", "--source", str(source), "--ingest-date", "2026-11-30", "--store", str(tmp_path / "s")]
    assert cli.main([*argv, "--quiet", "--log-level", "ERROR"]) == 0  # not passed on to the stage's params
    assert json.loads(capsys.readouterr().out)["stats"]["rows_written"] == 1


_LEVELS = """
import json, logging
from tasks import cli
cli.configure_logging({level!r})
names = ("tasks", "faiss.loader", "transformers", "torch", "py.warnings", "botocore")
print(json.dumps({{name: logging.getLevelName(logging.getLogger(name).getEffectiveLevel()) for name in names}}))
"""


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (None, {"tasks": "INFO", "botocore": "WARNING", "faiss.loader": "ERROR", "transformers": "ERROR"}),
        ("DEBUG", {"tasks": "DEBUG", "botocore": "DEBUG", "faiss.loader": "DEBUG", "py.warnings": "DEBUG"}),
    ],
)
def test_the_default_level_quiets_the_chatty_libraries_and_log_level_opens_them(level, expected):
    code = _LEVELS.format(level=level)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    levels = json.loads(run.stdout)
    assert {name: levels[name] for name in expected} == expected


def _complete(script: str, *words: str) -> list[str]:
    """What bash offers after ``hpd WORDS...`` (the last word being typed) through the hook ``script``: argcomplete's
    function, which runs the installed ``hpd`` to complete the line."""
    line = " ".join(["hpd", *words])  # a last word "" leaves the space after the one before
    probe = (
        f"{script}\nCOMP_WORDS=(hpd {' '.join(map(shlex.quote, words))}); COMP_CWORD={len(words)}; "
        f"COMP_LINE={shlex.quote(line)}; COMP_POINT=${{#COMP_LINE}}; _python_argcomplete hpd; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True, env=env)
    return done.stdout.split()


def test_bash_completion_offers_commands_options_and_choices(capsys):
    """`hpd completion bash` prints argcomplete's hook, and through it bash completes commands, sub-commands, flags
    and choices from the parser itself; zsh and fish have theirs."""
    assert cli.main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    parser = cli.build_parser()
    commands = completion.commands(parser)
    top = {name for name in commands if name and "/" not in name}
    assert top >= {cli.command_name(stage) for stage in STAGES} | {"search", "serve", "runs", "completion"}
    assert top <= set(_complete(script, ""))
    assert _complete(script, "se") == ["search", "serve"]
    assert {word for word in _complete(script, "runs", "") if not word.startswith("-")} == {"list", "compare"}
    assert _complete(script, "runs", "compare", "--o") == ["--output"]
    assert _complete(script, "distill", "--amp", "") == ["auto", "off", "bf16", "fp16"]
    assert _complete(script, "--log-level", "WARNING", "serve", "--query-encoder", "t") == ["torch"]
    options = {o for a in commands["build-index"]._actions for o in a.option_strings}
    assert set(_complete(script, "build-index", "--")) == {o for o in options if o.startswith("--")}
    for shell in ("zsh", "fish"):
        assert cli.main(["completion", shell]) == 0
        assert "_ARGCOMPLETE" in capsys.readouterr().out


def test_every_command_that_prints_a_result_takes_one_output_option():
    """-o/--output json|table: on every stage, search, lineage, runs list/compare and demo; none of the older
    --json or --table flags."""
    printing = set()
    for path, parser in completion.commands(cli.build_parser()).items():
        flags = {flag for action in parser._actions for flag in action.option_strings}
        assert not flags & {"--json", "--table"}, path
        output = [action for action in parser._actions if "--output" in action.option_strings]
        if output:
            assert output[0].option_strings == ["-o", "--output"] and output[0].choices == ("json", "table")
            printing.add(path)
    stages = {cli.command_name(stage) for stage in STAGES}
    assert printing == stages | {"search", "lineage", "runs/list", "runs/compare", "demo"}


def test_a_stage_prints_its_summary_as_json_or_as_a_table(tmp_path, capsys):
    source = tmp_path / "raw.txt"
    source.write_text("one\ntwo\n")
    argv = ["stage-corpus", "--source", str(source), "--ingest-date", "2026-11-30", "--store", str(tmp_path / "s")]
    assert cli.main([*argv, "--quiet", "-o", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert cli.main([*argv, "--quiet", "--output", "table"]) == 0
    rows = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert rows["manifest"] == summary["manifest"] and rows["skipped"] == "True"
    assert rows["stats.rows_written"] == "2" and rows["outputs"] == str(summary["outputs"])
