"""``hpd demo`` talks while it runs: the lines it keeps of Airflow's output, and its streaming of a command's output
(a small Python process in place of the chain's Airflow commands)."""

import re
import sys
import textwrap

import pytest

from tasks import demo
from tasks.core.progress import EVERY_S_ENV
from tasks.orchestration import airflow_cli

DAG = "airflow.sdk.definitions.dag"
API = "airflow.api_fastapi.execution_api.routes.task_instances"
STAGE = "tasks.stages.distill.stage"
MANIFEST = "tasks.core.manifest"


def _rendered(level: str, event: str, logger: str, extra: str = "") -> str:
    """A line as structlog's console renderer writes it for Airflow's CLI (no colours: not a terminal)."""
    return f"2026-12-06T04:18:54.739560Z [{level:<9}] {event:<30} [{logger}]{extra and ' ' + extra}\n"


COLOURED = (
    "\x1b[2m2026-12-06T04:18:54.8Z\x1b[0m [\x1b[33m\x1b[1mwarning  \x1b[0m] \x1b[1mdistill: a short epoch\x1b[0m "
    f"[\x1b[34m\x1b[1m{STAGE}\x1b[0m]\n"
)
PROGRESS = "distill demo-student: 640/2,000 rows (32.0%), 21.3 rows/s, ETA 1m04s, loss=0.0123"
# What `airflow dags test` writes as hpd_retrain's distill succeeds and its validate fails.
OUTPUT = [
    _rendered(
        "info", "Filling up the DagBag from /work/main/dags", "airflow.dag_processing.dagbag", "loc=dagbag.py:593"
    ),
    _rendered("warning", "/x.py:1: UserWarning: meh", "py.warnings", "filename=x.py lineno=1"),
    _rendered("info", "[DAG TEST] starting task_id=distill map_index=-1", DAG, "loc=dag.py:1501"),
    _rendered("info", "[DAG TEST] running task <TaskInstance: hpd_retrain.distill manual__2026 [scheduled]>", DAG),
    _rendered("info", "Task instance is in running state", "task", "loc=task_runner.py:1000"),
    _rendered("info", "distill demo-student: started run 1f2e in file:///s; inputs: 5 object(s)", MANIFEST),
    _rendered("info", "distill demo-student: input file:///s/sentences/part-0.parquet (80 rows)", MANIFEST),
    _rendered("info", 'distill demo-student: params k=128, name="demo-student"', MANIFEST),
    _rendered("info", "distill demo-student: running: no manifest at file:///s/manifests/distill.json", MANIFEST),
    _rendered("info", PROGRESS, "tasks.core.progress", "loc=progress.py:110"),
    _rendered("info", "distill demo-student: phase train took 2m01s", MANIFEST),
    _rendered("info", "distill demo-student: published 12 object(s), then the manifest", MANIFEST),
    COLOURED,
    _rendered("info", "Pushing xcom", "task", "loc=task_runner.py:2280 ti=TI(x)"),
    _rendered(
        "info", "Task instance state updated", API, "loc=task_instances.py:485 new_state=success rows_affected=1"
    ),
    _rendered("info", "[DAG TEST] end task task_id=distill map_index=-1", DAG, "loc=dag.py:1563"),
    _rendered("info", "[DAG TEST] starting task_id=validate map_index=-1", DAG, "loc=dag.py:1501"),
    _rendered("error", "Task failed with exception", "task", "loc=task_runner.py:1639"),
    "Traceback (most recent call last):\n",
    '  File "/work/main/tasks/stages/validate/stage.py", line 1, in run\n',
    "ValueError: no pairs\n",
    _rendered("info", "Task instance state updated", API, "new_state=<TaskInstanceState.FAILED: 'failed'>"),
    _rendered("info", "[DAG TEST] end task task_id=validate map_index=-1", DAG, "loc=dag.py:1563"),
    _rendered("info", "Marking run <DagRun hpd_retrain @ 2026-11-30> failed", "airflow.models.dagrun"),
]

KEPT = [
    "  [hpd_retrain 3.0s] task distill started",
    "  [hpd_retrain 3.0s] distill demo-student: running: no manifest at file:///s/manifests/distill.json",
    f"  [hpd_retrain 3.0s] {PROGRESS}",
    "  [hpd_retrain 3.0s] distill demo-student: published 12 object(s), then the manifest",
    "  [hpd_retrain 3.0s] warning: distill: a short epoch",
    "  [hpd_retrain 3.0s] task distill success in 0.0s",
    "  [hpd_retrain 3.0s] task validate started",
    "  [hpd_retrain 3.0s] error: Task failed with exception (task validate)",
    "  [hpd_retrain 3.0s] task validate failed in 0.0s",
]


def test_the_view_keeps_progress_task_states_and_errors():
    now = [100.0]
    view = demo.RunView("hpd_retrain", clock=lambda: now[0])
    now[0] = 103.0
    shown = [view.shown(line) for line in OUTPUT]
    assert [line for line in shown if line is not None] == KEPT


def test_the_heartbeat_names_the_running_task():
    now = [0.0]
    view = demo.RunView("hpd_retrain", clock=lambda: now[0])
    now[0] = 20.0
    assert view.heartbeat() == "  [hpd_retrain 20s] still running"
    assert view.shown(OUTPUT[2]) == "  [hpd_retrain 20s] task distill started"
    now[0] = 150.0
    assert view.heartbeat() == "  [hpd_retrain 2m30s] still running: task distill for 2m10s"


