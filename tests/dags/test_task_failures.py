"""Through Airflow (``dag.test()`` of ``hpd_ingest``, in a process of its own with its own metadata database): bad
input fails its task on the first try, with no retry; an unreachable store is retried until the task's retries are
spent. The retry delay is set to zero for the test (the DAG's is 30 s, growing); the policy itself is unit-tested
in tests/orchestration/test_task_failures.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta

import pytest

from tasks import demo
from tasks.orchestration import airflow_cli
from tests.support.paths import DAGS, REPO

pytestmark = pytest.mark.dags

BAD_INPUT, UNREACHABLE = date(2026, 11, 3), date(2026, 11, 4)


def run_ingest(runs: dict[str, dict]) -> dict[str, dict[str, list[tuple[int, str]]]]:
    """Migrate the metadata database, then run ``hpd_ingest`` for each day with its conf (retry delay zero); each
    task's tries as (try number, state): the earlier tries from the task instance history, then the last one."""
    from airflow.dag_processing.dagbag import DagBag
    from airflow.models.taskinstancehistory import TaskInstanceHistory
    from airflow.utils.session import create_session

    airflow_cli.run({"airflow db migrate": ["db", "migrate"]})
    dag = DagBag(str(DAGS)).get_dag("hpd_ingest")
    for task in dag.tasks:
        task.retry_delay, task.retry_exponential_backoff = timedelta(0), False
    found: dict[str, dict[str, list[tuple[int, str]]]] = {}
    for day, conf in runs.items():
        run = dag.test(logical_date=datetime.combine(date.fromisoformat(day), datetime.min.time(), UTC), run_conf=conf)
        tries = found.setdefault(day, {})
        with create_session() as session:
            earlier = session.query(TaskInstanceHistory).filter_by(dag_id=dag.dag_id, run_id=run.run_id).all()
            for ti in [*sorted(earlier, key=lambda t: t.try_number), *run.get_task_instances(session=session)]:
                tries.setdefault(ti.task_id, []).append((ti.try_number, str(ti.state)))
    return found


@pytest.fixture(scope="module")
def tries(tmp_path_factory) -> dict[date, dict[str, list[tuple[int, str]]]]:
    """The tries of two ``hpd_ingest`` runs: one whose raw file lacks the text column, one whose store is an S3
    endpoint nothing listens on."""
    root = tmp_path_factory.mktemp("failures")
    (root / "airflow").mkdir()
    (root / "no_sentence_column.tsv").write_text("text\na sentence\nanother sentence\n")  # the DAG reads 'sentence'
    (root / "raw.tsv").write_text("sentence\na sentence\nanother sentence\n")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]  # nothing listens there once the block ends
    plan = demo.DemoPlan(store=(root / "store").as_uri(), airflow_home=root / "airflow", day=BAD_INPUT)
    env = {
        **plan.airflow_env(),
        "AWS_ENDPOINT_URL_S3": f"http://127.0.0.1:{port}",
        "HPD_S3_MAX_ATTEMPTS": "1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    runs = {
        BAD_INPUT.isoformat(): {"source": str(root / "no_sentence_column.tsv")},
        UNREACHABLE.isoformat(): {"source": str(root / "raw.tsv"), "store": "s3://hpd-unreachable/store"},
    }
    call = f"import json; from tests.dags.test_task_failures import run_ingest; print(json.dumps(run_ingest({runs!r})))"
    done = subprocess.run([sys.executable, "-c", call], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    found = json.loads(done.stdout.splitlines()[-1])
    return {
        date.fromisoformat(day): {task: [tuple(t) for t in ts] for task, ts in by.items()} for day, by in found.items()
    }


def test_bad_input_fails_on_the_first_try(tries):
    assert tries[BAD_INPUT]["wait_for_source"] == [(1, "success")]
    assert tries[BAD_INPUT]["stage"] == [(1, "failed")]  # no earlier try: it was not retried
    assert tries[BAD_INPUT]["augment"] == [(0, "upstream_failed")]


def test_an_unreachable_store_is_retried_until_the_retries_are_spent(tries):
    assert tries[UNREACHABLE]["stage"] == [(1, "failed"), (2, "failed"), (3, "failed")]  # 1 + retries (2)
