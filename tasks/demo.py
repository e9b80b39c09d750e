"""``hpd demo``: the DAG chain on this machine, as Airflow runs it.

``airflow db migrate``, then ``airflow dags test`` of ``hpd_ingest`` (one day's sample of the vendored corpus),
``hpd_retrain``, ``hpd_index`` and ``hpd_quality_report`` in turn against one store, with SQLite metadata in its own
``AIRFLOW_HOME``, all in one process (:mod:`tasks.orchestration.airflow_cli`: Airflow and the tasks' libraries are
imported once); then the promoted model, its validation report and the index are looked up in the store. A rerun
skips every stage whose manifest matches, as a backfill would.

The output streams as it comes, filtered to what a user follows (:class:`RunView`, one per command): the stages'
progress and summary lines, which task started and how it ended, errors, and a heartbeat when a stretch stays quiet.
"""

from __future__ import annotations

import json
import os
import queue
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any, NamedTuple

from tasks.core import manifest, promoted
from tasks.core.progress import EVERY_S_ENV, format_duration
from tasks.orchestration import airflow_cli

# The demo runs from a checkout: its DAG folder and the vendored corpus, relative to the working directory.
DAGS_FOLDER = Path("dags")
SAMPLE = Path("data/corpus/sentences.tsv.gz")
# The stages' progress lines in the demo's runs (unless $HPD_LOG_EVERY_S says otherwise), and the longest quiet
# stretch before the demo says it is still running: a line at least every 30 s.
PROGRESS_EVERY_S = "10"
HEARTBEAT_S = 25.0
TAIL_LINES = 2000  # of a run's output, kept for the error when it fails


class DemoError(RuntimeError):
    """A DAG run of the demo failed, or it promoted nothing; the message holds the Airflow output."""


