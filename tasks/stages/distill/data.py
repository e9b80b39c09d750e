"""Training data for distillation: sentences joined with their projected targets, streamed.

Pairs of shards come from lineage, not from names: the PCA run's manifest lists its teacher input
shards and the target shard written for each (same order), and each teacher shard's
encode_teacher manifest names the sentences shard it encoded. A pair is read (verified against
the recorded checksums) and joined by sentence id one at a time, so memory holds one shard, never
the whole set.

Rows go to validation by a seeded hash of the sentence id. An epoch visits the shards in a seeded
order and each shard's training rows in a seeded order (optionally grouped so that a batch holds
sentences of similar length, which pads less); a position (epoch, shard, row) says where the next
batch starts, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

import numpy as np

from tasks.core import catalog, manifest, parquet_shards, sentences, storage
from tasks.core.catalog import Dataset, Stage


class DistillDataError(ValueError):
    """Training data that is missing or inconsistent; the message names it."""


@dataclass(frozen=True)
class ShardPair:
    """A sentences shard and its targets shard, with the sha256 of each as the manifests record them
    (``""``: none recorded, for a pair built by hand; such a shard is read unverified), and optionally the
    teacher embedding shard the targets were projected from, whose similarities the neighbourhood term then
    follows (``relation``: see :func:`shard_pairs`)."""

    sentences_uri: str
    targets_uri: str
    sha256: tuple[str, str]
    rows: int
    relation: manifest.Input | None = None

    def read(self) -> tuple[list[str], list[str], np.ndarray]:
        """(sentence ids, texts, targets) of the pair, joined by sentence id in the targets' order (the targets cover
        the teacher's sample of the sentences shard). Both shards are read verified against their recorded sha256
        (:class:`storage.IntegrityError` on a mismatch)."""
        sentences_sha, targets_sha = (digest or None for digest in self.sha256)
        staged = storage.read_parquet(self.sentences_uri, columns=["sentence_id", "text"], sha256=sentences_sha)
        targets = storage.read_parquet(self.targets_uri, columns=["sentence_id", "target"], sha256=targets_sha)
        text_of = dict(zip(staged.column("sentence_id").to_pylist(), staged.column("text").to_pylist(), strict=True))
        ids = targets.column("sentence_id").to_pylist()
        missing = [sid for sid in ids if sid not in text_of]
        if missing or len(set(ids)) != len(ids):
            raise DistillDataError(
                f"{self.targets_uri}: {len(missing)} target id(s) missing from {self.sentences_uri}, "
                f"{len(ids) - len(set(ids))} repeated"
            )
        return ids, [text_of[sid] for sid in ids], parquet_shards.vectors(targets, "target", self.targets_uri)

    def relation_vectors(self, ids: list[str]) -> np.ndarray:
        """The relation shard's embedding of each of ``ids``, in their order (read verified; empty columns
        without a relation shard); a :class:`DistillDataError` naming the shard when it lacks one of them."""
        if self.relation is None:
            return np.zeros((len(ids), 0), dtype=np.float32)
        uri = self.relation.uri
        table = storage.read_parquet(uri, columns=["sentence_id", "embedding"], sha256=self.relation.sha256 or None)
        row_of = {sid: row for row, sid in enumerate(table.column("sentence_id").to_pylist())}
        missing = [sid for sid in ids if sid not in row_of]
        if missing:
            raise DistillDataError(f"{uri}: {len(missing)} of its targets' sentence ids are not in it")
        return parquet_shards.vectors(table, "embedding", uri)[[row_of[sid] for sid in ids]]

    def relation_width(self, ids: list[str], others: int) -> int:
        """The width of the relation embeddings (0 without), checked to cover ``ids`` and to match the other
        pairs' (``others``; 0: none seen yet)."""
        width = self.relation_vectors(ids).shape[1]
        if others and width != others:
            raise DistillDataError(
                f"{self.relation.uri if self.relation else self.targets_uri}: relation embeddings have {width} "
                f"dimensions, the other shards {others}"
            )
        return width


@dataclass(frozen=True)
class Position:
    epoch: int = 0
    shard: int = 0
    row: int = 0


@dataclass(frozen=True)
class Batch:
    texts: list[str]
    targets: np.ndarray
    next_position: Position


