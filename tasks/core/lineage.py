"""The lineage of any artifact: back to its partitions and raw sources (verified), or forward from them
(`hpd lineage`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import date
from typing import Any

import pydantic
from pydantic import TypeAdapter

from tasks.core import catalog, manifest, promoted, storage
from tasks.core.catalog import Pointer, Stage
from tasks.core.partitions import partitions_in

# -- provenance: the graph the manifests imply --------------------------------------------------------------
# ``hpd lineage`` walks it back from an artifact to the staged partitions and raw sources, verifying each
# object on the way; ``hpd lineage --impacted`` walks it forward from a partition or source.

VERIFIED, UNAVAILABLE = "verified", "unavailable"
_DATE = re.compile(r"(?:ingest_date=)?(\d{4}-\d{2}-\d{2})")
_SHORT = 8


class LineageError(ValueError):
    """A lineage that cannot be followed: a missing object or manifest, an unknown target; names the URI."""


@dataclass(frozen=True)
class StoreGraph:
    """Every stage-run manifest of a store (gc runs aside), with who produced and who read each URI. A run of a
    stage that keeps versions (:data:`catalog.VERSIONED`) is known by its version's URI, its key's latest
    manifest an alias of it, and the kept versions of earlier runs are runs of the graph too."""

    store: str
    manifests: dict[str, manifest.Manifest]
    producers: dict[str, str]  # output URI -> manifest URI
    consumers: dict[str, list[str]]  # input URI -> manifest URIs
    aliases: dict[str, str]  # a latest manifest's URI -> its version's

    @classmethod
    def read(cls, store: str) -> StoreGraph:
        """One walk over the store's manifests and kept versions (each validated as it is read)."""
        store, found = storage.to_uri(store), list[tuple[str, manifest.Manifest | None]]()
        for stage in (stage for stage in Stage if stage is not Stage.GC):
            found += [
                (catalog.manifest_uri(store, stage, key), manifest.read(store, stage, key))
                for key in manifest.list_keys(store, stage)
            ]
        aliases = {uri: m.version_uri(store) for uri, m in found if m and Stage(m.stage) in catalog.VERSIONED}
        graph = cls(store, {}, {}, {}, aliases)
        kept = [uri for uri in storage.list_uris(catalog.manifest_versions_prefix(store)) if uri.endswith(".json")]
        found += [(uri, manifest.read_at(store, uri)) for uri in kept if uri not in graph.aliases.values()]
        for uri, record in found:
            graph.add(graph.canonical(uri), record)
        return graph

    def canonical(self, uri: str) -> str:
        """The URI the graph knows a manifest by (a latest's version)."""
        return self.aliases.get(uri, uri)

    def add(self, uri: str, record: manifest.Manifest | None) -> None:
        if record is None:  # deleted between the listing and the read
            return
        self.manifests[uri] = record
        for output in record.outputs:  # a kept index segment is listed by later versions too: its run made it
            if f"/{record.run_id}/" in output.uri:
                self.producers[output.uri] = uri
            else:
                self.producers.setdefault(output.uri, uri)
        for item in record.inputs:
            self.consumers.setdefault(self.canonical(item.uri), []).append(uri)

    def manifest_at(self, uri: str) -> manifest.Manifest:
        if self.canonical(uri) not in self.manifests:
            raise LineageError(f"{uri}: no such manifest in the store {self.store}")
        return self.manifests[self.canonical(uri)]

    def key(self, uri: str) -> str:
        """``uri`` as the store names it (its store-relative key), or the URI of what lies outside it."""
        return catalog.store_key(self.store, uri) or uri

    def seeds(self, what: str) -> tuple[list[str], list[str]]:
        """The runs that staged the partition ``what`` (``ingest_date=D`` or ``D``) and no URI; or no run and
        the URI of the source or object ``what`` names (URI, local path or store-relative key)."""
        if match := _DATE.fullmatch(what):
            try:
                key = catalog.partition_key(date.fromisoformat(match.group(1)))
            except ValueError:
                raise LineageError(f"{what!r}: not a partition (ingest_date=YYYY-MM-DD)") from None
            runs = [catalog.manifest_uri(self.store, stage, key) for stage in catalog.SENTENCE_WRITERS]
            runs = [run for run in runs if run in self.manifests]
            if not runs:
                raise LineageError(f"no partition {key} is staged in the store {self.store}")
            return runs, []
        uri = _target_uri(self.store, what)
        if uri not in self.consumers and uri not in self.producers:
            raise LineageError(f"{uri}: no manifest in the store {self.store} lists it")
        return [], [uri]

    def downstream(self, runs: list[str], uris: list[str]) -> set[str]:
        """``runs`` and every run that read, directly or not, one of ``uris`` or an output of those runs."""
        found: set[str] = set()
        pending, fresh = list(uris), list(runs)
        while fresh or pending:
            for run in fresh:
                if run not in found:
                    found.add(run)
                    pending += [run, *(o.uri for o in self.manifests[run].outputs)]
            fresh = self.consumers.get(pending.pop(), []) if pending else []
        return found


