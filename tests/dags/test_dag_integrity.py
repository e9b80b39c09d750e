"""Every DAG file imports cleanly and fast (what `airflow dags list-import-errors` would list is empty), and every
DAG carries docs, tags, a display name, a description, retries with the retry policy, and params the trigger form
shows with a title, a description and a section."""

import time
from collections import defaultdict

import pytest
from airflow.dag_processing.dagbag import DagBag

from tests.support.paths import DAGS, INFRA

FILES = sorted(DAGS.glob("*.py"))


@pytest.fixture(scope="module")
def dagbag():
    return DagBag(str(DAGS))


def test_no_import_errors(dagbag):
    assert dagbag.import_errors == {}
    assert set(dagbag.dag_ids) == {"hpd_ingest", "hpd_retrain", "hpd_index", "hpd_quality_report", "hpd_maintenance"}


def test_every_dag_has_docs_tags_a_display_name_and_retries_under_the_policy(dagbag):
    from tasks.orchestration.defaults import FailPermanentErrors

    for dag_id, dag in dagbag.dags.items():
        assert dag.doc_md and len(dag.doc_md) > 100, dag_id
        assert "hpd" in dag.tags, dag_id
        assert dag.dag_display_name and dag.dag_display_name != dag_id, dag_id
        assert dag.description and len(dag.description) > 30, dag_id
        for task in dag.tasks:
            assert task.retries >= 1, f"{dag_id}.{task.task_id}"
            assert isinstance(task.retry_policy, FailPermanentErrors), f"{dag_id}.{task.task_id}"


def param_form_problems(dag) -> list[str]:
    """The params of ``dag`` the trigger form would show without a title, a description or a section."""
    problems = []
    for name in dag.params:
        param = dag.params.get_param(name)
        shown = {
            "title": param.schema.get("title"),
            "description": param.description,
            "section": param.schema.get("section"),
        }
        problems += [
            f"{dag.dag_id}.{name}: no {key}" for key, value in shown.items() if not (value and str(value).strip())
        ]
    return problems


def test_every_param_has_a_title_a_description_and_a_section(dagbag):
    assert [p for dag in dagbag.dags.values() for p in param_form_problems(dag)] == []


def test_the_check_flags_a_param_without_a_title_or_section():
    from airflow.sdk import DAG, Param

    dag = DAG("d", params={"a": Param(1, description="one", title="A", section="S"), "b": Param(2, description="two")})
    assert param_form_problems(dag) == ["d.b: no title", "d.b: no section"]


def test_retrain_params_are_grouped_data_projection_student_gate(dagbag):
    params = dagbag.dags["hpd_retrain"].params
    sections = [params.get_param(name).schema["section"] for name in params]
    assert list(dict.fromkeys(sections)) == ["Data", "Projection", "Student", "Quality gate"]
    assert sections == sorted(sections, key=["Data", "Projection", "Student", "Quality gate"].index)  # one block each
    assert {name for name in params if params.get_param(name).schema["section"] == "Quality gate"} == {
        "min_stsb",
        "min_sickr",
        "max_regression",
        "max_dev_regression",
    }


LINKS = {
    ("hpd_retrain", "validate"): {
        "Validation report": "_link_ValidationReportLink",
        "Model card": "_link_ModelCardLink",
    },
    ("hpd_quality_report", "check_partition"): {"Data Docs": "_link_DataDocsLink"},
}


@pytest.mark.parametrize(("dag_id", "task_id"), list(LINKS))
def test_the_report_links_survive_serialization(dagbag, dag_id, task_id):
    """Each report button survives DAG serialization as the XCom key the UI reads its URL from."""
    from airflow.serialization.serialized_objects import DagSerialization

    serialized = DagSerialization.to_dict(dagbag.dags[dag_id])
    (task,) = [t for t in serialized["dag"]["tasks"] if t["__var"]["task_id"] == task_id]
    assert task["__var"]["_operator_extra_links"] == LINKS[dag_id, task_id]
    restored = DagSerialization.from_dict(serialized).get_task(task_id)
    assert [link.name for link in restored.operator_extra_links] == list(LINKS[dag_id, task_id])


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_each_file_parses_in_under_a_second(path):
    DagBag(str(path))  # warm: airflow itself is imported once
    start = time.perf_counter()
    bag = DagBag(str(path))
    assert time.perf_counter() - start < 1.0
    assert bag.import_errors == {}


