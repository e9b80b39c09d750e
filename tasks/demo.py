"""``hpd demo``: the DAG chain on this machine, as Airflow runs it.

``airflow dags test`` runs ``hpd_ingest`` (one day's sample of the vendored corpus), ``hpd_retrain``,
``hpd_index`` and ``hpd_quality_report`` in turn against one store, with SQLite metadata in its own
``AIRFLOW_HOME``; then the promoted model, its validation report and the index are looked up in the store.
A rerun skips every stage whose manifest matches, as a backfill would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from tasks.core import manifest, promoted

# The demo runs from a checkout: its DAG folder and the vendored corpus, relative to the working directory.
DAGS_FOLDER = Path("dags")
SAMPLE = Path("data/corpus/sentences.tsv.gz")


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
    extra_conf: dict[str, dict] = field(default_factory=dict)

    def confs(self) -> dict[str, dict]:
        """Each DAG's run conf, in the order they run."""
        models = {key: value for key, value in (("teacher", self.teacher), ("student", self.student)) if value}
        teacher = {"teacher": self.teacher} if self.teacher else {}
        confs = {
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
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }

    def run_chain(self, echo: Callable[..., None] = print) -> dict[str, float]:
        """Migrate the metadata database, then ``airflow dags test`` each DAG; the wall seconds of each step."""
        for needed in (self.dags_folder / "hpd_ingest.py", self.source):
            if not needed.is_file():
                hint = "run the demo from the checkout, or pass --dags-folder / --source"
                raise DemoError(f"{needed}: not found; {hint}")
        env = self.airflow_env()
        self.airflow_home.mkdir(parents=True, exist_ok=True)
        start = time.perf_counter()
        _airflow(["db", "migrate"], env)
        walls = {"airflow db migrate": round(time.perf_counter() - start, 2)}
        for dag_id, conf in self.confs().items():
            echo(f"airflow dags test {dag_id} {self.day} ...", flush=True)
            start = time.perf_counter()
            _airflow(["dags", "test", dag_id, self.day.isoformat(), "--conf", json.dumps(conf)], env)
            walls[dag_id] = round(time.perf_counter() - start, 2)
            echo(f"  done in {walls[dag_id]:.0f} s", flush=True)
        return walls


def _airflow(args: list[str], env: dict[str, str]) -> None:
    command = [str(Path(sys.executable).parent / "airflow"), *args]
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if done.returncode:
        raise DemoError(f"`airflow {' '.join(args[:3])}` failed (exit {done.returncode}):\n{done.stdout[-4000:]}")


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
