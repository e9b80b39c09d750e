"""bench/student_throughput.py on tiny models: int8 really quantises every Linear and stays close to fp32, the ONNX
graphs encode as the student does, the result has a row for every variant, the export rule decides as documented,
a retrained student gets new score keys, the students come from published distill runs."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from bench import distill_quality, student_throughput
from tasks.core import storage
from tasks.ml import sts, student
from tasks.ml.encoder import SentenceEncoder
from tests.support.tiny_models import build_sentence_model

pytestmark = pytest.mark.models

FLOATS = ("fp32", "bf16")
PER_STUDENT = (*FLOATS, *student_throughput.EXPORTS)
VARIANTS = [f"{model} {variant}" for model in ("MiniLM-L6", "MiniLM-L3") for variant in PER_STUDENT]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny teacher (48-d) and two tiny exported students (8-d Dense(tanh) heads, 2 and 1 layers)."""
    root = tmp_path_factory.mktemp("tiny")
    base = str(build_sentence_model(root / "base", hidden=32, seed=2))
    folders = {"teacher": build_sentence_model(root / "teacher", hidden=48, seed=1)}
    for name, layers in (("MiniLM-L6", 2), ("MiniLM-L3", 1)):
        torch.manual_seed(layers)
        student.build(base, 8, layers=layers).save(root / name)
        folders[name] = root / name
    return folders


def _linears(module: torch.nn.Module, kind: type) -> int:
    return sum(type(m) is kind for m in module.modules())


def test_int8_quantises_every_linear_and_keeps_the_embeddings(tiny: dict[str, Path]):
    encoder = SentenceEncoder.load(str(tiny["MiniLM-L6"]))
    linears = _linears(encoder, torch.nn.Linear)
    int8 = student_throughput.quantized(encoder)
    dynamic = torch.ao.nn.quantized.dynamic.Linear
    assert linears > 0 and _linears(int8, dynamic) == linears and _linears(int8, torch.nn.Linear) == 0
    assert _linears(encoder, torch.nn.Linear) == linears  # the fp32 student is left as it was
    texts = student_throughput.corpus_sentences(40)
    fp32 = student_throughput.encode_of(encoder, "fp32")(texts)
    quantised = student_throughput.encode_of(int8, "fp32")(texts)
    assert quantised.shape == fp32.shape == (40, 8) and quantised.dtype == np.float32
    assert sts.cosine(fp32, quantised).min() > 0.99
    assert not np.array_equal(fp32, quantised)


def _pair_scorer(calls: list[str]) -> student_throughput.Scorer:
    """Scores on the first 40 pairs of each test set (real Spearman x100), recording the keys asked for."""
    sets = {on: distill_quality.SETS[on]() for on in student_throughput.TEST_SETS}
    small = {on: sts.PairSet(on, p.first[:40], p.second[:40], p.scores[:40]) for on, p in sets.items()}

    def score(key: str, factory):
        calls.append(key)
        encode = factory()
        return {on: round(sts.score(encode, pairs), 2) for on, pairs in small.items()}

    return score


def test_onnx_variants_encode_as_the_student_does(tiny: dict[str, Path], tmp_path: Path):
    encoder = SentenceEncoder.load(str(tiny["MiniLM-L6"]))
    graphs = student_throughput.onnx_variants(encoder, tmp_path)
    assert set(graphs) == {"onnx fp32", "onnx int8"} and all(v.dim == 8 for v in graphs.values())
    texts = student_throughput.corpus_sentences(40)
    expected = encoder.encode(texts, batch_size=64)
    np.testing.assert_allclose(graphs["onnx fp32"].encode(texts), expected, atol=1e-4)
    int8 = graphs["onnx int8"].encode(texts)
    assert sts.cosine(expected, int8).min() > 0.95 and not np.allclose(expected, int8, atol=1e-6)


