"""The segments of an index version: what each holds, which a new version keeps, and which it merges.

An index version is a list of segments searched together. A segment is a FAISS index and its id map over the
corpus partitions it covers, encoded by one student, with the student embeddings it was built from. It records,
per partition, the fingerprint of the staged shards it encoded, the student (distill manifest version) and a
fingerprint of the index settings. A new version keeps every segment of the one before whose partitions are
still wanted and unchanged, with the same student and settings; the partitions no kept segment covers go into
one new segment. Each segment is stamped with the embedding space its vectors are in (:mod:`tasks.core.spaces`:
the PCA basis its student learned), and a version whose segments are not all in its query student's space is
refused where it is loaded. Segments then merge by tiers, as a log-structured store does: a segment's tier is the
integer log, base ``fanout``, of the partitions it covers; once ``fanout`` segments share a tier, the earliest of
them merge into one (built from their stored embeddings, nothing encoded again). A vector is merged about
log_fanout(partitions) times in all, and a version has at most ``fanout - 1`` segments a tier.

The version's table (``segments.json``) lists each segment by store-relative keys and checksums, so a copied
store reads it, and the version's manifest lists every file of every segment, so gc keeps them.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from tasks.core import manifest, storage

TABLE_FILE = "segments.json"
TABLE_FORMAT = 1


class SegmentTableError(ValueError):
    """A segment table that does not read; the message names it."""


def partition_fingerprint(shards: list[manifest.Output]) -> str:
    """A partition's staged content: sha256 over its shards' checksums (not their location: a copy matches)."""
    return hashlib.sha256("\n".join(sorted(s.sha256 for s in shards)).encode()).hexdigest()


def settings_fingerprint(settings: dict[str, Any]) -> str:
    """sha256 of the index settings a segment was built with."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


@dataclass(frozen=True)
class Segment:
    """One searchable part of an index version (see the module docstring)."""

    partitions: dict[str, str]  # ingest date (ISO) -> fingerprint of its staged shards
    model: str  # store-relative key of the distill manifest version whose student encoded it
    settings: str
    index: manifest.Output
    ids: manifest.Output
    embeddings: tuple[manifest.Output, ...]
    stats: dict[str, Any] = field(default_factory=dict)
    space: str | None = None  # the embedding space its vectors are in (tasks.core.spaces); None: before it was stamped

    @property
    def rows(self) -> int:
        return int(self.ids.rows or 0)

    @property
    def dim(self) -> int:
        return int(self.stats["dim"])

    @property
    def name(self) -> str:
        days = sorted(self.partitions)
        return days[0] if len(days) == 1 else f"{days[0]}_{days[-1]}"

    @property
    def outputs(self) -> list[manifest.Output]:
        return [self.index, self.ids, *self.embeddings]

    def tier(self, fanout: int) -> int:
        return int(math.log(len(self.partitions), fanout) + 1e-9)

    def keeps(self, wanted: dict[str, str], model: str, settings: str) -> bool:
        """Whether a version over the partitions ``wanted`` (date -> fingerprint), encoded by ``model`` with
        ``settings``, can keep this segment as it is."""
        same = all(wanted.get(day) == fingerprint for day, fingerprint in self.partitions.items())
        return same and self.model == model and self.settings == settings

    def to_dict(self, store: str) -> dict[str, Any]:
        return {
            "partitions": self.partitions,
            "model": self.model,
            "settings": self.settings,
            "index": self.index.to_dict(store, 0),
            "ids": self.ids.to_dict(store, 0),
            "embeddings": [e.to_dict(store, n) for n, e in enumerate(self.embeddings)],
            "stats": self.stats,
            "space": self.space,
        }

    @classmethod
    def from_dict(cls, record: dict[str, Any], store: str) -> Segment:
        return cls(
            dict(record["partitions"]),
            record["model"],
            record["settings"],
            manifest.Output.from_dict(record["index"], store),
            manifest.Output.from_dict(record["ids"], store),
            tuple(manifest.Output.from_dict(e, store) for e in record["embeddings"]),
            dict(record.get("stats", {})),
            record.get("space"),
        )


def ordered(segments: list[Segment]) -> list[Segment]:
    """Segments by their first partition: the order a version lists and searches them in."""
    return sorted(segments, key=lambda s: min(s.partitions))


def next_merge(segments: list[Segment], fanout: int) -> list[Segment] | None:
    """The ``fanout`` earliest segments of the lowest tier that has that many, else None."""
    tiers: dict[int, list[Segment]] = {}
    for segment in ordered(segments):
        tiers.setdefault(segment.tier(fanout), []).append(segment)
    full = [tier for tier, members in tiers.items() if len(members) >= fanout]
    return tiers[min(full)][:fanout] if full else None


def table_bytes(store: str, dim: int, segments: list[Segment]) -> bytes:
    """The version's ``segments.json``."""
    document = {"format": TABLE_FORMAT, "dim": dim, "segments": [s.to_dict(store) for s in ordered(segments)]}
    return json.dumps(document, indent=2, sort_keys=True).encode()


def read_table(store: str, uri: str, sha256: str | None = None) -> tuple[int, list[Segment]]:
    """(dimension, segments) of the table at ``uri``, checked against ``sha256`` when given;
    :class:`SegmentTableError` naming it when it does not read."""
    body = storage.read_bytes(uri, sha256=sha256)
    try:
        document = json.loads(body)
        if document.get("format") != TABLE_FORMAT:
            raise ValueError(f"format {document.get('format')!r}, this code reads {TABLE_FORMAT}")
        return int(document["dim"]), [Segment.from_dict(s, store) for s in document["segments"]]
    except (ValueError, KeyError, TypeError, AttributeError, storage.StorageError) as exc:
        raise SegmentTableError(f"{uri}: not a segment table ({type(exc).__name__}: {exc})") from None
