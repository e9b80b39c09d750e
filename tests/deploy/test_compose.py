"""docker/compose.yaml starts and runs a first day: each service's effective command (entrypoint and command, through
the Airflow image's entrypoint) is the program it should run, every long-running service has a health check, every
image is built or pinned, every secret is required, the default source of hpd_ingest holds the sample days, and only
the GPU worker's image installs the CUDA build of torch. Checked on `docker compose config`'s rendering and the
Dockerfile: no container runtime runs here."""

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from datetime import date
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.support.paths import REPO as ROOT

COMPOSE = ROOT / "docker" / "compose.yaml"
DOCKER = ROOT / "docker"
DOCKERFILE = DOCKER / "airflow.Dockerfile"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"  # PyTorch's index of its CPU builds
PYPI = "https://pypi.org/simple"  # torch's Linux wheel there is the CUDA build
SAMPLES = ROOT / "data" / "samples"
SECRETS = (
    "POSTGRES_PASSWORD",
    "S3_ACCESS_KEY_ID",
    "S3_SECRET_ACCESS_KEY",
    "AIRFLOW_FERNET_KEY",
    "AIRFLOW_JWT_SECRET",
    "AIRFLOW_API_SECRET_KEY",
    "AIRFLOW_ADMIN_PASSWORD",
)
ENV = {name: f"test-{name.lower()}" for name in SECRETS}
AIRFLOW_SERVICES = ("airflow-init", "api-server", "scheduler", "dag-processor", "triggerer", "worker", "worker-gpu")
LONG_RUNNING = (
    "postgres",
    "redis",
    "s3",
    "api-server",
    "scheduler",
    "dag-processor",
    "triggerer",
    "worker",
    "worker-gpu",
    "search",
)
ONE_SHOT = ("s3-init", "airflow-init")
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _compose(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The Compose v2 binary `make` installs into the venv, on exactly ``env`` (nothing leaks in from the caller)."""
    binary = Path(sys.executable).parent / "docker-compose"
    assert binary.exists(), "make installs the Compose binary into the venv"
    command = [str(binary), "-f", str(COMPOSE), "--profile", "gpu", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60, cwd=ROOT)


@pytest.fixture(scope="module")
def services() -> dict:
    rendered = _compose("config", "--format", "json", env=ENV)
    assert rendered.returncode == 0, rendered.stderr
    return json.loads(rendered.stdout)["services"]


def _image_entrypoint(dockerfile: Path) -> list[str]:
    (line,) = [line for line in dockerfile.read_text().splitlines() if line.startswith("ENTRYPOINT ")]
    return json.loads(line.removeprefix("ENTRYPOINT "))


def _unescape(words: list[str]) -> list[str]:
    """`config` writes a literal `$` as `$$` (its output is a Compose file again); the container gets one."""
    return [word.replace("$$", "$") for word in words]


def effective(service: dict) -> list[str]:
    """The argv a container of ``service`` runs. The project's images keep the official Airflow image's entrypoint
    (dumb-init, then /entrypoint): a command starting with `bash` or `python` runs as is, `airflow X` runs as
    `airflow X`, and anything else runs as `airflow <command>`, the trap `hpd serve` fell into."""
    entrypoint = service.get("entrypoint")
    command = _unescape(service.get("command") or [])
    if entrypoint is None and service["image"].startswith("hpd-pipeline/"):
        entrypoint = _image_entrypoint(DOCKERFILE)
    entrypoint = _unescape(entrypoint or [])
    if not entrypoint or entrypoint[-1] != "/entrypoint":
        return entrypoint + command
    first, rest = (command[0], command[1:]) if command else ("", [])
    if first == "bash":
        return ["/bin/bash", *rest]
    if first == "python":
        return ["python", *rest]
    return ["airflow", *(rest if first == "airflow" else command)]


def _init_steps(service: dict) -> list[list[str]]:
    """The `&&`-joined steps of a one-shot job's `sh -c` script, each split as the shell would."""
    return [shlex.split(step) for step in effective(service)[2].split("&&")]


def _aws(operation: str, bucket: str) -> list[str]:
    return ["aws", "s3api", operation, "--bucket", bucket]


def _port(service: dict) -> int:
    """The container port ``service`` publishes (its only one)."""
    (port,) = service["ports"]
    return int(port["target"])


@pytest.fixture(scope="module")
def airflow_cli(services, tmp_path_factory) -> dict[tuple[str, ...], str]:
    """Airflow's own CLI parser's verdict on every `airflow ...` argv in the file (service commands, the init job's
    steps, health checks): "" when it parses, else the parser's error. One fresh interpreter, with the
    CeleryExecutor set so its `celery` commands exist (the parser is built when its module is imported)."""
    argvs = [effective(service) for service in services.values()]
    argvs += _init_steps(services["airflow-init"])
    argvs += [_unescape(check["test"])[1:] for check in (s.get("healthcheck") for s in services.values()) if check]
    airflow = sorted({tuple(argv[1:]) for argv in argvs if argv[:1] == ["airflow"]})
    script = (
        "import contextlib, io, json, sys\n"
        "from airflow.cli.cli_parser import get_parser\n"
        "verdicts = []\n"
        "for argv in json.load(sys.stdin):\n"
        "    err = io.StringIO()\n"
        "    with contextlib.redirect_stderr(err):\n"
        "        try:\n"
        "            get_parser().parse_args(argv)\n"
        "        except SystemExit:\n"
        "            pass\n"
        "    verdicts.append(err.getvalue()[-500:])\n"
        "print(json.dumps(verdicts))\n"
    )
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path_factory.mktemp("airflow")),
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    }
    parsed = subprocess.run(
        [sys.executable, "-c", script], input=json.dumps(airflow), env=env, capture_output=True, text=True, timeout=120
    )
    assert parsed.returncode == 0, parsed.stderr[-2000:]
    return dict(zip(airflow, json.loads(parsed.stdout.splitlines()[-1]), strict=True))


