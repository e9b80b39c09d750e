"""Stage-run manifests: the audit record every stage writes last, and the basis of skipping.

A manifest lives where the catalog puts it (``manifests/<stage>/<key>.json``; the key names what the
run covers, e.g. ``ingest_date=2026-11-30``). Its records are typed: :class:`Input`, :class:`Output`
and :class:`Manifest`; on disk it is JSON checked against ``schemas/manifest.schema.json``. Its
``fingerprint`` hashes the stage, key, input checksums and params: a run that finds a manifest with
its own fingerprint, whose outputs are all still published with their recorded sizes, has nothing to
do. The manifest is published after every output (create-if-absent the first time, compare-and-swap
on a rerun), so "manifest present" means "outputs complete". A manifest is checked against the schema
whenever it is read; one that is not valid is named in the error, and a forced run replaces it.

Lineage is store-relative (manifest version 2). In memory every input and output has an absolute URI;
on the store, whatever lies below the store's root is recorded by its store-relative ``key`` and only
what lies outside it (a raw source file) by its absolute ``uri``; outputs are always below it. Reading
resolves the keys against the store the manifest is read from. The root is in no fingerprint: inputs
count by key, and the ``store`` param is left out of the fingerprint and of the recorded params (the
manifest's own location names its store). So a store copied to another root, bucket or prefix is
complete there, and its reruns skip. A manifest of another version is refused: rerun with --force.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Self, cast

import jsonschema
import pydantic

from tasks.core import catalog, storage, uris
from tasks.core.catalog import Stage
from tasks.core.progress import format_bytes, format_duration

MANIFEST_VERSION = 2
STORE_PARAM = "store"  # the root a store lives at: recorded nowhere, in no fingerprint
KEY_PACKAGES = (
    "hpd-pipeline",
    "apache-airflow",
    "torch",
    "transformers",
    "sentence-transformers",
    "pyarrow",
    "polars",
    "numpy",
    "faiss-cpu",
    "boto3",
    "great-expectations",
)
# Whole words only: "aws_secret_access_key" and "session_token" are secrets, "max_tokens" is not.
_SECRET_KEY = re.compile(r"(^|_)(secret|password|passwd|token|credentials?|access_key|api_key)(_id)?$", re.IGNORECASE)
_MAX_MESSAGE = 300  # a schema error quotes the offending value: keep a huge one from flooding the log
_LISTED = 5  # inputs and outputs a run logs one by one at INFO; the rest at DEBUG

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Input:
    """Something a stage run read: its URI, checksum and (when known) rows and bytes."""

    uri: str
    sha256: str
    rows: int | None = None
    bytes: int | None = None

    def to_dict(self, store: str) -> dict[str, Any]:
        """The on-store record: the store-relative ``key`` when below ``store``, else the absolute ``uri``."""
        key = catalog.store_key(store, self.uri)
        record: dict[str, Any] = {"uri": self.uri} if key is None else {"key": key}
        record |= {"sha256": self.sha256, "rows": self.rows}
        return record if self.bytes is None else {**record, "bytes": self.bytes}

    @classmethod
    def from_dict(cls, record: dict[str, Any], store: str) -> Self:
        fields = dict(record)
        key = fields.pop("key", None)
        return cls(catalog.resolve(store, key), **fields) if key is not None else cls(**fields)


@dataclass(frozen=True)
class Output:
    """Something a stage run published; ``contract`` names the data contract of a dataset shard."""

    uri: str
    sha256: str
    rows: int | None
    bytes: int
    contract: str | None = None
    schema_version: int | None = None

    @property
    def name(self) -> str:
        """The last segment of the URI (``index.faiss``, ``metrics.json`` ...)."""
        return self.uri.rsplit("/", 1)[-1]

    def as_input(self) -> Input:
        """This output as a downstream stage records it among its inputs."""
        return Input(self.uri, self.sha256, self.rows, self.bytes)

    def to_dict(self, store: str, position: int) -> dict[str, Any]:
        """The on-store record, with the store-relative ``key``; an output outside ``store`` is refused."""
        key = catalog.store_key(store, self.uri)
        if key is None:
            raise ManifestError(
                f"manifest invalid at outputs/{position}: {redact(self.uri)!r} is not below the store "
                f"{redact(store)}; a stage publishes only inside its store"
            )
        return {"key": key, **{k: v for k, v in asdict(self).items() if k != "uri"}}

    def damage(self) -> str | None:
        """What is wrong with the object as published (missing, or another size than recorded), None when
        nothing is: a stat, or one HEAD on S3; no reading."""
        try:
            size = storage.size(self.uri)
        except storage.ObjectNotFound:
            return "is missing"
        return None if size == self.bytes else f"has {size} bytes, the manifest records {self.bytes}"

    @classmethod
    def from_dict(cls, record: dict[str, Any], store: str) -> Self:
        fields = dict(record)
        return cls(catalog.resolve(store, fields.pop("key")), **fields)


class _Recorded(pydantic.BaseModel):
    """The parts of a manifest document that :class:`Manifest` holds (the schema checks the whole)."""

    stage: str
    key: str
    run_id: str
    fingerprint: str
    inputs: list[dict[str, Any]]
    outputs: list[dict[str, Any]]
    params: dict[str, Any]
    stats: dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    """A published stage-run manifest. ``params`` and ``stats`` are the stage's own records."""

    stage: str
    key: str
    run_id: str
    fingerprint: str
    inputs: tuple[Input, ...]
    outputs: tuple[Output, ...]
    params: dict[str, Any]
    stats: dict[str, Any]
    document: dict[str, Any] = field(repr=False, compare=False)

    @classmethod
    def from_dict(cls, document: dict[str, Any], uri: str, store: str) -> Self:
        """The manifest ``document`` read from ``uri`` in ``store``: its keys resolved against ``store``."""
        try:
            read = _Recorded.model_validate(document)
            inputs = tuple(Input.from_dict(i, store) for i in read.inputs)
            outputs = tuple(Output.from_dict(o, store) for o in read.outputs)
        except (pydantic.ValidationError, KeyError, TypeError, storage.StorageError) as exc:
            raise ManifestError(f"{uri}: not a manifest ({type(exc).__name__}: {exc})") from None
        return cls(
            read.stage, read.key, read.run_id, read.fingerprint, inputs, outputs, read.params, read.stats, document
        )

    def version_uri(self, store: str) -> str:
        """Where this run's manifest is kept unchanged (a stage of :data:`catalog.VERSIONED`), in ``store``."""
        return catalog.manifest_version_uri(store, Stage(self.stage), self.key, self.run_id)

    def outputs_of(self, contract: str) -> list[Output]:
        """The outputs written under data contract ``contract``."""
        return [o for o in self.outputs if o.contract == contract]

    def output_named(self, name: str) -> Output:
        """The output whose URI ends with ``/name``."""
        for output in self.outputs:
            if output.uri.endswith("/" + name):
                return output
        raise ManifestError(f"{self.stage} run {self.key!r} lists no output named {name!r}")


