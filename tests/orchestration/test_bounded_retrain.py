"""A bounded retrain: the partitions it learns from (new ones, then a replay sample, within max_train_rows) and a
warm start from the promoted student, which counts what that student had learned as learned."""

import json

import numpy as np
import pytest
from airflow.sdk.exceptions import AirflowSkipException

from tasks.core import catalog, config, learned, manifest, partitions, promoted, spaces
from tasks.core.catalog import Stage
from tasks.ml.encoder import SentenceEncoder
from tasks.ml.projection import PCAError
from tasks.orchestration import day_plan, runtime
from tasks.orchestration.run_records import RetrainParams
from tasks.stages import build_index, fit_pca
from tasks.stages.distill.errors import DistillError
from tasks.stages.distill.evaluation import Evaluation, FidelityEvaluator
from tests.support.paths import REPO
from tests.support.policy_store import LATER, NEW, TRAINED, TRAINED_ROWS, promoted_store, stage_new_partition
from tests.support.projected_store import distill_tiny

pytestmark = pytest.mark.models

NEW_ROWS = 40


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    found = promoted_store(tmp_path_factory.mktemp("bounded"))
    stage_new_partition(found, rows=NEW_ROWS)
    return found


def test_the_new_partitions_come_first_then_older_ones_while_they_fit(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    assert day_plan.training_partitions(store, teacher, None) == [TRAINED, NEW]
    assert day_plan.training_partitions(store, teacher, NEW_ROWS + TRAINED_ROWS) == [TRAINED, NEW]
    assert day_plan.training_partitions(store, teacher, NEW_ROWS + TRAINED_ROWS - 1) == [NEW]
    assert day_plan.training_partitions(store, teacher, 1) == [NEW]  # at least one


def _warm_started(prepared, name: str, **settings) -> manifest.StageResult:
    """A distill run on partition NEW alone (its own PCA run), warm-started from the promoted 'tiny'."""
    store, teacher = prepared["store"], prepared["teacher"]
    values = {"store": store, "teacher": teacher, "k": 8, "partitions": [NEW], "name": "k8-new"}
    fit_pca.run(config.parse(fit_pca.FitPCAParams, values))
    return distill_tiny(prepared, name, max_steps=1, pca_name="k8-new", **settings)


def test_a_warm_start_begins_from_the_promoted_student_and_inherits_what_it_learned(prepared, tmp_path):
    store = prepared["store"]
    warm = _warm_started(prepared, "warm", warm_start="tiny", blend_initial=[], lr=1e-9)
    cold = _warm_started(prepared, "cold", blend_initial=[], lr=1e-9)
    published = manifest.read(store, Stage.DISTILL, "warm")
    assert published.inputs[-1].uri == prepared["distilled"].version_uri(store)  # lineage, and the fingerprint
    assert published.stats["learned_partitions"] == [TRAINED.isoformat(), NEW.isoformat()]
    assert cold.stats["learned_partitions"] == [NEW.isoformat()]
    assert learned.of(store, published).partitions == [TRAINED, NEW]
    assert (published.stats["learned_rows"], cold.stats["learned_rows"]) == (TRAINED_ROWS + NEW_ROWS, NEW_ROWS)

    def body(run: str):  # the transformer's weights, the head aside (it is initialised again)
        from tasks.ml import student

        folder = student.fetch_exported(store, run, tmp_path / run)
        return SentenceEncoder.load(str(folder)).transformer.state_dict()

    promoted, started, base = body("tiny"), body("warm"), body("cold")
    name = next(n for n in promoted if n.endswith("query.weight"))
    assert np.allclose(started[name], promoted[name], atol=1e-5)  # lr 1e-9: the weights it started from
    assert not np.allclose(base[name], promoted[name], atol=1e-5)
    card = (tmp_path / "warm" / "README.md").read_text()
    assert "warm-started from distill run `tiny`" in card
    assert warm.stats["steps"] == 1


def test_once_promoted_a_warm_started_model_leaves_nothing_untrained(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    if manifest.read(store, Stage.DISTILL, "warm") is None:
        _warm_started(prepared, "warm", warm_start="tiny", blend_initial=[], lr=1e-9)
    warm = manifest.read(store, Stage.DISTILL, "warm")
    validation = catalog.manifest_uri(store, Stage.VALIDATE, "warm")
    pointer, etag = catalog.read_pointer(store, catalog.Pointer.MODEL)
    catalog.move_pointer(store, catalog.ModelPointer("warm", {}, validation, warm.version_uri(store)), etag)
    try:
        assert promoted.unlearned(store, partitions.encoded_partitions(store, teacher)) == []  # through the warm start
        stage_new_partition(prepared, rows=NEW_ROWS, day=LATER)
        decided = day_plan.decide(store, teacher, day_plan.Policy(0.5, 30))
        assert decided.facts.learned_rows == TRAINED_ROWS + NEW_ROWS  # not only the rows "warm" read
        assert decided.facts.new_rows == NEW_ROWS
    finally:
        catalog.move_pointer(store, pointer, catalog.read_pointer(store, catalog.Pointer.MODEL)[1])


def test_a_warm_start_from_a_run_that_does_not_exist_is_refused_naming_it(prepared):
    with pytest.raises(DistillError, match="no published distill run 'nowhere' to warm-start from"):
        _warm_started(prepared, "orphan", warm_start="nowhere")


def test_the_dag_warm_starts_from_the_promoted_model_of_the_same_base_and_a_rerun_as_it_ran(prepared):
    for run in ("warm", "cold"):
        if manifest.read(prepared["store"], Stage.DISTILL, run) is None:
            _warm_started(prepared, run, **({"warm_start": "tiny"} if run == "warm" else {}))
    store = prepared["store"]
    params = RetrainParams(teacher=prepared["teacher"], student=prepared["student"])
    assert day_plan.warm_start_for(store, params, "next") == "tiny"
    other_base = params.model_copy(update={"student_layers": 1})
    assert day_plan.warm_start_for(store, other_base, "next") is None  # another base: from it
    assert day_plan.warm_start_for(store, params.model_copy(update={"student": prepared["teacher"]}), "next") is None
    assert day_plan.warm_start_for(store, params, "warm") == "tiny"  # a rerun of a published run starts as it did
    assert day_plan.warm_start_for(store, params, "cold") is None


def test_a_warm_started_retrain_can_keep_the_pca_basis_its_start_learned_and_so_its_embedding_space(prepared):
    store, teacher = prepared["store"], prepared["teacher"]
    start = manifest.read(store, Stage.DISTILL, "tiny")
    values = {"store": store, "teacher": teacher, "k": 8, "partitions": [NEW], "name": "k8-kept", "basis_from": "tiny"}
    kept = fit_pca.run(config.parse(fit_pca.FitPCAParams, values))
    artifact = kept.manifest.output_named("pca.safetensors")
    assert artifact.sha256 == spaces.basis(store, start).sha256  # the very basis, not a new fit on NEW alone
    assert spaces.basis(store, start).uri in {i.uri for i in kept.manifest.inputs}  # lineage: the basis it kept
    refit = fit_pca.run(config.parse(fit_pca.FitPCAParams, {**values, "name": "k8-refit", "basis_from": None}))
    assert refit.manifest.output_named("pca.safetensors").sha256 != artifact.sha256
    warm = distill_tiny(prepared, "kept-space", max_steps=1, pca_name="k8-kept", warm_start="tiny")
    assert spaces.of(store, warm.manifest) == spaces.of(store, start)
    with pytest.raises(PCAError, match="a uncentered basis of k=8, not the uncentered k=4 asked for"):
        fit_pca.run(config.parse(fit_pca.FitPCAParams, {**values, "k": 4, "name": "k4-kept"}))
    with pytest.raises(PCAError, match="no published distill run 'nowhere' to keep the PCA basis of"):
        fit_pca.run(config.parse(fit_pca.FitPCAParams, {**values, "basis_from": "nowhere"}))


def test_a_warm_start_in_its_start_s_basis_keeps_its_head_so_step_0_is_the_model_it_replaces(prepared, tmp_path):
    """In the same space the head is kept (training starts from, and selection can fall back to, the promoted
    student itself); in another basis the head is fitted again by ``init``."""
    values = {"store": prepared["store"], "teacher": prepared["teacher"], "k": 8, "partitions": [NEW]}
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {**values, "name": "k8-kept", "basis_from": "tiny"}))  # or skipped
    kept = distill_tiny(prepared, "kept-head", max_steps=1, pca_name="k8-kept", warm_start="tiny", lr=1e-9)
    refitted = _warm_started(prepared, "refitted-head", warm_start="tiny", lr=1e-9)
    assert kept.stats["init"] == {"init": "warm_start"}
    assert refitted.stats["init"]["init"] == "ridge"

    def head(run: str) -> np.ndarray:
        from tasks.ml import student

        folder = student.fetch_exported(prepared["store"], run, tmp_path / run)
        return SentenceEncoder.load(str(folder)).dense.linear.weight.detach().numpy()

    assert np.allclose(head("kept-head"), head("tiny"), atol=1e-5)
    assert not np.allclose(head("refitted-head"), head("tiny"), atol=1e-3)


