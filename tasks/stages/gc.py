"""Garbage collection: delete the store's objects that nothing references any longer.

A stage that replaces its outputs (a rerun with changed params) leaves the shards of the manifest it
replaced in place, so a reader still holding that manifest can finish; a concurrent run that lost the
compare-and-swap leaves its shards behind; a killed writer leaves its ``.tmp-*`` file. This stage
removes them. It lists every object under the store (hidden temp and lock files too, with their
last-modified time), then reads what is live:

* every manifest object (``manifests/...``), and every input and output that each manifest lists;
* both pointers (``models/current.json``, ``indexes/current.json``) and the objects they name;
* every kept manifest version (``manifest_versions/...``) a pointer or a live manifest names, and what it lists,
  followed through the versions those name (a promoted index's build names the distill run it encoded with);
* the staged-id index (``staged_ids/index.json``) and the segments it lists;
* the checkpoint folder of every distill run whose ``latest.json`` exists, whole;
* the lock file of an object that exists (a compare-and-swap may be holding it).

Every other object is unreferenced. The retention counts from the moment an object was first seen
unreferenced (mark, then sweep): each run records when it first saw each unreferenced object, and an
object is deleted only when a run at least ``retention_hours`` earlier had already seen it
unreferenced, so the readers of a replaced manifest keep a full retention period whatever the age of
the shards they read. Hidden temp and lock files are deleted once their last write is older than the
retention (their writers are gone by then). With ``dry_run`` nothing is deleted (the marks are still
recorded). The listing comes first and the manifests are read after it, so a manifest published
meanwhile still protects what it lists, and an object written after the listing is not a candidate.
A manifest or pointer that does not read stops the run before anything is deleted (nothing it
references can be known), and so does a manifest a pointer names that is missing (a lost kept version: what the
promoted run lists cannot be known); a manifest no pointer names that is missing was deleted since the listing
(by another gc run), and what it listed is left to the next run.

Each run records its manifest at ``manifests/gc/<UTC time>.json``: the deleted objects' count, bytes
and store-relative keys (with ``dry_run``: what would have been deleted), and the marks
(``unreferenced_since``: key -> first seen) the next run starts from. A gc run never skips.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict
from datetime import UTC, datetime, timedelta

from tasks.core import catalog, manifest, promoted, staged_ids, storage
from tasks.core.catalog import Pointer, Stage
from tasks.core.progress import format_bytes
from tasks.stages.params import GCParams

CHECKPOINT_POINTER = "latest.json"  # a distill run's checkpoint pointer (tasks.stages.distill.checkpoints)

log = logging.getLogger(__name__)


def now() -> datetime:
    """The clock gc reads (one place, so a test can move it)."""
    return datetime.now(UTC)


def run(params: GCParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Delete the objects of ``params.store`` unreferenced for longer than the retention; publish the record.
    ``force`` and ``progress`` are accepted as for every stage: a gc run never skips."""
    started = now()
    cutoff = started - timedelta(hours=params.retention_hours)
    stage_run = manifest.StageRun(
        stage=Stage.GC,
        key=catalog.gc_key(started),
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[],
    )
    with stage_run.phase("list"):
        listed = storage.list_objects(params.store)
    with stage_run.phase("live"):
        live = live_set(params.store, listed)
    unreferenced = [o for o in listed if o.uri not in live]
    seen_before, key = previous_marks(params.store), _key(params.store)
    marks = {key(o): seen_before.get(key(o), started) for o in unreferenced}
    doomed = [o for o in unreferenced if _expired(o, marks, key, cutoff)]
    log.info(
        "gc: %d objects listed, %d live, %d unreferenced: %d kept until past the retention, %d (%s) to delete%s",
        len(listed),
        len(listed) - len(unreferenced),
        len(unreferenced),
        len(unreferenced) - len(doomed),
        len(doomed),
        format_bytes(sum(o.size for o in doomed)),
        " (dry run: nothing is deleted)" if params.dry_run else "",
    )
    if not params.dry_run:
        with stage_run.phase("delete"):
            for listed_object in doomed:
                storage.delete(listed_object.uri)
                log.debug("gc: deleted %s", key(listed_object))
    stage_run.stats = {
        "dry_run": params.dry_run,
        "cutoff": cutoff.isoformat(timespec="milliseconds"),
        "listed": len(listed),
        "live": len(listed) - len(unreferenced),
        "kept_young": len(unreferenced) - len(doomed),
        "deleted": len(doomed),
        "deleted_bytes": sum(o.size for o in doomed),
        "deleted_keys": [key(o) for o in doomed],
        "unreferenced_since": _marks_left(marks, doomed, params),
    }
    return stage_run.publish()


def previous_marks(store: str) -> dict[str, datetime]:
    """When the latest gc run had first seen each object it left unreferenced."""
    keys = manifest.list_keys(store, Stage.GC)
    if not keys:
        return {}
    recorded = manifest.read(store, Stage.GC, keys[-1])
    marks = recorded.stats.get("unreferenced_since", {}) if recorded else {}
    return {key: datetime.fromisoformat(when) for key, when in marks.items()}


