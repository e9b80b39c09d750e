"""Static checks of infra/: Helm values, the GPU pod template and the bucket's Terraform."""

import re
import tomllib

import yaml

from tests.support.paths import INFRA

VERSION = tomllib.loads((INFRA.parent / "pyproject.toml").read_text())["project"]["version"]


def test_helm_values_use_the_kubernetes_executor_and_remote_logs():
    """The chart runs one image in every component: the GPU worker's (CUDA torch), since its Celery GPU worker set
    runs distillation on it. A day's raw data is read from the bucket's prefix of that day."""
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    assert values["executor"].split(",")[0] == "KubernetesExecutor"  # the default executor: the first listed
    assert values["airflowVersion"] == "3.3.2"
    assert (values["defaultAirflowRepository"], values["defaultAirflowTag"]) == ("hpd-pipeline/worker-gpu", VERSION)
    logging = values["config"]["logging"]
    assert logging["remote_logging"] == "True" and logging["remote_base_log_folder"].startswith("s3://")
    env = {item["name"]: item["value"] for item in values["env"]}
    assert env["HPD_STORE"].startswith("s3://") and env["HPD_GPU_QUEUE"] == "gpu"
    bucket = env["HPD_STORE"].removeprefix("s3://").split("/")[0]
    assert env["HPD_DEFAULT_SOURCE"] == f"s3://{bucket}/raw/{{ingest_date}}/"


