"""``dag.test()`` one DAG run in a fresh process (its own AIRFLOW_HOME): DAG_ID LOGICAL_DATE CONF_JSON."""

import json
import os
import sys

import pendulum
from airflow.dag_processing.dagbag import DagBag

dag_id, logical_date, conf = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
bag = DagBag(os.environ["AIRFLOW__CORE__DAGS_FOLDER"])
if bag.import_errors:
    sys.exit(f"import errors: {bag.import_errors}")
run = bag.get_dag(dag_id).test(logical_date=pendulum.parse(logical_date), run_conf=conf)
print("DAG RUN STATE", run.state)
sys.exit(0 if run.state == "success" else 1)
