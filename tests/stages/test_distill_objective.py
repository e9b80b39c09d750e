"""The training objective's options: the cosine and similarity-structure terms, frozen layers, selection on STS dev."""

import json
import logging
from datetime import date
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tasks.core import config, storage
from tasks.ml import student
from tasks.ml.encoder import SentenceEncoder
from tasks.stages import distill
from tasks.stages.distill.data import Position, TrainingData, length_grouped, shard_pairs
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.evaluation import Evaluation
from tasks.stages.distill.objective import HPDLoss, extra_loss, neighbourhood_kl
from tasks.stages.distill.run_log import RunLog
from tasks.stages.distill.sampler import HPDBatchSampler, Order
from tasks.stages.distill.state import TrainState
from tests.stages.test_distill import _run_file, _values, _weights
from tests.support.projected_store import PCA_NAME, corpus_lines, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 2)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A store with 160 staged sentences, encoded by a tiny teacher and projected to 8 dims."""
    return projected_store(tmp_path_factory.mktemp("objective"), corpus_lines(160), DAY, shard_rows=80)


def _params(prepared, **extra):
    """The terms are tested one at a time: each is off (the neighbourhood term too) unless ``extra`` turns it on."""
    values = {"eval_every": 3, "init": "random", "relation_weight": 0.0, **extra}
    return config.parse(distill.DistillParams, _values(prepared, **values))


def _trainer(prepared, **extra):
    params = _params(prepared, **extra)
    data = TrainingData(shard_pairs(params.store, params.teacher, PCA_NAME), 0, params.val_fraction, 100)
    trainer = distill.Trainer(params, data, "cpu", Distributed(), "objective")
    trainer.restore_or_initialise(force=True)
    return trainer


def test_extra_terms_vanish_on_perfect_outputs_and_grow_with_error(prepared):
    trainer = _trainer(prepared, cosine_weight=1.0, structure_weight=1.0)
    goal = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert float(extra_loss(trainer.params, goal * 3, goal)) == pytest.approx(0, abs=1e-6)  # both are scale-free
    rotated = goal[:, [1, 0]]
    # cosine: rows 1 and 2 are orthogonal to their goal (1 each), row 3 is aligned; structure: unchanged
    assert float(extra_loss(trainer.params, rotated, goal)) == pytest.approx(2.0, abs=1e-6)
    collapsed = torch.ones(3, 2)
    cosine_only = extra_loss(_trainer(prepared, cosine_weight=1.0).params, collapsed, goal)
    both = extra_loss(trainer.params, collapsed, goal)
    # structure: the collapsed outputs are all alike, the goals' similarities are 0 and 0.71 off the diagonal
    expected_structure = (2 * (1 - 0) ** 2 + 4 * (1 - 2**-0.5) ** 2) / 3
    assert float(both - cosine_only) == pytest.approx(expected_structure, abs=1e-5)
    assert float(extra_loss(_trainer(prepared).params, collapsed, goal)) == 0.0


def _hpd_gradient(trainer, texts, targets, micro_batches=1):
    """The Dense head's gradient of :class:`HPDLoss` over ``texts`` cut into ``micro_batches``, each divided by
    their count as the trainer divides it; with the summed squared error and rows the loss recorded."""
    view = student.as_sentence_transformer(trainer.model)
    loss = HPDLoss(view, trainer.params)
    trainer.model.zero_grad()
    size = len(texts) // micro_batches
    for start in range(0, len(texts), size):
        features = view.tokenize(texts[start : start + size])
        (loss([features], torch.as_tensor(targets[start : start + size])) / micro_batches).backward()
    return trainer.model.dense.linear.weight.grad.clone(), loss.take()


@pytest.mark.parametrize(
    "extra",
    [{}, {"cosine_weight": 1.0, "structure_weight": 0.5, "relation_weight": 1.0}],
    ids=["mse", "with-extras"],
)
def test_the_loss_gradient_is_that_of_the_global_batch(prepared, extra):
    """Two micro-batches of 8 give the gradient the loop this replaced took on the batch of 16: the squared
    error summed over the batch, over k and the batch's size, plus the extra terms over the size (the in-batch
    structure and neighbourhood terms: within each micro-batch)."""
    trainer = _trainer(prepared, dropout=0.0, **extra)
    batch = next(trainer.data.batches(trainer.state.position, 16))
    gradient, (squared_error, rows) = _hpd_gradient(trainer, batch.texts, batch.targets, micro_batches=2)
    trainer.model.zero_grad()
    expected_error = 0.0
    for half in (slice(0, 8), slice(8, 16)):
        output = trainer.model(trainer.model.tokenize(batch.texts[half])).float()
        goal = torch.as_tensor(batch.targets[half])
        sse = ((output - goal) ** 2).sum()
        ((sse / trainer.data.dim + extra_loss(trainer.params, output, goal)) / 16).backward()
        expected_error += float(sse.detach())
    torch.testing.assert_close(gradient, trainer.model.dense.linear.weight.grad, rtol=1e-5, atol=1e-7)
    assert rows == 16 and squared_error == pytest.approx(expected_error, rel=1e-5)
    assert HPDLoss(None, trainer.params).take() == (0.0, 0)


def test_the_extra_terms_change_the_gradient(prepared):
    grads = {}
    for name, extra in (("mse", {}), ("cosine", {"cosine_weight": 1.0}), ("structure", {"structure_weight": 1.0})):
        trainer = _trainer(prepared, **extra)
        batch = next(trainer.data.batches(trainer.state.position, 16))
        grads[name] = _hpd_gradient(trainer, batch.texts, batch.targets)[0]
    assert not torch.allclose(grads["mse"], grads["cosine"])
    assert not torch.allclose(grads["mse"], grads["structure"])


def test_frozen_layers_keep_their_weights_and_the_rest_trains(prepared):
    before = SentenceEncoder.load(prepared["student"]).transformer.state_dict()
    result = distill.run(_params(prepared, freeze_layers=1, max_steps=6, name="frozen"))
    after = _weights(prepared["store"], "frozen")
    frozen = [k for k in after if k.startswith("embeddings.") or ".layer.0." in k]
    trained = [k for k in after if ".layer.1." in k]
    assert frozen and trained and result.stats["steps"] == 6
    assert all(np.array_equal(before[k].numpy(), after[k]) for k in frozen)
    assert any(not np.array_equal(before[k].numpy(), after[k]) for k in trained)


def test_freezing_more_layers_than_the_student_has_is_named(prepared):
    with pytest.raises(student.StudentError, match="cannot freeze 9"):
        _trainer(prepared, freeze_layers=9)


def test_selection_on_sts_dev_keeps_the_best_dev_score(prepared):
    result = distill.run(_params(prepared, select_on="sts_dev", max_steps=9, name="by-dev"))
    evals = _evals(prepared, "by-dev")
    assert all("sts_dev" in e for e in evals)
    best = max(evals, key=lambda e: e["sts_dev"])
    assert result.stats["best_step"] == best["step"]
    assert result.stats["exported"]["sts_dev"] == pytest.approx(best["sts_dev"], abs=1e-3)
    card = next(o for o in result.manifest.outputs if o.uri.endswith("/model/README.md"))
    assert "**exported** (the best by sts_dev)" in storage.read_bytes(card.uri).decode()


@pytest.mark.parametrize(
    ("select_on", "named"), [("sts_dev", "best sts_dev 60 at step 0"), ("val_mse", "best val_mse 0.5 at step 5")]
)
def test_no_improvement_names_the_best_by_the_selection_criterion(caplog, select_on, named):
    state = TrainState()
    for result in (Evaluation(0, 1.0, sts_dev=60.0), Evaluation(5, 0.5, sts_dev=50.0)):
        state.record_eval(result, None, select_on)
    last = Evaluation(10, 0.8, 0.9, 40.0)
    assert not state.record_eval(last, None, select_on)
    params = SimpleNamespace(name="run", select_on=select_on, patience=None)
    caplog.set_level(logging.INFO, logger="tasks")
    RunLog(params, leader=True).evaluation(last, False, state)
    assert named in caplog.text


def test_state_selects_lowest_mse_or_highest_dev_score():
    by_mse, by_dev = TrainState(), TrainState()
    for step, mse, dev in ((0, 1.0, 50.0), (1, 0.5, 40.0), (2, 0.7, 60.0)):
        by_mse.record_eval(Evaluation(step, mse, sts_dev=dev), None)
        by_dev.record_eval(Evaluation(step, mse, sts_dev=dev), None, "sts_dev")
    assert (by_mse.best_step, by_mse.best_val_mse) == (1, 0.5)
    assert (by_dev.best_step, by_dev.best_val_mse, by_dev.best_score) == (2, 0.7, -60.0)


def _evals(prepared, name):
    return json.loads(storage.read_bytes(_run_file(prepared["store"], name, "metrics.json")))["evals"]


def test_length_grouping_reorders_the_same_rows_into_batches_of_like_lengths():
    rng = np.random.default_rng(0)
    rows = rng.permutation(200)
    lengths = list(rng.integers(1, 100, size=200))
    grouped = length_grouped(rows, lengths, batch_size=8, carried=3, rng=np.random.default_rng(1))
    assert sorted(grouped) == sorted(rows)
    assert list(grouped[:5]) == list(rows[:5])  # the open batch is completed first, unsorted
    length_of = dict(zip(rows, lengths, strict=True))

    def spread(order):
        return np.mean([np.ptp([length_of[r] for r in order[i : i + 8]]) for i in range(5, 197, 8)])

    assert spread(grouped) < spread(rows) / 4


def test_grouped_batches_resume_where_an_unbroken_epoch_would_be(prepared):
    data = TrainingData(shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME), 0, 0.15, 100)
    assert data.train_rows % 16 and data.train_counts[0] % 16  # a batch straddles the shards
    unbroken = list(data.batches(Position(1), 16, grouped=True))
    ungrouped = list(data.batches(Position(1), 16))
    assert [t for b in unbroken for t in b.texts] != [t for b in ungrouped for t in b.texts]
    assert sorted(t for b in unbroken for t in b.texts) == sorted(t for b in ungrouped for t in b.texts)
    for middle in (3, len(unbroken) // 2 + 1):  # within the first shard, and past the straddling batch
        resumed = list(data.batches(unbroken[middle - 1].next_position, 16, grouped=True))
        assert [b.texts for b in resumed] == [b.texts for b in unbroken[middle:]]


@pytest.mark.parametrize("grouped", [False, True], ids=["shuffled", "grouped"])
def test_the_dataset_in_epoch_order_is_the_batch_stream(prepared, tmp_path, grouped):
    """sentence-transformers' trainer takes the rows of each epoch in the order the batches came in."""
    data = TrainingData(shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME), 0, 0.15, 100)
    dataset = data.training_dataset(tmp_path)
    assert len(dataset) == data.train_rows and dataset.column_names == ["sentence", "label"]
    for epoch in range(3):
        order = data.epoch_order(epoch, 16, grouped)
        batches = list(data.batches(Position(epoch), 16, grouped))
        rows = dataset[order.tolist()]
        assert rows["sentence"] == [t for b in batches for t in b.texts]
        np.testing.assert_array_equal(
            np.array(rows["label"], dtype=np.float32), np.concatenate([b.targets for b in batches])
        )
    assert list(data.epoch_order(0, 16, grouped)) != list(data.epoch_order(1, 16, grouped))


