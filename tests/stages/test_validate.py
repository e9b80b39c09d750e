import gzip
import html
import json
import logging
import re
import threading
from datetime import date
from pathlib import Path

import numpy as np
import pytest

from tasks.core import catalog, config, manifest, storage
from tasks.core.catalog import Pointer, Stage
from tasks.stages import validate
from tasks.stages.validate.records import DevVersusPromoted
from tests.support.projected_store import PCA_NAME, STS_DEV_SELECTION, corpus_lines, distill_tiny, projected_store

pytestmark = pytest.mark.models

DAY = date(2026, 11, 1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Staged + encoded + projected (k=8) corpus and two distilled tiny students, 'good' and 'short'."""
    prepared = projected_store(tmp_path_factory.mktemp("validate"), corpus_lines(300), DAY, shard_rows=150)
    for name, steps in (("good", 20), ("short", 1)):
        # random batches: on 300 sentences, 20 length-grouped steps do not move 'good' past its initial weights
        distill_tiny(prepared, name, max_steps=steps, lr=1e-3, length_grouped=False, **STS_DEV_SELECTION)
    return prepared["store"]


def _validate(store, **extra):
    return validate.run(config.parse(validate.ValidateParams, {"store": store, "retrieval_sample": 100, **extra}))


def test_first_run_compares_with_the_baseline_and_promotes(store, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    pairs = tmp_path / "pairs.csv"
    pairs.write_text(
        "sentence1,sentence2,score\nA cat sleeps.,A cat is sleeping.,5\nA cat sleeps.,Stocks fell.,0\n"
        "Rain today.,It rains today.,4\n"
    )
    result = _validate(store, model_run="good", pair_files=[str(pairs)], max_regression=100.0)
    stats = result.stats
    assert set(stats["sts"]) == {"teacher", "teacher + PCA", "student", "baseline (base model + PCA)"}
    assert set(stats["sts"]["student"]) == {"STS-B test", "SICK-R test", "pairs.csv"}
    assert all(-100 <= v <= 100 for row in stats["sts"].values() for v in row.values())
    assert 0 <= stats["retrieval"]["recall_at_10_vs_teacher"] <= 1 and 0 < stats["retrieval"]["mrr_stsb_ge4"] <= 1
    assert stats["fidelity"]["val_mse"] > 0
    baseline = stats["sts"]["baseline (base model + PCA)"]
    assert stats["gate"] == {
        "passed": True,
        "reasons": ["all checks passed"],
        "reference": "baseline",
        "reference_scores": {k: baseline[k] for k in validate.GATED},
        "rules": [  # max_regression 100: each score may fall 100 points below the baseline's
            {
                "score": k,
                "rule": "regression",
                "value": stats["sts"]["student"][k],
                "threshold": round(baseline[k] - 100, 4),
                "passed": True,
            }
            for k in validate.GATED
        ],
    }
    current = json.loads(storage.read_bytes(catalog.pointer_uri(store, Pointer.MODEL)))
    assert current["model_run"] == "good" and current["scores"] == stats["sts"]["student"]
    lines = [r.getMessage() for r in caplog.records if r.name.startswith("tasks.stages.validate")]
    student = stats["sts"]["student"]
    assert (
        f"validate good: STS of student: STS-B test {student['STS-B test']:.2f}, "
        f"SICK-R test {student['SICK-R test']:.2f}, pairs.csv {student['pairs.csv']:.2f}"
    ) in lines
    report = next(o.uri for o in result.outputs if o.uri.endswith("/report.html"))
    assert f"validate good: report {report}" in lines and "gate passed: all checks passed" in lines
    assert any(line.startswith("validate good STS: finished 12/12 pair sets (100.0%) in ") for line in lines)
    assert f"promoted good: {catalog.pointer_uri(store, Pointer.MODEL)} names it now" in lines
    assert _validate(store, model_run="good", pair_files=[str(pairs)], max_regression=100.0).skipped


def test_the_gate_refuses_and_the_pointer_stays(store):
    _validate(store, model_run="good", max_regression=100.0)  # promotes 'good' (a skip if already done)
    before = storage.read_bytes(catalog.pointer_uri(store, Pointer.MODEL))
    result = _validate(store, model_run="short", min_stsb=99.0, max_regression=0.0)
    gate = result.stats["gate"]
    assert gate["passed"] is False
    assert any("below the minimum 99.00" in reason for reason in gate["reasons"])
    (dev,) = [rule for rule in gate["rules"] if rule["score"] == "STS dev (mean)"]  # 'short' against 'good' on dev
    assert dev["passed"] == (dev["value"] >= dev["threshold"]) and dev["rule"] == "regression"
    assert gate["reference"] == "promoted model good"
    assert storage.read_bytes(catalog.pointer_uri(store, Pointer.MODEL)) == before
    versus = result.stats["versus_promoted"]  # 'short' against the promoted 'good'
    promoted = json.loads(before)["scores"]
    student = result.stats["sts"]["student"]
    assert versus["run"] == "good"
    assert versus["sts_delta"] == {s: round(student[s] - promoted[s], 2) for s in validate.GATED}
    assert versus["neighbours"]["queries"] == 100 and 0 <= versus["neighbours"]["overlap_at_10"] < 1
    differences = {row["name"]: (row["a"], row["b"]) for row in versus["differences"]}
    assert differences["params.max_steps"] == (1, 20) and differences["gate"] == ("failed", "passed")
    assert differences["validate.params.min_stsb"] == (99.0, None) and "params.teacher" not in differences
    page = storage.read_bytes(result.manifest.output_named("report.html").uri).decode()
    text = _visible_text(page)
    assert "Compared with the promoted run good . Student STS, this run minus promoted: STS-B test" in text
    assert "params.max_steps 1 20" in text
    assert f"Neighbour overlap@10: {versus['neighbours']['overlap_at_10']:.4f}" in text


def test_gate_rules_by_hand(caplog):
    caplog.set_level(logging.INFO, logger="tasks")
    params = config.parse(validate.ValidateParams, {"model_run": "x", "min_sickr": 70, "max_regression": 1.0})
    reference = {"STS-B test": 80.0, "SICK-R test": 75.0}
    ok = validate.promotion.decide({"STS-B test": 79.5, "SICK-R test": 74.5}, reference, "baseline", params)
    assert ok.passed
    assert caplog.messages == [
        "gate STS-B test: 79.50, threshold 79.00 (the baseline's 80.00 less 1.00): pass",
        "gate SICK-R test: 74.50, threshold 70.00 (minimum): pass",
        "gate SICK-R test: 74.50, threshold 74.00 (the baseline's 75.00 less 1.00): pass",
        "gate passed: all checks passed",
    ]
    caplog.clear()
    bad = validate.promotion.decide({"STS-B test": 78.9, "SICK-R test": 69.0}, reference, "baseline", params)
    assert not bad.passed and len(bad.reasons) == 3
    assert caplog.messages[:3] == [
        "gate STS-B test: 78.90, threshold 79.00 (the baseline's 80.00 less 1.00): FAIL",
        "gate SICK-R test: 69.00, threshold 70.00 (minimum): FAIL",
        "gate SICK-R test: 69.00, threshold 74.00 (the baseline's 75.00 less 1.00): FAIL",
    ]
    assert caplog.messages[3] == "gate failed: " + "; ".join(bad.reasons)


def test_a_retrain_worse_on_the_dev_sets_than_the_promoted_model_fails_by_the_tolerance(caplog):
    """Against a promoted model, the mean STS dev score may fall max_dev_regression (0.2) points below its, no more,
    whatever the test scores; without one (a first run) there is no such rule."""
    caplog.set_level(logging.INFO, logger="tasks")
    decide = validate.promotion.decide
    params = config.parse(validate.ValidateParams, {"model_run": "x", "max_regression": 100.0})
    reference, scores = {"STS-B test": 80.0, "SICK-R test": 75.0}, {"STS-B test": 81.0, "SICK-R test": 76.0}
    within = DevVersusPromoted(run="p", student=79.85, promoted=80.0)
    worse = within.model_copy(update={"student": 79.7})
    assert decide(scores, reference, "promoted model p", params, within).passed
    assert (
        "gate STS dev (mean): 79.85, threshold 79.80 (the promoted model p's 80.00 less 0.20): pass" in caplog.messages
    )
    refused = decide(scores, reference, "promoted model p", params, worse)
    assert not refused.passed
    assert refused.reasons == ["STS dev (mean) 79.70 regresses more than 0.20 below the promoted model p's 80.00"]
    (rule,) = [r for r in refused.rules if r.score == "STS dev (mean)"]
    assert (rule.rule, rule.value, rule.threshold, rule.passed) == ("regression", 79.7, 79.8, False)
    looser = params.model_copy(update={"max_dev_regression": 1.0})
    assert decide(scores, reference, "promoted model p", looser, worse).passed
    assert [r.score for r in decide(scores, reference, "baseline", params).rules] == list(validate.GATED)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("first,second,score\na,b,1\n", "missing \\['sentence1', 'sentence2'\\]"),
        ("sentence1,sentence2,score\na,b,high\n", "line 2: score 'high' is not a number"),
        ("sentence1,sentence2,score\na,b\n", "line 2: score '' is not a number"),
        ("sentence1,sentence2,score\n", "needs columns sentence1, sentence2, score \\(missing \\[\\]\\)"),
        (b"\x89PNG\r\n\x1a\n\xff\xfe", "not UTF-8 text \\(byte 0\\)"),
        (b"sentence1,sentence2,score\na\x00,b,1\n", "binary, not CSV or TSV text"),
        (b"\x1f\x8b\x08\x00truncated", "not a readable gzip file"),
    ],
)
def test_bad_pair_files_are_named(tmp_path, content, message):
    path = tmp_path / "pairs.csv"
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(validate.ValidateError, match=f"^{path.as_uri()}: .*{message}"):
        validate.read_pairs(storage.to_uri(str(path)))


def test_a_gzipped_tsv_pair_file_reads(tmp_path):
    path = tmp_path / "pairs.tsv.gz"
    path.write_bytes(gzip.compress(b"sentence1\tsentence2\tscore\na, b\tc\t4.5\nd\te\t1\n"))
    pairs = validate.read_pairs(storage.to_uri(str(path)))
    assert (pairs.first, pairs.second, pairs.scores.tolist()) == (["a, b", "d"], ["c", "e"], [4.5, 1.0])


def test_unknown_model_run(store):
    with pytest.raises(validate.ValidateError, match="no published distill run 'nope'"):
        _validate(store, model_run="nope")


def test_report_renders_offline_in_headless_chromium(store, tmp_path):
    import subprocess

    from PIL import Image

    from tasks.core import manifest
    from tasks.stages import quality

    teacher = manifest.read(store, "distill", "good").params["teacher"]
    quality.run(
        config.parse(
            quality.QualityParams, {"store": store, "ingest_date": DAY, "teacher": teacher, "pca_name": PCA_NAME}
        )
    )
    result = _validate(store, model_run="good", max_regression=100.0, promote=False, retrieval_sample=120)
    page_uri = next(o.uri for o in result.outputs if o.uri.endswith("report.html"))
    page = storage.read_bytes(page_uri).decode()
    assert "http://" not in page and "https://" not in page  # nothing to fetch: it works offline
    path = tmp_path / "report.html"
    path.write_text(page)
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--window-size=1200,2400",
    ]
    shot = tmp_path / "shot.png"
    subprocess.run(
        ["chromium", *flags, f"--screenshot={shot}", path.as_uri()], check=True, capture_output=True, timeout=120
    )
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.std() > 10 and (pixels < 200).mean() > 0.02  # not blank: text, tables and plots drawn
    dom = subprocess.run(
        ["chromium", *flags, "--dump-dom", path.as_uri()], check=True, capture_output=True, text=True, timeout=120
    ).stdout
    assert dom.count("<table") >= 3 and dom.count('src="data:image/png;base64,') == 4
    assert "Quality gate" in dom and "STS-B test" in dom and "Lineage" in dom
    assert dom.count(">5/5<") == 2 and ">4/4<" in dom  # the sentences shards' and embeddings' suites all passed
    text = _visible_text(dom)
    assert f"model run good validated {result.manifest.document['started_at'][:10]}" in text
    assert f"code version {manifest.code_version()} trained on partitions {DAY} teacher {teacher}" in text
    assert f"PCA {PCA_NAME}" in text and dom.count("<tr><td>STS-B test</td><td>no regression below the") == 1
    assert 'id="drift"' in dom and "Drift score 0.0000, below the threshold 0.2500" in text  # its own data
    assert f"Partitions {DAY} against those of good: {DAY}" in text
    assert _LONG_DECIMALS.findall(text) == []
    assert "fidelity of the blend 0.25 (initial toward step 20) sts_dev " in text  # the defaults score blends
    assert f"{catalog.partition_key(DAY)} Data Docs" in text  # the quality run of the partition it trained on
    href = re.search(r'<a class="data-docs" href="([^"]+)"', dom).group(1)
    assert (
        not href.startswith(("/", "file:"))
        and (Path(page_uri.removeprefix("file://")).parent / href).resolve().is_file()
    )
    evals = json.loads(storage.read_bytes(manifest.read(store, "distill", "good").output_named("metrics.json").uri))
    assert len(evals["evals"]) >= 10  # eval_every unset: about 20 validations a run, a curve to read


_LONG_DECIMALS = re.compile(r"\d\.\d{5,}")


def _visible_text(page: str) -> str:
    """The page's text as a reader sees it, whitespace collapsed (style and script left out)."""
    body = re.sub(r"<(style|script)[^>]*>.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", body)).split())


