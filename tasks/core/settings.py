"""Every ``HPD_*`` environment variable the pipeline reads, in one typed model (pydantic-settings).

Code reads them through :func:`current` (the environment as it is now, then a ``.env`` file in the working
directory: tests and runs change them), never ``os.environ`` directly; ``docs/reference/configuration.md`` is
generated from this model (``python -m tasks.reference``). An empty variable counts as unset, except
``HPD_SERVE_URL``, where it turns the service off; an ``HPD_*`` name in ``.env`` that is no setting is refused.
A URI setting that carries credentials (``scheme://user:secret@...``) is refused, except ``HPD_TRACKING_URI``, which
MLflow reads as it is (the code shows it only redacted); no error shows the credentials of a value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, NamedTuple

from pydantic import AfterValidator, BeforeValidator, Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import BaseSettings, NoDecode, PydanticBaseSettingsSource, SettingsConfigDict

from tasks.core.uris import redact

PREFIX = "HPD_"
ENV_FILE = ".env"  # read from the working directory, after the environment
MIB = 1024 * 1024
_CACHE = "~/.cache/hpd-pipeline"
_KEEPS_EMPTY = frozenset({"serve_url"})

STORE, S3, FILES, DAGS, WORKERS, ALERTS, SERVICE, TRACKING, LOCAL = (
    "Store",
    "S3 client",
    "Models, data and logs",
    "DAG defaults",
    "Workers and executors",
    "Alerts",
    "Search service",
    "Experiment tracking",
    "Local Airflow",
)


class SettingsError(ValueError):
    """``HPD_*`` variables that fail validation; the message names each wrong one. A permanent error."""


def _var(default: Any = None, *, section: str, description: str, shown: str | None = None, **kw: Any) -> Any:
    """A setting: its default, the docs' section and description, and how the docs show a computed default."""
    extra: dict[str, Any] = {"section": section, **({"shown": shown} if shown else {})}
    if "default_factory" in kw:
        return Field(description=description, json_schema_extra=extra, **kw)
    return Field(default, description=description, json_schema_extra=extra, **kw)


def _without_credentials(value: str) -> str:
    """A URI with credentials is refused: they would reach log lines, errors and records."""
    if redact(value) != value:
        raise ValueError("credentials do not belong in a URI: use the environment or an Airflow connection")
    return value


def _comma_separated(value: Any) -> Any:
    return [part.strip() for part in value.split(",") if part.strip()] if isinstance(value, str) else value


UriSetting = Annotated[str, AfterValidator(_without_credentials)]
CommaList = Annotated[list[str], NoDecode, BeforeValidator(_comma_separated)]  # a,b,c rather than JSON
UriList = Annotated[list[UriSetting], NoDecode, BeforeValidator(_comma_separated)]
_REPORT_STORES = (
    "stores besides HPD_STORE whose reports the Airflow plugin serves, comma-separated: those your runs name in "
    "their store param"
)


