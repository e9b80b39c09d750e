"""The neighbourhood term on a teacher's own embeddings (``relation_on="teacher"``): found by lineage, joined by
sentence id, carried beside the targets in the labels, followed by the term, recorded as the run's inputs."""

import re
from datetime import date
from pathlib import Path

import numpy as np
import pytest
import torch

from tasks.core import catalog, config, manifest, storage
from tasks.ml import student
from tasks.stages import distill
from tasks.stages.distill.data import DistillDataError, TrainingData, shard_pairs
from tasks.stages.distill.objective import HPDLoss, extra_loss, neighbourhood_kl
from tests.support.projected_store import PCA_NAME, corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 5)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The projected store of a tiny teacher (48-d), two sentences shards (hence two teacher shards)."""
    return projected_store(tmp_path_factory.mktemp("relation"), corpus_lines(120), DAY, shard_rows=60)


def test_each_pair_carries_the_teacher_shard_its_targets_were_projected_from(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    pairs = shard_pairs(store, teacher, PCA_NAME, teacher_embeddings=True)
    assert [p.relation for p in shard_pairs(store, teacher, PCA_NAME)] == [None, None]
    fitted = manifest.read(store, catalog.Stage.FIT_PCA, catalog.pca_key(teacher, PCA_NAME))
    assert [p.relation for p in pairs] == [i for i in fitted.inputs if "/teacher/" in i.uri]
    for pair in pairs:
        key = catalog.teacher_shard_key(teacher, DAY, pair.sentences_uri)
        assert [o.uri for o in manifest.read(store, catalog.Stage.ENCODE_TEACHER, key).outputs] == [pair.relation.uri]
        ids, _, _ = pair.read()
        table = storage.read_parquet(pair.relation.uri)
        by_id = dict(zip(table.column("sentence_id").to_pylist(), table.column("embedding").to_pylist(), strict=True))
        np.testing.assert_array_equal(pair.relation_vectors(ids[::-1]), np.array([by_id[i] for i in ids[::-1]]))


def test_the_training_labels_are_the_targets_then_the_relation_embeddings(prepared, tmp_path: Path):
    store, teacher = prepared["store"], prepared["teacher"]
    plain = TrainingData(shard_pairs(store, teacher, PCA_NAME), 0, 0.15, 100)
    related = TrainingData(shard_pairs(store, teacher, PCA_NAME, teacher_embeddings=True), 0, 0.15, 100)
    assert (plain.dim, plain.relation_dim, related.dim, related.relation_dim) == (8, 0, 8, 48)
    np.testing.assert_array_equal(plain.val_targets, related.val_targets)  # validation scores the targets alone
    plain_rows, related_rows = plain.training_dataset(tmp_path / "a"), related.training_dataset(tmp_path / "b")
    labels = np.array(related_rows["label"])
    assert labels.shape == (plain.train_rows, 56)
    np.testing.assert_array_equal(labels[:, :8], np.array(plain_rows["label"]))
    assert not np.allclose(labels[:, 8:], 0)


def test_the_loss_scores_the_targets_and_takes_the_neighbourhoods_from_the_relation_columns(prepared):
    params = config.parse(
        distill.DistillParams,
        {"store": prepared["store"], "teacher": prepared["teacher"], "name": "x", "relation_weight": 2.0},
    )
    generator = torch.Generator().manual_seed(0)
    output, goal, relation = (torch.randn(5, width, generator=generator) for width in (8, 8, 32))
    loss = HPDLoss(lambda features: {"sentence_embedding": features["x"]}, params)
    with_relation = float(loss([{"x": output}], torch.hstack([goal, relation])))
    assert loss.take() == (pytest.approx(float(((output - goal) ** 2).sum())), 5)
    without = float(loss([{"x": output}], goal))
    expected_kl = 2.0 * float(neighbourhood_kl(output, relation, params.relation_temperature))
    assert float(extra_loss(params, output, goal, relation)) == pytest.approx(expected_kl, rel=1e-5)
    mse = float(((output - goal) ** 2).sum()) / 8
    assert with_relation == pytest.approx((mse + expected_kl) / 5, rel=1e-5)
    assert without == pytest.approx((mse + float(extra_loss(params, output, goal))) / 5, rel=1e-5)
    assert with_relation != pytest.approx(without)


def test_a_run_follows_its_teachers_own_embeddings_records_their_shards_and_names_them_on_its_card(prepared):
    result = distill_tiny(prepared, "related", 2, relation_weight=1.0)
    pairs = shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME, teacher_embeddings=True)
    assert {(p.relation.uri, p.relation.sha256) for p in pairs} <= {(i.uri, i.sha256) for i in result.manifest.inputs}
    card = storage.read_bytes(f"{student.exported_prefix(prepared['store'], 'related')}/README.md").decode()
    assert "and the in-batch neighbourhoods of the teacher's own embeddings" in card


def test_on_the_targets_or_without_the_term_a_run_reads_no_teacher_embeddings(prepared):
    for name, settings in {"on-targets": {"relation_on": "targets"}, "no-term": {"relation_weight": 0.0}}.items():
        result = distill_tiny(prepared, name, 1, **settings)
        teacher_prefix = catalog.teacher_key_prefix(prepared["teacher"])
        assert not [i for i in result.manifest.inputs if f"/teacher/{teacher_prefix}/" in i.uri]
        card = storage.read_bytes(f"{student.exported_prefix(prepared['store'], name)}/README.md").decode()
        assert "neighbourhoods of the teacher's own" not in card


def test_a_teacher_shard_that_lacks_a_targets_row_is_refused_naming_it(prepared):
    pair = shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME, teacher_embeddings=True)[0]
    ids, _, _ = pair.read()
    refusal = rf"^{re.escape(pair.relation.uri)}: 1 of its targets' sentence ids are not in it$"
    with pytest.raises(DistillDataError, match=refusal):
        pair.relation_vectors([*ids, "not-a-staged-id"])
