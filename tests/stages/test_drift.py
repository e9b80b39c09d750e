"""The drift stage with tiny models: a partition of unrelated, shuffled text is flagged against the promoted
model's training data, a disjoint sample of the same corpus is not; profiles are made once and verified. Every
partition is profiled from the teacher's sample of it (SAMPLE of its ROWS rows), as the pipeline encodes it."""

import logging
import random
from datetime import date

import pytest

from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Pointer, Stage
from tasks.stages import drift, encode_teacher, profiles, stage_corpus
from tests.support.paths import REPO
from tests.support.projected_store import PCA_NAME, corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

TRAINED, SAME, SHUFFLED, RANDOM = date(2026, 11, 1), date(2026, 11, 2), date(2026, 11, 3), date(2026, 11, 4)
ROWS = 400
SAMPLE = 200  # the teacher's sample of each partition: what drift is computed from


def _shuffled_text(rows: int) -> list[str]:
    """Lines of 3-25 words drawn, shuffled, from the vendored STS benchmark's readme and licence: unrelated text."""
    folder = REPO / "tasks" / "ml" / "sts_sets" / "stsbenchmark"
    words = "".join((folder / name).read_text() for name in ("readme.txt", "LICENSE.txt")).split()
    rng = random.Random(7)
    return [" ".join(rng.sample(words, rng.randint(3, 25))) for _ in range(rows)]


def _random_strings(rows: int) -> list[str]:
    """Lines of random lower-case "words": text from no language at all."""
    rng = random.Random(11)
    word = lambda: "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(2, 9)))  # noqa: E731
    return [" ".join(word() for _ in range(rng.randint(2, 12))) for _ in range(rows)]


def _add_partition(prepared: dict[str, str], lines: list[str], day: date) -> None:
    source = prepared["root"] / f"raw-{day}.txt"
    source.write_text("\n".join(lines))
    values = {"store": prepared["store"], "source": str(source), "ingest_date": day}
    stage_corpus.run(config.parse(stage_corpus.StageCorpusParams, values))
    values = {"store": prepared["store"], "teacher": prepared["teacher"], "ingest_date": day, "teacher_sample": SAMPLE}
    encode_teacher.run(config.parse(encode_teacher.EncodeTeacherParams, values))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A model run trained on one corpus sample and promoted; then a disjoint sample of the same corpus,
    word-shuffled unrelated text and random strings staged and encoded as three new partitions."""
    root = tmp_path_factory.mktemp("drift")
    lines = corpus_lines(2 * ROWS)
    prepared = {**projected_store(root, lines[:ROWS], TRAINED, shard_rows=200, teacher_sample=SAMPLE), "root": root}
    distill_tiny(prepared, "trained", max_steps=2)
    validation = catalog.manifest_uri(prepared["store"], Stage.VALIDATE, "trained")
    catalog.move_pointer(prepared["store"], catalog.ModelPointer("trained", {}, validation), None)
    _add_partition(prepared, lines[ROWS:], SAME)
    _add_partition(prepared, _shuffled_text(ROWS), SHUFFLED)
    _add_partition(prepared, _random_strings(ROWS), RANDOM)
    return prepared


def _drift(prepared, day, **extra) -> manifest.StageResult:
    values = {"store": prepared["store"], "ingest_date": day, **extra}
    return drift.run(config.parse(drift.DriftParams, values))


@pytest.mark.parametrize("unrelated", [SHUFFLED, RANDOM])
def test_unrelated_text_is_flagged_and_a_same_distribution_sample_is_not(prepared, unrelated, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    same, other = _drift(prepared, SAME).stats, _drift(prepared, unrelated).stats
    assert same["model_run"] == other["model_run"] == "trained"
    assert same["reference_partitions"] == [TRAINED.isoformat()]
    assert not same["flagged"] and other["flagged"]
    assert same["score"] < same["threshold"] <= other["score"]
    assert other["score"] > 1.8 * same["score"]  # from samples of half the rows: a noisier vocabulary than all rows
    assert other["components"]["vocabulary"] > same["components"]["vocabulary"]
    assert any("DRIFT" in m and unrelated.isoformat() in m for m in caplog.messages)


def test_a_partition_against_its_own_training_data_has_no_drift(prepared):
    stats = _drift(prepared, TRAINED).stats
    assert stats["score"] == pytest.approx(0.0, abs=1e-9) and not stats["flagged"]
    assert stats["partition"] == stats["reference"]


def test_a_lower_threshold_flags_the_same_sample(prepared):
    score = _drift(prepared, SAME).stats["score"]
    assert _drift(prepared, SAME, threshold=score / 2).stats["flagged"]


def test_profiles_are_published_once_and_the_comparison_skips_when_nothing_changed(prepared):
    first = _drift(prepared, SAME)
    assert _drift(prepared, SAME).skipped
    key = catalog.profile_key(prepared["teacher"], PCA_NAME, SAME)
    profiled = manifest.read(prepared["store"], Stage.PROFILE, key)
    assert profiled.stats["rows"] == SAMPLE and 0 < profiled.stats["explained_variance_ratio"] <= 1
    assert {i.uri for i in first.manifest.inputs} >= {o.uri for o in profiled.outputs}
    assert storage.exists(first.outputs[0].uri)


def test_a_tampered_profile_is_refused(prepared):
    output = profiles.ensure(prepared["store"], prepared["teacher"], PCA_NAME, SAME)
    storage.write_bytes(output.uri, storage.read_bytes(output.uri).replace(b'"rows": ', b'"rows": 1'))
    with pytest.raises(storage.IntegrityError):
        profiles.read(output)
    storage.delete(output.uri)  # the profile is made again on the next use
    assert profiles.ensure(prepared["store"], prepared["teacher"], PCA_NAME, SAME).sha256 == output.sha256


def test_without_a_promoted_model_it_says_so(store_root):
    with pytest.raises(profiles.DriftError, match="no promoted model"):
        _drift({"store": store_root}, SAME)
    assert storage.list_uris(catalog.pointer_uri(store_root, Pointer.MODEL)) == []


def test_hpd_drift_prints_the_comparison(prepared, capsys):
    from tasks import cli

    argv = ["drift", "--store", prepared["store"], "--ingest-date", RANDOM.isoformat()]
    assert cli.main([*argv, "--output", "table"]) == 0
    table = capsys.readouterr().out
    assert table.startswith(f"ingest_date={RANDOM} against the training data of trained ({TRAINED}): score ")
    assert table.splitlines()[0].endswith(": DRIFT") and "reconstruction_error" in table and "vocabulary " in table
    assert cli.main(argv) == 0
    assert '"flagged": true' in capsys.readouterr().out
    assert cli.main([*argv, "--threshold", "2"]) == 2  # a threshold above 1 is refused


def test_between_runs_compares_two_runs_training_data(prepared):
    distilled = manifest.read(prepared["store"], Stage.DISTILL, "trained")
    assert drift.between_runs(prepared["store"], distilled, None) is None
    same = drift.between_runs(prepared["store"], distilled, "trained")
    assert same.partitions == same.reference_partitions == [TRAINED.isoformat()]
    assert same.reference_run == "trained" and same.score == 0.0 and not same.flagged
