"""The demo's plan: every conf it passes is a param of the DAG it triggers, valid against the DAG's schema.
(The chain itself runs in tests/dags/test_dag_runs.py.)"""

import copy
from pathlib import Path

import pytest
from airflow.dag_processing.dagbag import DagBag

from tasks import demo


@pytest.fixture(scope="module")
def dags():
    bag = DagBag(str(demo.DAGS_FOLDER))
    assert not bag.import_errors
    return bag.dags


def test_demo_confs_are_valid_params_of_their_dags(dags, tmp_path):
    plan = demo.DemoPlan(store="file:///tmp/store", airflow_home=tmp_path)
    confs = plan.confs()
    assert list(confs) == ["hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report"]
    for dag_id, conf in confs.items():
        params = copy.deepcopy(dags[dag_id].params)
        assert set(conf) <= set(params), (dag_id, set(conf) - set(params))
        params.update(conf)
        params.validate()  # raises on a value the DAG's JSON schema refuses
    assert confs["hpd_retrain"]["name"] == "demo-student"
    assert Path(confs["hpd_ingest"]["source"]).is_file()


def test_a_conf_the_dag_refuses_is_caught(dags, tmp_path):
    plan = demo.DemoPlan(store="file:///tmp/store", airflow_home=tmp_path, extra_conf={"hpd_retrain": {"k": 0}})
    params = copy.deepcopy(dags["hpd_retrain"].params)
    with pytest.raises(ValueError, match="param k: 0 is less than or equal to the minimum of 0"):
        params.update(plan.confs()["hpd_retrain"])
        params.validate()