def _parses(airflow_cli: dict[tuple[str, ...], str], argv: list[str]) -> bool:
    assert argv[0] == "airflow"
    assert airflow_cli[tuple(argv[1:])] == "", airflow_cli[tuple(argv[1:])]
    return True


def test_every_service_runs_the_program_it_should(services, airflow_cli):
    """The Airflow services run their Airflow command, the one-shot jobs their shell script, and the search service
    `hpd serve` itself (not `airflow hpd serve`), on the port it publishes."""
    from tasks import cli

    argv = {name: effective(service) for name, service in services.items()}
    assert argv["api-server"] == ["airflow", "api-server", "--port", "8080"]
    assert argv["scheduler"] == ["airflow", "scheduler"]
    assert argv["dag-processor"] == ["airflow", "dag-processor"]
    assert argv["triggerer"] == ["airflow", "triggerer"]
    assert argv["worker"] == ["airflow", "celery", "worker", "--queues", "default", "--concurrency", "2"]
    assert argv["worker-gpu"] == ["airflow", "celery", "worker", "--queues", "default,gpu", "--concurrency", "1"]
    assert argv["search"][:3] == ["/usr/bin/dumb-init", "--", "hpd"]
    args = cli.build_parser().parse_args(argv["search"][3:])
    assert (args.command, args.host) == ("serve", "0.0.0.0")
    assert [port["target"] for port in services["search"]["ports"]] == [args.port]
    assert argv["s3"][:2] == ["/usr/bin/weed", "mini"] and "-dir=/data" in argv["s3"]
    assert argv["s3-init"][:2] == ["/bin/sh", "-c"]
    assert argv["airflow-init"][:2] == ["/bin/bash", "-c"]
    assert argv["postgres"] == [] and argv["redis"][0] == "redis-server"  # the images' own entrypoints
    assert all(_parses(airflow_cli, words) for words in argv.values() if words[:1] == ["airflow"])