def test_benchmark_has_every_variant_side_by_side(tiny: dict[str, Path], tmp_path: Path):
    teacher = SentenceEncoder.load(str(tiny["teacher"]))
    students = {name: SentenceEncoder.load(str(tiny[name])) for name in ("MiniLM-L6", "MiniLM-L3")}
    measured = student_throughput.variants(teacher, students, tmp_path, floats=FLOATS)
    keys = student_throughput.score_keys({name: tiny[name] for name in students}, floats=FLOATS, dtype="bf16")
    calls: list[str] = []
    texts = student_throughput.corpus_sentences(24)
    details = student_throughput.benchmark(measured, texts, 2, keys, _pair_scorer(calls), dtype="bf16")
    rows = details["table"]
    assert list(rows) == ["teacher fp32", "teacher bf16", *VARIANTS]
    assert calls == [keys[name] for name in rows if name != "teacher fp32"]  # the teacher is scored in bf16 only
    assert rows["teacher fp32"]["STS-B test"] is None and rows["teacher bf16"]["STS-B test"] is not None
    for name, row in rows.items():
        assert row["sentences_per_s"] > 0 and set(student_throughput.TEST_SETS) <= set(row)
        assert row["dim"] == (48 if name.startswith("teacher") else 8)
        assert row["index_bytes_per_vector"] == row["dim"] * 4
        assert len(details["seconds"][name]) == 2
    pair = details["like_for_like"]
    assert (pair["ours"], pair["baseline"]) == ("MiniLM-L6 bf16", "teacher bf16")
    assert pair["ours_per_s"] == rows["MiniLM-L6 bf16"]["sentences_per_s"]
    onnx = details["onnx_vs_pytorch_fp32"]["MiniLM-L3"]
    assert (onnx["ours"], onnx["baseline"]) == ("MiniLM-L3 onnx fp32", "MiniLM-L3 fp32")
    assert set(details["exports"]) == {"MiniLM-L6", "MiniLM-L3"}
    for decisions in details["exports"].values():
        assert set(decisions) == set(student_throughput.EXPORTS)
        assert all(isinstance(d["worth_exporting"], bool) for d in decisions.values())
    assert set(details["load_average_1min"]) == {"start", "end"} and details["threads"] == torch.get_num_threads()


def _rows(fp32: float, bf16: float, int8: float, stsb: float, sick: float) -> dict[str, dict]:
    """Hand-made rows of student S: the speed of each precision; fp32 and bf16 score 80 and 70, int8 as given."""
    floats = {
        f"S {p}": {"sentences_per_s": speed, "STS-B test": 80.0, "SICK-R test": 70.0}
        for p, speed in (("fp32", fp32), ("bf16", bf16))
    }
    return floats | {"S onnx int8": {"sentences_per_s": int8, "STS-B test": stsb, "SICK-R test": sick}}


@pytest.mark.parametrize(
    ("rows", "worth", "why"),
    [
        (_rows(100, 120, 150, 79.7, 69.8), True, "within 0.3 STS"),  # a loss of exactly 0.3 is allowed
        (_rows(100, 120, 150, 81.0, 70.5), True, "faster"),  # a gain is no reason to refuse the export
        (_rows(100, 120, 150, 80.0, 69.69), False, "loses more than 0.3 STS on SICK-R test"),
        (_rows(100, 120, 110, 80.0, 70.0), False, "of S bf16 (not faster)"),  # faster than fp32 only
        (_rows(130, 120, 125, 80.0, 70.0), False, "of S fp32 (not faster)"),
    ],
)
def test_export_decision(rows: dict[str, dict], worth: bool, why: str):
    decision = student_throughput.export_decision(rows, "S", "onnx int8")
    assert decision["worth_exporting"] is worth and why in decision["why"]
    assert decision["delta_vs_fp32"] == {
        on: round(rows["S onnx int8"][on] - rows["S fp32"][on], 2) for on in student_throughput.TEST_SETS
    }
    candidate, fp32 = rows["S onnx int8"]["sentences_per_s"], rows["S fp32"]["sentences_per_s"]
    assert decision["speed_ratio_vs_fp32"] == round(candidate / fp32, 3)