@dataclass(frozen=True)
class Node:
    """One step of a lineage: a pointer, a stage run's manifest, an object in the store or a raw source
    outside it. ``sha256`` is the checksum its reader recorded (for a manifest read as an input: its
    fingerprint) and ``status`` whether it matched (``verified``) or, for a source gone, ``unavailable``.
    A manifest already shown higher in the tree is ``seen``, with no children. ``note`` says what a run read of
    its input where that is not all of it: the rows of a sentences shard the teacher encoded (its sample)."""

    kind: str
    uri: str
    sha256: str | None = None
    status: str | None = None
    stage: str | None = None
    key: str | None = None
    seen: bool = False
    children: tuple[Node, ...] = ()
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "children": [child.to_dict() for child in self.children]}

    def walk(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            yield from child.walk()


@dataclass(frozen=True)
class Lineage:
    """Where ``target`` came from: the tree of verified objects and runs back to the raw sources."""

    store: str
    target: str
    root: Node

    @property
    def partitions(self) -> list[str]:
        keys = (catalog.store_key(self.store, n.uri) or "" for n in self.root.walk() if n.kind == "object")
        return [day.isoformat() for day in sorted(partitions_in(keys))]

    @property
    def sources(self) -> dict[str, str]:
        """Each raw source outside the store, and whether it is ``verified`` or ``unavailable``."""
        return {n.uri: n.status or "" for n in self.root.walk() if n.kind == "source"}

    def to_dict(self) -> dict[str, Any]:
        return {
            "store": self.store,
            "target": self.target,
            "partitions": self.partitions,
            "sources": self.sources,
            "root": self.root.to_dict(),
        }

    def line(self, node: Node) -> str:
        """``stage key`` for a run, the key (or outside URI) for an object; the short checksum and its status."""
        checksum = ("fingerprint " if node.kind == "manifest" else "") + (node.sha256 or "")[:_SHORT]
        check = f"  {checksum} {node.status}" if node.status else ""
        if node.kind == "manifest":
            note = f"  ({node.note})" if node.note else ""
            return f"{node.stage} {node.key}{check}{note}" + ("  (see above)" if node.seen else "")
        name = catalog.store_key(self.store, node.uri) or node.uri
        gap = "  (no manifest lists it as an output)" if node.kind == "object" and not node.children else ""
        return f"{name}{check}{gap}"

    def render(self) -> str:
        """The lineage as an indented tree (``stage key`` for runs, each object with its short sha256)."""
        lines: list[str] = []

        def add(node: Node, depth: int) -> None:
            lines.append("  " * depth + self.line(node))
            for child in node.children:
                add(child, depth + 1)

        add(self.root, 0)
        lines.append(f"partitions: {', '.join(self.partitions) or '(none)'}")
        for uri, status in self.sources.items():
            lines.append(f"source: {uri} ({status}{', it is gone' if status == UNAVAILABLE else ''})")
        return "\n".join(lines)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Lineage:
        """The lineage :meth:`to_dict` gave (its partitions and sources follow from the tree)."""
        return TypeAdapter(cls).validate_python(record)


class _Walk:
    """One walk back through ``graph``: each object hashed once, each manifest expanded once."""

    def __init__(self, graph: StoreGraph) -> None:
        self.graph = graph
        self.checked: dict[tuple[str, str], str] = {}
        self.expanded: set[str] = set()

    def run(self, uri: str, fingerprint: str | None = None, reader: str | None = None) -> Node:
        """The manifest at ``uri`` and (the first time) its inputs; ``fingerprint`` is what a reader recorded."""
        record = self.graph.manifest_at(uri)
        if fingerprint is not None and record.fingerprint != fingerprint:
            raise LineageError(
                f"{uri}: fingerprint {record.fingerprint[:12]} differs from the {fingerprint[:12]} recorded by "
                f"{reader}: the {record.stage} run was replaced since"
            )
        uri = self.graph.canonical(uri)
        seen, status = uri in self.expanded, None if fingerprint is None else VERIFIED
        self.expanded.add(uri)
        children = () if seen else tuple(self.input(i.uri, i.sha256, uri) for i in record.inputs)
        return Node("manifest", uri, fingerprint, status, record.stage, record.key, seen, children, _sampled(record))

    def input(self, uri: str, sha256: str, reader: str) -> Node:
        """An object ``reader`` lists with ``sha256``, checked, and the run that produced it."""
        if self.graph.canonical(uri) in self.graph.manifests:  # a run read whole (validate, build_index: distill's)
            return self.run(uri, sha256, reader)
        outside = catalog.store_key(self.graph.store, uri) is None
        status = self.check(uri, sha256, reader, outside)
        producer = self.graph.producers.get(uri)
        children = (self.run(producer),) if producer and status == VERIFIED else ()
        return Node("source" if outside else "object", uri, sha256, status, children=children)

    def check(self, uri: str, sha256: str, reader: str, outside: bool) -> str:
        """``verified`` once the object streams to ``sha256``; a source outside the store that is gone is
        ``unavailable``; a mismatch (or an object of the store that is gone) raises, naming it."""
        if (uri, sha256) not in self.checked:
            try:
                actual = storage.sha256_of(uri)
            except storage.ObjectNotFound:
                if not outside:
                    raise LineageError(f"{uri}: missing from the store; {reader} lists it") from None
                actual = None
            if actual is not None and actual != sha256:
                raise LineageError(f"{storage.IntegrityError(uri, sha256, actual)} (recorded by {reader})")
            self.checked[uri, sha256] = UNAVAILABLE if actual is None else VERIFIED
        return self.checked[uri, sha256]

    def recorded(self, uri: str) -> tuple[str, manifest.Output]:
        """The manifest that lists ``uri`` as an output, and its record of it."""
        producer = self.graph.producers.get(uri)
        if producer is None:
            raise LineageError(f"{uri}: no manifest in the store {self.graph.store} lists it as an output")
        return producer, next(o for o in self.graph.manifests[producer].outputs if o.uri == uri)

    def output(self, uri: str) -> Node:
        """A published object, checked against the manifest that lists it, and that run."""
        producer, recorded = self.recorded(uri)
        self.check(uri, recorded.sha256, producer, outside=False)
        return Node("object", uri, recorded.sha256, VERIFIED, children=(self.run(producer),))

    def segments(self, table: str) -> tuple[Node, ...]:
        """The segment table at ``table`` and every file it lists (index, id map, embeddings), each checked
        against the checksum the table records, which must be the one the manifest listing it records."""
        node = self.output(table)
        listed = _segment_files(self.graph.store, table, node.sha256 or "")
        for file in listed:
            producer, recorded = self.recorded(file.uri)
            if recorded.sha256 != file.sha256:
                raise LineageError(
                    f"{file.uri}: sha256 {file.sha256[:12]} in the segment table {table}, {recorded.sha256[:12]} "
                    f"in {producer}"
                )
            self.check(file.uri, file.sha256, table, outside=False)
        return (node, *(self.output(file.uri) for file in listed))

    def pointer(self, pointer: Pointer) -> Node:
        """A pointer's objects (each checked against the manifest that lists it) and the runs behind them."""
        store, uri = self.graph.store, catalog.pointer_uri(self.graph.store, pointer)
        if pointer is Pointer.INDEX:
            current = promoted.index(store)
            index = None if current is None else current.pointer
            named: tuple[Node, ...] = ()
            if index is not None:  # a segment table (no ``ids``), or one index and its id map from before
                named = (
                    self.segments(index.index)
                    if index.ids is None
                    else tuple(map(self.output, (index.index, index.ids)))
                )
        else:
            model = promoted.pointer(store)
            runs = () if model is None else (model.validation, catalog.distill_manifest_uri(store, model))
            named = tuple(self.run(run) for run in runs)
        if not named:
            raise LineageError(f"{uri}: nothing is promoted (no pointer)")
        return Node("pointer", uri, children=named)


class _TableSegment(pydantic.BaseModel):
    """The files one segment of a segment table lists (``segments.json``, written by :mod:`tasks.ml.segments`,
    which the core does not import): each an output record with its store-relative key."""

    index: dict[str, Any]
    ids: dict[str, Any]
    embeddings: list[dict[str, Any]]


class _Table(pydantic.BaseModel):
    segments: list[_TableSegment]


def _segment_files(store: str, uri: str, sha256: str) -> list[manifest.Output]:
    """Every file the segment table at ``uri`` (read and checked against ``sha256``) lists, with the checksum
    it records; :class:`LineageError` naming it when it is not a segment table."""
    try:
        table = _Table.model_validate_json(storage.read_bytes(uri, sha256=sha256))
        records = [record for s in table.segments for record in (s.index, s.ids, *s.embeddings)]
        return [manifest.Output.from_dict(record, store) for record in records]
    except (pydantic.ValidationError, KeyError, TypeError, storage.StorageError) as exc:
        raise LineageError(f"{uri}: not a segment table ({type(exc).__name__}: {' '.join(str(exc).split())})") from None


class _TeacherSample(pydantic.BaseModel):
    """What an encode_teacher run's stats say of the rows it encoded: its sample of the shard."""

    rows: int
    shard_rows: int | None = None


def _sampled(record: manifest.Manifest) -> str | None:
    """``the teacher saw N of M rows`` for an encode_teacher run of one shard (its sample); None otherwise."""
    if Stage(record.stage) is not Stage.ENCODE_TEACHER:
        return None
    try:
        sample = _TeacherSample.model_validate(record.stats)
    except pydantic.ValidationError:
        return None
    of = f" of {sample.shard_rows}" if sample.shard_rows is not None else ""
    return f"the teacher saw {sample.rows}{of} rows"


def _target_uri(store: str, target: str) -> str:
    """A target given as a URI, a local path or a store-relative key, as a URI."""
    if "://" in target or target.startswith("/"):
        return storage.to_uri(target)
    return catalog.resolve(store, target)


def trace(store: str, target: str) -> Lineage:
    """The lineage of ``target``: a pointer (``indexes/current.json``, ``models/current.json``), a model
    run's name, a manifest, or any published object (by URI, local path or store-relative key); each object
    on the way back is checked against the sha256 its reader recorded (streamed; :class:`LineageError`
    naming the object on a mismatch)."""
    walk = _Walk(StoreGraph.read(store))
    graph = walk.graph
    uri = _target_uri(graph.store, target)
    if any(uri == catalog.pointer_uri(graph.store, p) for p in Pointer):
        root = walk.pointer(Pointer(graph.key(uri)))
    elif (
        re.fullmatch(catalog.RUN_NAME_PATTERN, target)
        and (run := graph.canonical(catalog.manifest_uri(graph.store, Stage.DISTILL, target))) in graph.manifests
    ):
        root = walk.run(run)
    elif graph.canonical(uri) in graph.manifests:
        root = walk.run(uri)
    else:
        root = walk.output(uri)
    return Lineage(graph.store, target, root)


# -- impact: what was made from a partition or a source ----------------------------------------------------
@dataclass(frozen=True)
class Impacted:
    """A stage run downstream of the partition or source asked about, its outputs, and the pointers that
    name it now (``models/current.json``, ``indexes/current.json``; empty when it is not promoted)."""

    stage: str
    key: str
    manifest: str
    outputs: tuple[str, ...]
    promoted: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "outputs": list(self.outputs), "promoted": list(self.promoted)}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> Impacted:
        return TypeAdapter(cls).validate_python(record)


