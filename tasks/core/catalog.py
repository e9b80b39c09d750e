"""The catalog: where every dataset, artifact, manifest and pointer lives in the store, and what names it.

One owner of the store's layout (Dagster's IO-manager idea): stages ask the catalog for a key or a
path and never spell another stage's. Paths are built from a store root URI; everything below it is
fixed here:

=====================================================  ===========================================
``sentences/ingest_date=D/``                            staged corpus shards (stage_corpus)
``sentences_aug/ingest_date=D/``                        augmented sentences (augment)
``teacher/<teacher>/ingest_date=D/``                    teacher embeddings (encode_teacher)
``pca/<teacher>/<pca run>/<fp12>/``                     the PCA artifact and its summary (fit_pca)
``targets/<teacher>/<pca run>/``                        projected targets (fit_pca)
``students/<run>/<run id>/``, ``students/<run>/checkpoints/``  exported student, checkpoints (distill)
``validation/<run>/<run id>/``                          metrics and report (validate)
``indexes/<name>/<run id>/``                            FAISS index and id map (build_index)
``quality/ingest_date=D/<run id>/results.json``         expectation results (quality)
``quality/ingest_date=D/<run id>/data_docs/``           their great-expectations Data Docs, offline (quality)
``profiles/<teacher>/<pca run>/ingest_date=D/<fp12>/``  a partition's drift profile (profile)
``drift/ingest_date=D/<fp12>/drift.json``               a partition's drift from a model's data (drift)
``manifests/<stage>/<key>.json``                        every stage run's manifest (its key's latest run)
``manifest_versions/<stage>/<key>/<run id>.json``       every run's manifest, kept (distill, validate, build_index)
``models/current.json``, ``indexes/current.json``       the promoted model and index pointers
=====================================================  ===========================================

What the store records about itself (manifests, pointers, the distill checkpoint pointer) names objects
below its root by their store-relative key (:func:`store_key`), resolved against the store that reads it
(:func:`resolve`): a store copied to another root, or another bucket or prefix, is complete there.

What a pointer names never changes (:data:`VERSIONED`): the runs of the stages whose work a pointer names
(distill, validate, build_index) publish into a folder of their own run id, never into another run's, and each
keeps its manifest as a version (``manifest_versions/``) beside the key's latest; pointers name the version.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from datetime import UTC, date, datetime
from enum import StrEnum
from typing import Any, Literal, overload

from tasks.core import teacher_spec
from tasks.core.uris import StorageError, join, to_uri


class Stage(StrEnum):
    """The pipeline's stages, as named in manifests and store paths."""

    STAGE_CORPUS = "stage_corpus"
    AUGMENT = "augment"
    ENCODE_TEACHER = "encode_teacher"
    FIT_PCA = "fit_pca"
    DISTILL = "distill"
    VALIDATE = "validate"
    BUILD_INDEX = "build_index"
    QUALITY = "quality"
    PROFILE = "profile"
    DRIFT = "drift"
    GC = "gc"


class Dataset(StrEnum):
    """The datasets the stages write, named as their data contracts (``schemas/datasets/<name>.json``)."""

    SENTENCES = "sentences"
    TEACHER_EMBEDDINGS = "teacher_embeddings"
    PROJECTED_TARGETS = "projected_targets"
    STUDENT_EMBEDDINGS = "student_embeddings"
    INDEX_IDS = "index_ids"


# The stages whose runs a pointer names: each run publishes into a folder of its own run id and keeps its
# manifest as an immutable version (:func:`manifest_version_uri`), so a later run under the same name (with any
# flags) never changes what a pointer names.
VERSIONED = (Stage.DISTILL, Stage.VALIDATE, Stage.BUILD_INDEX)

# The stages that write the ``sentences`` dataset, and the folder each writes to.
SENTENCE_WRITERS = (Stage.STAGE_CORPUS, Stage.AUGMENT)
_SENTENCE_FOLDERS = {Stage.STAGE_CORPUS: "sentences", Stage.AUGMENT: "sentences_aug"}