def test_the_init_jobs_migrate_create_the_pool_the_login_and_the_bucket(services, airflow_cli):
    """airflow-init migrates, creates the encoding pool and writes the admin's password file where the api-server's
    SimpleAuthManager reads it (a volume both mount); s3-init creates and versions the bucket of the store and
    the remote logs, with the account the S3 server is started with and the pipeline's connection uses."""
    from tasks.orchestration.defaults import ENCODE_POOL

    steps = _init_steps(services["airflow-init"])
    assert steps[0] == ["airflow", "db", "migrate"] and steps[1][:4] == ["airflow", "pools", "set", ENCODE_POOL]
    assert _parses(airflow_cli, steps[0]) and _parses(airflow_cli, steps[1])
    env = services["api-server"]["environment"]
    assert env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS"] == "admin:admin"
    passwords = env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]
    assert f"> {passwords}" in effective(services["airflow-init"])[2]
    assert services["airflow-init"]["environment"]["AIRFLOW_ADMIN_PASSWORD"] == ENV["AIRFLOW_ADMIN_PASSWORD"]
    assert "AIRFLOW_ADMIN_PASSWORD" not in env, "the password reaches the init job only"
    for name in ("airflow-init", "api-server"):
        (mount,) = services[name]["volumes"]
        assert mount["type"] == "volume" and Path(passwords).parent == Path(mount["target"]), name

    bucket = urlparse(env["HPD_STORE"]).netloc
    assert urlparse(env["AIRFLOW__LOGGING__REMOTE_BASE_LOG_FOLDER"]).netloc == bucket
    steps = _init_steps(services["s3-init"])
    assert steps[0] == ["aws", "s3api", "head-bucket", "--bucket", bucket, "||"] + _aws("create-bucket", bucket)
    assert steps[1] == _aws("put-bucket-versioning", bucket) + ["--versioning-configuration", "Status=Enabled"]
    connection = json.loads(env["AIRFLOW_CONN_HPD_S3"])
    keys = (ENV["S3_ACCESS_KEY_ID"], ENV["S3_SECRET_ACCESS_KEY"])
    assert (connection["login"], connection["password"]) == keys
    for name in ("s3", "s3-init"):
        s3_env = services[name]["environment"]
        assert (s3_env["AWS_ACCESS_KEY_ID"], s3_env["AWS_SECRET_ACCESS_KEY"]) == keys, name
    for endpoint in (connection["extra"]["endpoint_url"], services["s3-init"]["environment"]["AWS_ENDPOINT_URL"]):
        assert urlparse(endpoint).hostname == "s3" and urlparse(endpoint).port == _port(services["s3"])


def test_every_long_running_service_has_a_health_check(services, airflow_cli):
    """A health check on each long-running service, probing what that service serves; the one-shot jobs run to
    completion instead and the services that need them wait for it."""
    assert set(LONG_RUNNING) | set(ONE_SHOT) == set(services)
    for name in LONG_RUNNING:
        check = services[name].get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), name
    for name in ONE_SHOT:
        assert services[name]["restart"] == "no" and "healthcheck" not in services[name], name
    tests = {name: _unescape(services[name]["healthcheck"]["test"]) for name in LONG_RUNNING}
    assert tests["api-server"][-1] == "http://localhost:8080/api/v2/monitor/health"
    assert tests["search"][-1] == "http://localhost:8765/health"
    assert tests["postgres"][1] == "pg_isready"
    assert tests["s3"][1:] == ["wget", "-q", "-O", "/dev/null", f"http://127.0.0.1:{_port(services['s3'])}/healthz"]
    jobs = {"scheduler": "SchedulerJob", "dag-processor": "DagProcessorJob", "triggerer": "TriggererJob"}
    for name, job in jobs.items():
        assert tests[name] == ["CMD", "airflow", "jobs", "check", "--job-type", job, "--local"], name
    assert all(_parses(airflow_cli, tests[name][1:]) for name in jobs)
    for name in ("worker", "worker-gpu"):
        assert 'inspect ping -d "celery@${HOSTNAME}"' in tests[name][-1], name


def test_services_wait_for_what_they_need(services):
    """Every Airflow service waits for a healthy database and broker and the finished init jobs; the workers for a
    healthy api-server (their tasks report through its execution API); the search service for the bucket."""

    def waits(name: str) -> dict[str, str]:
        return {dep: spec["condition"] for dep, spec in services[name].get("depends_on", {}).items()}

    healthy, done = "service_healthy", "service_completed_successfully"
    for name in AIRFLOW_SERVICES:
        assert waits(name)["postgres"] == waits(name)["redis"] == healthy, name
        assert waits(name)["s3-init"] == done, name
        if name != "airflow-init":
            assert waits(name)["airflow-init"] == done, name
    assert waits("worker")["api-server"] == waits("worker-gpu")["api-server"] == healthy
    assert waits("s3-init") == {"s3": healthy} and waits("search") == {"s3-init": done}


