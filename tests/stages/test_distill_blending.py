"""``blend_initial``: blends of the initial and the final weights, scored after training, one exported when it
scores better by ``select_on``; the initial weights survive a resume."""

import io
import json
import logging
from dataclasses import replace
from datetime import date

import numpy as np
import pytest
import torch

from tasks import cli
from tasks.core import config, storage
from tasks.stages import distill
from tasks.stages.distill import blending, weights
from tasks.stages.distill import stage as distill_stage
from tasks.stages.distill.data import TrainingData, shard_pairs
from tasks.stages.distill.distributed import Distributed
from tasks.stages.distill.evaluation import Evaluation, FidelityEvaluator
from tests.stages.test_distill import (
    _max_diff,
    _run_file,
    _stopped_after_first_checkpoint,
    _torchrun,
    _values,
    _weights,
)
from tests.support.projected_store import PCA_NAME, corpus_lines, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 3)
FRACTIONS = [0.25, 0.5, 0.75]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A store with 160 staged sentences, encoded by a tiny teacher and projected to 8 dims."""
    return projected_store(tmp_path_factory.mktemp("blending"), corpus_lines(160), DAY, shard_rows=80)


def _params(prepared, **extra):
    values = {"init": "random", "max_steps": 6, "eval_every": 3, "blend_initial": FRACTIONS, **extra}
    return config.parse(distill.DistillParams, _values(prepared, **values))


@pytest.fixture
def trainers(monkeypatch):
    """Every Trainer the distill stage builds in this test, in order."""
    built = []

    class Recorded(distill.Trainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(self)

    monkeypatch.setattr(distill_stage, "Trainer", Recorded)
    return built


def _as_published(weights, published):
    """Trainer weights (a state dict) under the names the exported folder gives them, as ``published`` has."""
    renamed = {key.removeprefix("transformer."): value.float().cpu().numpy() for key, value in weights.items()}
    assert published.keys() <= renamed.keys()
    return {key: renamed[key] for key in published}


# -- the pure functions ---------------------------------------------------------------------------------------
def test_blend_interpolates_floating_point_tensors_and_keeps_the_others():
    initial = {"w": torch.zeros(2, 3), "h": torch.zeros(4, dtype=torch.bfloat16), "ids": torch.arange(4)}
    best = {"w": torch.full((2, 3), 2.0), "h": torch.ones(4, dtype=torch.bfloat16), "ids": torch.arange(4) + 10}
    blended = weights.blend(initial, best, 0.25)
    assert torch.equal(blended["w"], torch.full((2, 3), 0.5))
    assert blended["h"].dtype == torch.bfloat16 and torch.equal(blended["h"], torch.full((4,), 0.25).bfloat16())
    assert torch.equal(blended["ids"], best["ids"])  # an integer buffer is the best weights'
    assert torch.equal(initial["w"], torch.zeros(2, 3)) and torch.equal(best["w"], torch.full((2, 3), 2.0))
    copy = weights.cpu_copy(best)
    copy["w"].add_(1)
    assert copy["w"].device.type == "cpu" and torch.equal(best["w"], torch.full((2, 3), 2.0))


@pytest.mark.parametrize(
    ("select_on", "best", "scores", "chosen"),
    [
        ("val_mse", 1.0, [1.2, 0.9, 0.8], 0.75),  # the lowest MSE
        ("val_mse", 1.0, [1.0, 1.0, 1.1], None),  # a tie keeps the best weights
        ("val_mse", 1.0, [1.1, 1.2, 1.3], None),
        ("sts_dev", 50.0, [49.0, 52.0, 51.0], 0.5),  # the highest dev score
        ("sts_dev", 50.0, [50.0, 49.0, 48.0], None),
    ],
)
def test_a_blend_is_chosen_only_when_strictly_better(select_on, best, scores, chosen):
    def record(value, **extra):
        return Evaluation.from_record(
            {"step": 6, "val_cosine": 0.5, "val_mse": 1.0, "sts_dev": 50.0, select_on: value, **extra}
        )

    blends = [record(score, blend=a) for a, score in zip(FRACTIONS, scores, strict=True)]
    choice = blending.choose(record(best), blends, select_on)
    assert (choice and choice.blend) == chosen
    assert blending.choose(record(best), [], select_on) is None


def test_blend_fractions_are_validated_and_normalised(prepared):
    assert _params(prepared, blend_initial=[0.5, 0.25, 0.5]).blend_initial == [0.25, 0.5]
    assert _params(prepared, blend_initial=[]).blend_initial == []
    for wrong in (0, 1, 1.5, -0.1):
        with pytest.raises(config.ConfigError, match="blend_initial"):
            _params(prepared, blend_initial=[0.5, wrong])
    args = cli.build_parser().parse_args(["distill", "--blend-initial", "0.75", "0.5"])
    assert _params(prepared, blend_initial=args.blend_initial).blend_initial == [0.5, 0.75]
    assert cli.build_parser().parse_args(["distill", "--blend-initial"]).blend_initial == []  # blending off


# -- the stage --------------------------------------------------------------------------------------------------
def test_by_default_the_best_sts_dev_score_is_exported_among_the_blends(prepared):
    """The benchmark's winning recipe is the default: selection on STS dev, blends 0.25/0.5/0.75 scored."""
    recipe = ("select_on", "blend_initial")
    values = {k: v for k, v in _values(prepared, init="random", max_steps=6, eval_every=3).items() if k not in recipe}
    stats = distill.run(config.parse(distill.DistillParams, {**values, "name": "defaults"})).stats
    blends = stats["exported"]["blends"]
    assert [b["blend"] for b in blends] == FRACTIONS and all("sts_dev" in b for b in blends)
    evals = json.loads(storage.read_bytes(_metrics_uri(prepared["store"], "defaults")))["evals"]
    candidates = [e["sts_dev"] for e in evals] + [b["sts_dev"] for b in blends]
    assert stats["exported"]["sts_dev"] == pytest.approx(max(candidates), abs=1e-3)
    assert stats["best_step"] == max(evals, key=lambda e: e["sts_dev"])["step"]


