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
        "minio",
        "minio-init",
        "airflow-init",
        "api-server",
        "scheduler",
        "dag-processor",
        "triggerer",
        "scheduler-gpu",
    } <= set(services)
    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes a port beyond loopback"
    assert services["scheduler"]["environment"]["AIRFLOW__CORE__EXECUTOR"] == "LocalExecutor"
    assert services["scheduler"]["environment"]["HPD_STORE"].startswith("s3://")
    assert "gpus" in services["scheduler-gpu"] or services["scheduler-gpu"].get("deploy")


def test_images_install_from_the_locks():
    dockerfile = (ROOT / "docker" / "airflow.Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM apache/airflow:3.3.2-python3.11" in dockerfile
    assert (
        "-r /opt/hpd/requirements.lock" in dockerfile
        and "--require-hashes -r /opt/hpd/requirements-models.lock" in dockerfile
    )
    assert "apache-airflow==3.3.2" in (ROOT / "requirements.lock").read_text()
