"""A store with a promoted tiny model trained on one partition, and a new partition to stage beside it: what the
retrain policy reads."""

from __future__ import annotations

from datetime import date
from pathlib import Path

from tasks.core import catalog, config
from tasks.core.catalog import ModelPointer, Stage
from tasks.stages import encode_teacher, stage_corpus
from tests.support.projected_store import STS_DEV_SELECTION, corpus_lines, distill_tiny, projected_store

TRAINED, NEW, LATER = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3)
TRAINED_ROWS = 80


def promoted_store(root: Path) -> dict:
    """A model 'tiny' trained on 80 sentences of partition TRAINED and promoted: the prepared store (its URI,
    teacher and student), with ``root`` and the distill manifest (``distilled``)."""
    prepared = projected_store(root, corpus_lines(TRAINED_ROWS), TRAINED, shard_rows=40)
    distilled = distill_tiny(prepared, "tiny", max_steps=1, **STS_DEV_SELECTION).manifest  # exports the step-1 weights
    store = prepared["store"]
    validation = catalog.manifest_uri(store, Stage.VALIDATE, "tiny")
    catalog.move_pointer(store, ModelPointer("tiny", {}, validation, distilled.version_uri(store)), None)
    return {**prepared, "root": root, "distilled": distilled}


def stage_new_partition(prepared: dict, rows: int, day: date = NEW) -> None:
    """Stage ``rows`` new sentences as partition ``day`` and encode them with the teacher."""
    raw = Path(prepared["root"]) / f"{day}.txt"
    place = "mars" if day == NEW else f"mars on {day}"
    raw.write_text("\n".join(f"a new sentence {i} about the weather on {place}" for i in range(rows)))
    store, teacher = prepared["store"], prepared["teacher"]
    values = {"store": store, "source": str(raw), "ingest_date": day, "shard_rows": 40}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    encode_teacher.run(
        config.parse(encode_teacher.EncodeTeacherParams, {"store": store, "teacher": teacher, "ingest_date": day})
    )