def test_the_first_day_has_its_raw_data(services):
    """hpd_ingest's default source in compose is a prefix per day in the store's bucket, and s3-init copies the
    shipped sample days there (data/samples/<date>/, mounted from the checkout), so a run for a sample day finds
    its raw files; the image's own default (HPD_DEFAULT_SOURCE, for a container without compose's) is the copy
    of the same days inside the image, an absolute path (the workers run in /opt/airflow)."""
    from tasks.core.sources import resolve_source

    env = services["worker"]["environment"]
    bucket = urlparse(env["HPD_STORE"]).netloc
    source = env["HPD_DEFAULT_SOURCE"]
    assert {services[name]["environment"]["HPD_DEFAULT_SOURCE"] for name in AIRFLOW_SERVICES} == {source}
    assert source == f"s3://{bucket}/raw/{{ingest_date}}/"
    (mount,) = services["s3-init"]["volumes"]
    assert (mount["type"], Path(mount["source"]), mount["read_only"]) == ("bind", SAMPLES, True)
    *_, sync = _init_steps(services["s3-init"])
    assert sync[:3] == ["aws", "s3", "sync"] and sync[-2:] == [mount["target"].rstrip("/") + "/", f"s3://{bucket}/raw/"]
    (image_default,) = re.findall(r"HPD_DEFAULT_SOURCE=(\S+)$", DOCKERFILE.read_text(), re.M)
    days = sorted(path.name for path in SAMPLES.iterdir())
    assert days, "data/samples holds the sample days"
    for day in map(date.fromisoformat, days):
        synced = resolve_source(source, day).removeprefix(f"s3://{bucket}/raw/")
        assert sorted(p.name for p in (SAMPLES / synced).iterdir()) == ["sentences.txt"], day
        inside = resolve_source(image_default, day)
        assert inside.startswith("/") and _in_image(inside) == SAMPLES / day.isoformat(), day


