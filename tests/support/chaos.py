"""Kill a stage run with SIGKILL before one of its writes, rerun it, and tell what its store then holds.

Every write a run makes goes through a storage backend's ``write_bytes``, ``put_if_absent``,
``compare_and_swap`` or ``delete``: :func:`recorded_writes` lists them in order (a clean run, in this process),
and :func:`killed_before` runs the stage in a child process that SIGKILLs itself as it is about to make the n-th
one (nothing of it runs: no ``finally``, no cleanup; a local temp file or lock file stays as a dead writer
leaves it). :func:`kill_points` picks where: the first write, one in the middle, and every commit (a
compare-and-swap, a create-if-absent, a manifest, a manifest version, a pointer, the staged-id index) and
the write after it: between each publish and the next step.

:func:`state` is what a store holds once gc (retention 0) has swept what nothing references: each object
by its store-relative key with run ids replaced by ``<run>``, JSON as parsed (run ids replaced too), other
bytes as their sha256; gc's own records left out. :func:`stable` keeps what two clean runs agree on (a
build's timings, a model trained on another thread schedule, differ between any two runs), and
:func:`unverified` lists what a manifest or pointer names that does not verify.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import signal
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Stage
from tasks.core.storage.local import LocalBackend
from tasks.core.storage.s3 import S3Backend
from tasks.stages import registry

WRITES = ("write_bytes", "put_if_absent", "compare_and_swap", "delete")
_COMMITS = ("put_if_absent", "compare_and_swap")
_RECORDS = ("manifests/", "manifest_versions/", "staged_ids/", "models/current.json", "indexes/current.json")
# run ids (32 hex digits, not part of a sha256), and run times (great-expectations')
_RUN_ID = re.compile(r"(?<![0-9a-f])[0-9a-f]{32}(?![0-9a-f])|\d{8}T\d{6}\.\d{6}Z")
# How a run went, not what it made: a manifest's times, measured speeds, the step a resumed run resumed from.
_HOW_IT_WENT = re.compile(r"^\.(timings_s|started_at|ended_at)$|(seconds|per_s[a-z0-9_]*|resumed_from_step)$")
_LEFT_OUT = ("manifests/gc/",)  # gc's own records: the sweep that makes states comparable writes them
_PAGE = "a page"  # a rendered page (a report, Data Docs) shows its run's times: compared by name, not content
_CONFLICT = 17  # the exit code of a child whose run lost to another one's (see :func:`at_once`)
_SERVER = multiprocessing.get_context("forkserver")
_SERVER.set_forkserver_preload(
    ["tests.support.forked_warmup", *(f"tasks.stages.{stage}" for stage in registry.STAGES), __name__]
)


@dataclass(frozen=True)
class Write:
    """One write a run made: the backend method and the store-relative key."""

    method: str
    key: str

    @property
    def commits(self) -> bool:
        return self.method in _COMMITS or self.key.startswith(_RECORDS)

    @property
    def publishes_a_segment(self) -> bool:
        """A file of an index segment (its FAISS index or id map): an index version publishes each in turn."""
        return "/segments/" in self.key


@contextmanager
def _wrapped(before_each: Callable[[str, str], None]) -> Iterator[None]:
    """Every backend write calls ``before_each(method, uri)`` first."""
    originals = [(backend, name, getattr(backend, name)) for backend in (LocalBackend, S3Backend) for name in WRITES]
    for backend, name, original in originals:

        def write(
            self: Any, uri: str, *args: Any, __name: str = name, __original: Any = original, **kwargs: Any
        ) -> Any:
            before_each(__name, uri)
            return __original(self, uri, *args, **kwargs)

        setattr(backend, name, write)
    try:
        yield
    finally:
        for backend, name, original in originals:
            setattr(backend, name, original)


def recorded_writes(stage: Stage, values: dict[str, Any]) -> list[Write]:
    """Run ``stage`` here and list its writes in order."""
    writes: list[Write] = []
    store = values["store"]
    with _wrapped(lambda method, uri: writes.append(Write(method, catalog.store_key(store, uri) or uri))):
        run(stage, values)
    return writes


def kill_points(writes: list[Write]) -> list[int]:
    """1-based positions of the writes to die before: the first, the middle one, each commit and each segment file
    of an index version, and the write after each."""
    points = {1, len(writes) // 2 + 1}
    for position, write in enumerate(writes, start=1):
        if write.commits or write.publishes_a_segment:
            points |= {position, position + 1}
    return sorted(p for p in points if p <= len(writes))


def killed_before(position: int, stage: Stage, values: dict[str, Any]) -> None:
    """Run ``stage`` with ``values`` in a child process that SIGKILLs itself as it is about to make its
    ``position``-th write; AssertionError when the child ended any other way (it finished or failed).

    The child is forked from a server process that imported the stages and ran nothing (multiprocessing's
    ``forkserver``): a fork of this process would inherit thread pools (polars', OpenMP's) without their
    threads, and hang on them. Its temporary folders are made in one removed here: the kill leaves them behind."""
    with tempfile.TemporaryDirectory(prefix="hpd-chaos-") as scratch:
        child = _SERVER.Process(target=_in_child, args=(_environment(), stage, values, position, scratch))
        child.start()
        child.join(timeout=300)
    assert child.exitcode == -signal.SIGKILL, f"write {position}: exit code {child.exitcode}"


def at_once(runs: int, stage: Stage, values: dict[str, Any]) -> None:
    """Run ``stage`` with ``values`` in ``runs`` child processes at once; AssertionError unless all succeed or
    the losers fail naming the conflict (a promotion that lost its compare-and-swap)."""
    children = [_SERVER.Process(target=_in_child, args=(_environment(), stage, values, 0)) for _ in range(runs)]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=300)
    codes = [child.exitcode for child in children]
    assert 0 in codes and set(codes) <= {0, _CONFLICT}, f"{stage} run {runs} at once: exit codes {codes}"


def _environment() -> dict[str, str]:
    """The S3 settings a child needs (the server's environment is the one it started with)."""
    return {name: value for name, value in os.environ.items() if name.startswith(("AWS_", "HPD_"))}


def _in_child(
    environment: dict[str, str], stage: Stage, values: dict[str, Any], die_before: int, scratch: str | None = None
) -> None:
    """A child's work: with ``die_before`` (a position), SIGKILL itself before that write; else exit 0, or
    :data:`_CONFLICT` when another run's promotion came first. Its temporary folders go in ``scratch`` (None: the
    system's)."""
    from tasks.core.catalog import PointerMoved
    from tasks.stages.build_index import PromotionConflict
    from tasks.stages.validate import ValidateError

    for name in [n for n in os.environ if n.startswith(("AWS_", "HPD_")) and n not in environment]:
        del os.environ[name]
    os.environ.update(environment)
    tempfile.tempdir = scratch
    storage.reset_s3_clients()
    count = iter(range(1, die_before + 1))

    def maybe_die(method: str, uri: str) -> None:
        if next(count, None) == die_before:
            os.kill(os.getpid(), signal.SIGKILL)

    try:
        with _wrapped(maybe_die):
            run(stage, values)
    except (PointerMoved, PromotionConflict, ValidateError, manifest.ManifestError) as exc:
        if "another" not in str(exc) and "concurrent" not in str(exc):
            raise
        os._exit(_CONFLICT)


def run(stage: Stage, values: dict[str, Any]) -> object:
    """Run ``stage`` with the params ``values``."""
    return registry.module(stage).run(config.parse(registry.STAGES[stage], values))


def _normalised(value: Any) -> Any:
    if isinstance(value, str):
        return _RUN_ID.sub("<run>", value)
    if isinstance(value, dict):
        return {_normalised(k): _normalised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normalised(v) for v in value]
    return value


def _flat(value: Any, path: str = "") -> dict[str, Any]:
    """A JSON value as path -> leaf (``.stats.rows``, ``.outputs.0.key``), but for how the run went."""
    if _HOW_IT_WENT.search(path):
        return {}
    if isinstance(value, dict):
        return {p: v for k, child in value.items() for p, v in _flat(child, f"{path}.{k}").items()} or {path: {}}
    if isinstance(value, list):
        return {p: v for i, child in enumerate(value) for p, v in _flat(child, f"{path}.{i}").items()} or {path: []}
    return {path: value}


def state(store: str) -> dict[str, Any]:
    """What ``store`` holds once gc has swept what nothing references (see the module's docstring)."""
    from tasks.stages import gc

    gc.run(config.parse(gc.GCParams, {"store": store, "retention_hours": 0}))
    held: dict[str, Any] = {}
    for listed in storage.list_objects(store):
        key = catalog.store_key(store, listed.uri) or listed.uri
        if storage.hidden(listed.uri) or key.startswith(_LEFT_OUT):
            continue
        body = storage.read_bytes(listed.uri)
        value = _flat(_normalised(json.loads(body))) if key.endswith(".json") else hashlib.sha256(body).hexdigest()
        value = _PAGE if key.endswith(".html") else value
        name = _normalised(key)
        assert name not in held, f"{key}: two objects of one name but for their run ids"
        held[name] = value
    return held


def stable(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """What two clean runs' states agree on: the objects (and fields of JSON objects) equal in both; an object's
    recorded size only where its recorded sha256 agrees (two reports of one length are not the same report), and
    of a listed page or JSON document neither (they are compared as objects)."""
    agreed: dict[str, Any] = {}
    for name in first.keys() & second.keys():
        one, two = first[name], second[name]
        if isinstance(one, dict) and isinstance(two, dict):
            same = {path: value for path, value in one.items() if two.get(path, object()) == value}
            # a listed page or JSON document is compared as an object (by name, or field by field), not by digest
            pages = {p.removesuffix(".key") for p, v in same.items() if str(v).endswith((".html", ".json"))}
            agreed[name] = {
                p: v
                for p, v in same.items()
                if p.rsplit(".", 1)[0] not in pages and (not p.endswith(".bytes") or p[:-6] + ".sha256" in same)
            }
        elif one == two:
            agreed[name] = one
    return agreed


def differences(expected: dict[str, Any], reference: dict[str, Any], found: dict[str, Any]) -> list[str]:
    """How ``found`` departs from a clean run's state ``reference``: objects added or missing, and what
    differs among the objects and fields two clean runs agree on (``expected``, from :func:`stable`)."""
    missing = sorted(reference.keys() - found.keys())
    added = sorted(found.keys() - reference.keys())
    altered = []
    for name, value in expected.items():
        if name in found and isinstance(value, dict):
            altered += [
                f"{name} {p}: {v!r}, now {found[name].get(p)!r}"
                for p, v in value.items()
                if found[name].get(p, object()) != v
            ]
        elif name in found and found[name] != value:
            altered.append(name)
    return [f"missing {n}" for n in missing] + [f"added {n}" for n in added] + [f"altered {n}" for n in altered]


def unverified(store: str) -> list[str]:
    """Every object a manifest (latest or kept version) lists as an output that is missing or whose bytes
    do not match the sha256 it records, and every object a pointer names that is missing."""
    problems = []
    for listed in storage.list_objects(store):
        key = catalog.store_key(store, listed.uri) or ""
        if storage.hidden(listed.uri) or not key.startswith(("manifests/", "manifest_versions/")):
            continue
        published = manifest.read_at(store, listed.uri)
        for output in published.outputs:
            try:
                storage.read_bytes(output.uri, sha256=output.sha256)
            except (storage.ObjectNotFound, storage.IntegrityError) as exc:
                problems.append(f"{key} lists {output.uri}: {type(exc).__name__}")
    for pointer in catalog.Pointer:
        value, _ = catalog.read_pointer(store, pointer)
        named = [] if value is None else [v for v in vars(value).values() if isinstance(v, str) and "://" in v]
        problems += [f"{pointer} names {uri}: missing" for uri in named if not storage.exists(uri)]
    return problems