def test_the_sampler_cuts_the_epoch_order_into_micro_batches(prepared, tmp_path):
    data = TrainingData(shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME), 0, 0.15, 100)
    rows = data.train_rows
    assert rows % 4  # a short last micro-batch
    order = Order(data, global_batch=16, grouped=True)
    sampler = HPDBatchSampler(range(rows), 4, False, order=order)
    sampler.set_epoch(2)
    cut = list(sampler)
    assert len(cut) == len(sampler) == -(-rows // 4) and len(cut[-1]) == rows % 4
    assert [i for b in cut for i in b] == data.epoch_order(2, 16, grouped=True).tolist()
    two = HPDBatchSampler(range(rows), 4, True, order=Order(data, global_batch=16, grouped=True, world=2))
    two.set_epoch(2)
    kept = list(two)  # full micro-batches only, in whole rounds over both processes
    assert len(kept) == len(two) == rows // 4 // 2 * 2 and {len(b) for b in kept} == {4}
    assert kept == cut[: len(kept)]


def test_the_runs_epoch_wins_over_set_epoch(prepared):
    """Under DDP a resumed trainer's ``set_epoch`` stops at accelerate's wrappers: the run's own epoch orders rows."""
    data = TrainingData(shard_pairs(prepared["store"], prepared["teacher"], PCA_NAME), 0, 0.15, 100)
    order = Order(data, global_batch=16, grouped=False, world=2, epoch_of=lambda: 1)
    sampler = HPDBatchSampler(range(data.train_rows), 4, True, order=order)
    assert sampler.epoch == 0  # a fresh sampler, as after a resume
    rows = [i for batch in sampler for i in batch]
    assert rows == data.epoch_order(1, 16, grouped=False)[: len(rows)].tolist()
    assert rows != data.epoch_order(0, 16, grouped=False)[: len(rows)].tolist()


@pytest.mark.parametrize(("amp", "autocast"), [("bf16", [torch.bfloat16] * 2), ("off", [None] * 2)])
def test_bf16_autocasts_the_forward_pass_on_the_cpu(prepared, monkeypatch, amp, autocast):
    """``amp=bf16``: the trainer runs the whole forward pass (transformer, pooling, head) under bf16 autocast."""
    seen = []
    forward = HPDLoss.forward

    def autocast_dtype(module, inputs):
        seen.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else None)

    def recorded(self, features, labels):  # notes the autocast the head (the last module) runs under
        hook = self.model[-1].register_forward_pre_hook(autocast_dtype)
        try:
            return forward(self, features, labels)
        finally:
            hook.remove()

    monkeypatch.setattr(HPDLoss, "forward", recorded)
    result = distill.run(_params(prepared, amp=amp, max_steps=2, name=f"amp-{amp}"))
    assert result.stats["amp"] == amp and result.stats["steps"] == 2 and seen == autocast