def test_a_retrain_that_exports_its_start_unchanged_is_neither_validated_nor_promoted(prepared, monkeypatch):
    """Every trained step scores worse than step 0 here: kept in its start's basis, the run exports its start's own
    weights, and hpd_retrain's validate task skips (promoting them would re-encode the corpus for nothing)."""
    monkeypatch.setattr(FidelityEvaluator, "evaluate", lambda self, model, step: Evaluation(step, 1.0 + step, 0.0))
    values = {"store": prepared["store"], "teacher": prepared["teacher"], "k": 8, "partitions": [NEW]}
    fit_pca.run(config.parse(fit_pca.FitPCAParams, {**values, "name": "k8-kept", "basis_from": "tiny"}))  # or skipped
    kept = distill_tiny(prepared, "unchanged", max_steps=2, pca_name="k8-kept", warm_start="tiny")
    refitted = _warm_started(prepared, "refitted-unchanged", warm_start="tiny")
    assert (kept.stats["best_step"], kept.stats["exports_its_start"]) == (0, True)
    assert (refitted.stats["best_step"], refitted.stats["exports_its_start"]) == (0, False)  # another head
    with pytest.raises(AirflowSkipException, match="distill run unchanged exports the weights it was warm-started"):
        runtime.validate({"params": {"store": prepared["store"]}}, "unchanged")