def test_search_is_healthy_only_once_it_can_answer(services, tmp_path):
    """The search service's health check asks /health, which answers 503 as /search does until a promoted index is
    loaded: `search` shows unhealthy until the first promotion, as docs/deployment.md says. On Kubernetes the same
    /health gates readiness, and liveness probes the port, so a pod waiting for its first index is not restarted."""
    import yaml
    from fastapi.testclient import TestClient

    from tasks.serve.app import create_app
    from tasks.serve.holder import IndexHolder

    assert (
        _unescape(services["search"]["healthcheck"]["test"])[-1]
        == f"http://localhost:{_port(services['search'])}/health"
    )
    with TestClient(create_app(IndexHolder(str(tmp_path / "store"), 60.0), poll=False)) as client:
        health, search = client.get("/health"), client.get("/search", params={"q": "a dog"})
    assert (health.status_code, health.json()["status"], search.status_code) == (503, "no_index", 503)
    deployment, _ = yaml.safe_load_all((ROOT / "infra" / "k8s" / "search.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "httpGet" not in container["livenessProbe"] and container["livenessProbe"]["tcpSocket"]
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert "`search` shows `unhealthy` until" in page


def test_images_are_built_or_pinned(services):
    """No `:latest` and no untagged image; the project's images carry the project's version and are built from its
    Dockerfile (the GPU worker from its own target); the others name a release."""
    for name, service in services.items():
        image = service["image"]
        repository, _, tag = image.rpartition(":")
        assert repository and "/" not in tag and tag != "latest", f"{name}: {image}"
        if repository.startswith("hpd-pipeline/"):
            assert tag == VERSION, f"{name}: {image}"
            dockerfile = Path(service["build"]["context"]) / service["build"]["dockerfile"]
            assert dockerfile.resolve().parent == DOCKER and dockerfile.exists(), name
        else:
            assert "build" not in service and re.search(r"\d", tag), f"{name}: {image}"
    builds = {name: s["build"] for name, s in services.items() if "build" in s}
    assert {build["target"] for build in builds.values()} == {"airflow", "worker-gpu"}
    for name, build in builds.items():
        expected = "worker-gpu" if name == "worker-gpu" else "airflow"
        assert build["target"] == expected and services[name]["image"] == f"hpd-pipeline/{expected}:{VERSION}", name


def test_every_secret_is_required():
    """Each secret is `${VAR:?message}`, never a fallback: `config` fails naming the one that is unset."""
    text = "\n".join(line for line in COMPOSE.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert set(re.findall(r"\$\{(\w+):\?", text)) == set(SECRETS)
    defaults = set(re.findall(r"\$\{(\w+):-", text))
    assert not {name for name in defaults if re.search("PASSWORD|SECRET|KEY", name)}, defaults
    for name in SECRETS:
        rendered = _compose("config", "-q", env={key: value for key, value in ENV.items() if key != name})
        assert rendered.returncode != 0 and f"required variable {name} is missing a value" in rendered.stderr, name


def test_make_env_writes_every_secret_once(tmp_path):
    """docker/make-env.sh writes a private env file with which the file renders; a valid Fernet key; a second run
    leaves the file as it is."""
    from cryptography.fernet import Fernet

    env_file = tmp_path / ".env"
    written = []
    for _ in ("writes", "leaves"):
        made = subprocess.run(["sh", str(DOCKER / "make-env.sh"), str(env_file)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        written.append(env_file.read_text())
    first, second = written
    assert second == first and env_file.stat().st_mode & 0o777 == 0o600
    values = dict(line.split("=", 1) for line in first.splitlines() if line and not line.startswith("#"))
    assert set(SECRETS) <= set(values) and len(set(values[name] for name in SECRETS)) == len(SECRETS)
    Fernet(values["AIRFLOW_FERNET_KEY"].encode())
    rendered = _compose("--env-file", str(env_file), "config", "--format", "json", env={})
    assert rendered.returncode == 0, rendered.stderr
    env = json.loads(rendered.stdout)["services"]["scheduler"]["environment"]
    assert env["AIRFLOW__API_AUTH__JWT_SECRET"] == values["AIRFLOW_JWT_SECRET"]


def test_ports_stay_on_loopback_and_the_celery_layout(services):
    """Published ports bind 127.0.0.1 only. The layout tests/dags/test_airflow_services.py runs: the CeleryExecutor on
    Redis and Postgres, a worker on the default queue and a GPU worker on the default and GPU queues, and one set of
    signing secrets for every Airflow container (the scheduler signs the workers' task tokens, the api-server
    checks them)."""
    from tasks.orchestration.celery_config import CELERY_CONFIG_ENV
    from tasks.orchestration.defaults import ENCODE_POOL

    for name, service in services.items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", f"{name} publishes a port beyond loopback"
    env = services["scheduler"]["environment"]
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor" and env["HPD_ENCODE_POOL"] == ENCODE_POOL
    assert env["AIRFLOW__CELERY__BROKER_URL"].startswith("redis://redis:")
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"].startswith("db+postgresql")
    assert {env[name] for name in CELERY_CONFIG_ENV} == set(CELERY_CONFIG_ENV.values())
    assert env["HPD_STORE"].startswith("s3://") and "HPD_ALERT_EMAIL" in env
    for key in ("AIRFLOW__API_AUTH__JWT_SECRET", "AIRFLOW__API__SECRET_KEY", "AIRFLOW__CORE__FERNET_KEY"):
        assert {services[name]["environment"][key] for name in AIRFLOW_SERVICES} == {env[key]}, key
    assert "gpus" in services["worker-gpu"] and services["worker-gpu"]["profiles"] == ["gpu"]


def _copies() -> dict[str, str]:
    """The Dockerfile's COPY lines: each destination in the image -> the source in the build context."""
    copies = {}
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY "):
            *sources, destination = [word for word in line.split()[1:] if not word.startswith("--")]
            for source in sources:
                copies[destination.rstrip("/") + ("/" + source if destination.endswith("/") else "")] = source
    return copies


def _in_image(path: str) -> Path:
    """Where ``path``, a path inside the image, comes from in the checkout (through the COPY lines)."""
    for destination, source in sorted(_copies().items(), key=lambda item: -len(item[0])):
        if path == destination or path.startswith(destination + "/"):
            return ROOT / source / path.removeprefix(destination).lstrip("/")
    raise AssertionError(f"{path} is not in the image")


def test_images_install_from_the_locks():
    """The Airflow image installs from the lock files on the pinned Airflow image, and its build context
    (airflow.Dockerfile.dockerignore, an allow-list) holds every path its COPY lines name."""
    dockerfile = DOCKERFILE.read_text()
    assert dockerfile.startswith("#") and "FROM apache/airflow:3.3.2-python3.11 AS hpd" in dockerfile
    assert (
        "-r /opt/hpd/requirements.lock" in dockerfile
        and "--require-hashes -r /opt/hpd/requirements-models.lock" in dockerfile
    )
    assert "apache-airflow==3.3.2" in (ROOT / "requirements.lock").read_text()
    allowed = {
        line[1:]
        for line in (DOCKER / "airflow.Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = set(_copies().values())
    assert copied and copied <= allowed and all((ROOT / src).exists() for src in copied)


def _stages() -> dict[str, str]:
    """The Dockerfile's stages: name -> its lines, in order (the last is what a plain `docker build` makes)."""
    stages: dict[str, str] = {}
    for block in re.split(r"^(?=FROM )", DOCKERFILE.read_text(), flags=re.M)[1:]:
        stages[block.split("\n", 1)[0].split(" AS ")[1].strip()] = block
    return stages


def test_only_the_gpu_worker_installs_cuda_torch(services):
    """torch comes from TORCH_INDEX before the locks install: PyTorch's CPU index by default, PyPI (whose Linux wheel
    is the CUDA build) only where the GPU worker's image is built. The locks hold no CUDA wheel, so nothing else brings
    one in; each target's build checks which torch it got. A plain `docker build` makes the CPU image."""
    stages = _stages()
    assert list(stages) == ["hpd", "worker-gpu", "airflow"]
    (arg,) = re.findall(r"^ARG TORCH_INDEX=(\S+)$", stages["hpd"], re.M)
    assert arg == CPU_INDEX
    pips = [
        step.strip() for run in re.findall(r"^RUN (.*?[^\\])$", stages["hpd"], re.M | re.S) for step in run.split("&&")
    ]
    pips = [step for step in pips if step.startswith("pip install")]
    torch, locks = pips[0], pips[1:]
    assert '--index-url "$TORCH_INDEX" "torch==$(sed -n \'s/^torch==//p\' /opt/hpd/requirements.lock)"' in torch
    assert locks and not [step for step in locks if "index-url" in step or "torch" in step]
    locked = [ROOT / name for name in ("requirements.lock", "requirements-models.lock")]
    names = [line.split("==")[0].lower() for path in locked for line in path.read_text().splitlines()]
    assert names.count("torch") == 1 and not [n for n in names if n.startswith(("nvidia-", "triton", "cuda"))]
    assert "'torch is a CUDA build" in stages["airflow"] and "'torch has no CUDA" in stages["worker-gpu"]
    for name, service in services.items():
        if "build" in service:
            index = service["build"].get("args", {}).get("TORCH_INDEX", arg)
            assert index == (PYPI if name == "worker-gpu" else CPU_INDEX), name


def test_the_deployment_page_names_every_service_and_secret(services):
    page = (ROOT / "docs" / "deployment.md").read_text()
    assert not [name for name in (*services, *SECRETS) if f"`{name}`" not in page]
    pinned = {service["image"] for service in services.values() if not service["image"].startswith("hpd-pipeline/")}
    assert not [image for image in pinned if image.startswith("quay.io/") and f"`{image}`" not in page]


def test_every_hpd_variable_is_a_setting_with_a_valid_value(services):
    """The `HPD_*` variables the services get are settings the code reads (tasks/core/settings.py), and valid."""
    from tasks.core import settings

    known = {settings.env_name(field) for field in settings.Settings.model_fields}
    for name, service in services.items():
        env = {key: value for key, value in service.get("environment", {}).items() if key.startswith("HPD_")}
        assert set(env) <= known, f"{name}: {set(env) - known}"
        settings.current(env)