# Run names (PCA runs, distill runs, model runs, index names) become one path segment of the store.
# The one name rule: letters, digits and ``_ . = -`` (so no ``/``: exactly one segment), and the first
# character is not ``.``; so ``.`` and ``..`` (and hidden names) are refused, while a dot inside a name
# (``run.v2``, even ``a..b``) is just a character of that one segment. Not empty: a field whose empty
# value means "derive the name" uses AUTO_RUN_NAME_PATTERN. No look-arounds, so Python's ``re``,
# pydantic's Rust regex and the JSON Schema of the DAG params (Airflow's form) read it alike.
RUN_NAME_PATTERN = r"^[A-Za-z0-9_=-][A-Za-z0-9_.=-]*$"
AUTO_RUN_NAME_PATTERN = r"^(?:[A-Za-z0-9_=-][A-Za-z0-9_.=-]*)?$"  # the rule above, or "" (a derived name)
_UNSAFE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")
_LEADING_DOTS = re.compile(r"^\.+")
SAFE_TOKEN = "_"  # what an empty name becomes, and what replaces leading dots
_FINGERPRINT_CHARS = 12


class PointerMoved(RuntimeError):
    """A pointer changed since it was read; the compare-and-swap lost."""


class PointerError(ValueError):
    """A pointer object that is not what its name says; the message names it."""


# -- names --------------------------------------------------------------------------------------------------
def _segment(text: str) -> str:
    """``text`` made one safe path segment: leading dots become :data:`SAFE_TOKEN` (so ``.``, ``..`` and
    ``.hidden`` give ``_``, ``_`` and ``_hidden``), and an empty result is :data:`SAFE_TOKEN`."""
    return _LEADING_DOTS.sub(SAFE_TOKEN, text) or SAFE_TOKEN


def slug(spec: str) -> str:
    """A path-safe name for a model spec (its last path component), used in store paths: runs of other
    characters than letters, digits and ``_ . -`` become ``_``, and the result never is empty, ``.``,
    ``..`` nor starts with ``.`` (see :func:`_segment`; ``".."``, ``"x/.."`` and ``"/"`` give ``_``).
    It always matches :data:`RUN_NAME_PATTERN`. A composite teacher (``a+b``, :mod:`tasks.ml.teachers`)
    is its members' slugs joined by ``--``, a weighted member's (``0.5*model``) as ``0.5x-<model's slug>``."""
    members = teacher_spec.split(spec)
    if len(members) > 1:
        return "--".join(map(_member_slug, members))
    return _segment(_UNSAFE_CHARS.sub("_", spec.rstrip("/").rsplit("/", 1)[-1]))


def _member_slug(member: teacher_spec.Member) -> str:
    if member.weight is None:
        return slug(member.model)
    return _segment(f"{_UNSAFE_CHARS.sub('_', member.weight)}x-{slug(member.model)}")


def default_pca_name(k: int, mode: str) -> str:
    return f"k{k}-{mode}"


def default_student_run(student: str, layers: int | None, pca_name: str) -> str:
    return f"{slug(student)}{f'-L{layers}' if layers else ''}-{pca_name}"


def airflow_run_name(run_id: str) -> str:
    """A store-safe name for an Airflow run id (the default name of a distill run); it matches
    :data:`RUN_NAME_PATTERN`, as :func:`slug` does."""
    return _segment("".join(c if (c.isascii() and c.isalnum()) or c in "-_." else "-" for c in run_id))


# -- manifest keys ------------------------------------------------------------------------------------------
def partition_key(ingest_date: date) -> str:
    return f"ingest_date={ingest_date.isoformat()}"


def partition_date(key: str) -> date:
    return date.fromisoformat(key.removeprefix("ingest_date="))


def teacher_key_prefix(teacher: str) -> str:
    """What every encode_teacher key of ``teacher`` starts with."""
    return slug(teacher)


def teacher_partition(teacher: str, ingest_date: date) -> str:
    """A partition's teacher embeddings, under ``teacher/`` and ``manifests/encode_teacher/``."""
    return f"{teacher_key_prefix(teacher)}/{partition_key(ingest_date)}"