def test_a_promoted_successor_in_the_same_space_re_encodes_the_corpus_as_the_measured_verdict_says(prepared):
    """Keeping old segments beside a new student's queries would need them to find 0.97 of what a re-encode finds;
    the steady-state benchmark measured far less after a warm-started retrain that kept its basis, so a new
    student's index version keeps none of its predecessor's segments, though both are in one embedding space."""
    verdict = json.loads((REPO / "bench" / "results" / "steady_state.json").read_text())["details"]["volume"]
    reuse = verdict["reuse_after_promotion"]
    assert reuse["lowest_recall_at_10_vs_re_encode"] < reuse["threshold"]
    assert reuse["verdict"] == "re-encode the corpus at promotion"

    store = prepared["store"]
    if manifest.read(store, Stage.DISTILL, "kept-space") is None:
        test_a_warm_started_retrain_can_keep_the_pca_basis_its_start_learned_and_so_its_embedding_space(prepared)
    old, new = (manifest.read(store, Stage.DISTILL, run) for run in ("tiny", "kept-space"))
    assert spaces.of(store, old) == spaces.of(store, new)
    values = {"store": store, "name": "served", "index_type": "flat", "promote": False}
    first = build_index.run(config.parse(build_index.BuildIndexParams, {**values, "model_run": "tiny"}))
    second = build_index.run(config.parse(build_index.BuildIndexParams, {**values, "model_run": "kept-space"}))
    assert second.stats["segments_kept"] == 0 and second.stats["rows_encoded"] == first.stats["rows"]
