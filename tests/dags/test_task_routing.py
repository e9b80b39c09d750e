"""Where the deployment settings put the DAGs' heavy tasks: the teacher encodings take a slot of the encoding
pool, and distill goes to the GPU queue and, where the deployment lists several executors, to the executor
``HPD_DISTILL_EXECUTOR`` names (checked after serialization, as the scheduler reads it). The settings are read
when the DAG files are parsed, so each case parses the DAG folder in a fresh process."""

import json
import os
import subprocess
import sys

from tests.support.paths import DAGS
from tests.support.paths import REPO as ROOT

PROBE = f"""
import json
from airflow.dag_processing.dagbag import DagBag
from airflow.serialization.serialized_objects import DagSerialization

bag = DagBag({str(DAGS)!r})
found = {{"errors": {{k.rsplit("/", 1)[-1]: v for k, v in bag.import_errors.items()}}}}
if "hpd_retrain" in bag.dags:
    retrain = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["hpd_retrain"]))
    ingest = DagSerialization.from_dict(DagSerialization.to_dict(bag.dags["hpd_ingest"]))
    distill, encode = retrain.get_task("distill"), ingest.get_task("encode")
    found.update(
        distill={{"queue": distill.queue, "executor": distill.executor}},
        encode={{"pool": encode.pool, "pool_slots": encode.pool_slots, "queue": encode.queue}},
        others=sorted({{t.executor for t in retrain.tasks if t.task_id != "distill"}}, key=str),
    )
print(json.dumps(found))
"""


def _parse(**env: str) -> dict:
    unset = ("HPD_GPU_QUEUE", "HPD_DISTILL_EXECUTOR", "HPD_ENCODE_POOL", "AIRFLOW__CORE__EXECUTOR")
    base = {k: v for k, v in os.environ.items() if k not in unset}
    done = subprocess.run(
        [sys.executable, "-c", PROBE],
        env={**base, "PYTHONPATH": str(ROOT), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_defaults_use_the_default_executor_and_the_encoding_pool():
    found = _parse()
    assert found["errors"] == {}
    assert found["distill"] == {"queue": "default", "executor": None}
    assert found["encode"] == {"pool": "hpd_teacher_encode", "pool_slots": 1, "queue": "default"}


def test_a_mixed_deployment_routes_distill_to_celery_on_the_gpu_queue():
    found = _parse(
        AIRFLOW__CORE__EXECUTOR="KubernetesExecutor,CeleryExecutor",
        HPD_DISTILL_EXECUTOR="CeleryExecutor",
        HPD_GPU_QUEUE="gpu",
        HPD_ENCODE_POOL="encodings",
    )
    assert found["errors"] == {}
    assert found["distill"] == {"queue": "gpu", "executor": "CeleryExecutor"}
    assert found["others"] == [None]  # every other task: the default executor (KubernetesExecutor)
    assert found["encode"]["pool"] == "encodings"


def test_an_executor_the_deployment_lacks_fails_the_import():
    found = _parse(AIRFLOW__CORE__EXECUTOR="LocalExecutor", HPD_DISTILL_EXECUTOR="CeleryExecutor")
    assert "distill" not in found
    assert (
        "CeleryExecutor" in found["errors"]["hpd_retrain.py"] and "not available" in found["errors"]["hpd_retrain.py"]
    )