def derived_stem(source_uri: str) -> str:
    """``<dataset>-<shard name>``: a shard computed from another is named after it."""
    dataset, _, name = source_uri.rsplit("/", 3)[-3:]
    return f"{dataset}-{name.removesuffix('.parquet')}"


def teacher_shard_key(teacher: str, ingest_date: date, sentences_uri: str) -> str:
    """The encode_teacher manifest key of the embeddings of one sentences shard."""
    return f"{teacher_partition(teacher, ingest_date)}/{derived_stem(sentences_uri)}"


def pca_key(teacher: str, pca_name: str) -> str:
    return f"{slug(teacher)}/{pca_name}"


def profile_key(teacher: str, pca_name: str, ingest_date: date) -> str:
    """The profile manifest key of a partition under a teacher's PCA run."""
    return f"{pca_key(teacher, pca_name)}/{partition_key(ingest_date)}"


def gc_key(when: datetime) -> str:
    """The gc manifest key of a run started at ``when``: its UTC time, to the microsecond
    (``20261130T120000.123456Z``), so keys sort by time and each run records its own manifest."""
    return when.astimezone(UTC).strftime("%Y%m%dT%H%M%S.%fZ")


# -- paths --------------------------------------------------------------------------------------------------
def manifest_uri(store: str, stage: Stage, key: str) -> str:
    return join(store, "manifests", stage, f"{key}.json")


def manifest_version_uri(store: str, stage: Stage, key: str, run_id: str) -> str:
    """The immutable copy of one run's manifest (a stage of :data:`VERSIONED`)."""
    return join(store, "manifest_versions", stage, key, f"{run_id}.json")


def manifest_versions_prefix(store: str) -> str:
    return join(store, "manifest_versions")


def manifests_prefix(store: str, stage: Stage, under: str = "") -> str:
    root = join(store, "manifests", stage)
    return join(root, under) if under else root


def sentences_prefix(store: str, writer: Stage, ingest_date: date) -> str:
    return join(store, _SENTENCE_FOLDERS[writer], partition_key(ingest_date))


def teacher_prefix(store: str, teacher: str, ingest_date: date) -> str:
    return join(store, "teacher", teacher_partition(teacher, ingest_date))


def pca_prefix(store: str, teacher: str, pca_name: str, fingerprint: str) -> str:
    return join(store, "pca", pca_key(teacher, pca_name), fingerprint[:_FINGERPRINT_CHARS])


def targets_prefix(store: str, teacher: str, pca_name: str) -> str:
    return join(store, "targets", pca_key(teacher, pca_name))


def student_prefix(store: str, run: str, run_id: str) -> str:
    return join(store, "students", run, run_id)


def checkpoints_prefix(store: str, run: str) -> str:
    return join(store, "students", run, "checkpoints")


def validation_prefix(store: str, model_run: str, run_id: str) -> str:
    return join(store, "validation", model_run, run_id)


def index_prefix(store: str, name: str, run_id: str) -> str:
    return join(store, "indexes", name, run_id)


QUALITY_RESULTS = "results.json"  # a quality run's results, the file its manifest lists under this name


def quality_results_uri(store: str, ingest_date: date, run_id: str) -> str:
    return join(store, "quality", partition_key(ingest_date), run_id, QUALITY_RESULTS)


def quality_data_docs_prefix(store: str, ingest_date: date, run_id: str) -> str:
    """The folder of a quality run's Data Docs (``index.html`` and what its pages link and load): its run's own,
    as the pages show the run's times (two runs at once never write one page)."""
    return join(store, "quality", partition_key(ingest_date), run_id, "data_docs")


def profile_uri(store: str, teacher: str, pca_name: str, ingest_date: date, fingerprint: str) -> str:
    key = profile_key(teacher, pca_name, ingest_date)
    return join(store, "profiles", key, fingerprint[:_FINGERPRINT_CHARS], "profile.json")