def impacted(store: str, what: str) -> list[Impacted]:
    """Every stage run downstream of the partition or source ``what`` (the runs that staged a partition
    included), in pipeline order, each with its outputs and whether it is promoted: what to recall."""
    graph = StoreGraph.read(store)
    runs, uris = graph.seeds(what)
    found = [(uri, graph.manifests[uri]) for uri in graph.downstream(runs, uris)]
    found.sort(key=lambda item: (list(Stage).index(Stage(item[1].stage)), item[1].key))
    promoted = catalog.promoted_manifests(graph.store)
    return [
        Impacted(m.stage, m.key, uri, tuple(graph.key(o.uri) for o in m.outputs), tuple(promoted.get(uri, ())))
        for uri, m in found
    ]


def render_impacted(store: str, runs: list[Impacted]) -> str:
    """One line per run (``stage key``, promoted or not), its outputs indented under it, and a count."""
    lines: list[str] = []
    for run in runs:
        promoted = f"  PROMOTED ({', '.join(run.promoted)})" if run.promoted else ""
        lines += [f"{run.stage} {run.key}{promoted}", *(f"  {output}" for output in run.outputs)]
    promoted_runs = sum(1 for run in runs if run.promoted)
    lines.append(
        f"{len(runs)} run(s) impacted, {sum(len(r.outputs) for r in runs)} artifact(s), {promoted_runs} promoted"
    )
    return "\n".join(lines)


# -- rendering ----------------------------------------------------------------------------------------------