def test_without_native_bf16_the_fastest_float_is_fp32():
    rows = {name: row for name, row in _rows(100, 500, 150, 80.0, 70.0).items() if name != "S bf16"}
    decision = student_throughput.export_decision(rows, "S", "onnx int8")
    assert decision["fastest_float"] == "S fp32" and decision["worth_exporting"] is True


def test_a_retrained_student_gets_new_score_keys(tiny: dict[str, Path], tmp_path: Path):
    copy = Path(shutil.copytree(tiny["MiniLM-L6"], tmp_path / "MiniLM-L6"))
    before = student_throughput.score_keys({"MiniLM-L6": copy}, floats=FLOATS, dtype="bf16")
    assert before == student_throughput.score_keys({"MiniLM-L6": tiny["MiniLM-L6"]}, floats=FLOATS, dtype="bf16")
    assert before["teacher bf16"] == "teacher" and len(set(before.values())) == len(before)
    assert set(before) == {"teacher bf16", *(f"MiniLM-L6 {v}" for v in PER_STUDENT)}
    (copy / "2_Dense" / "model.safetensors").write_bytes(b"retrained")
    after = student_throughput.score_keys({"MiniLM-L6": copy}, floats=FLOATS, dtype="bf16")
    assert all(after[name] != before[name] for name in before if name.startswith("MiniLM"))


def test_a_graph_built_otherwise_gets_a_new_score_key(tiny: dict[str, Path], tmp_path: Path):
    encoder = SentenceEncoder.load(str(tiny["MiniLM-L6"]))
    graphs = student_throughput.onnx_variants(encoder, tmp_path)
    int8 = hashlib.sha256((tmp_path / "encoder_int8.onnx").read_bytes()).hexdigest()[:16]
    assert graphs["onnx int8"].built == int8 and graphs["onnx fp32"].built not in ("", int8)
    folders = {"MiniLM-L6": tiny["MiniLM-L6"]}
    built = {f"MiniLM-L6 {name}": variant.built for name, variant in graphs.items()}
    keys = student_throughput.score_keys(folders, built, floats=FLOATS, dtype="bf16")
    requantised = student_throughput.score_keys(folders, {**built, "MiniLM-L6 onnx int8": "other"}, FLOATS, "bf16")
    assert [name for name in keys if keys[name] != requantised[name]] == ["MiniLM-L6 onnx int8"]


def test_missing_students_say_how_to_make_them(tmp_path: Path):
    with pytest.raises(SystemExit, match="python -m bench distill_quality"):
        student_throughput.student_folders(storage.to_uri(str(tmp_path)), {"MiniLM-L6": "recipe-MiniLM-L6"})


def test_students_come_from_the_runs_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("HPD_BENCH_STUDENT_STORE", str(tmp_path / "store"))
    monkeypatch.setenv("HPD_BENCH_STUDENT_RUNS", "MiniLM-L6=demo-student,MiniLM-L3=demo-l3")
    store, runs = student_throughput.student_runs()
    assert store == storage.to_uri(str(tmp_path / "store"))
    assert runs == {"MiniLM-L6": "demo-student", "MiniLM-L3": "demo-l3"}
    monkeypatch.delenv("HPD_BENCH_STUDENT_RUNS")
    assert student_throughput.student_runs() == (
        distill_quality.STORE,
        {"MiniLM-L6": "recipe-MiniLM-L6", "MiniLM-L3": "recipe-MiniLM-L3"},
    )


def test_corpus_sentences_skip_the_header():
    texts = student_throughput.corpus_sentences(3)
    assert len(texts) == 3 and "sentence" not in texts and texts[0] == "What is a person called that likes fire ?"