def drift_uri(store: str, ingest_date: date, fingerprint: str) -> str:
    return join(store, "drift", partition_key(ingest_date), fingerprint[:_FINGERPRINT_CHARS], "drift.json")


# -- which dataset a shard is ------------------------------------------------------------------------------
_DATASET_FOLDERS = {
    **{folder: Dataset.SENTENCES for folder in _SENTENCE_FOLDERS.values()},
    "teacher": Dataset.TEACHER_EMBEDDINGS,
    "targets": Dataset.PROJECTED_TARGETS,
}


def dataset_at(store: str, uri: str) -> Dataset | None:
    """The dataset whose shard ``uri`` is, by where this catalog puts each (None for any other object)."""
    key = store_key(store, uri)
    if key is None or not key.endswith(".parquet"):
        return None
    segments = key.split("/")
    if segments[0] == "indexes":
        if Dataset.STUDENT_EMBEDDINGS in segments:
            return Dataset.STUDENT_EMBEDDINGS
        return Dataset.INDEX_IDS if segments[-1].startswith("ids-") else None
    return _DATASET_FOLDERS.get(segments[0])


# -- store-relative references -----------------------------------------------------------------------------
def _is_key(text: str) -> bool:
    """Whether ``text`` is a store-relative key: no scheme, no leading ``/``, no empty, ``.`` or ``..`` segment."""
    return "://" not in text and all(segment not in ("", ".", "..") for segment in text.split("/"))


def store_key(store: str, uri: str) -> str | None:
    """The key of ``uri`` relative to the root ``store`` (``sentences/ingest_date=D/part-....parquet``) when
    it names an object below it, else None (something outside the store, e.g. a raw source file)."""
    root = to_uri(store).rstrip("/") + "/"
    if not uri.startswith(root):
        return None
    key = uri[len(root) :]
    return key if _is_key(key) else None


def resolve(store: str, reference: str) -> str:
    """The URI a reference read from ``store`` names: a store-relative key is joined onto ``store`` (an
    empty, ``.`` or ``..`` segment is refused with a :class:`StorageError`); an absolute URI (something
    outside the store) stays as it is."""
    if "://" in reference:
        return reference
    if not _is_key(reference):
        raise StorageError(reference, "not a store-relative key (empty, '.' or '..' segment, or a leading '/')")
    return join(store, reference)


# -- pointers -----------------------------------------------------------------------------------------------
class Pointer(StrEnum):
    """The two pointers a promotion moves: to the promoted student and to the promoted index."""

    MODEL = "models/current.json"
    INDEX = "indexes/current.json"


@dataclass(frozen=True)
class ModelPointer:
    """``models/current.json``: the promoted distill run, its STS scores, the version of its validate manifest,
    and the version of the distill manifest it validated (``model``: None in a pointer written before versions,
    which means the run's latest)."""

    model_run: str
    scores: dict[str, float]
    validation: str
    model: str | None = None


@dataclass(frozen=True)
class IndexPointer:
    """``indexes/current.json``: the promoted index's segment table (``ids`` None: each segment has its id map;
    a pointer written before segments names one index and its id map), the version of its build manifest, what
    it holds, and the version of the distill manifest whose student encoded it (``model``: None in a pointer
    written before versions, which means the run's latest)."""

    index: str
    ids: str | None
    manifest: str
    model_run: str
    dim: int
    run_id: str
    model: str | None = None


_RECORDS: dict[Pointer, type[ModelPointer] | type[IndexPointer]] = {
    Pointer.MODEL: ModelPointer,
    Pointer.INDEX: IndexPointer,
}
# The fields that name objects: recorded as store-relative keys, resolved against the store reading them.
_OBJECT_FIELDS: dict[Pointer, tuple[str, ...]] = {
    Pointer.MODEL: ("validation", "model"),
    Pointer.INDEX: ("index", "ids", "manifest", "model"),
}


def pointer_uri(store: str, pointer: Pointer) -> str:
    return join(store, pointer)


