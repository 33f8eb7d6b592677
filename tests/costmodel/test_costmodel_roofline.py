import numpy as np
import pytest

from infermax.costmodel import get_cost_model
from infermax.costmodel.accuracy import roofline_check
from infermax.costmodel.catalog import canonical_name, load_fitted
from infermax.costmodel.fitting import operator_data
from infermax.costmodel.profiles import available_profiles
from infermax.costmodel.roofline import RooflineCostModel, nonattention_ops, roofline_terms
from infermax.costmodel.specs import GPUS, MODELS


@pytest.mark.parametrize("model", ["llama2-7b", "llama3-70b", "mistral-7b"])
@pytest.mark.parametrize("tp", [1, 4])
def test_nonattention_lines_equal_sum_of_operator_maxima(model, tp):
    spec, gpu = MODELS[model], GPUS["h100"]
    terms = roofline_terms(spec, gpu, tp)
    n = np.arange(1, 20000, 7, dtype=float)
    direct = sum(op.count * np.maximum(op.flops_per_token * n / gpu.peak_flops,
                                       (op.bytes_fixed + op.bytes_per_token * n) / gpu.hbm_bandwidth)
                 for op in nonattention_ops(spec, tp))
    np.testing.assert_allclose(terms.nonattention_s(n), direct, rtol=1e-12)


def test_weight_read_floor_and_flop_slope():
    spec, gpu = MODELS["llama2-7b"], GPUS["a100"]
    terms = roofline_terms(spec, gpu)
    layer_weights = spec.num_layers * (spec.layer_params - 2 * spec.hidden_size) * spec.dtype_bytes
    assert terms.nonattention_s(1) == pytest.approx(layer_weights / gpu.hbm_bandwidth, rel=0.01)
    flops = 2 * spec.num_layers * (spec.layer_params - 2 * spec.hidden_size) / gpu.peak_flops
    elementwise = sum(op.count * op.bytes_per_token for op in nonattention_ops(spec) if op.flops_per_token == 0)
    assert terms.nonattn_lines[-1][1] == pytest.approx(flops + elementwise / gpu.hbm_bandwidth, rel=1e-9)
    assert terms.decode_bytes_s == pytest.approx(spec.kv_bytes_per_token / gpu.hbm_bandwidth)


def test_faster_hardware_is_faster(batches):
    a100, h200 = RooflineCostModel("llama3-8b", "a100"), RooflineCostModel("llama3-8b", "h200")
    for b in batches[:50]:
        assert h200.batch_time(*b) < a100.batch_time(*b)


def test_to_linear_stays_a_lower_bound(batches):
    roof = RooflineCostModel("llama2-70b", "h100", tp=4)
    linear = roof.to_linear()
    for b in batches:
        assert linear.batch_time(*b) <= roof.batch_time(*b) * (1 + 1e-12)


@pytest.mark.parametrize("profile", available_profiles())
def test_fitted_never_faster_than_roofline_on_any_profiled_point(profile):
    """Every shipped fit, at every TP degree, at every operator point and composed batch of its profile."""
    model = load_fitted(canonical_name(profile))
    for tp, k in {1: model.coefficients, **model.tp_coefficients}.items():
        data = operator_data(profile, model.model, tp, require_attention=False)
        check = roofline_check(data, k, RooflineCostModel(model.model, model.gpu, tp))
        assert check["violations"] == 0 and check["min_ratio"] >= 1.0, (tp, check)


@pytest.mark.parametrize("name", ["a100/llama2-7b", "a100/llama3-8b", "h100/llama2-70b"])
def test_shipped_models_beat_roofline_on_random_batches(name, batches):
    fitted = get_cost_model(name)
    roof = get_cost_model(f"roofline:{name}")
    for b in batches:
        assert fitted.batch_time(*b) >= roof.batch_time(*b)
