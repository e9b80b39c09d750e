"""Backfill: three past days staged in any order, one of them staged again, give the same training set, the same
promoted model and the same index as the days staged in date order (a backfill's retrain starts from the base model
and learns what the store holds, not what an earlier model learned). The teacher encodes its sample of each day
(SAMPLE of its 30 rows), the student indexes every row."""

from datetime import date, timedelta
from pathlib import Path

import pytest

from tasks.core import config, storage
from tasks.ml import vector_index
from tasks.orchestration import day_plan
from tasks.stages import build_index, encode_teacher, fit_pca, stage_corpus
from tests.support.projected_store import corpus_lines, distill_tiny
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

DAYS = [date(2026, 10, 1) + timedelta(days=n) for n in range(3)]
QUERIES = ["a film about love", "the market fell", "a man is playing a guitar"]
SAMPLE = 12  # the teacher's sample of each day's 30 rows


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("backfill-models")
    return {
        "teacher": str(build_sentence_model(root / "teacher", hidden=48, seed=1)),
        "student": str(build_sentence_model(root / "student", hidden=32, seed=2)),
    }


def _raw(root: Path, day: date, lines: list[str]) -> str:
    path = root / f"{day}.txt"
    path.write_text("\n".join(lines))
    return str(path)


def _staged_in(root: Path, order: list[int], models: dict[str, str]) -> dict:
    """A store whose days were staged (and teacher-encoded) in ``order``; then trained and indexed as a backfill's
    retrain and index runs do. What came out: training days, model checksum, index searches."""
    root.mkdir()
    lines = corpus_lines(90)
    store = storage.to_uri(str(root / "store"))
    for position in order:
        day = DAYS[position]
        source = _raw(root, day, lines[30 * position : 30 * (position + 1)])
        values = {"store": store, "source": source, "ingest_date": day, "shard_rows": 20}
        stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
        values = {"store": store, "teacher": models["teacher"], "ingest_date": day, "teacher_sample": SAMPLE}
        encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))
    days = day_plan.training_partitions(store, models["teacher"], 10_000, after_promoted=False)
    values = {"store": store, "teacher": models["teacher"], "k": 8, "partitions": days, "name": "k8-backfill"}
    fit_pca.run(config.parse(fit_pca.FitPCAParams, values))
    prepared = {"store": store, **models}
    trained = distill_tiny(prepared, "backfilled", max_steps=2, pca_name="k8-backfill").manifest
    values = {"store": store, "model_run": "backfilled", "partitions": days}
    build_index.run(config.parse(build_index.BuildIndexParams, values))
    loaded = vector_index.load_current(store)
    return {
        "days": days,
        "model": trained.output_named("model/model.safetensors").sha256,
        "index": sorted(loaded.sentence_ids),
        "hits": [[(h.sentence_id, round(h.score, 4)) for h in found] for found in loaded.search(QUERIES, 5)],
    }


def test_days_staged_out_of_order_and_again_give_the_same_model_and_index(tmp_path, models):
    in_order = _staged_in(tmp_path / "in-order", [0, 1, 2], models)
    shuffled = _staged_in(tmp_path / "shuffled", [2, 0, 1, 0], models)  # the last: day 0 staged again
    assert in_order["days"] == DAYS
    assert len(in_order["index"]) == 90  # every staged row searchable, though the teacher saw 3 x SAMPLE
    assert shuffled == in_order