@overload
def read_pointer(store: str, pointer: Literal[Pointer.MODEL]) -> tuple[ModelPointer | None, str | None]: ...
@overload
def read_pointer(store: str, pointer: Literal[Pointer.INDEX]) -> tuple[IndexPointer | None, str | None]: ...
@overload
def read_pointer(store: str, pointer: Pointer) -> tuple[ModelPointer | IndexPointer | None, str | None]: ...
def read_pointer(store: str, pointer: Pointer) -> tuple[ModelPointer | IndexPointer | None, str | None]:
    """The pointer and its etag, or (None, None) while nothing is promoted. The objects it names by
    store-relative key are resolved against ``store``; a pointer naming anything outside ``store`` (an absolute
    URI of a hand-made or copied pointer) is a :class:`PointerError`. Read it through :mod:`tasks.core.promoted`."""
    from tasks.core import storage  # the storage clients load on first I/O: DAG files import the catalog

    uri = pointer_uri(store, pointer)
    try:
        value, etag = storage.read_json_versioned(uri)
    except (ValueError, RecursionError) as exc:  # truncated or not JSON, not UTF-8, absurd nesting
        raise PointerError(f"{uri}: not a {pointer} pointer (not readable JSON: {exc})") from None
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise PointerError(f"{uri}: not a {pointer} pointer (not a JSON object)")
    try:
        resolved: dict[str, Any] = {
            name: resolve(store, field) if name in _OBJECT_FIELDS[pointer] and isinstance(field, str) else field
            for name, field in value.items()
        }
        record = _RECORDS[pointer](**resolved)
    except (TypeError, StorageError) as exc:
        raise PointerError(f"{uri}: not a {pointer} pointer ({exc})") from None
    _contained(store, uri, [resolved[name] for name in _OBJECT_FIELDS[pointer] if resolved.get(name)])
    return record, etag


def _contained(store: str, uri: str, named: list[str]) -> None:
    """Refuse a pointer (at ``uri``) that names an object outside ``store``: a pointer is never followed out."""
    from tasks.core.uris import redact

    for target in named:
        if store_key(store, target) is None:
            raise PointerError(f"{uri} names {redact(target)}, outside the store {redact(store)}; refused")


def move_pointer(store: str, value: ModelPointer | IndexPointer, seen_etag: str | None) -> None:
    """Point the pointer of ``value``'s kind at it, by compare-and-swap against the version read as
    ``seen_etag``; raises :class:`PointerMoved` if it changed since. The objects it names below ``store``
    are recorded by store-relative key, so a copy of the store points into the copy."""
    from tasks.core import storage

    pointer = Pointer.MODEL if isinstance(value, ModelPointer) else Pointer.INDEX
    uri = pointer_uri(store, pointer)
    record = asdict(value)
    for name in _OBJECT_FIELDS[pointer]:
        if record[name] is not None:
            record[name] = store_key(store, record[name]) or record[name]
    try:
        storage.compare_and_swap(uri, json.dumps(record, indent=2).encode(), seen_etag)
    except storage.PreconditionFailed:
        raise PointerMoved(f"{uri}: moved by another run since this one read it") from None


def distill_manifest_uri(store: str, pointer: ModelPointer | IndexPointer) -> str:
    """The distill manifest (version) whose student ``pointer`` serves; a pointer written before versions names
    none, and means its run's latest."""
    return pointer.model or manifest_uri(store, Stage.DISTILL, pointer.model_run)


def promoted_manifests(store: str) -> dict[str, list[str]]:
    """Manifest URI (a version, or a latest a pointer from before versions names) -> the pointers that name that
    run now (directly, or through the distill run they name)."""
    model, _ = read_pointer(store, Pointer.MODEL)
    index, _ = read_pointer(store, Pointer.INDEX)
    named: dict[str, list[str]] = {}
    if model is not None:
        named.setdefault(model.validation, []).append(Pointer.MODEL)
        named.setdefault(distill_manifest_uri(store, model), []).append(Pointer.MODEL)
    if index is not None:
        named.setdefault(index.manifest, []).append(Pointer.INDEX)
        named.setdefault(distill_manifest_uri(store, index), []).append(Pointer.INDEX)
    return named