def shard_pairs(
    store: str, teacher: str, pca_name: str, partitions: list[date] | None = None, teacher_embeddings: bool = False
) -> list[ShardPair]:
    """(sentences shard, targets shard) pairs of a PCA run, optionally restricted to partitions; with
    ``teacher_embeddings``, each with the teacher embedding shard its targets were projected from (``relation``)."""
    pca_key = catalog.pca_key(teacher, pca_name)
    pca = manifest.read(store, Stage.FIT_PCA, pca_key)
    if pca is None:
        raise DistillDataError(f"{store}: no PCA run {pca_name!r} for teacher {teacher!r}; run fit-pca first")
    targets = pca.outputs_of(Dataset.PROJECTED_TARGETS)
    if not targets:
        raise DistillDataError(f"{store}: PCA run {pca_name!r} wrote no targets; rerun fit-pca with --write-targets")
    embeddings = [i for i in pca.inputs if catalog.dataset_at(store, i.uri) == Dataset.TEACHER_EMBEDDINGS]
    if len(targets) != len(embeddings):
        raise DistillDataError(
            f"{catalog.manifest_uri(store, Stage.FIT_PCA, pca_key)}: "
            f"{len(targets)} target shards for {len(embeddings)} teacher shards"
        )
    encoded = _encoded_sources(store, teacher)
    pairs = []
    for teacher_input, target in zip(embeddings, targets, strict=True):
        source = encoded.get(teacher_input.uri)
        if source is None:
            raise DistillDataError(f"{teacher_input.uri}: no encode_teacher manifest names its sentences shard")
        if partitions is not None and not any(f"/{catalog.partition_key(d)}/" in source.uri for d in partitions):
            continue
        if not target.rows:  # none of the shard's rows in the teacher's sample
            continue
        relation = teacher_input if teacher_embeddings else None
        pairs.append(ShardPair(source.uri, target.uri, (source.sha256, target.sha256), target.rows or 0, relation))
    if not pairs:
        raise DistillDataError(f"{store}: PCA run {pca_name!r} has no target shards for partitions {partitions}")
    return pairs


def pca_basis(store: str, teacher: str, pca_name: str) -> manifest.Output:
    """The PCA artifact of a published PCA run, as its manifest records it: the basis of its targets."""
    from tasks.ml.projection import ARTIFACT

    pca = manifest.read(store, Stage.FIT_PCA, catalog.pca_key(teacher, pca_name))
    if pca is None:
        raise DistillDataError(f"{store}: no PCA run {pca_name!r} for teacher {teacher!r}; run fit-pca first")
    return pca.output_named(ARTIFACT)


def _encoded_sources(store: str, teacher: str) -> dict[str, manifest.Input]:
    """Each teacher-embedding shard of ``teacher`` -> the sentences shard it encoded."""
    sources = {}
    for key in manifest.list_keys(store, Stage.ENCODE_TEACHER, catalog.teacher_key_prefix(teacher)):
        published = manifest.read(store, Stage.ENCODE_TEACHER, key)
        for output in published.outputs if published else ():
            sources[output.uri] = published.inputs[0]
    return sources


def is_validation(sentence_ids: list[str], fraction: float, seed: int) -> np.ndarray:
    return sentences.hashed_below(sentence_ids, fraction, f"val:{seed}")