def test_report_shows_the_header_the_rules_and_a_student_below_its_baseline():
    from tasks.core.stage_records import Retrieval, StsTable
    from tasks.stages.validate.records import ValidationReport
    from tasks.stages.validate.report import render
    from tasks.stages.validate.scoring import Plots, TrainingCurves

    sts = StsTable(
        teacher={"STS-B test": 83.4213, "SICK-R test": 80.49},
        teacher_pca={"STS-B test": 82.1, "SICK-R test": 79.5},
        student={"STS-B test": 79.94, "SICK-R test": 78.09},
        baseline={"STS-B test": 80.41, "SICK-R test": 78.03},
    )
    params = config.parse(validate.ValidateParams, {"model_run": "demo", "min_stsb": 75, "max_regression": 1.0})
    gate = validate.promotion.decide(sts.student, sts.baseline, "baseline", params)
    assert gate.passed
    report = ValidationReport(
        sts=sts,
        fidelity={"step": 61, "val_cosine": 0.822431004619779, "val_mse": 0.0019431913067888857},
        retrieval=Retrieval(recall_at_10_vs_teacher=0.4966, corpus_sample=2000, stsb_pairs_ge4=9, mrr_stsb_ge4=0.8),
        gate=gate,
        drift=None,
        versus_promoted=None,
    )
    rng = np.random.default_rng(0)
    curves = TrainingCurves(
        [(s, 0.002 - s * 1e-5) for s in range(1, 41)], [(s, 0.0021 - s * 1e-5) for s in range(0, 41, 4)]
    )
    norms = {"teacher": np.ones(200), "student": rng.normal(4, 0.3, 200)}
    plots = Plots(np.full(8, 0.1), curves, rng.random(50), rng.random(50) * 5, norms)
    header = [("model run", "demo"), ("validated", "2026-11-30 15:20 UTC"), ("code version", "git:abc")]
    page = render("Validation of demo", report, plots, [], {}, header, None)
    text = _visible_text(page)
    assert "model run demo validated 2026-11-30 15:20 UTC code version git:abc" in text
    assert "Quality gate: passed" in text and "all checks passed" not in text
    assert (
        "Warning: the student is below its same-size baseline by 0.47 points on STS-B test (79.94 against 80.41)."
    ) in text and "on SICK-R test" not in text  # 78.09 is above the baseline's 78.03
    assert "score rule threshold value margin result" in text
    assert "STS-B test minimum 75.00 79.94 +4.94 pass" in text
    assert "STS-B test no regression below the baseline 79.41 79.94 +0.53 pass" in text
    assert "SICK-R test no regression below the baseline 77.03 78.09 +1.06 pass" in text
    assert "student 79.94 ▼ 78.09" in text and "teacher 83.42 80.49" in text
    assert "fidelity val_cosine 0.8224 fidelity val_mse 1.943e-03" in text
    assert _LONG_DECIMALS.findall(text) == [] and _LONG_DECIMALS.findall(page.split("<body>")[1]) == []
    assert page.count('src="data:image/png;base64,') == 4


