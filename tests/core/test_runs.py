import json
from datetime import date

import pytest

from tasks import cli
from tasks.core import catalog, config, runs
from tasks.stages import validate
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)
EXPECTED = {"redo": "stale", "fresh": "not validated", "slow": "failed", "fast": "passed"}  # newest first


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A tiny store with model runs 'fast' (validated, promoted), 'slow' (other lr and max_steps, failed the
    gate), 'fresh' (not validated) and 'redo' (validated, then distilled again: its validation is stale)."""
    prepared = projected_store(tmp_path_factory.mktemp("runs"), corpus_lines(40), DAY, shard_rows=20)
    store = prepared["store"]

    def check(name, **settings):
        values = {"store": store, "model_run": name, "retrieval_sample": 20, **settings}
        return validate.run(config.parse(validate.ValidateParams, values))

    distill_tiny(prepared, "fast", max_steps=2, lr=1e-3)
    distill_tiny(prepared, "slow", max_steps=3)
    assert check("fast", max_regression=100.0).stats["gate"]["passed"]
    assert not check("slow", min_stsb=99.0).stats["gate"]["passed"]
    distill_tiny(prepared, "fresh", max_steps=1)
    distill_tiny(prepared, "redo", max_steps=1)
    check("redo", promote=False)
    distill_tiny(prepared, "redo", max_steps=2)
    return store


def test_list_shows_every_run_newest_first_with_its_gate_and_the_promoted_one(store, capsys):
    found = runs.list_runs(store)
    assert {run.name: run.gate for run in found} == EXPECTED and [run.name for run in found] == list(EXPECTED)
    assert [run.name for run in found if run.promoted] == ["fast"]
    assert all(run.partitions == ["2026-11-01"] for run in found)
    fast = found[-1]
    assert fast.student_score("STS-B test") == fast.validation.sts.student["STS-B test"]
    assert found[0].validation is None and found[0].student_score("STS-B test") is None  # stale: left out

    assert cli.main(["runs", "list", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["run", "created", "partitions", "STS-B", "test", "SICK-R", "test", "gate", "promoted"]
    assert [line.split()[0] for line in lines[1:]] == list(EXPECTED)
    assert lines[-1].split()[0] == "fast" and lines[-1].split()[-2:] == ["passed", "*"]
    assert lines[2].split()[-4:] == ["-", "-", "not", "validated"]
    assert f"{fast.student_score('SICK-R test'):g}" in lines[-1]


def test_compare_marks_the_params_that_differ_and_not_the_others(store, capsys):
    rows = {row.name: row for row in runs.compare(store, "fast", "slow").rows}
    differing = {name for name, row in rows.items() if name.startswith("params.") and row.differs}
    assert differing == {"params.lr", "params.max_steps", "params.name"}
    assert (rows["params.lr"].a, rows["params.lr"].b) == (1e-3, 1e-4)
    assert not rows["params.batch_size"].differs and not rows["partitions"].differs
    assert (rows["gate"].a, rows["gate"].b, rows["promoted"].a, rows["promoted"].b) == ("passed", "failed", True, False)
    slow_stsb = rows["sts.student.STS-B test"].b
    assert rows["gate.margin.STS-B test.minimum"].b == pytest.approx(slow_stsb - 99.0, abs=0.011)
    assert rows["gate.margin.STS-B test.minimum"].a is None  # no minimum set for 'fast'
    assert rows["gate.reference"].b == "promoted model fast"
    assert {"fidelity.val_mse", "retrieval.recall_at_10_vs_teacher", "timings.distill.train"} <= set(rows)
    assert "timings.validate.total" in rows

    assert cli.main(["runs", "compare", "fast", "slow", "--store", store]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["fast", "slow"]
    assert any(line.split() == ["*", "params.lr", "0.001", "0.0001"] for line in lines)
    assert any(line.split() == ["*", "params.max_steps", "2", "3"] for line in lines)
    assert any(line.split() == ["params.batch_size", "16", "16"] and line.startswith(" ") for line in lines)


def test_compare_with_a_run_not_validated(store):
    rows = {row.name: row for row in runs.compare(store, "fast", "fresh").rows}
    assert rows["gate"].b == "not validated" and rows["sts.student.STS-B test"].b is None
    assert rows["sts.student.STS-B test"].differs and rows["timings.validate.total"].b is None
    assert rows["fidelity.val_mse"].b is not None


def test_json_round_trips(store, capsys):
    capsys.readouterr()
    assert cli.main(["runs", "list", "-o", "json", "--store", store]) == 0
    assert [runs.Run.from_dict(r) for r in json.loads(capsys.readouterr().out)] == runs.list_runs(store)
    assert cli.main(["runs", "compare", "slow", "fresh", "-o", "json", "--store", store]) == 0
    record = json.loads(capsys.readouterr().out)
    assert runs.Comparison.from_dict(record) == runs.compare(store, "slow", "fresh")
    assert (
        record["a"] == "slow"
        and {"name": "gate", "a": "failed", "b": "not validated", "differs": True} in record["rows"]
    )


def test_an_unknown_run_exits_1_naming_its_manifest(store, capsys):
    capsys.readouterr()
    assert cli.main(["runs", "compare", "fast", "nope", "--store", store]) == 1
    captured = capsys.readouterr()
    assert f"{catalog.manifest_uri(store, catalog.Stage.DISTILL, 'nope')}: no such model run" in captured.err
    assert "Traceback" not in captured.err and captured.out == ""


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["fast", "../x"], "'../x' is not a run name"), (["fast"], "the following arguments are required: B")],
)
def test_bad_arguments_exit_2(store, capsys, argv, named):
    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        cli.main(["runs", "compare", *argv, "--store", store])
    assert exited.value.code == 2 and named in capsys.readouterr().err


def test_an_empty_store_has_no_runs(tmp_path, capsys):
    assert cli.main(["runs", "list", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "no model runs\n"
