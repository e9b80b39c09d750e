"""Augment: a ``sentences`` partition -> new sentences with lineage, under the same data contract.

Methods (each switchable, as in HPD): WordNet synonym substitution, back-translation through a
local pair of seq2seq translation models (en->X, X->en), and cheap token operations (random
deletion, random swap). Every output row keeps its parent's id, the method and the method's
parameters; randomness is seeded per (seed, method, parent), so a run is deterministic whatever
the shard order. Outputs equal to any staged original, or repeated, are dropped.
Written to ``sentences_aug/ingest_date=D/`` with manifest ``manifests/augment/ingest_date=D.json``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from tasks.core import catalog, manifest, sentences, staged_ids, storage, teacher_sample
from tasks.core.catalog import Stage
from tasks.core.progress import Progress
from tasks.stages.params import AugmentParams

log = logging.getLogger(__name__)

# Function words WordNet would otherwise "replace" ("a" -> "angstrom", "in" -> "inch").
STOPWORDS = frozenset(
    """a an the and or but if of at by for with about against between into through during
before after above below to from up down in out on off over under again further then once here there when
where why how all any both each few more most other some such no nor not only own same so than too very can
will just don should now i me my we our you your he him his she her it its they them their what which who
whom this that these those am is are was were be been being have has had having do does did doing""".split()
)


class AugmentError(ValueError):
    """The augmentation cannot run as configured; the message names the input or setting."""


@dataclass(frozen=True)
class Augmenter:
    """One method: a name, its recorded parameters, and a batch function parents -> variants."""

    method: str
    params: dict
    apply: Callable[[list[tuple[str, str]]], list[str]]


class Parent(NamedTuple):
    """A staged sentence an augmenter may vary: its id, its text and its line in the source."""

    sentence_id: str
    text: str
    line: int | None

    @classmethod
    def read(cls, shard: manifest.Input) -> list[Parent]:
        """The rows of a staged shard, read verified against the checksum the staging manifest records."""
        table = storage.read_parquet(shard.uri, columns=list(cls._fields), sha256=shard.sha256)
        return [cls(*row) for row in zip(*(table.column(name).to_pylist() for name in cls._fields), strict=True)]


@dataclass
class MethodCounts:
    """One method's variants: how many it generated, and how many had each outcome ("written", or the reason it
    was dropped), in the order the outcomes first came."""

    generated: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def record(self, dropped: str | None) -> None:
        """Count one generated variant: written, or dropped for the reason ``dropped``."""
        self.generated += 1
        self.outcomes[dropped or "written"] += 1

    def as_record(self) -> dict[str, int]:
        """The counts as published and logged: generated, then each outcome (none before anything is generated)."""
        return {"generated": self.generated, **self.outcomes} if self.generated else {}


def rng_for(seed: int, method: str, parent_id: str) -> random.Random:
    digest = hashlib.blake2b(f"{seed}:{method}:{parent_id}".encode(), digest_size=8).digest()
    return random.Random(int.from_bytes(digest, "big"))


def selected(seed: int, method: str, parent_id: str, fraction: float) -> bool:
    return fraction >= 1.0 or rng_for(seed, f"select-{method}", parent_id).random() < fraction


def synonym_substitute(text: str, rng: random.Random, rate: float, synonyms: Callable[[str], list[str]]) -> str:
    """Replace about ``rate`` of the content words that have WordNet synonyms with a random synonym."""
    words = text.split()
    candidates = [i for i, w in enumerate(words) if w.isalpha() and w.lower() not in STOPWORDS and len(w) > 2]
    rng.shuffle(candidates)
    budget = max(1, round(rate * len(candidates)))
    for i in candidates:
        if budget == 0:
            break
        options = synonyms(words[i].lower())
        if options:
            choice = rng.choice(options)
            words[i] = choice.capitalize() if words[i][0].isupper() else choice
            budget -= 1
    return " ".join(words)


def random_delete(text: str, rng: random.Random, rate: float) -> str:
    words = text.split()
    kept = [w for w in words if rng.random() >= rate]
    return " ".join(kept or [rng.choice(words)]) if words else text


def random_swap(text: str, rng: random.Random, swaps: int) -> str:
    words = text.split()
    for _ in range(swaps if len(words) > 1 else 0):
        i, j = rng.sample(range(len(words)), 2)
        words[i], words[j] = words[j], words[i]
    return " ".join(words)


def _wordnet_augmenter(params: AugmentParams) -> Augmenter:
    from tasks.ml import wordnet

    try:
        reader = wordnet.load()
    except wordnet.WordNetMissing as exc:
        raise AugmentError(f"wordnet augmentation: {exc}") from None
    synonyms = wordnet.synonyms_of(reader)

    def apply(parents: list[tuple[str, str]]) -> list[str]:
        return [
            synonym_substitute(text, rng_for(params.seed, "wordnet", pid), params.synonym_rate, synonyms)
            for pid, text in parents
        ]

    return Augmenter("wordnet", {"synonym_rate": params.synonym_rate, "wordnet": "3.0"}, apply)


def _back_translation_augmenter(params: AugmentParams) -> Augmenter:
    from tasks.ml.translate import Translator

    forward = Translator.load(
        params.translate_forward, params.translate_batch_size, params.translate_beams, params.translate_max_tokens
    )
    backward = Translator.load(
        params.translate_backward, params.translate_batch_size, params.translate_beams, params.translate_max_tokens
    )

    def apply(parents: list[tuple[str, str]]) -> list[str]:
        return backward.translate(forward.translate([text for _, text in parents]))

    recorded = {
        "forward": forward.name,
        "backward": backward.name,
        "beams": params.translate_beams,
        "max_tokens": params.translate_max_tokens,
    }
    return Augmenter("back_translation", recorded, apply)


def _token_augmenter(params: AugmentParams, method: str) -> Augmenter:
    if method == "delete":

        def apply(parents):
            return [random_delete(t, rng_for(params.seed, method, pid), params.delete_rate) for pid, t in parents]

        return Augmenter(method, {"delete_rate": params.delete_rate}, apply)

    def apply(parents):  # swap
        return [random_swap(t, rng_for(params.seed, method, pid), params.swaps) for pid, t in parents]

    return Augmenter(method, {"swaps": params.swaps}, apply)


def build_augmenters(params: AugmentParams) -> list[Augmenter]:
    builders = {"wordnet": _wordnet_augmenter, "back_translation": _back_translation_augmenter}
    return [builders[m](params) if m in builders else _token_augmenter(params, m) for m in params.methods]


def run(params: AugmentParams, force: bool = False, progress: bool = False) -> manifest.StageResult:
    """Augment the staged originals of ``params.ingest_date``."""
    key = catalog.partition_key(params.ingest_date)
    source_manifest = manifest.read(params.store, Stage.STAGE_CORPUS, key)
    if source_manifest is None:  # staged but empty (every sentence already staged elsewhere) is fine
        raise AugmentError(f"{params.store}: no sentences staged for {key}; run stage-corpus first")
    stage_run = manifest.StageRun(
        stage=Stage.AUGMENT,
        key=key,
        store=params.store,
        params=params.model_dump(mode="json"),
        inputs=[o.as_input() for o in source_manifest.outputs],
    )
    if skipped := stage_run.skip_result(force):
        return skipped
    with stage_run.phase("load"):
        augmenters = build_augmenters(params)
        candidates = teacher_sample.augmentable(
            params.store, params.ingest_date, params.teacher_sample, params.sample_seed
        )
    if candidates is not None:
        log.info("augment %s: varying only the %d sentence(s) the teacher sample can hold", key, len(candidates))
    generated: list[tuple[Augmenter, Parent, str, str]] = []  # (augmenter, parent, normalised variant, its shard)
    for augmenter in augmenters:
        with stage_run.phase(augmenter.method):
            generated.extend(_generate(params, augmenter, (stage_run.inputs, candidates), progress))
    with stage_run.phase("dedup"):
        rows, counts = _deduplicated(params.store, generated, augmenters)
    table = sentences.table(rows, params.ingest_date)
    stage_run.stats = {"rows_written": table.num_rows, "by_method": {m: c.as_record() for m, c in counts.items()}}
    for method, count in counts.items():
        log.info("augment %s: %s %s", key, method, ", ".join(f"{n} {what}" for what, n in count.as_record().items()))
    return sentences.publish_partition(stage_run, params.ingest_date, table, params.shard_rows)


def _generate(
    params: AugmentParams,
    augmenter: Augmenter,
    source: tuple[list[manifest.Input], set[str] | None],
    progress: bool,
) -> list[tuple[Augmenter, Parent, str, str]]:
    """(augmenter, parent row, normalised variant, parent shard's store key) for every selected parent among the
    ``candidates`` of ``source = (shards, candidates)`` (None: every staged sentence). Each staged shard is read
    verified against the checksum the staging manifest records."""
    shards, candidates = source
    generated = []
    total = sum(shard.rows or 0 for shard in shards)
    with Progress(f"augment {augmenter.method}", total, bar=progress, logger=log) as reporter:
        for shard in shards:
            parents = Parent.read(shard)
            read = len(parents)
            parents = [
                p
                for p in parents
                if (candidates is None or p.sentence_id in candidates)
                and selected(params.seed, augmenter.method, p.sentence_id, params.fraction)
            ]
            variants = augmenter.apply([(p.sentence_id, p.text) for p in parents])
            parent_shard = catalog.store_key(params.store, shard.uri) or shard.uri  # a copied store holds the same rows
            generated.extend(
                (augmenter, parent, sentences.normalise_text(variant), parent_shard)
                for parent, variant in zip(parents, variants, strict=True)
            )
            reporter.update(read)
    return generated


def _deduplicated(
    store: str, generated: list[tuple[Augmenter, Parent, str, str]], augmenters: list[Augmenter]
) -> tuple[dict[str, list], dict[str, MethodCounts]]:
    """The rows to write (variants that are new, non-empty and not staged originals) and counts per method."""
    ids = [sentences.sentence_id(text) if text else None for _, _, text, _ in generated]
    originals = staged_ids.held(store, [sid for sid in ids if sid])
    rows: dict[str, list] = {name: [] for name in sentences.COLUMNS}
    seen: set[str] = set()
    counts = {a.method: MethodCounts() for a in augmenters}
    recorded = {a.method: json.dumps(a.params, sort_keys=True) for a in augmenters}
    for (augmenter, parent, text, shard_uri), sid in zip(generated, ids, strict=True):
        reason = _drop_reason(sid, parent.sentence_id, originals, seen)
        counts[augmenter.method].record(reason)
        if reason:
            continue
        seen.add(sid)
        for name, value in zip(
            sentences.COLUMNS,
            (sid, text, shard_uri, parent.line, parent.sentence_id, augmenter.method, recorded[augmenter.method]),
            strict=True,
        ):
            rows[name].append(value)
    return rows, counts


def _drop_reason(sid: str | None, parent_id: str, originals: set[str], seen: set[str]) -> str | None:
    if sid is None:
        return "dropped_empty"
    if sid == parent_id or sid in originals:
        return "dropped_equals_original"
    return "dropped_duplicate" if sid in seen else None