def test_heavy_libraries_are_imported_inside_tasks():
    """Parsing the DAG folder imports none of the pipeline's heavy libraries (they load inside tasks): no AWS SDK
    (the assets' ``x-hpd`` scheme needs no provider's URI normaliser) and, under an executor other than Kubernetes,
    no Kubernetes client (distill's pod is built only for the KubernetesExecutor)."""
    import subprocess
    import sys

    probe = (
        "import sys; from airflow.dag_processing.dagbag import DagBag; "
        f"bag = DagBag({str(DAGS)!r}); assert not bag.import_errors, bag.import_errors; "
        "print(sorted(m for m in ('torch', 'transformers', 'faiss', 'great_expectations', 'sklearn', "
        "'sentence_transformers', 'tasks.ml.encoder', 'tasks.stages.distill', 'boto3', 'kubernetes') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_distill_task_pod_asks_for_a_gpu(dagbag, monkeypatch):
    """Under the KubernetesExecutor, the pod override survives DAG serialization and, merged onto infra's pod
    template by the KubernetesExecutor's own reconciliation, yields a pod requesting nvidia.com/gpu on the base
    container. Under another executor distill carries no pod."""
    from airflow.executors import executor_loader
    from airflow.providers.cncf.kubernetes.pod_generator import PodGenerator
    from airflow.serialization.serialized_objects import DagSerialization

    from tasks.orchestration.defaults import gpu_executor_config

    assert dagbag.dags["hpd_retrain"].get_task("distill").executor_config == {}  # parsed under the LocalExecutor
    monkeypatch.setenv("AIRFLOW__CORE__EXECUTOR", "KubernetesExecutor")
    monkeypatch.setattr(executor_loader, "_executor_names", [])  # Airflow reads the executors once per process
    monkeypatch.setattr(executor_loader, "_team_name_to_executors", defaultdict(list))
    for lookup in ("_alias_to_executors_per_team", "_module_to_executors_per_team", "_classname_to_executors_per_team"):
        monkeypatch.setattr(executor_loader, lookup, defaultdict(dict))
    on_kubernetes = DagBag(str(DAGS / "hpd_retrain.py")).dags["hpd_retrain"]
    serialized = DagSerialization.from_dict(DagSerialization.to_dict(on_kubernetes))
    override = PodGenerator.from_obj(serialized.get_task("distill").executor_config)
    template = PodGenerator.deserialize_model_file(str(INFRA / "helm/gpu-pod-template.yaml"))
    (container,) = PodGenerator.reconcile_pods(template, override).spec.containers
    assert container.name == "base" and container.image == template.spec.containers[0].image
    assert container.image.startswith("hpd-pipeline/worker-gpu:") and not container.image.endswith(":latest")
    assert container.resources.limits["nvidia.com/gpu"] == "1" and container.resources.requests["nvidia.com/gpu"] == "1"
    assert [t.key for t in PodGenerator.reconcile_pods(template, override).spec.tolerations] == ["nvidia.com/gpu"]

    monkeypatch.setenv("HPD_GPU_COUNT", "4")
    monkeypatch.setenv("HPD_GPU_POD_TEMPLATE", "/opt/airflow/pod_templates/gpu.yaml")
    config = gpu_executor_config()
    assert config["pod_template_file"] == "/opt/airflow/pod_templates/gpu.yaml"
    assert config["pod_override"].spec.containers[0].resources.limits["nvidia.com/gpu"] == "4"


def test_the_quality_report_checks_then_scores_drift_whose_flag_can_trigger_a_retrain(dagbag):
    from tasks.orchestration.assets import CORPUS_UPDATED

    dag = dagbag.dags["hpd_quality_report"]
    assert dag.get_task("drift").upstream_task_ids == {"check_partition"}
    announce = dag.get_task("announce_drift")
    assert announce.upstream_task_ids == {"drift"} and announce.outlets == [CORPUS_UPDATED]
    assert "drift_threshold" in dag.params
    assert CORPUS_UPDATED.name in str(dagbag.dags["hpd_retrain"].timetable.asset_condition)
