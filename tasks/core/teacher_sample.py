"""The teacher's sample of a partition: the rows the teacher encodes, a bounded and deterministic choice.

The teacher costs several student encodes a sentence (``bench/results/student_throughput.json``) and only what
teaches needs it: the rows the PCA is fitted on and a retrain learns from, and those drift and the quality
checks read. The student encodes every staged sentence (the index); the teacher encodes at most ``size`` rows of a
partition, chosen from its content and a seed alone:

- the partition's staged sentences are ranked by a seeded hash of their id (a content hash), each followed by its
  augmented variants (in id order): the same content gives the same order, wherever and whenever it is staged;
- the sample is the first ``size`` rows of that order; augmentation varies only the first ``size`` staged
  sentences of the order (:func:`parents`), as no variant of a later one could be sampled;
- a larger ``size`` samples a superset of a smaller one, so raising it encodes only the rows it adds (the encode
  stage reuses the embeddings it published before: nothing is encoded twice).

``size`` 0 samples every row (the setting for small corpora).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import date

from tasks.core import manifest, sentences, storage
from tasks.core.catalog import Stage

EVERY_ROW = 0  # the size that samples every row


def _rank(sentence_id: str, seed: int) -> bytes:
    """The sort key of a staged sentence: a seeded hash of its id."""
    return hashlib.blake2b(f"{seed}:{sentence_id}".encode(), digest_size=8).digest()


def ordered(staged_ids: list[str], seed: int) -> list[str]:
    """Staged sentence ids in sample order (see the module docstring)."""
    return sorted(staged_ids, key=lambda sid: (_rank(sid, seed), sid))


def parents(staged_ids: list[str], size: int, seed: int) -> set[str]:
    """The staged sentences augmentation may vary: the first ``size`` of the order (every one with size 0)."""
    return set(staged_ids if size == EVERY_ROW else ordered(staged_ids, seed)[:size])


def chosen(staged_ids: list[str], variants: dict[str, str], size: int, seed: int) -> set[str]:
    """The sample: the first ``size`` rows of the order, staged sentences each followed by their variants
    (``variants``: variant id -> parent id; a variant whose parent is not staged here is never sampled)."""
    if size == EVERY_ROW:
        return set(staged_ids) | set(variants)
    children: dict[str, list[str]] = {}
    for variant, parent in sorted(variants.items()):
        children.setdefault(parent, []).append(variant)
    sample: list[str] = []
    for staged in ordered(staged_ids, seed):
        sample += [staged, *children.get(staged, ())]
        if len(sample) >= size:
            break
    return set(sample[:size])


@dataclass(frozen=True)
class Sample:
    """A partition's teacher sample: each shard's sampled ids in its row order (by shard URI), and the rows they
    were chosen from."""

    by_shard: dict[str, tuple[str, ...]]
    rows_available: int

    @property
    def rows(self) -> int:
        return sum(len(ids) for ids in self.by_shard.values())

    def of(self, shard_uri: str) -> tuple[str, ...]:
        """The sampled ids of one shard of the partition, in its row order."""
        return self.by_shard.get(shard_uri, ())

    def digest(self, shard_uri: str) -> str:
        """sha256 of a shard's sampled ids, in order: what the shard's encoding depends on besides its content."""
        return hashlib.sha256("\n".join(self.of(shard_uri)).encode()).hexdigest()


def of_partition(store: str, day: date, size: int, seed: int) -> Sample:
    """The teacher sample of partition ``day`` as staged and augmented now (each shard's ids read verified
    against the checksum its writer's manifest records)."""
    staged = {shard.uri: _ids(shard) for shard in sentences.published(store, day, (Stage.STAGE_CORPUS,))}
    variants: dict[str, str] = {}
    augmented: dict[str, list[str]] = {}
    for shard in sentences.published(store, day, (Stage.AUGMENT,)):
        table = storage.read_parquet(shard.uri, columns=["sentence_id", "parent_id"], sha256=shard.sha256)
        augmented[shard.uri] = table.column("sentence_id").to_pylist()
        variants.update(zip(augmented[shard.uri], table.column("parent_id").to_pylist(), strict=True))
    every = {**staged, **augmented}
    sample = chosen([sid for ids in staged.values() for sid in ids], variants, size, seed)
    by_shard = {uri: tuple(sid for sid in ids if sid in sample) for uri, ids in every.items()}
    return Sample(by_shard, sum(len(ids) for ids in every.values()))


def augmentable(store: str, day: date, size: int, seed: int) -> set[str] | None:
    """The staged sentences of partition ``day`` augmentation may vary (:func:`parents`); None: every one (the
    sample can hold them all)."""
    if size == EVERY_ROW:
        return None
    staged = [sid for shard in sentences.published(store, day, (Stage.STAGE_CORPUS,)) for sid in _ids(shard)]
    return parents(staged, size, seed) if size < len(staged) else None


def _ids(shard: manifest.Output) -> list[str]:
    table = storage.read_parquet(shard.uri, columns=["sentence_id"], sha256=shard.sha256)
    ids: list[str] = table.column("sentence_id").to_pylist()
    return ids


def describe(size: int) -> str:
    """The sample setting in words, for logs."""
    return "every row" if size == EVERY_ROW else f"at most {size} rows"