def test_the_neighbourhood_term_sees_who_is_near_whom_not_where():
    """Zero when the student's neighbourhoods are the targets' (whatever the scale or a rotation), positive when
    they differ, and larger the more they differ; it needs three rows (two have no distribution over others)."""
    goal = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    rotation = torch.linalg.qr(torch.randn(3, 3, generator=torch.Generator().manual_seed(0)))[0]
    assert float(neighbourhood_kl(2 * goal @ rotation, goal, 0.05)) == pytest.approx(0, abs=1e-4)
    swapped = goal[[2, 1, 0, 3]]  # row 0's near neighbour is row 1 in the targets; in the student, row 2's is
    mixed = neighbourhood_kl(swapped, goal, 0.05)
    noise = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    slightly, more = (float(neighbourhood_kl(goal + scale * noise, goal, 0.05)) for scale in (0.01, 0.1))
    assert 0 < slightly < more < float(mixed)


def test_the_neighbourhood_term_is_added_by_its_weight(prepared):
    goal = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    output = goal[[2, 0, 1]]
    off = extra_loss(_trainer(prepared).params, output, goal)
    on = extra_loss(_trainer(prepared, relation_weight=2.0, relation_temperature=0.1).params, output, goal)
    assert float(off) == 0.0
    assert float(on) == pytest.approx(2.0 * float(neighbourhood_kl(output, goal, 0.1)), rel=1e-6) and float(on) > 0