def test_report_marks_a_training_partition_no_quality_run_checked():
    from tasks.stages.quality import QualityResults
    from tasks.stages.validate.report_parts import quality_section

    checks = [{"uri": "s3://b/s/sentences/x.parquet", "suite": "sentences", "rows": 120, "expectations": []}]
    results = QualityResults(partition="ingest_date=2026-11-02", checks=checks)
    quality = {"ingest_date=2026-11-01": None, "ingest_date=2026-11-02": results}
    text = _visible_text(quality_section(quality, "validation/run/0123456789ab/report.html"))
    assert "ingest_date=2026-11-01: no data-quality run is published ( hpd quality --ingest-date 2026-11-01 )" in text
    assert "ingest_date=2026-11-02 shard suite rows passed s3://b/s/sentences/x.parquet sentences 120 0/0" in text
    assert "Data Docs" not in text


def test_report_warns_when_the_training_data_drifted():
    from tasks.stages.drift import TrainingDrift
    from tasks.stages.validate.records import DriftNotMeasured
    from tasks.stages.validate.report_parts import drift_section

    profile = {"rows": 500, "reconstruction_error": 0.458224}
    drift = {
        "reference_run": "old",
        "partitions": ["2026-11-30", "2026-12-02"],
        "reference_partitions": ["2026-11-30"],
        "score": 0.605767,
        "threshold": 0.25,
        "flagged": True,
        "components": {"direction": 0.64138, "vocabulary": 0.710235},
        "weights": {"direction": 0.3, "vocabulary": 0.3},
        "partition": profile,
        "reference": {"rows": 2000, "reconstruction_error": 0.261541},
    }
    text = _visible_text(drift_section(TrainingDrift.model_validate(drift)))
    assert text.startswith("Drift flagged: score 0.6058 reaches the threshold 0.2500.")
    assert "Partitions 2026-11-30, 2026-12-02 against those of old: 2026-11-30." in text
    assert "direction 0.6414 0.3000" in text and "reconstruction_error 0.4582 0.2615" in text
    assert _visible_text(drift_section(None)) == "No promoted model to compare with."
    unmeasured = drift_section(DriftNotMeasured(reference_run="old", error="1 sentences shard(s) not encoded"))
    assert _visible_text(unmeasured) == "Drift not measured: 1 sentences shard(s) not encoded"