def _python(code: str) -> list[str]:
    return [sys.executable, "-c", textwrap.dedent(code)]


def _log(event: str) -> str:
    return _rendered("info", event, STAGE).rstrip()


def test_lines_arrive_while_the_command_runs(tmp_path):
    """The command goes on only once the demo has echoed its first line (else it fails after 10 s)."""
    seen = tmp_path / "seen"
    code = f"""
        import pathlib, sys, time
        print({_log("first")!r}, flush=True)
        deadline = time.monotonic() + 10
        while not pathlib.Path({str(seen)!r}).exists():
            if time.monotonic() > deadline:
                sys.exit(3)
            time.sleep(0.01)
        print({_log("second")!r}, flush=True)
    """
    echoed: list[str] = []

    def echo(line: str, **_: object) -> None:
        echoed.append(line)
        seen.touch()

    demo.stream(_python(code), {}, "hpd_ingest", echo)
    assert [line.split("] ", 1)[1] for line in echoed] == ["first", "second"]


def test_a_quiet_stretch_gets_a_heartbeat():
    noise = OUTPUT[0].rstrip()
    code = f"""
        import time
        print({_log("before")!r}, flush=True)
        for _ in range(6):
            time.sleep(0.1)
            print({noise!r}, flush=True)  # Airflow's chatter: not something the user sees
        print({_log("after")!r}, flush=True)
    """
    echoed: list[str] = []
    demo.stream(_python(code), {}, "hpd_retrain", lambda line, **_: echoed.append(line), heartbeat_s=0.25)
    assert echoed[0].endswith("] before") and echoed[-1].endswith("] after")
    assert echoed[1:-1] and all("] still running" in line for line in echoed[1:-1])


INGEST = ["dags", "test", "hpd_ingest", "2026-11-30", "--conf", '{"limit": 20}']


def test_step_lines_split_the_output_into_steps_each_led_and_timed():
    code = f"""
        import time
        print("an import's warning", flush=True)
        print({airflow_cli.Step.of("airflow db migrate", ["db", "migrate"]).line()!r}, flush=True)
        print({_log("migrated")!r}, flush=True)
        time.sleep(0.3)
        print({airflow_cli.Step.of("hpd_ingest", INGEST).line()!r}, flush=True)
        print({_log("staged")!r}, flush=True)
    """
    echoed: list[str] = []
    walls = demo.stream(_python(code), {}, "airflow", lambda line, **_: echoed.append(line))
    assert list(walls) == ["airflow db migrate", "hpd_ingest"] and walls["airflow db migrate"] >= 0.3
    assert [re.sub(r" \d[^\]]*\]", "]", line) for line in echoed] == [
        "airflow db migrate ...",
        "  [airflow db migrate] migrated",
        "  done in 0 s",
        "airflow dags test hpd_ingest 2026-11-30 ...",  # its conf left out
        "  [hpd_ingest] staged",
        "  done in 0 s",
    ]


def test_a_step_line_is_written_whole_with_its_newline(monkeypatch):
    """One write per step line: a thread still writing for the previous command (OpenLineage's client logs as it
    starts) could otherwise put its own line between the step's text and its newline, which the reader then cannot
    parse."""
    import airflow.__main__

    writes: list[str] = []

    class Recorder:
        def write(self, text: str) -> int:
            writes.append(text)
            return len(text)

        def flush(self) -> None:
            pass

    monkeypatch.setattr(airflow.__main__, "main", lambda: None)
    monkeypatch.setattr(sys, "stdout", Recorder())
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    airflow_cli.run({"hpd_ingest": INGEST})
    assert writes == [airflow_cli.Step.of("hpd_ingest", INGEST).line() + "\n"]


def test_a_failing_step_is_named_and_ends_the_output():
    code = f"""
        import sys
        print({airflow_cli.Step.of("hpd_ingest", INGEST).line()!r}, flush=True)
        sys.exit("DagRun failed")
    """
    with pytest.raises(demo.DemoError, match=r"^`airflow dags test hpd_ingest 2026-11-30` failed \(exit 1\):\n"):
        demo.stream(_python(code), {}, "airflow", lambda *a, **k: None)


def test_a_failure_holds_the_end_of_the_output():
    code = """
        import sys
        for n in range(3000):
            print(f"noise {n}")
        sys.stdout.flush()
        sys.stdout.buffer.write(b"not UTF-8: \\xff\\n")
        print("the last words")
        sys.exit(2)
    """
    ending = r"(?s)failed \(exit 2\):\n.*noise 2999\nnot UTF-8: \ufffd\nthe last words\n$"
    with pytest.raises(demo.DemoError, match=ending) as failed:
        demo.stream(_python(code), {}, "hpd_index", lambda *a, **k: None)
    assert len(str(failed.value)) < 4200


def test_the_demo_asks_for_frequent_progress_lines(tmp_path, monkeypatch):
    """A stage's progress every 10 s (unless $HPD_LOG_EVERY_S says otherwise), a heartbeat within 30 s."""
    monkeypatch.delenv(EVERY_S_ENV, raising=False)
    plan = demo.DemoPlan(store="file:///tmp/store", airflow_home=tmp_path)
    assert float(plan.airflow_env()[EVERY_S_ENV]) <= 10 and demo.HEARTBEAT_S < 30
    monkeypatch.setenv(EVERY_S_ENV, "5")
    assert plan.airflow_env()[EVERY_S_ENV] == "5"