def test_each_blend_is_scored_and_the_export_follows_the_scores(prepared, trainers, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    result = distill.run(_params(prepared, name="blended"))
    [trainer] = trainers
    exported, best_step = result.stats["exported"], result.stats["best_step"]
    blends = exported["blends"]
    assert [b["blend"] for b in blends] == FRACTIONS
    final_step = result.stats["steps"]
    assert all(b["step"] == final_step and {"val_mse", "val_cosine"} <= b.keys() for b in blends)
    lowest = min(blends, key=lambda b: b["val_mse"])
    published = _weights(prepared["store"], "blended")
    if lowest["val_mse"] < result.stats["best_val_mse"]:
        assert exported == {**lowest, "blends": blends}
        expected = trainer.kept.blend(lowest["blend"])
    else:
        assert exported["blend"] is None and exported["val_mse"] == pytest.approx(result.stats["best_val_mse"])
        expected = trainer.kept.best
    assert _max_diff(published, _as_published(expected, published)) < 1e-6
    metrics = json.loads(storage.read_bytes(_metrics_uri(prepared["store"], "blended")))
    assert metrics["exported"] == exported
    lines = [r.getMessage() for r in caplog.records if r.name == "tasks.stages.distill.run_log"]
    for b in blends:
        assert (
            f"distill blended: blend {b['blend']:g} of the initial weights and those of step {final_step}: "
            f"val_mse {b['val_mse']:.6g}, val_cosine {b['val_cosine']:.4f}" in lines
        )
    assert f"exporting the weights of step {best_step}" in lines[-1] or "exporting the initial weights" in lines[-1]


def _metrics_uri(store, name):
    return _run_file(store, name, "metrics.json")


def _forced_scores(monkeypatch, trainers, final_scores):
    """Scores that make training improve at every evaluation (so the best weights are the last ones, not the
    initial ones) and, once training is over, score the weights by ``final_scores(trainer)``."""
    choosing, measure = blending.export_choice, FidelityEvaluator.evaluate

    def export_choice(kept, evaluator, *rest):
        evaluator.scoring_the_export = True
        return choosing(kept, evaluator, *rest)

    def evaluate(evaluator, model, step):
        measured = measure(evaluator, model, step)
        later_is_better = -float(step)
        value = final_scores(trainers[-1]) if getattr(evaluator, "scoring_the_export", False) else later_is_better
        return replace(measured, val_mse=value, sts_dev=-value)

    monkeypatch.setattr(blending, "export_choice", export_choice)
    monkeypatch.setattr(FidelityEvaluator, "evaluate", evaluate)


def _distance_to_the_midpoint(trainer):
    """Lowest (0) for the weights halfway between the initial and the final ones."""
    now = trainer.model.state_dict()
    return sum(
        float(((now[k].cpu() - (trainer.kept.initial[k] + trainer.kept.final[k].cpu()) / 2) ** 2).sum())
        for k in now
        if torch.is_floating_point(now[k])
    )


@pytest.mark.parametrize("select_on", ["val_mse", "sts_dev"])
def test_a_blend_that_scores_better_is_published(prepared, trainers, monkeypatch, select_on):
    _forced_scores(monkeypatch, trainers, _distance_to_the_midpoint)
    name = f"midpoint-{select_on.replace('_', '-')}"
    result = distill.run(_params(prepared, select_on=select_on, name=name))
    [trainer] = trainers
    exported = result.stats["exported"]
    assert result.stats["best_step"] == 6 and exported["blend"] == 0.5 and exported["step"] == 6
    assert [b["blend"] for b in exported["blends"]] == FRACTIONS
    published = _weights(prepared["store"], name)
    halfway = _as_published(trainer.kept.blend(0.5), published)
    assert _max_diff(published, halfway) < 1e-6
    assert _max_diff(published, _as_published(trainer.kept.best, published)) > 1e-4  # training moved them


def test_a_tie_publishes_the_best_weights(prepared, trainers, monkeypatch):
    _forced_scores(monkeypatch, trainers, lambda trainer: 0.0)
    result = distill.run(_params(prepared, name="tied"))
    [trainer] = trainers
    assert result.stats["exported"]["blend"] is None and len(result.stats["exported"]["blends"]) == 3
    published = _weights(prepared["store"], "tied")
    assert _max_diff(published, _as_published(trainer.kept.best, published)) < 1e-6


def test_the_initial_weights_survive_a_resume(prepared, trainers, monkeypatch):
    straight = distill.run(_params(prepared, checkpoint_every=3, name="blend-straight"))
    params = _params(prepared, checkpoint_every=3, name="blend-resumed")
    _stopped_after_first_checkpoint(params, monkeypatch)
    latest = json.loads(storage.read_bytes(f"{prepared['store']}/students/blend-resumed/checkpoints/latest.json"))
    payload = torch.load(
        io.BytesIO(storage.read_bytes(f"{prepared['store']}/{latest['key']}")), map_location="cpu", weights_only=True
    )
    assert latest["step"] == 3 and payload["initial_weights"].keys() == payload["model"].keys()
    resumed = distill.run(params)
    assert resumed.stats["init"]["resumed_from_step"] == 3
    first, _, restored = trainers
    assert all(torch.equal(first.kept.initial[k], restored.kept.initial[k]) for k in first.kept.initial)
    assert _max_diff(_weights(prepared["store"], "blend-resumed"), _weights(prepared["store"], "blend-straight")) < 1e-6
    for ran, again in zip(straight.stats["exported"]["blends"], resumed.stats["exported"]["blends"], strict=True):
        assert again == pytest.approx(ran)
    assert resumed.stats["exported"]["blend"] == straight.stats["exported"]["blend"]


def test_without_blending_no_initial_weights_are_kept(prepared, trainers, monkeypatch):
    params = _params(prepared, blend_initial=[], checkpoint_every=3, max_steps=4, name="unblended")
    result = distill.run(params)
    [trainer] = trainers
    assert trainer.kept.initial is None
    assert "blend" not in result.stats["exported"] and "blends" not in result.stats["exported"]
    latest = json.loads(storage.read_bytes(f"{prepared['store']}/students/unblended/checkpoints/latest.json"))
    payload = torch.load(
        io.BytesIO(storage.read_bytes(f"{prepared['store']}/{latest['key']}")), map_location="cpu", weights_only=True
    )
    assert "initial_weights" not in payload
    assert np.isfinite(result.stats["exported"]["val_mse"])


class _LeaderChoseHalf(Distributed):
    """One process standing for a follower: whatever it scores, the leader (rank 0) chose the blend 0.5."""

    def gather(self, value):
        if isinstance(value, tuple):  # (the choice, every blend's evaluation)
            _, blends = value
            return [(replace(blends[1], val_mse=-1.0), blends), value]
        return super().gather(value)


def test_every_process_exports_the_leaders_choice(prepared):
    params = _params(prepared, name="follower")
    data = TrainingData(shard_pairs(params.store, params.teacher, PCA_NAME), 0, params.val_fraction, 100)
    trainer = distill.Trainer(params, data, "cpu", _LeaderChoseHalf(), "follower")
    trainer.restore_or_initialise(force=True)
    trainer.train(progress=False)
    assert trainer.exported["blend"] == 0.5 and trainer.exported["val_mse"] == -1.0
    halfway = trainer.kept.blend(0.5)
    assert all(torch.equal(value, halfway[key]) for key, value in trainer.model.state_dict().items())


def test_two_process_ddp_blends_as_one_process_does(prepared, warm_hpd):
    common = {"max_steps": 6, "eval_every": 3, "dropout": 0.0, "init": "ridge", "grad_accum": 2, "relation_weight": 0.0}
    single = distill.run(_params(prepared, name="blend-single", **common))
    values = _values(prepared, name="blend-ddp", **common)
    out = _torchrun(warm_hpd, values, "--blend-initial", *map(str, FRACTIONS), "--quiet")
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = json.loads(storage.read_bytes(_metrics_uri(prepared["store"], "blend-ddp")))
    assert metrics["world_size"] == 2
    exported = single.stats["exported"]
    assert metrics["exported"]["blend"] == exported["blend"]
    for ddp, one in zip(metrics["exported"]["blends"], exported["blends"], strict=True):
        assert ddp["blend"] == one["blend"] and ddp["val_mse"] == pytest.approx(one["val_mse"], abs=1e-6)
    assert _max_diff(_weights(prepared["store"], "blend-ddp"), _weights(prepared["store"], "blend-single")) < 1e-4