def test_the_validated_card_carries_the_test_scores_the_overlap_and_the_verdict(store):
    """The validation publishes the student's card with what it measured: the test scores and the neighbour overlap
    as model-index results of Hub tasks, and a section with the STS table, the gate's verdict and the training data
    in place of the note that validation is to come."""
    from huggingface_hub import ModelCard

    result = _validate(store, model_run="good", max_regression=100.0)
    stats = result.manifest.stats
    validated = ModelCard(storage.read_bytes(result.manifest.output_named("model_card.md").uri).decode())
    found = {(r.dataset_name, r.metric_type): r for r in validated.data.eval_results}
    student = stats["sts"]["student"]
    assert found[("STS Benchmark", "spearman_cosine")].metric_value == round(student["STS-B test"] / 100, 5)
    assert found[("SICK-R", "spearman_cosine")].dataset_split == "test"
    overlap = next(r for (name, metric), r in found.items() if metric == "recall_at_10")
    assert overlap.metric_value == round(stats["retrieval"]["recall_at_10_vs_teacher"], 5)
    assert {r.task_type for r in validated.data.eval_results} <= {"sentence-similarity", "feature-extraction"}
    text = validated.text
    assert f"Validated by run `{result.manifest.run_id}`: the quality gate passed" in text
    assert f"| student | {student['STS-B test']:.2f} | {student['SICK-R test']:.2f} |" in text
    assert "Training data: 300 staged sentences of the store's partitions 2026-11-01" in text
    assert "The test scores (STS-B test, SICK-R test, retrieval) and the quality gate are measured" not in text