class TrainingData:
    """The split, validation set and seeded batch stream over a list of shard pairs."""

    def __init__(self, pairs: list[ShardPair], seed: int, val_fraction: float, val_max_rows: int) -> None:
        self.pairs, self.seed, self.val_fraction = pairs, seed, val_fraction
        self.train_rows, val_texts, val_targets = 0, [], []
        self.train_counts: list[int] = []  # training rows per pair
        self.train_lengths: list[np.ndarray] = []  # per pair, its training rows' text lengths (length grouping)
        self.dim, self.relation_dim = 0, 0
        for pair in pairs:
            ids, texts, targets = pair.read()
            if self.dim and targets.shape[1] != self.dim:
                raise DistillDataError(
                    f"{pair.targets_uri}: targets have {targets.shape[1]} dimensions, the other shards {self.dim}"
                )
            self.dim = targets.shape[1]
            self.relation_dim = pair.relation_width(ids, self.relation_dim)
            held_out = is_validation(ids, val_fraction, seed)
            self.train_counts.append(int((~held_out).sum()))
            self.train_lengths.append(np.array([len(t) for t, h in zip(texts, held_out, strict=True) if not h]))
            self.train_rows += self.train_counts[-1]
            room = val_max_rows - len(val_texts)
            val_texts.extend([t for t, h in zip(texts, held_out, strict=True) if h][:room])
            val_targets.extend(targets[held_out][:room])
        if not val_texts:
            raise DistillDataError("the validation split is empty: raise val_fraction or add data")
        if not self.train_rows:
            raise DistillDataError("the training split is empty")
        self.val_texts, self.val_targets = val_texts, np.stack(val_targets)

    def _rng(self, *parts: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *parts])

    def batches(self, start: Position, batch_size: int, grouped: bool = False) -> Iterator[Batch]:
        """Batches of ``batch_size`` training rows from ``start`` to the end of its epoch (last may be short);
        ``grouped``: each batch of sentences of similar length (see :func:`length_grouped`)."""
        texts: list[str] = []
        targets: list[np.ndarray] = []
        for shard, pair, local in self._shard_orders(start.epoch, batch_size, grouped):
            if shard < start.shard:
                continue
            ids, shard_texts, shard_targets = self.pairs[pair].read()
            rows = np.flatnonzero(~is_validation(ids, self.val_fraction, self.seed))[local]
            first = start.row if shard == start.shard else 0
            for offset in range(first, len(rows)):
                texts.append(shard_texts[rows[offset]])
                targets.append(shard_targets[rows[offset]])
                if len(texts) == batch_size:
                    yield Batch(texts, np.stack(targets), self._after(start.epoch, shard, offset + 1, len(rows)))
                    texts, targets = [], []
        if texts:
            yield Batch(texts, np.stack(targets), Position(start.epoch + 1, 0, 0))

    def epoch_order(self, epoch: int, batch_size: int, grouped: bool = False) -> np.ndarray:
        """Epoch ``epoch``'s training rows as :meth:`training_dataset` indices, in the order :meth:`batches`
        gives them (batches of ``batch_size``, ``grouped`` or not)."""
        offsets = np.cumsum([0, *self.train_counts])
        orders = [offsets[pair] + local for _, pair, local in self._shard_orders(epoch, batch_size, grouped)]
        return np.concatenate(orders) if orders else np.zeros(0, dtype=np.int64)

    def _shard_orders(self, epoch: int, batch_size: int, grouped: bool) -> Iterator[tuple[int, int, np.ndarray]]:
        """(position in the epoch, pair index, order of the pair's training rows) of each shard of ``epoch``:
        a seeded order of shards, of each shard's rows (and with ``grouped``, batches of like lengths, the
        batch the previous shards left open completed first, as in an unbroken epoch)."""
        order = self._rng(epoch).permutation(len(self.pairs))
        for shard, pair in enumerate(int(p) for p in order):
            rng = self._rng(epoch, pair)
            local = rng.permutation(self.train_counts[pair])
            if grouped:
                carried = sum(self.train_counts[i] for i in order[:shard]) % batch_size
                local = length_grouped(local, list(self.train_lengths[pair][local]), batch_size, carried, rng)
            yield shard, pair, local

    def training_dataset(self, scratch: Path) -> Any:
        """The training rows (``sentence``, ``label``: the target, followed by the row's relation embedding when
        the pairs have one, :data:`relation_dim` columns) as a ``parquet_shards.Dataset``, pair after pair
        in file order (the indices :meth:`epoch_order` gives), in Arrow files under ``scratch`` (memory-mapped:
        memory holds one shard at a time). Each pair is read again, verified."""
        import datasets as hf_datasets

        features = hf_datasets.Features(
            {
                "sentence": hf_datasets.Value("string"),
                "label": hf_datasets.List(hf_datasets.Value("float32"), self.label_dim),
            }
        )
        bars = hf_datasets.is_progress_bar_enabled()
        hf_datasets.disable_progress_bars()
        try:
            return hf_datasets.Dataset.from_generator(
                self._training_rows, features=features, cache_dir=str(scratch), fingerprint=f"hpd-{uuid.uuid4().hex}"
            )
        finally:
            if bars:
                hf_datasets.enable_progress_bars()

    @property
    def label_dim(self) -> int:
        return self.dim + self.relation_dim

    def _training_rows(self) -> Iterator[dict[str, Any]]:
        for pair in self.pairs:
            ids, texts, targets = pair.read()
            labels = np.hstack([targets, pair.relation_vectors(ids)])
            for row in np.flatnonzero(~is_validation(ids, self.val_fraction, self.seed)):
                yield {"sentence": texts[row], "label": labels[row]}

    def _after(self, epoch: int, shard: int, row: int, shard_rows: int) -> Position:
        if row < shard_rows:
            return Position(epoch, shard, row)
        return Position(epoch, shard + 1, 0) if shard + 1 < len(self.pairs) else Position(epoch + 1, 0, 0)


GROUP_WINDOW = 32  # batches whose rows are sorted by length together


def length_grouped(
    rows: np.ndarray, lengths: list[int], batch_size: int, carried: int, rng: np.random.Generator
) -> np.ndarray:
    """``rows`` reordered so that each batch holds sentences of similar length (less padding, the same rows).

    The first ``batch_size - carried`` rows complete a batch already open (``carried`` rows in it) and stay
    first; the rest go in windows of ``GROUP_WINDOW`` batches, each sorted by length, cut into batches and
    the whole batches shuffled (a window's short last batch stays last).
    """
    head = (batch_size - carried) % batch_size
    parts = [rows[:head]]
    window = batch_size * GROUP_WINDOW
    for start in range(head, len(rows), window):
        chunk = rows[start : start + window]
        chunk = chunk[np.argsort(lengths[start : start + window], kind="stable")]
        cuts = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        full = len(chunk) // batch_size
        parts.extend(cuts[i] for i in rng.permutation(full))
        parts.extend(cuts[full:])
    return np.concatenate(parts)
