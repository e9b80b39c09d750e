"""Orchestration overhead: the demo's DAG chain under Airflow against its stages' own compute time.

Runs what ``make demo`` runs (``airflow dags test`` of hpd_ingest, hpd_retrain, hpd_index and
hpd_quality_report in one process, on the demo sample, real packaged models) in a fresh store and Airflow home,
then sums every stage manifest's ``timings_s.total`` (from the stage's start to its manifest). Everything else in
the DAG runs' wall time is orchestration: imports, DAG parsing, task state and XCom in the metadata database, each
task's input lookup. A rerun of the finished chain (every stage skips) is timed too.
"""

from __future__ import annotations

import shutil
from collections import defaultdict

from bench import REPO, results
from tasks import demo
from tasks.core import manifest, storage
from tasks.core.catalog import Stage

WORKDIR = REPO / "var" / "bench" / "pipeline_overhead"


def stage_seconds(store: str) -> dict[str, dict]:
    """Per stage: how many manifests and the sum of their ``timings_s.total``."""
    found: dict[str, dict] = defaultdict(lambda: {"runs": 0, "seconds": 0.0})
    for stage in Stage:
        for key in manifest.list_keys(store, stage):
            found[stage]["runs"] += 1
            found[stage]["seconds"] += manifest.read(store, stage, key).document["timings_s"]["total"]
    return {stage: {"runs": v["runs"], "seconds": round(v["seconds"], 2)} for stage, v in found.items()}


def main() -> dict:
    shutil.rmtree(WORKDIR, ignore_errors=True)
    plan = demo.DemoPlan(store=storage.to_uri(str(WORKDIR / "store")), airflow_home=WORKDIR / "airflow")
    walls = plan.run_chain()
    stages = stage_seconds(plan.store)
    rerun = plan.run_chain()
    dag_wall = round(sum(v for k, v in walls.items() if k.startswith("hpd_")), 2)
    compute = round(sum(s["seconds"] for s in stages.values()), 2)
    return results.write(
        "pipeline_overhead",
        unit="s",
        ours=dag_wall,
        baseline_name="sum of the stages' own compute time",
        baseline=compute,
        higher_is_better=False,
        details={
            "sample_rows": plan.rows,
            "epochs": plan.epochs,
            "dag_wall_seconds": walls,
            "stages": stages,
            "overhead_seconds": round(dag_wall - compute, 2),
            "overhead_percent": round(100 * (dag_wall - compute) / dag_wall, 1),
            "rerun_all_skipped_wall_seconds": rerun,
            "note": "ours: wall time of `airflow dags test` of the four DAGs in turn, in one process (no executor; "
            "SQLite), excluding the one-off `airflow db migrate`; ratio = compute / wall",
        },
    )


if __name__ == "__main__":
    print(main())
