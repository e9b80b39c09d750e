"""Stage-run manifests: the audit record every stage writes last, and the basis of skipping.

A manifest lives at ``<store>/manifests/<stage>/<key>.json`` (the key names what the run covers,
e.g. ``ingest_date=2026-11-30``). Its ``fingerprint`` hashes the stage, key, input checksums and
params: a run that finds a manifest with its own fingerprint has nothing to do. The manifest is
published after every output (create-if-absent the first time, compare-and-swap on a rerun), so
"manifest present" means "outputs complete".
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any

import jsonschema

from tasks import storage

MANIFEST_VERSION = 1
KEY_PACKAGES = ("hpd-pipeline", "apache-airflow", "torch", "transformers", "sentence-transformers",
                "pyarrow", "polars", "numpy", "faiss-cpu", "boto3", "great-expectations")
# Whole words only: "aws_secret_access_key" and "session_token" are secrets, "max_tokens" is not.
_SECRET_KEY = re.compile(r"(^|_)(secret|password|passwd|token|credentials?|access_key|api_key)(_id)?$",
                         re.IGNORECASE)
_URI_USERINFO = re.compile(r"^([a-z][a-z0-9+.-]*://)[^/@]*@", re.IGNORECASE)


@dataclass(frozen=True)
class StageResult:
    """What a stage run returns: where its manifest is, whether it was a skip, and the manifest."""

    manifest_uri: str
    skipped: bool
    manifest: dict


class ManifestError(ValueError):
    """A manifest that does not validate, or a concurrent run that published a different one."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_uri(store: str, stage: str, key: str) -> str:
    return storage.join(store, "manifests", stage, f"{key}.json")


def redact(value: Any) -> Any:
    """Drop credentials: secret-looking keys are masked and URI user-info is removed."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return _URI_USERINFO.sub(r"\1", value)
    return value


def fingerprint(stage: str, key: str, inputs: list[dict], params: dict) -> str:
    canonical = json.dumps(
        {"stage": stage, "key": key, "inputs": sorted((i["uri"], i["sha256"]) for i in inputs),
         "params": params},
        sort_keys=True, default=str,
    )
    return sha256_hex(canonical.encode())


@cache
def _schema() -> dict:
    return json.loads(resources.files("schemas").joinpath("manifest.schema.json").read_text())


def validate(manifest: dict) -> None:
    """Raise :class:`ManifestError` unless ``manifest`` matches ``schemas/manifest.schema.json``."""
    try:
        jsonschema.validate(manifest, _schema(), format_checker=jsonschema.FormatChecker())
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ManifestError(f"manifest invalid at {where}: {exc.message}") from None


@cache
def code_version() -> str:
    """The git commit of the checkout the code runs from, else the package version."""
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                             text=True, timeout=5, check=True).stdout.strip()
        if sha:
            return f"git:{sha}"
    except (OSError, subprocess.SubprocessError):
        pass
    return f"hpd-pipeline=={metadata.version('hpd-pipeline')}"


@cache
def package_versions() -> dict[str, str]:
    versions = {}
    for name in KEY_PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


@dataclass
class StageRun:
    """Collects one stage run's inputs, outputs, stats and timings, and publishes its manifest."""

    stage: str
    key: str
    store: str
    params: dict
    inputs: list[dict]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    outputs: list[dict] = field(default_factory=list)
    stats: dict = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: str = field(default_factory=_now)
    _clock: float = field(default_factory=time.perf_counter)
    _previous_etag: str | None = None
    _looked_up: bool = False

    @property
    def uri(self) -> str:
        return manifest_uri(self.store, self.stage, self.key)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.stage, self.key, self.inputs, self.params)

    def previous(self) -> dict | None:
        """The manifest already published for this stage and key (any fingerprint), if any."""
        self._looked_up = True
        previous, self._previous_etag = storage.read_json_versioned(self.uri)
        return previous

    def completed(self) -> dict | None:
        """The published manifest if it has this run's fingerprint: the work is already done."""
        previous = self.previous()
        if previous is not None and previous.get("fingerprint") == self.fingerprint:
            return previous
        return None

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings_s[name] = round(self.timings_s.get(name, 0.0) + time.perf_counter() - start, 4)

    def add_output(self, uri: str, sha256: str, size: int, rows: int | None,
                   contract: str | None = None, schema_version: int | None = None) -> None:
        self.outputs.append({"uri": uri, "sha256": sha256, "rows": rows, "bytes": size,
                             "contract": contract, "schema_version": schema_version})

    def add_shard(self, shard: Any) -> None:
        """Record a published :class:`tasks.datasets.Shard`."""
        self.add_output(shard.uri, shard.sha256, shard.bytes, shard.rows, shard.contract, shard.schema_version)

    def build(self) -> dict:
        self.timings_s["total"] = round(time.perf_counter() - self._clock, 4)
        manifest = redact({
            "manifest_version": MANIFEST_VERSION,
            "stage": self.stage,
            "run_id": self.run_id,
            "key": self.key,
            "fingerprint": self.fingerprint,
            "inputs": self.inputs,
            "outputs": self.outputs,
            "params": self.params,
            "stats": self.stats,
            "code_version": code_version(),
            "packages": package_versions(),
            "started_at": self.started_at,
            "ended_at": _now(),
            "timings_s": self.timings_s,
            "host": socket.gethostname(),
        })
        validate(manifest)
        return manifest

    def publish(self) -> dict:
        """Validate and publish the manifest; call after every output is published.

        Replaces the manifest seen by :meth:`previous` by compare-and-swap, so a concurrent run
        that published in between is detected instead of overwritten.
        """
        if not self._looked_up:
            self.previous()
        manifest = self.build()
        body = json.dumps(manifest, indent=2, sort_keys=True).encode()
        try:
            storage.compare_and_swap(self.uri, body, self._previous_etag)
        except storage.PreconditionFailed:
            winner = json.loads(storage.read_bytes(self.uri))
            if winner.get("fingerprint") != manifest["fingerprint"]:
                raise ManifestError(f"{self.uri}: a concurrent {self.stage} run published a manifest for "
                                    f"different inputs or params; rerun to reconcile") from None
            return winner
        return manifest


def read(store: str, stage: str, key: str) -> dict | None:
    """A published manifest, or None."""
    uri = manifest_uri(store, stage, key)
    try:
        return json.loads(storage.read_bytes(uri))
    except storage.ObjectNotFound:
        return None
    except json.JSONDecodeError as exc:
        raise ManifestError(f"{uri}: not a readable manifest ({exc})") from None


def list_keys(store: str, stage: str, under: str = "") -> list[str]:
    """Keys of every manifest published for ``stage`` (optionally under a key prefix), sorted."""
    root = storage.join(store, "manifests", stage)
    prefix = storage.join(root, under) if under else root
    return sorted(uri[len(root) + 1:].removesuffix(".json") for uri in storage.list_uris(prefix)
                  if uri.endswith(".json"))
