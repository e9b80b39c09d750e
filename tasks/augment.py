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
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from datetime import date
from typing import Literal

from pydantic import Field, model_validator
from tqdm import tqdm

from tasks import manifest, sentences, storage
from tasks.config import StageParams

STAGE = "augment"
OUTPUT_DATASET = "sentences_aug"
Method = Literal["wordnet", "back_translation", "delete", "swap"]
# Function words WordNet would otherwise "replace" ("a" -> "angstrom", "in" -> "inch").
STOPWORDS = frozenset("""a an the and or but if of at by for with about against between into through during
before after above below to from up down in out on off over under again further then once here there when
where why how all any both each few more most other some such no nor not only own same so than too very can
will just don should now i me my we our you your he him his she her it its they them their what which who
whom this that these those am is are was were be been being have has had having do does did doing""".split())


class AugmentError(ValueError):
    """The augmentation cannot run as configured; the message names the input or setting."""


class AugmentParams(StageParams):
    ingest_date: date = Field(description="the sentences partition to augment")
    methods: list[Method] = Field(["wordnet"], min_length=1, description="augmentation methods to apply")
    fraction: float = Field(1.0, gt=0, le=1, description="share of sentences each method augments")
    seed: int = 0
    synonym_rate: float = Field(0.2, gt=0, le=1, description="wordnet: share of content words replaced")
    delete_rate: float = Field(0.1, gt=0, lt=1, description="delete: probability of dropping each word")
    swaps: int = Field(1, gt=0, description="swap: number of word swaps")
    translate_forward: str | None = Field(None, description="back_translation: en->X model folder")
    translate_backward: str | None = Field(None, description="back_translation: X->en model folder")
    translate_batch_size: int = Field(16, gt=0)
    translate_beams: int = Field(1, gt=0, description="beam size (1: greedy, deterministic)")
    translate_max_tokens: int = Field(128, gt=0)
    shard_rows: int = Field(50_000, gt=0)

    @model_validator(mode="after")
    def _translation_models(self) -> AugmentParams:
        if "back_translation" in self.methods and not (self.translate_forward and self.translate_backward):
            raise ValueError("back_translation needs translate_forward and translate_backward model folders")
        return self


@dataclass(frozen=True)
class Augmenter:
    """One method: a name, its recorded parameters, and a batch function parents -> variants."""

    method: str
    params: dict
    apply: Callable[[list[tuple[str, str]]], list[str]]


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
    from tasks import wordnet

    try:
        reader = wordnet.load()
    except wordnet.WordNetMissing as exc:
        raise AugmentError(f"wordnet augmentation: {exc}") from None
    cache: dict[str, list[str]] = {}

    def synonyms(word: str) -> list[str]:
        if word not in cache:
            names = {lemma.name().replace("_", " ") for synset in reader.synsets(word) for lemma in synset.lemmas()}
            cache[word] = sorted(n for n in names if n.lower() != word)
        return cache[word]

    def apply(parents: list[tuple[str, str]]) -> list[str]:
        return [synonym_substitute(text, rng_for(params.seed, "wordnet", pid), params.synonym_rate, synonyms)
                for pid, text in parents]

    return Augmenter("wordnet", {"synonym_rate": params.synonym_rate, "wordnet": "3.0"}, apply)


def _back_translation_augmenter(params: AugmentParams) -> Augmenter:
    from tasks.translate import Translator

    forward = Translator.load(params.translate_forward, params.translate_batch_size, params.translate_beams,
                              params.translate_max_tokens)
    backward = Translator.load(params.translate_backward, params.translate_batch_size, params.translate_beams,
                               params.translate_max_tokens)

    def apply(parents: list[tuple[str, str]]) -> list[str]:
        return backward.translate(forward.translate([text for _, text in parents]))

    recorded = {"forward": forward.name, "backward": backward.name, "beams": params.translate_beams,
                "max_tokens": params.translate_max_tokens}
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
    key = sentences.partition_key(params.ingest_date)
    source_manifest = manifest.read(params.store, "stage_corpus", key)
    if source_manifest is None:  # staged but empty (every sentence already staged elsewhere) is fine
        raise AugmentError(f"{params.store}: no sentences staged for {key}; run stage-corpus first")
    stage_run = manifest.StageRun(
        stage=STAGE, key=key, store=params.store, params=params.model_dump(mode="json"),
        inputs=[{"uri": o["uri"], "sha256": o["sha256"], "rows": o["rows"], "bytes": o["bytes"]}
                for o in source_manifest["outputs"]],
    )
    if not force and (done := stage_run.completed()) is not None:
        return manifest.StageResult(stage_run.uri, skipped=True, manifest=done)
    previous_outputs = {o["uri"] for o in (stage_run.previous() or {}).get("outputs", [])}

    with stage_run.phase("load"):
        augmenters = build_augmenters(params)
    generated: list[tuple[Augmenter, dict, str, str]] = []  # (augmenter, parent, normalised variant, its shard)
    for augmenter in augmenters:
        with stage_run.phase(augmenter.method):
            for shard_uri in tqdm([o["uri"] for o in source_manifest["outputs"]], disable=not progress,
                                  desc=f"augment {augmenter.method}", unit=" shard"):
                parents = storage.read_parquet(shard_uri, columns=["sentence_id", "text", "line"]).to_pylist()
                parents = [p for p in parents if selected(params.seed, augmenter.method, p["sentence_id"],
                                                          params.fraction)]
                variants = augmenter.apply([(p["sentence_id"], p["text"]) for p in parents])
                generated.extend((augmenter, parent, sentences.normalise(variant), shard_uri)
                                 for parent, variant in zip(parents, variants, strict=True))
    with stage_run.phase("dedup"):
        ids = [sentences.sentence_id(text) if text else None for _, _, text, _ in generated]
        originals = sentences.already_staged(params.store, [sid for sid in ids if sid])
        rows: dict[str, list] = {name: [] for name in sentences.COLUMNS}
        seen: set[str] = set()
        counts: dict[str, Counter] = {a.method: Counter() for a in augmenters}
        recorded = {a.method: json.dumps(a.params, sort_keys=True) for a in augmenters}
        for (augmenter, parent, text, shard_uri), sid in zip(generated, ids, strict=True):
            _collect(rows, counts[augmenter.method], originals, seen, parent, text, sid, shard_uri,
                     augmenter.method, recorded[augmenter.method])

    table = sentences.table(rows, params.ingest_date)
    stage_run.stats = {"rows_written": table.num_rows, "by_method": {m: dict(c) for m, c in counts.items()}}
    published = sentences.publish_partition(stage_run, storage.join(params.store, OUTPUT_DATASET, key), table,
                                            params.shard_rows, previous_outputs)
    return manifest.StageResult(stage_run.uri, skipped=False, manifest=published)


def _collect(rows: dict[str, list], counts: Counter, originals: set[str], seen: set[str], parent: dict, text: str,
             sid: str | None, source: str, method: str, recorded: str) -> None:
    counts["generated"] += 1
    if sid is None:
        counts["dropped_empty"] += 1
        return
    if sid == parent["sentence_id"] or sid in originals:
        counts["dropped_equals_original"] += 1
        return
    if sid in seen:
        counts["dropped_duplicate"] += 1
        return
    seen.add(sid)
    counts["written"] += 1
    for name, value in (("sentence_id", sid), ("text", text), ("source", source), ("line", parent["line"]),
                        ("parent_id", parent["sentence_id"]), ("aug_method", method), ("aug_params", recorded)):
        rows[name].append(value)
