import pytest

from gpupool_hub.placement import InvalidRequest, Request
from gpupool_hub.placement.request import model_allowed, normalize_model


@pytest.mark.parametrize("kwargs, words", [
    (dict(gpus=17), "at most 16"),
    (dict(gpus=-1), "negative"),
    (dict(gpu_milli=1000), "fraction of one GPU"),
    (dict(gpu_milli=1500), "fraction of one GPU"),
    (dict(gpus=1, gpu_milli=500), "not both"),
    (dict(cpu_milli=1.5), "whole number"),
    (dict(memory_mib=-5), "negative"),
    (dict(gpus=True), "whole number"),
    (dict(gpus=1, models=frozenset()), "at least one"),
])
def test_invalid_requests_raise_clear_value_errors(kwargs, words):
    with pytest.raises(InvalidRequest) as info:
        Request(**kwargs)
    assert isinstance(info.value, ValueError)
    assert words in str(info.value)


def test_fraction_helper_rounds_to_milli():
    assert Request.fraction(0.25).gpu_milli == 250
    assert Request.fraction(0.0015).gpu_milli == 2
    with pytest.raises(InvalidRequest):
        Request.fraction(1.0)
    with pytest.raises(InvalidRequest):
        Request.fraction(0.0001)


def test_models_are_normalized_for_case_insensitive_exact_match():
    r = Request(gpus=1, models=frozenset({"NVIDIA GeForce  RTX 3090"}))
    assert r.models == frozenset({"nvidia geforce rtx 3090"})
    assert model_allowed(normalize_model("nvidia GeForce RTX 3090"), r.models)
    assert not model_allowed(normalize_model("NVIDIA GeForce RTX 3090 Ti"), r.models)
    assert model_allowed("anything", None)


def test_total_gpu_milli():
    assert Request(gpus=2).total_gpu_milli == 2000
    assert Request(gpu_milli=250).total_gpu_milli == 250
    assert Request().total_gpu_milli == 0