class _Killed(BaseException):
    """Ends a run where a kill would, past every ``except Exception``."""


def test_a_rerun_completes_a_model_promotion_its_run_did_not_finish(store, monkeypatch, caplog):
    """Last in the module: it leaves 'short' promoted."""
    _validate(store, model_run="good", max_regression=100.0)  # promotes 'good' (a skip if already done)
    caplog.set_level(logging.INFO, logger="tasks")
    with monkeypatch.context() as patch:  # killed between publishing its manifest and moving the pointer
        patch.setattr(validate.promotion, "promote_model", lambda *args: (_ for _ in ()).throw(_Killed()))
        with pytest.raises(_Killed):  # its gate open (tiny students' scores are noise)
            _validate(store, model_run="short", max_regression=100.0, max_dev_regression=100.0)
    assert catalog.read_pointer(store, Pointer.MODEL)[0].model_run == "good"
    rerun = _validate(store, model_run="short", max_regression=100.0, max_dev_regression=100.0)
    promoted, _ = catalog.read_pointer(store, Pointer.MODEL)
    assert rerun.skipped and promoted.model_run == "short"
    assert promoted.scores == rerun.stats["sts"]["student"]
    assert "validate short: published but its pointer move unfinished" in caplog.messages
    assert _validate(store, model_run="good", max_regression=100.0).skipped
    assert catalog.read_pointer(store, Pointer.MODEL)[0].model_run == "short"  # never taken back by a rerun
    assert "validate good: superseded: the pointer moved since this run read it" in caplog.messages


def test_two_promotions_at_once_have_one_winner(store):
    """Last in the module, after the one that leaves 'short' promoted: both race from another pointer's version
    (re-promoting 'short' over itself would write the same bytes, and no version would change)."""
    current, seen = catalog.read_pointer(store, Pointer.MODEL)
    catalog.move_pointer(store, catalog.ModelPointer("earlier", {}, current.validation, current.model), seen)
    _, seen = catalog.read_pointer(store, Pointer.MODEL)
    barrier, outcomes = threading.Barrier(2), []

    def promote(model_run):
        barrier.wait()
        published = manifest.read(store, Stage.VALIDATE, model_run)
        try:
            validate.promotion.promote_model(store, published, seen)
            outcomes.append(model_run)
        except validate.ValidateError as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=promote, args=(run,)) for run in ("good", "short")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    [winner] = [o for o in outcomes if isinstance(o, str)]
    [lost] = [o for o in outcomes if isinstance(o, validate.ValidateError)]
    assert "another promotion happened since this validation started" in str(lost)
    assert catalog.read_pointer(store, Pointer.MODEL)[0].model_run == winner
