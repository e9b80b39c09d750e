"""Which partitions a run read or a model was trained on, and which encoded partitions the promoted model has not
learned (:mod:`tasks.core.partitions`, :func:`tasks.core.promoted.unlearned`)."""

from datetime import date

import pytest

from tasks.core import catalog, config, partitions, promoted
from tasks.core.catalog import ModelPointer
from tasks.stages import encode_teacher, stage_corpus
from tests.support.projected_store import corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY1, DAY2 = date(2026, 11, 1), date(2026, 11, 2)


def test_partitions_in_reads_ingest_date_segments_only():
    keys = [
        "sentences/ingest_date=2026-11-01/part-00000-aa.parquet",
        "teacher/t/ingest_date=2026-11-02/sentences-part-00000-aa-bb.parquet",
        "targets/t/k8/sentences-part-00000-aa-bb-cc.parquet",
        "x/not_ingest_date=2026-11-03/y",
    ]
    assert partitions.partitions_in(keys) == {DAY1, DAY2}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("lineage")
    prepared = projected_store(root, corpus_lines(40), DAY1, shard_rows=20)
    distill_tiny(prepared, "first", max_steps=2)
    return prepared, root


def test_a_new_partition_is_untrained_until_a_model_trained_on_it_is_promoted(trained):
    prepared, root = trained
    store, teacher = prepared["store"], prepared["teacher"]
    assert partitions.trained_partitions(store, "first") == {DAY1}
    assert promoted.unlearned(store, partitions.encoded_partitions(store, teacher)) == [DAY1]  # nothing promoted yet

    catalog.move_pointer(store, ModelPointer("first", {}, "manifests/validate/first.json"), None)
    assert promoted.unlearned(store, partitions.encoded_partitions(store, teacher)) == []

    (root / "day2.txt").write_text("\n".join(corpus_lines(60)[40:]))
    values = {"store": store, "source": str(root / "day2.txt"), "ingest_date": DAY2}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    assert promoted.unlearned(store, partitions.encoded_partitions(store, teacher)) == []  # staged, not encoded yet
    encode_teacher.run(
        config.parse(encode_teacher.EncodeTeacherParams, {"store": store, "teacher": teacher, "ingest_date": DAY2})
    )
    assert partitions.encoded_partitions(store, teacher) == {DAY1, DAY2}
    assert promoted.unlearned(store, partitions.encoded_partitions(store, teacher)) == [DAY2]


def test_an_unknown_model_run_is_named(trained):
    prepared, _ = trained
    with pytest.raises(ValueError, match=r"manifests/distill/nope\.json: no such model run"):
        partitions.trained_partitions(prepared["store"], "nope")
