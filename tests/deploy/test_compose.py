"""docker/compose.yaml is a valid Compose file with the services the deployment needs."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.paths import REPO as ROOT

COMPOSE = ROOT / "docker" / "compose.yaml"


def _compose(*args, tmp_path):
    """`docker compose ...` with the Compose v2 plugin from the venv (standalone binary if no docker CLI)."""
    binary = Path(sys.executable).parent / "docker-compose"
    assert binary.exists(), "make installs the Compose binary into the venv"
    docker = shutil.which("docker")
    if docker:
        plugins = tmp_path / "docker" / "cli-plugins"
        plugins.mkdir(parents=True)
        (plugins / "docker-compose").symlink_to(binary)
        command, env = [docker, "compose", *args], {"DOCKER_CONFIG": str(tmp_path / "docker")}
    else:
        command, env = [str(binary), *args], {}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def test_compose_file_is_valid(tmp_path):
    checked = _compose("-f", str(COMPOSE), "config", "-q", tmp_path=tmp_path)
    assert checked.returncode == 0, checked.stderr


def test_services_ports_and_profiles(tmp_path):
    rendered = _compose("-f", str(COMPOSE), "--profile", "gpu", "config", "--format", "json", tmp_path=tmp_path)
    assert rendered.returncode == 0, rendered.stderr
    services = json.loads(rendered.stdout)["services"]
    assert {
        "postgres",
        "redis",
        "minio",
        "minio-init",
        "airflow-init",
        "api-server",
        "scheduler",
        "dag-processor",
        "triggerer",
        "worker",
        "worker-gpu",
        "search",
    } <= set(services)
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes a port beyond loopback"
    assert services["scheduler"]["environment"]["HPD_STORE"].startswith("s3://")
    assert services["search"]["command"][:2] == ["hpd", "serve"]
    assert "HPD_ALERT_EMAIL" in services["scheduler"]["environment"]


def test_the_celery_layout_of_the_live_test(tmp_path):
    """The layout tests/dags/test_celery_workers.py runs: the CeleryExecutor on Redis and Postgres, a worker on
    the default queue and a GPU worker on the default and GPU queues, the encoding pool created at init, and
    one JWT secret for every container (the scheduler signs the workers' task tokens, the api-server checks)."""
    from tasks.orchestration.defaults import ENCODE_POOL

    rendered = _compose("-f", str(COMPOSE), "--profile", "gpu", "config", "--format", "json", tmp_path=tmp_path)
    services = json.loads(rendered.stdout)["services"]
    env = services["scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql")
    airflow = [name for name, service in services.items() if service.get("image", "").startswith("hpd-pipeline/")]
    assert len({services[name]["environment"]["AIRFLOW__API_AUTH__JWT_SECRET"] for name in airflow}) == 1

    def queues(name):
        command = services[name]["command"]
        assert command[:3] == ["airflow", "celery", "worker"], name
        return command[command.index("--queues") + 1].split(",")

    assert queues("worker") == ["default"] and queues("worker-gpu") == ["default", "gpu"]
    assert "gpus" in services["worker-gpu"] or services["worker-gpu"].get("deploy")
    assert services["worker-gpu"]["profiles"] == ["gpu"]
    init = " ".join(services["airflow-init"]["command"])
    assert "airflow db migrate" in init and f"airflow pools set {ENCODE_POOL} " in init
    assert env["HPD_ENCODE_POOL"] == ENCODE_POOL


def test_images_install_from_the_locks():
    dockerfile = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM apache/airflow:3.3.2-python3.11" in dockerfile
    assert (
        "-r /opt/hpd/requirements.lock" in dockerfile
        and "--require-hashes -r /opt/hpd/requirements-models.lock" in dockerfile
    )
    assert "apache-airflow==3.3.2" in (ROOT / "requirements.lock").read_text()