@dataclass(frozen=True)
class StageResult:
    """What a stage run returns: where its manifest is, whether it was a skip, its stats, outputs and inputs.
    ``manifest`` is None where a run publishes several manifests (encode_teacher: one per shard)."""

    manifest_uri: str
    skipped: bool
    stats: dict[str, Any]
    outputs: tuple[Output, ...]
    manifest: Manifest | None = None
    inputs: tuple[Input, ...] = ()

    @classmethod
    def of(cls, manifest: Manifest, uri: str, skipped: bool) -> Self:
        return cls(uri, skipped, manifest.stats, manifest.outputs, manifest, manifest.inputs)


class ManifestError(ValueError):
    """A manifest that does not validate, or a concurrent run that published a different one."""


class ConcurrentPublish(ManifestError):
    """A concurrent run of the same stage and key published a manifest for other inputs or params first (the
    quality report and a retrain checking one partition at once, say): another try runs against it."""


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def redact(value: Any) -> Any:
    """Drop credentials: secret-looking keys are masked and URI user-info is removed."""
    if isinstance(value, dict):
        return {k: "***" if _SECRET_KEY.search(str(k)) else redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    if isinstance(value, str):
        return uris.redact(value)
    return value


def recorded_params(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` as a manifest records and fingerprints them: without the ``store`` root."""
    return {name: value for name, value in params.items() if name != STORE_PARAM}


def fingerprint(stage: str, key: str, inputs: list[Input], params: dict[str, Any], store: str | None = None) -> str:
    """sha256 over the stage, key, inputs and params, free of the store's root: an input below ``store``
    counts by its store-relative key (one outside it by its URI), and the ``store`` param is left out."""
    references = sorted(((catalog.store_key(store, i.uri) if store else None) or i.uri, i.sha256) for i in inputs)
    canonical = json.dumps(
        {"stage": stage, "key": key, "inputs": references, "params": recorded_params(params)},
        sort_keys=True,
        default=str,
    )
    return sha256_hex(canonical.encode())


@cache
def _schema() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads(resources.files("schemas").joinpath("manifest.schema.json").read_text()))


@cache
def _validator() -> Any:
    """The schema's validator, built (and the schema checked) once per process: manifests are read often."""
    schema = _schema()
    validator_class = jsonschema.validators.validator_for(schema)
    validator_class.check_schema(schema)
    return validator_class(schema, format_checker=jsonschema.FormatChecker())


def validate(manifest: Any, uri: str | None = None) -> None:
    """Raise :class:`ManifestError` unless ``manifest`` matches ``schemas/manifest.schema.json``;
    the message starts with ``uri`` when the document was read from one."""
    error = jsonschema.exceptions.best_match(_validator().iter_errors(manifest))
    if error is None:
        return
    where = "/".join(str(p) for p in error.absolute_path) or "(root)"
    text = uris.redact(error.message)  # it quotes the offending value, which may be a URI with credentials
    message = text if len(text) <= _MAX_MESSAGE else text[:_MAX_MESSAGE] + "..."
    if uri is None:
        raise ManifestError(f"manifest invalid at {where}: {message}")
    raise ManifestError(f"{uri}: not a manifest (invalid at {where}: {message})")


def _check_version(document: Any, uri: str) -> None:
    """Refuse a manifest of another version than this code writes, saying how to replace it."""
    if isinstance(document, dict) and document.get("manifest_version", MANIFEST_VERSION) != MANIFEST_VERSION:
        found = repr(document["manifest_version"])[:40]
        raise ManifestError(
            f"{uri}: manifest version {found} is not supported (this code reads version {MANIFEST_VERSION}, "
            f"with store-relative lineage); rerun the stage with --force to replace it"
        )


def parse(uri: str, body: bytes, store: str) -> Manifest:
    """The manifest read from ``uri`` in ``store``: JSON that matches the schema (this version), its keys
    resolved against ``store``; else :class:`ManifestError` naming ``uri``."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, UnicodeDecodeError, absurd nesting
        raise ManifestError(f"{uri}: not a readable manifest ({exc})") from None
    _check_version(document, uri)
    validate(document, uri)
    return Manifest.from_dict(document, uri, store)


def _described(item: Input | Output) -> str:
    """``uri (rows, bytes)``, credentials removed."""
    facts = ([] if item.rows is None else [f"{item.rows:,} rows"]) + (
        [] if item.bytes is None else [format_bytes(item.bytes)]
    )
    return uris.redact(item.uri) + (f" ({', '.join(facts)})" if facts else "")


def _totals(items: Sequence[Input | Output]) -> str:
    """``3 objects, 1,200 rows, 4.5 MiB`` (rows and bytes as far as known)."""
    rows = [i.rows for i in items if i.rows is not None]
    sizes = [i.bytes for i in items if i.bytes is not None]
    return (
        f"{len(items)} object(s)"
        + (f", {sum(rows):,} rows" if rows else "")
        + (f", {format_bytes(sum(sizes))}" if sizes else "")
    )


@cache
def code_version() -> str:
    """The git commit of the checkout the code runs from, else the package version."""
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
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


# The orchestrator's run a stage runs in (an Airflow task instance's ids), recorded in its manifest.
_ORCHESTRATION: ContextVar[Mapping[str, str | int] | None] = ContextVar("hpd_orchestration", default=None)


@contextmanager
def orchestrated_by(run: Mapping[str, str | int]) -> Iterator[None]:
    """Within: every manifest published records ``run`` (e.g. Airflow's dag_id, run_id, task_id, try_number)
    as its ``orchestration``."""
    token = _ORCHESTRATION.set(dict(run))
    try:
        yield
    finally:
        _ORCHESTRATION.reset(token)


def _orchestration() -> dict[str, Any]:
    """The manifest's ``orchestration`` record, when a stage runs under :func:`orchestrated_by`."""
    run = _ORCHESTRATION.get()
    return {} if run is None else {"orchestration": dict(run)}


@dataclass
class _Published:
    """What is published at manifest ``uri``, read once: its etag (for the compare-and-swap of a publish), the
    manifest when it is a valid one, else the error that says why not."""

    uri: str
    store: str
    looked_up: bool = False
    manifest: Manifest | None = None
    etag: str | None = None
    error: ManifestError | None = None

    def look_up(self) -> None:
        self.looked_up, self.manifest, self.etag, self.error = True, None, None, None
        try:
            info = storage.head(self.uri)
            body = storage.read_bytes(self.uri)
        except storage.ObjectNotFound:
            return
        self.etag = info.etag
        try:
            self.manifest = parse(self.uri, body, self.store)
        except ManifestError as exc:
            self.error = exc

    def seen(self) -> Manifest | None:
        """The manifest as first looked up (a corrupt one: None)."""
        if not self.looked_up:
            self.look_up()
        return self.manifest

    def valid(self) -> Manifest | None:
        """Look again: the manifest published (None when there is none); :class:`ManifestError` naming the URI
        when what is published there is not a valid manifest."""
        self.look_up()
        if self.error is not None:
            raise ManifestError(str(self.error))
        return self.manifest

    def verdict(self, fingerprint: str, params: dict[str, Any], inputs: list[Input]) -> tuple[Manifest | None, str]:
        """The published manifest when the work of ``fingerprint`` is done (else None), and why."""
        previous = self.valid()
        if previous is None:
            return None, f"no manifest at {uris.redact(self.uri)}"
        if previous.fingerprint != fingerprint:
            return None, f"the published manifest has another fingerprint ({_changes(params, inputs, previous)})"
        for output in previous.outputs:
            if damage := output.damage():
                return None, f"output {uris.redact(output.uri)} {damage}"
        return previous, f"{uris.redact(self.uri)} matches, and its {len(previous.outputs)} output(s) are intact"


@dataclass(frozen=True)
class _StageLog:
    """The log lines of one stage run, under its stage and key."""

    stage: Stage
    key: str

    def note(self, level: int, message: str, *args: object) -> None:
        log.log(level, "%s %s: " + message, self.stage, self.key, *args)

    def items(self, kind: str, items: Sequence[Input | Output]) -> None:
        """Each of ``items``: the first few at INFO, the rest at DEBUG."""
        for position, item in enumerate(items):
            self.note(logging.INFO if position < _LISTED else logging.DEBUG, "%s %s", kind, _described(item))
        if len(items) > _LISTED:
            self.note(logging.INFO, "... and %d more %ss (listed at DEBUG)", len(items) - _LISTED, kind)

    def start(self, run_id: str, store: str, inputs: list[Input], params: dict[str, Any]) -> None:
        """The run's store, inputs and params, credentials removed."""
        self.note(logging.INFO, "started run %s in %s; inputs: %s", run_id, uris.redact(store), _totals(inputs))
        self.items("input", inputs)
        shown = redact(recorded_params(params))
        self.note(logging.INFO, "params %s", ", ".join(f"{k}={json.dumps(v, default=str)}" for k, v in shown.items()))

    def published(self, outputs: list[Output], uri: str, seconds: float) -> None:
        self.items("output", outputs)
        what = "published %s, then the manifest %s; %s in all"
        self.note(logging.INFO, what, _totals(outputs), uris.redact(uri), format_duration(seconds))


@dataclass
class StageRun:
    """Collects one stage run's inputs, outputs, stats and timings, and publishes its manifest."""

    stage: Stage
    key: str
    store: str
    params: dict[str, Any]
    inputs: list[Input]
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    outputs: list[Output] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)
    timings_s: dict[str, float] = field(default_factory=dict)
    started_at: str = field(default_factory=_now)
    _clock: float = field(default_factory=time.perf_counter)

    def __post_init__(self) -> None:
        self._log = _StageLog(self.stage, self.key)
        self._log.start(self.run_id, self.store, self.inputs, self.params)
        self._published = _Published(self.uri, self.store)

    @property
    def uri(self) -> str:
        return catalog.manifest_uri(self.store, self.stage, self.key)

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.stage, self.key, self.inputs, self.params, self.store)

    def previous(self) -> Manifest | None:
        """The manifest published for this stage and key, if any (:class:`ManifestError` when not valid)."""
        return self._published.valid()

    def replaced(self) -> Manifest | None:
        """The manifest this run replaces, as first read (None: none or corrupt; a concurrent publish since is not)."""
        return self._published.seen()

    def previous_outputs(self) -> set[str]:
        """URIs the manifest this run replaces lists (a corrupt one: none, so a forced run deletes nothing on it)."""
        return {o.uri for o in replaced.outputs} if (replaced := self.replaced()) else set()

    def skip_result(self, force: bool) -> StageResult | None:
        """The result of skipping this run (its work is done), or None when it must run; the decision and
        its reason are logged. A forced run reads no manifest here, so it recovers from a corrupt one."""
        forced = (None, "forced, the published manifest is not read")
        done, reason = forced if force else self._published.verdict(self.fingerprint, self.params, self.inputs)
        self._log.note(logging.INFO, "%s: %s", "running" if done is None else "skipped", reason)
        return None if done is None else StageResult.of(done, self.uri, skipped=True)

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time a part of the run (the timings of one name add up) and log how long it took."""
        start, outcome = time.perf_counter(), "failed after"
        try:
            yield
            outcome = "took"
        finally:
            took = time.perf_counter() - start
            self.timings_s[name] = round(self.timings_s.get(name, 0.0) + took, 4)
            self._log.note(logging.INFO, "phase %s %s %s", name, outcome, format_duration(took))

    def add_output(self, uri: str, body: bytes, rows: int | None = None) -> None:
        """Record a published object that is not a dataset shard."""
        self.outputs.append(Output(uri, sha256_hex(body), rows, len(body)))

    def write_output(self, uri: str, body: bytes, rows: int | None = None) -> None:
        """Publish ``body`` at ``uri`` and record it."""
        storage.write_bytes(uri, body)
        self.add_output(uri, body, rows)

    def add_shard(self, shard: Any) -> None:
        """Record a published :class:`tasks.core.parquet_shards.Shard`."""
        facts = (shard.sha256, shard.rows, shard.bytes, shard.contract, shard.schema_version)
        self.outputs.append(Output(shard.uri, *facts))

    def build(self) -> dict[str, Any]:
        """The manifest document, as published: lineage below the store by store-relative key (see the
        module's docstring); :class:`ManifestError` when it does not validate."""
        self.timings_s["total"] = round(time.perf_counter() - self._clock, 4)
        document: dict[str, Any] = redact(
            {
                "stage": str(self.stage),
                "run_id": self.run_id,
                "key": self.key,
                "fingerprint": self.fingerprint,
                "inputs": [i.to_dict(self.store) for i in self.inputs],
                "outputs": [o.to_dict(self.store, n) for n, o in enumerate(self.outputs)],
                "params": recorded_params(self.params),
                "stats": self.stats,
                "started_at": self.started_at,
                "ended_at": _now(),
                "timings_s": self.timings_s,
                **_provenance(),
            }
        )
        document |= _orchestration()
        validate(document)
        return document

    def publish(self) -> StageResult:
        """Validate and publish the manifest, after every output: by compare-and-swap over the one this run saw,
        so a concurrent run that published in between is detected instead of overwritten."""
        self._published.seen()  # a corrupt manifest is replaced: only its etag is needed
        document = self.build()
        body = json.dumps(document, indent=2, sort_keys=True).encode()
        if self.stage in catalog.VERSIONED:  # the version first: a pointer may name it once the latest is out
            storage.write_bytes(catalog.manifest_version_uri(self.store, self.stage, self.key, self.run_id), body)
        try:
            storage.compare_and_swap(self.uri, body, self._published.etag)
        except storage.PreconditionFailed:
            winner = parse(self.uri, storage.read_bytes(self.uri), self.store)
            if winner.fingerprint != self.fingerprint:
                raise ConcurrentPublish(
                    f"{self.uri}: a concurrent {self.stage} run published a manifest for "
                    f"different inputs or params; rerun to reconcile"
                ) from None
            self._log.note(logging.WARNING, "a concurrent run published the same work first; its manifest stands")
            return StageResult.of(winner, self.uri, skipped=False)
        self._log.published(self.outputs, self.uri, self.timings_s["total"])
        return StageResult.of(Manifest.from_dict(document, self.uri, self.store), self.uri, skipped=False)


def _provenance() -> dict[str, Any]:
    """What a manifest records of the code and host that wrote it."""
    versions = {"code_version": code_version(), "packages": package_versions()}
    return {"manifest_version": MANIFEST_VERSION, **versions, "host": socket.gethostname()}


def _changes(params: dict[str, Any], inputs: list[Input], previous: Manifest) -> str:
    """What differs from the ``previous`` run: the names of changed params, the inputs new and gone."""
    ours = json.loads(json.dumps(redact(recorded_params(params)), default=str))
    names = sorted(n for n in ours.keys() | previous.params.keys() if ours.get(n) != previous.params.get(n))
    now, before = ({(uris.redact(i.uri), i.sha256) for i in listed} for listed in (inputs, previous.inputs))
    changes = [f"params changed: {', '.join(names)}"] if names else []
    if now != before:
        changes.append(f"inputs: {len(now - before)} new or changed, {len(before - now)} replaced or gone")
    return "; ".join(changes) or "same params and inputs"


def read(store: str, stage: Stage, key: str) -> Manifest | None:
    """A published manifest, its keys resolved against ``store``, or None; :class:`ManifestError` naming
    the URI when it is not a valid one."""
    uri = catalog.manifest_uri(store, stage, key)
    try:
        body = storage.read_bytes(uri)
    except storage.ObjectNotFound:
        return None
    return parse(uri, body, store)


def read_at(store: str, uri: str) -> Manifest:
    """The manifest at ``uri`` (a latest or a kept version), its keys resolved against ``store``;
    :class:`ManifestError` naming the URI when it is missing or not a valid one."""
    try:
        body = storage.read_bytes(uri)
    except storage.ObjectNotFound:
        raise ManifestError(f"{uri}: no such manifest") from None
    return parse(uri, body, store)


def list_versions(store: str, stage: Stage) -> dict[str, str | None]:
    """The key of every manifest published for ``stage`` and its version (:class:`storage.ListedObject`), from
    one listing: what changed since a version was seen can be told without reading every manifest."""
    root = catalog.manifests_prefix(store, stage)
    return {
        o.uri[len(root) + 1 :].removesuffix(".json"): o.version
        for o in storage.list_objects(root)
        if o.uri.endswith(".json") and not storage.hidden(o.uri)
    }


def list_keys(store: str, stage: Stage, under: str = "") -> list[str]:
    """Keys of every manifest published for ``stage`` (optionally under a key prefix), sorted."""
    root = catalog.manifests_prefix(store, stage)
    return sorted(
        uri[len(root) + 1 :].removesuffix(".json")
        for uri in storage.list_uris(catalog.manifests_prefix(store, stage, under))
        if uri.endswith(".json")
    )