@dataclass(frozen=True)
class DemoPlan:
    """What the demo runs: one partition of ``rows`` corpus sentences and a short distillation."""

    store: str
    airflow_home: Path
    dags_folder: Path = field(default_factory=DAGS_FOLDER.resolve)
    source: Path = field(default_factory=SAMPLE.resolve)
    day: date = date(2026, 11, 30)
    rows: int = 2000
    epochs: int = 1
    teacher: str | None = None  # default: the DAGs' (HPD_DEFAULT_TEACHER or the packaged mpnet + MiniLM)
    student: str | None = None
    k: int = 128
    teacher_dtype: str = "auto"  # bf16 where the hardware runs it natively, else fp32 (tasks.ml.precision)
    amp: str = "auto"
    model_name: str = "demo-student"
    extra_conf: dict[str, dict[str, Any]] = field(default_factory=dict)

    def confs(self) -> dict[str, dict[str, Any]]:
        """Each DAG's run conf, in the order they run."""
        models = {key: value for key, value in (("teacher", self.teacher), ("student", self.student)) if value}
        teacher = {"teacher": self.teacher} if self.teacher else {}
        confs: dict[str, dict[str, Any]] = {
            "hpd_ingest": {
                "store": self.store,
                "source": str(self.source),
                "limit": self.rows,
                **teacher,
                "augment_methods": ["wordnet", "swap"],
                "augment_fraction": 0.5,
                "dtype": self.teacher_dtype,
            },
            "hpd_retrain": {
                "store": self.store,
                "partitions": [self.day.isoformat()],
                **models,
                "k": self.k,
                "max_rows": None,
                "epochs": self.epochs,
                "batch_size": 64,
                "amp": self.amp,
                "name": self.model_name,
            },
            "hpd_index": {"store": self.store},
            "hpd_quality_report": {"store": self.store, **teacher, "pca_name": f"k{self.k}-uncentered"},
        }
        return {dag: {**conf, **self.extra_conf.get(dag, {})} for dag, conf in confs.items()}

    def airflow_env(self) -> dict[str, str]:
        """A standalone Airflow for the demo: its own home and SQLite database, the repo's DAG folder, the stage
        tasks' OpenLineage extractor (silent until a transport is set)."""
        from tasks.orchestration import openlineage

        return {
            **os.environ,
            "AIRFLOW_HOME": str(self.airflow_home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags_folder),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__OPENLINEAGE__EXTRACTORS": openlineage.EXTRACTOR,
            "HPD_STORE": self.store,
            EVERY_S_ENV: os.environ.get(EVERY_S_ENV, PROGRESS_EVERY_S),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def commands(self) -> dict[str, list[str]]:
        """The chain's Airflow commands (the ``airflow`` arguments), by label, in the order they run."""
        day = self.day.isoformat()
        tests = {dag: ["dags", "test", dag, day, "--conf", json.dumps(conf)] for dag, conf in self.confs().items()}
        return {"airflow db migrate": ["db", "migrate"], **tests}

    def run_chain(self, echo: Callable[..., None] = print) -> dict[str, float]:
        """Migrate the metadata database, then ``airflow dags test`` each DAG, in one process; the wall seconds of
        each command, by label."""
        for needed in (self.dags_folder / "hpd_ingest.py", self.source):
            if not needed.is_file():
                hint = "run the demo from the checkout, or pass --dags-folder / --source"
                raise DemoError(f"{needed}: not found; {hint}")
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", airflow_cli.__name__, json.dumps(self.commands())]
        return stream(command, self.airflow_env(), "airflow", echo)


def stream(
    command: list[str],
    env: Mapping[str, str],
    label: str,
    echo: Callable[..., None] = print,
    heartbeat_s: float = HEARTBEAT_S,
) -> dict[str, float]:
    """Run ``command``, echoing the lines of its output that :class:`RunView` keeps as they come, and a heartbeat
    after ``heartbeat_s`` seconds without one; a failure raises :class:`DemoError` with the end of the output. Its
    output is ``label``'s until a step line (:class:`airflow_cli.Step`) starts a step of its own. The wall
    seconds of each step (or of ``label``'s, without step lines)."""
    steps = _Steps(label, " ".join([Path(command[0]).name, *command[1:4]]), echo)
    tail = deque[str](maxlen=TAIL_LINES)
    with subprocess.Popen(
        command,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        encoding="utf-8",
        errors="replace",
    ) as process:
        assert process.stdout is not None
        lines = _pump(process.stdout)
        shown_at = time.monotonic()
        while (line := _next(lines, shown_at + heartbeat_s - time.monotonic())) != "":
            if line is not None:
                tail.append(line)
            if line and (step := airflow_cli.Step.read(line)):
                steps.start(step)
                continue
            shown = steps.view.heartbeat() if line is None else steps.view.shown(line)
            if shown is not None:
                echo(shown, flush=True)
                shown_at = time.monotonic()
    if process.returncode:
        raise DemoError(f"`{steps.command}` failed (exit {process.returncode}):\n{''.join(tail)[-4000:]}")
    return steps.ended()


@dataclass
class _Steps:
    """The steps of a command's output: the one running (its label, command and :class:`RunView`) and each one's
    wall seconds; a step's start and end are echoed."""

    label: str
    command: str
    echo: Callable[..., None]
    view: RunView = field(init=False)
    walls: dict[str, float] = field(init=False, default_factory=dict)
    _stepped: bool = field(init=False, default=False)  # whether a step line came
    _start: float = field(init=False, default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self.view = RunView(self.label)

    def start(self, step: airflow_cli.Step) -> None:
        """A step line's command begins."""
        if self._stepped:
            self._end()
        self.label, self.command, self.view = step.label, step.command, RunView(step.label)
        self._stepped, self._start = True, time.perf_counter()
        self.echo(f"{self.command} ...", flush=True)

    def ended(self) -> dict[str, float]:
        """The last step ends; each step's wall seconds."""
        if self._stepped:
            self._end()
        else:
            self.walls[self.label] = self._seconds()
        return self.walls

    def _end(self) -> None:
        self.walls[self.label] = self._seconds()
        self.echo(f"  done in {self.walls[self.label]:.0f} s", flush=True)

    def _seconds(self) -> float:
        return round(time.perf_counter() - self._start, 2)


def _pump(pipe: Iterable[str]) -> queue.Queue[str]:
    """The pipe's lines as a reader thread reads them, then ``""`` at its end."""
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        try:
            for line in pipe:
                lines.put(line)
        finally:
            lines.put("")

    threading.Thread(target=read, daemon=True).start()
    return lines


def _next(lines: queue.Queue[str], timeout: float) -> str | None:
    """The next line (``""``: the end of the output), or None when none came within ``timeout`` seconds."""
    try:
        return lines.get(timeout=max(timeout, 0.0))
    except queue.Empty:
        return None


class _Record(NamedTuple):
    """One line of Airflow's console log, ``<time> [<level>] <event> [<logger>] key=value ...``."""

    level: str
    event: str
    logger: str
    extra: str


# What structlog's console renderer writes for Airflow's CLI (its colour codes stripped first), and the lines of
# `airflow dags test` (airflow.sdk.definitions.dag) and of its execution API that tell a task's state.
_RECORD = re.compile(r"^\S+ \[(\w+)\s*\] (.*?)\s+\[([\w.\-]+)\]((?: \S+=.*)?)$")
_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
DAG_TEST_LOGGER = "airflow.sdk.definitions.dag"
_TASK_START = re.compile(r"\[DAG TEST\] starting task_id=(\S+)")
_TASK_END = re.compile(r"\[DAG TEST\] end task task_id=(\S+)")
_STATE_UPDATED = "Task instance state updated"
_NEW_STATE = re.compile(r"\bnew_state=(?:<\w+\.)?(\w+)")
# Of a stage run's bookkeeping (``<stage> <key>: ...`` from tasks.core.manifest), only why it runs or skips and what
# it published: not its inputs, outputs, params and phases one by one.
MANIFEST_LOGGER = "tasks.core.manifest"
_RUN_OUTCOME = re.compile(r"^\S+ \S+: (?:running|skipped|published)\b")


@dataclass
class RunView:
    """What the demo shows of a run's output: the ``tasks.*`` loggers' lines (the stages' progress and summaries),
    each task's start and end, errors; each line led by the run's label and the time since it started."""

    label: str
    clock: Callable[[], float] = time.monotonic
    task: str | None = field(init=False, default=None)  # the task running now
    _start: float = field(init=False)
    _task_start: float = field(init=False, default=0.0)
    _state: str | None = field(init=False, default=None)  # the running task's last state

    def __post_init__(self) -> None:
        self._start = self.clock()

    def shown(self, line: str) -> str | None:
        """The line as the demo prints it; None for the rest (Airflow's chatter, a traceback's lines)."""
        record = _RECORD.match(_COLOUR.sub("", line.rstrip()))
        message = self._message(_Record(*record.groups())) if record else None
        return None if message is None else self._led(message)

    def heartbeat(self) -> str:
        """The line for a quiet stretch: still running, in which task since when."""
        running = f": task {self.task} for {format_duration(self.clock() - self._task_start)}" if self.task else ""
        return self._led(f"still running{running}")

    def _led(self, message: str) -> str:
        return f"  [{self.label} {format_duration(self.clock() - self._start)}] {message}"

    def _message(self, record: _Record) -> str | None:
        if record.logger == DAG_TEST_LOGGER and (started := _TASK_START.match(record.event)):
            self.task, self._task_start, self._state = started.group(1), self.clock(), None
            return f"task {self.task} started"
        if record.logger == DAG_TEST_LOGGER and (ended := _TASK_END.match(record.event)):
            took = format_duration(self.clock() - self._task_start)
            outcome, self.task, self._state = self._state or "ended", None, None
            return f"task {ended.group(1)} {outcome} in {took}"
        if record.event == _STATE_UPDATED and (state := _NEW_STATE.search(record.extra)):
            self._state = state.group(1).lower()
            return None
        if record.logger.startswith("tasks.") and record.level != "info":
            return f"{record.level}: {record.event}"
        if record.logger.startswith("tasks."):
            return record.event if record.logger != MANIFEST_LOGGER or _RUN_OUTCOME.match(record.event) else None
        if record.level in ("error", "critical"):
            return f"{record.level}: {record.event}" + (f" (task {self.task})" if self.task else "")
        return None


def locations(store: str) -> dict[str, str]:
    """Where the promoted student, its validation report and the promoted index are."""
    from tasks.ml import student

    model = promoted.model(store)
    if model is None:
        raise DemoError(f"{store}: no promoted model (the quality gate did not pass; see the validate manifest)")
    index = promoted.index(store)
    if index is None:
        raise DemoError(f"{store}: no index was promoted")
    validated = manifest.read_at(store, model.pointer.validation)
    return {
        "model run": model.model_run,
        "model (sentence-transformers folder)": student.model_folder(model.distilled),
        "validation report": validated.output_named("report.html").uri,
        "index": index.pointer.index,
    }