def _key(store: str) -> Callable[[storage.ListedObject], str]:
    return lambda listed: catalog.store_key(store, listed.uri) or listed.uri


def _expired(listed: storage.ListedObject, marks: dict[str, datetime], key: Callable, cutoff: datetime) -> bool:
    """Unreferenced since before the cutoff (hidden temp and lock files: last written before it)."""
    return listed.modified < cutoff if storage.hidden(listed.uri) else marks[key(listed)] <= cutoff


def _marks_left(marks: dict[str, datetime], doomed: list[storage.ListedObject], params: GCParams) -> dict[str, str]:
    gone = set() if params.dry_run else {_key(params.store)(o) for o in doomed}
    return {key: when.isoformat() for key, when in sorted(marks.items()) if key not in gone}


def live_set(store: str, listed: list[storage.ListedObject]) -> set[str]:
    """URIs that must stay: manifests and what they list, the pointers and what they name, the kept manifest
    versions a pointer or a live manifest names and what those list (and so on), live checkpoint folders, and
    the lock files of existing objects. Raises when a manifest or pointer does not read, or a manifest a pointer
    names is missing."""
    uris = {o.uri for o in listed}
    manifests_root = storage.join(store, "manifests") + "/"
    live = {uri for uri in uris if uri.startswith(manifests_root) and not storage.hidden(uri)}
    named, named_by = pointed_at(store)
    live |= named
    versions_root = catalog.manifest_versions_prefix(store) + "/"
    manifests = {uri for uri in live if uri.endswith(".json") and uri.startswith((manifests_root, versions_root))}
    live |= _listed_by(store, manifests | set(named_by), named_by)
    live |= staged_ids.live(store)
    live |= live_checkpoints(store, uris)
    live |= {uri for uri in uris if _lock_target(uri) in uris}
    return live


def _listed_by(store: str, manifests: set[str], named_by: dict[str, list[str]]) -> set[str]:
    """What ``manifests`` list, followed through every kept manifest version one of them names; those of
    ``named_by`` (manifest -> the pointers naming it) must exist."""
    versions_root = catalog.manifest_versions_prefix(store) + "/"
    pending, read, live = list(manifests), set(), set()
    while pending:
        uri = pending.pop()
        if uri in read or not (uri.startswith(versions_root) or uri in manifests):
            continue
        read.add(uri)
        found = referenced(store, uri, named_by.get(uri, []))
        live |= found
        pending += found - read
    return live


def referenced(store: str, uri: str, named_by: list[str] | None = None) -> set[str]:
    """The manifest at ``uri`` and every input and output it lists (nothing if it vanished since the listing
    and no pointer names it); :class:`manifest.ManifestError` naming it when it is not a valid manifest, or is
    missing while pointers (``named_by``) name it."""
    try:
        body = storage.read_bytes(uri)
    except storage.ObjectNotFound:
        if named_by:
            raise manifest.ManifestError(
                f"{uri}: missing, and {' and '.join(named_by)} names it: gc deletes nothing while what is promoted "
                "is unknown (restore the manifest or promote another run)"
            ) from None
        return set()
    published = manifest.parse(uri, body, store)
    return {uri} | {o.uri for o in published.outputs} | {i.uri for i in published.inputs}


def pointed_at(store: str) -> tuple[set[str], dict[str, list[str]]]:
    """Both pointers and every object they name; and the manifests they name (each with the pointers naming it:
    the validation or build, and the distill run). :class:`catalog.PointerError` when one does not read."""
    live, named_by = set(), dict[str, list[str]]()
    for pointer in Pointer:
        uri = catalog.pointer_uri(store, pointer)
        live.add(uri)
        value, _ = promoted.read(store, pointer)
        if value is not None:
            live |= {field for field in asdict(value).values() if isinstance(field, str) and "://" in field}
            run = value.validation if isinstance(value, catalog.ModelPointer) else value.manifest
            for named in (run, catalog.distill_manifest_uri(store, value)):
                named_by.setdefault(named, []).append(uri)
    return live, named_by


def live_checkpoints(store: str, uris: set[str]) -> set[str]:
    """Every object in the checkpoint folder of a distill run whose ``latest.json`` exists."""
    folders = set()
    for uri in uris:
        key = catalog.store_key(store, uri) or ""
        parts = key.split("/")
        if len(parts) == 4 and parts[0] == "students" and parts[2:] == ["checkpoints", CHECKPOINT_POINTER]:
            folders.add(catalog.checkpoints_prefix(store, parts[1]) + "/")
    return {uri for uri in uris if uri.startswith(tuple(folders))} if folders else set()


def _lock_target(uri: str) -> str | None:
    """The object whose lock file ``uri`` is, or None when ``uri`` is no lock file."""
    folder, _, name = uri.rpartition("/")
    return f"{folder}/{name.removeprefix(storage.LOCK_PREFIX)}" if name.startswith(storage.LOCK_PREFIX) else None
