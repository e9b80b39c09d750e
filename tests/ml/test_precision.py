import pytest
import torch

from tasks.ml import precision


@pytest.mark.parametrize("choice", ["fp32", "bf16", "fp16"])
def test_an_explicit_dtype_is_kept(choice):
    assert precision.resolve(choice, "cpu") == choice


@pytest.mark.parametrize(
    ("avx512_bf16", "amx", "expected"), [(True, False, "bf16"), (False, True, "bf16"), (False, False, "fp32")]
)
def test_auto_is_bf16_only_where_the_cpu_runs_it_natively(monkeypatch, avx512_bf16, amx, expected):
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
    assert precision.native_bf16("cpu") is (expected == "bf16")
    assert precision.resolve("auto", "cpu") == expected


def test_auto_on_a_missing_gpu_is_fp32(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert precision.resolve("auto", "cuda") == "fp32"