class Settings(BaseSettings):
    """The deployment's settings; each field is the variable of its name in capitals, prefixed ``HPD_``."""

    # .env: other tools' variables there are theirs; an HPD_* name that is no setting is refused (extra="forbid")
    model_config = SettingsConfigDict(
        env_prefix=PREFIX, env_file=ENV_FILE, dotenv_filtering="match_prefix", frozen=True, extra="forbid"
    )

    store: UriSetting = _var(
        "var/store",
        section=STORE,
        description="root of the object store: a folder, file:// or s3://bucket/prefix URI; the default of every "
        "command's --store and every DAG's store param",
    )
    report_stores: UriList = _var([], section=STORE, description=_REPORT_STORES, shown="(none)")
    aws_conn_id: str | None = _var(
        section=S3,
        description="Airflow connection whose credentials and endpoint the S3 client uses; unset: boto3's own chain "
        "(AWS_* variables, profile, instance role)",
    )
    s3_max_attempts: int = _var(8, section=S3, description="attempts per S3 request in all (at least 1)")
    s3_multipart_threshold: int = _var(
        64 * MIB, section=S3, description="bytes above which an upload goes up in parts", shown="67108864 (64 MiB)"
    )
    s3_part_size: int = _var(
        8 * MIB,
        section=S3,
        description="bytes per multipart upload part (at least 5 MiB)",
        shown="8388608 (8 MiB)",
    )
    model_cache: Path = _var(
        default_factory=lambda: Path.home() / ".cache" / "hpd-pipeline" / "models",
        section=FILES,
        description="where the packaged teacher and student models are unpacked",
        shown=f"{_CACHE}/models",
    )
    nltk_data: Path | None = _var(
        section=FILES,
        description=f"the WordNet data of the augment stage; unset: the first NLTK_DATA entry, else {_CACHE}/nltk_data",
    )
    log_every_s: float = _var(30.0, section=FILES, description="seconds between a stage's progress lines", ge=0)
    default_source: UriSetting = _var(
        "data/corpus/sentences.tsv.gz",
        section=DAGS,
        description="hpd_ingest's source param: the raw file of each day ({ingest_date} is replaced)",
    )
    default_teacher: UriSetting = _var(
        "all-mpnet-base-v2+all-MiniLM-L6-v2",
        section=DAGS,
        description="the teacher param: a model name, path or URI; a + joins a composite teacher",
    )
    default_student: UriSetting = _var("all-MiniLM-L6-v2", section=DAGS, description="hpd_retrain's student param")
    default_k: int = _var(128, section=DAGS, description="the projection's dimension (the k param)", ge=1)
    default_min_stsb: float | None = _var(
        section=DAGS, description="hpd_retrain's gate threshold min_stsb; unset: the validate stage's default"
    )
    default_min_sickr: float | None = _var(
        section=DAGS, description="hpd_retrain's gate threshold min_sickr; unset: the validate stage's default"
    )
    default_max_regression: float | None = _var(
        section=DAGS, description="hpd_retrain's gate threshold max_regression; unset: the validate stage's default"
    )
    default_max_dev_regression: float | None = _var(
        section=DAGS, description="hpd_retrain's gate threshold max_dev_regression; unset: the validate stage's default"
    )
    gpu_queue: str = _var("default", section=WORKERS, description="the Celery queue the distill task is sent to")
    distill_executor: str | None = _var(
        section=WORKERS,
        description="the executor of the distill task where several are configured (e.g. CeleryExecutor); it must be "
        "one of them, else the DAG fails to import; unset: the default executor",
    )
    gpu_count: int = _var(1, section=WORKERS, description="GPUs the distill pod asks for (KubernetesExecutor)", ge=0)
    gpu_pod_template: str | None = _var(
        section=WORKERS, description="pod template file of the distill pod (KubernetesExecutor): image, node selector"
    )
    encode_pool: str = _var(
        "hpd_teacher_encode",
        section=WORKERS,
        description="the Airflow pool of the teacher-encoding tasks; the deployment creates it",
    )
    encode_pool_slots: int = _var(4, section=WORKERS, description="the pool's slots: encodings running at once", ge=1)
    alert_email: CommaList = _var(
        [], section=ALERTS, description="failure alert recipients, comma-separated; unset: no alerts", shown="(none)"
    )
    alert_from: str | None = _var(
        section=ALERTS, description="the alerts' sender; unset: the connection's from address"
    )
    smtp_conn_id: str = _var("smtp_default", section=ALERTS, description="Airflow connection the alerts are sent by")
    serve_url: UriSetting = _var(
        "http://127.0.0.1:8765",
        section=SERVICE,
        description="the hpd serve that hpd search asks first; empty or off: always search locally",
    )
    tracking_uri: str | None = _var(
        section=TRACKING,
        description="the MLflow tracking server or store distill and validate report to (http://... or "
        "sqlite:///...; MLflow 3 takes file:///... only with MLFLOW_ALLOW_FILE_STORE=true); unset: no tracking",
    )
    tracking_experiment: str = _var("hpd-pipeline", section=TRACKING, description="the MLflow experiment of the runs")
    tracking_model: str = _var(
        "hpd-student",
        section=TRACKING,
        description="the MLflow registered model of the validated students; its alias champion names the promoted one",
    )
    airflow_password: str | None = _var(
        section=LOCAL,
        description="the admin password of `make airflow`'s local Airflow; unset: one generated once into its home",
    )

    @field_validator("*", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any, info: ValidationInfo) -> Any:
        """An empty (or blank) variable is the setting's default, but where empty means something."""
        if isinstance(value, str) and not value.strip() and info.field_name not in _KEEPS_EMPTY:
            return cls.model_fields[str(info.field_name)].get_default(call_default_factory=True)
        return value


class Connection(NamedTuple):
    """An Airflow connection the code uses: the setting naming it, its default and what it is for."""

    setting: str
    default: str
    use: str


CONNECTIONS = (
    Connection(
        "aws_conn_id",
        "(none: boto3's default chain, no connection)",
        "S3 stores: credentials, region and endpoint (an `aws` connection, e.g. `AIRFLOW_CONN_AWS_DEFAULT`)",
    ),
    Connection(
        "smtp_conn_id",
        "`smtp_default`",
        "failure alerts by e-mail (an `smtp` connection, e.g. `AIRFLOW_CONN_SMTP_DEFAULT`)",
    ),
)


def env_name(field: str) -> str:
    return PREFIX + field.upper()


class _Given(Settings):
    """The settings of given variables alone: neither the process's environment nor a ``.env`` file."""

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)


def current(environ: Mapping[str, str] | None = None) -> Settings:
    """The settings of the process's environment and ``.env`` file, or of ``environ`` alone (a deployment's
    variables, to check them); raises :class:`SettingsError` naming each wrong variable (its value without the
    credentials of a URI in it)."""
    try:
        if environ is None:
            return _read(_source())
        given: dict[str, Any] = {
            name: environ[env_name(name)] for name in Settings.model_fields if env_name(name) in environ
        }
        return _Given(**given)
    except ValidationError as exc:
        wrong = []
        for error in exc.errors(include_url=False):
            name = str(error.get("loc", ("",))[0])
            given = error.get("input")
            shown = redact(given) if isinstance(given, str) else ""
            wrong.append(f"  {env_name(name.lower())}={shown!r}: {error.get('msg')}")
        raise SettingsError("invalid environment:\n" + "\n".join(wrong)) from None


# What the process's settings are read from: its ``HPD_*`` variables (any case) and ``HOME`` (a default's home),
# then the ``.env`` file of the working directory as it is now: its path and bytes (None: no such file).
_Source = tuple[tuple[tuple[str, str], ...], str, bytes | None]


def _source() -> _Source:
    variables = tuple(sorted((k, v) for k, v in os.environ.items() if k.upper().startswith(PREFIX) or k == "HOME"))
    path = os.path.abspath(ENV_FILE)
    try:
        with open(path, "rb") as env_file:
            return variables, path, env_file.read()
    except OSError:  # none there (or unreadable, as pydantic-settings then reads it)
        return variables, path, None


@lru_cache(maxsize=32)
def _read(source: _Source) -> Settings:
    """The settings of ``source`` (the environment, then its ``.env`` file), read once for each: every S3 call
    reads them. Settings are immutable: each caller may keep the one instance."""
    return Settings(_env_file=source[1])  # type: ignore[call-arg]