def test_distill_routes_to_the_celery_gpu_workers():
    """HPD_DISTILL_EXECUTOR names a configured executor (else the DAG does not import), the Celery GPU worker set
    consumes HPD_GPU_QUEUE on GPU nodes with a GPU per pod, with the project's Celery configuration, and the
    migration job creates the encoding pool."""
    from tasks.orchestration.celery_config import CELERY_CONFIG_ENV
    from tasks.orchestration.defaults import ENCODE_POOL

    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    env = {item["name"]: item["value"] for item in values["env"]}
    assert env["HPD_DISTILL_EXECUTOR"] == "CeleryExecutor" and "CeleryExecutor" in values["executor"].split(",")
    celery = values["workers"]["celery"]
    (gpu,) = celery["sets"]
    assert celery["enableDefault"] is False and gpu["queue"] == env["HPD_GPU_QUEUE"] == "gpu"
    assert f"--queues {env['HPD_GPU_QUEUE']} --concurrency 1" in gpu["args"][-1]
    assert gpu["resources"]["requests"]["nvidia.com/gpu"] == gpu["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert gpu["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert [t["key"] for t in gpu["tolerations"]] == ["nvidia.com/gpu"]
    assert env["HPD_ENCODE_POOL"] == ENCODE_POOL
    options = values["config"]["celery"]["celery_config_options"]  # the workers load the tasks' libraries first
    assert CELERY_CONFIG_ENV == {"AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": options}
    migrate = values["migrateDatabaseJob"]["args"][-1]
    assert migrate.startswith("airflow db migrate &&") and f"airflow pools set {ENCODE_POOL} 4 " in migrate


def test_gpu_pod_template_runs_the_gpu_worker_on_a_gpu_node():
    pod = yaml.safe_load((INFRA / "helm" / "gpu-pod-template.yaml").read_text())
    assert pod["kind"] == "Pod"
    (container,) = pod["spec"]["containers"]
    assert container["name"] == "base"  # the KubernetesExecutor runs the task in the container named base
    assert container["image"] == f"hpd-pipeline/worker-gpu:{VERSION}"
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    env = {item["name"]: item["value"] for item in values["env"]}
    mounts = {m["mountPath"] for m in values["scheduler"]["extraVolumeMounts"]}
    assert env["HPD_GPU_POD_TEMPLATE"] in mounts


def _blocks(text: str, resource: str) -> list[str]:
    return re.findall(rf'resource "{resource}" "\w+" \{{(.*?)\n\}}', text, re.S)


def test_bucket_is_private_encrypted_versioned():
    tf = (INFRA / "terraform" / "bucket.tf").read_text()
    (block,) = _blocks(tf, "aws_s3_bucket_public_access_block")
    for flag in ("block_public_acls", "block_public_policy", "ignore_public_acls", "restrict_public_buckets"):
        assert re.search(rf"{flag}\s*=\s*true", block), flag
    assert 'status = "Enabled"' in _blocks(tf, "aws_s3_bucket_versioning")[0]
    assert 'sse_algorithm = "aws:kms"' in _blocks(tf, "aws_s3_bucket_server_side_encryption_configuration")[0]
    assert "abort_incomplete_multipart_upload" in _blocks(tf, "aws_s3_bucket_lifecycle_configuration")[0]
    assert '"aws:SecureTransport"' in tf


def test_pipeline_policy_is_least_privilege():
    tf = (INFRA / "terraform" / "bucket.tf").read_text()
    policy = tf[tf.index('data "aws_iam_policy_document" "pipeline"') : tf.index('resource "aws_iam_role_policy"')]
    actions = set(re.findall(r'"(s3:[A-Za-z*]+)"', policy))
    assert actions == {
        "s3:ListBucket",
        "s3:ListBucketMultipartUploads",
        "s3:GetObject",
        "s3:PutObject",
        "s3:DeleteObject",
        "s3:AbortMultipartUpload",
        "s3:ListMultipartUploadParts",
    }
    assert "s3:*" not in policy and '"*"' not in policy


def test_search_service_runs_hpd_serve_on_the_pipeline_store():
    """The search Deployment's command is a valid ``hpd serve`` command line listening on the port the Service
    targets, in the CPU image; it is ready once /health answers (an index is loaded) and alive while its port
    accepts connections; it runs as the image's non-root user, and reads the store and S3 connection the Airflow
    release uses."""
    from tasks import cli

    deployment, service = yaml.safe_load_all((INFRA / "k8s" / "search.yaml").read_text())
    assert (deployment["kind"], service["kind"]) == ("Deployment", "Service")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["command"][0] == "hpd"  # `command` replaces the image's entrypoint (`airflow ...`)
    assert container["image"] == f"hpd-pipeline/airflow:{VERSION}"
    args = cli.build_parser().parse_args(container["command"][1:])
    assert args.command == "serve" and args.host == "0.0.0.0"
    (port,) = container["ports"]
    (exposed,) = service["spec"]["ports"]
    assert args.port == port["containerPort"] and exposed["targetPort"] == port["name"]
    assert service["spec"]["type"] == "ClusterIP"
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()
    assert container["readinessProbe"]["httpGet"] == {"path": "/health", "port": port["name"]}
    assert container["livenessProbe"]["tcpSocket"] == {"port": port["name"]}
    assert container["securityContext"]["runAsNonRoot"] is True
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    airflow_env = {item["name"]: item["value"] for item in values["env"]}
    env = {item["name"]: item["value"] for item in container["env"]}
    assert env["HPD_STORE"] == airflow_env["HPD_STORE"] and env["HPD_AWS_CONN_ID"] == airflow_env["HPD_AWS_CONN_ID"]
    assert {"secretRef": {"name": "hpd-s3-connection"}} in container["envFrom"]
    assert "hpd-s3-connection" in values["extraEnvFrom"]


def test_every_deployment_enables_the_stage_tasks_lineage_extractor():
    """Without the extractor the events lose the datasets' schemas: the Helm values and compose set it."""
    from tasks.orchestration.lineage_extractor import StageTaskExtractor
    from tasks.orchestration.openlineage import EXTRACTOR

    assert EXTRACTOR == f"{StageTaskExtractor.__module__}.{StageTaskExtractor.__qualname__}"
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    assert values["config"]["openlineage"]["extractors"] == EXTRACTOR
    compose = yaml.safe_load((INFRA.parent / "docker" / "compose.yaml").read_text())
    assert compose["x-airflow"]["environment"]["AIRFLOW__OPENLINEAGE__EXTRACTORS"] == EXTRACTOR


def test_the_signing_secrets_come_from_secrets_created_beforehand():
    """The chart would generate the Fernet key, the api-server's key and the JWT secret itself; named Secrets keep
    them stable across upgrades and shared by every component."""
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    names = [values[key] for key in ("fernetKeySecretName", "apiSecretKeySecretName", "jwtSecretName")]
    assert all(name.startswith("hpd-airflow-") for name in names) and len(set(names)) == 3
    assert not {key for key in ("fernetKey", "apiSecretKey", "jwtSecret") if values.get(key)}


def test_every_hpd_variable_is_a_setting_with_a_valid_value():
    """The `HPD_*` variables of the Helm release and the search Deployment are settings the code reads, and valid."""
    from tasks.core import settings

    known = {settings.env_name(field) for field in settings.Settings.model_fields}
    values = yaml.safe_load((INFRA / "helm" / "values.yaml").read_text())
    deployment, _ = yaml.safe_load_all((INFRA / "k8s" / "search.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    for items in (values["env"], container["env"]):
        env = {item["name"]: item["value"] for item in items if item["name"].startswith("HPD_")}
        assert env and set(env) <= known, set(env) - known
        settings.current(env)
