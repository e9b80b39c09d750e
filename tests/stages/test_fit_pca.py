import logging
from datetime import date

import numpy as np
import pytest
from safetensors.numpy import load
from sklearn.decomposition import PCA

from tasks.core import catalog, config, contracts, manifest, storage
from tasks.ml.projection import load_projection
from tasks.stages import fit_pca
from tests.support.synthetic import correlated_embeddings, publish_teacher_shards

TEACHER = "synthetic-teacher"
DAYS = [date(2026, 11, 1), date(2026, 11, 2)]


@pytest.fixture
def store(store_root):
    return store_root


@pytest.fixture
def embeddings(store):
    data = correlated_embeddings(3000, 24, seed=1)
    publish_teacher_shards(store, TEACHER, DAYS[0], data[:2000], shard_rows=700)
    publish_teacher_shards(store, TEACHER, DAYS[1], data[2000:], shard_rows=700)
    return data


def _params(store, **extra):
    return config.parse(fit_pca.FitPCAParams, {"store": store, "teacher": TEACHER, "k": 6, **extra})


@pytest.mark.parametrize("mode", ["uncentered", "centered"])
def test_agrees_with_scikit_learn(store, embeddings, mode):
    result = fit_pca.run(_params(store, mode=mode))
    projection = load_projection(store, TEACHER, f"k6-{mode}")
    reference = PCA(n_components=6).fit(embeddings.astype(np.float64))
    signs = np.sign((projection.components * reference.components_).sum(axis=1))
    np.testing.assert_allclose(projection.components * signs[:, None], reference.components_, atol=1e-6)
    np.testing.assert_allclose(projection.explained_variance, reference.explained_variance_, atol=1e-4)
    np.testing.assert_allclose(projection.explained_variance_ratio, reference.explained_variance_ratio_, atol=1e-6)
    np.testing.assert_allclose(projection.mean, reference.mean_, atol=1e-5)
    assert projection.mode == mode and projection.rows == 3000

    targets = np.concatenate(
        [
            np.array(storage.read_parquet(uri).column("target").to_pylist())
            for uri in fit_pca.target_shards(store, TEACHER, f"k6-{mode}")
        ]
    )
    expected = reference.transform(embeddings) if mode == "centered" else embeddings @ reference.components_.T
    np.testing.assert_allclose(np.abs(targets), np.abs(expected), atol=1e-4)
    assert result.stats["rows_fitted"] == 3000
    manifest.validate(result.manifest.document)


def test_artifact_summary_and_target_contract(store, embeddings):
    result = fit_pca.run(_params(store))
    uris = {o.uri.rsplit("/", 1)[1]: o for o in result.outputs}
    tensors = load(storage.read_bytes(uris["pca.safetensors"].uri))
    assert tensors["components"].shape == (6, 24) and tensors["mean"].shape == (24,)
    summary = storage.read_bytes(uris["summary.json"].uri).decode()
    assert '"mode": "uncentered"' in summary
    target_uris = fit_pca.target_shards(store, TEACHER, "k6-uncentered")
    assert len(target_uris) == 5  # one per teacher shard
    table = storage.read_parquet(target_uris[0])
    assert contracts.identify(table.schema) == ("projected_targets", 1)
    assert table.schema.metadata[contracts.META_DIM] == b"6"
    assert fit_pca.run(_params(store)).skipped


def test_row_cap_samples_deterministically(store, embeddings):
    capped = fit_pca.run(_params(store, max_rows=1000, name="capped", write_targets=False))
    rows = capped.stats["rows_fitted"]
    assert 850 < rows < 1150
    again = fit_pca.run(_params(store, max_rows=1000, name="capped", write_targets=False), force=True)
    assert again.stats["rows_fitted"] == rows
    first, second = (load_projection(store, TEACHER, "capped") for _ in range(2))
    np.testing.assert_array_equal(first.components, second.components)


def test_partition_selection(store, embeddings):
    result = fit_pca.run(_params(store, partitions=[DAYS[1]], name="day2"))
    assert result.stats["rows_fitted"] == 1000
    assert len(result.manifest.inputs) == 2


def test_bad_requests_are_clear(store, embeddings):
    with pytest.raises(fit_pca.PCAError, match="k=40 exceeds the embedding dimension 24"):
        fit_pca.run(_params(store, k=40))
    with pytest.raises(fit_pca.PCAError, match=r"5 sentences shard\(s\) not encoded by 'other'"):
        fit_pca.run(_params(store, teacher="other"))
    with pytest.raises(config.ConfigError, match="k"):
        _params(store, k=0)
    assert manifest.list_keys(store, "fit_pca") == []


def test_the_run_logs_its_inputs_fit_progress_outputs_and_skip(store, embeddings, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    result = fit_pca.run(_params(store))
    by_logger = {}
    for record in caplog.records:
        by_logger.setdefault(record.name, []).append(record.getMessage())
    key = catalog.pca_key(TEACHER, "k6-uncentered")
    run_lines = by_logger["tasks.core.manifest"]
    assert run_lines[0].startswith(
        f"fit_pca {key}: started run {result.manifest.run_id} in {store}; inputs: 5 object(s)"
    )
    assert ", 3,000 rows, " in run_lines[0] and f'fit_pca {key}: params teacher="{TEACHER}", ' in run_lines[6]
    assert f"fit_pca {key}: running: no manifest at {result.manifest_uri}" in run_lines
    assert [line.split(": phase ")[1].split(" took ")[0] for line in run_lines if ": phase " in line] == [
        "accumulate",
        "eigendecomposition",
        "write_artifact",
        "write_targets",
    ]
    assert f"fit_pca {key}: ... and 2 more outputs (listed at DEBUG)" in run_lines  # 2 artifacts + 5 target shards
    assert run_lines[-1].startswith(f"fit_pca {key}: published 7 object(s), ")
    stage_lines = by_logger["tasks.stages.fit_pca"]
    explained = result.stats["explained_variance_ratio_sum"]
    fitted = f"fit_pca {key}: fitted k=6 (uncentered) on 3000 of 3000 rows, dim 24: explained variance ratio "
    assert f"{fitted}{explained:.4f} in all" in " ".join(stage_lines)
    assert any(line.startswith("fit_pca accumulate: finished 3,000/3,000 rows (100.0%) in ") for line in stage_lines)
    assert any(line.startswith(f"fit_pca {key} targets: finished 3,000/3,000 rows") for line in stage_lines)

    caplog.clear()
    assert fit_pca.run(_params(store)).skipped
    skip = [r.getMessage() for r in caplog.records if ": skipped: " in r.getMessage()]
    assert skip == [f"fit_pca {key}: skipped: {result.manifest_uri} matches, and its 7 output(s) are intact"]
