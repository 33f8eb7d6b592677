"""The CPU profiler: tiny grid → Vidur-format CSVs → fit → predict (and, slow, → measure)."""
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("torch")

from infermax.costmodel.accuracy import accuracy_report
from infermax.costmodel.fitting import fit_operators, operator_data
from infermax.costmodel.linear import LinearCostModel
from infermax.costmodel.profiler import ProfileGrid, measure_batch_s, profile_model
from infermax.costmodel.profiles import load_attention_profile, load_mlp_profile


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    return profile_model("llama-tiny", device="cpu", out_dir=tmp_path_factory.mktemp("prof"), grid=ProfileGrid.tiny())


def test_tiny_profile_is_readable_vidur_format(tiny_profile):
    assert tiny_profile.name == "llama-tiny" and tiny_profile.parent.name == "cpu"
    mlp = load_mlp_profile(tiny_profile, stat="min")
    assert mlp.num_tokens.tolist() == list(ProfileGrid.tiny().num_tokens)
    assert set(mlp.op_times_s) == {"emb", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                                   "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add",
                                   "lm_head"}
    head = mlp.lm_head_s()
    assert np.all(head > 0) and head[-1] > head[0]                 # 256 logits rows cost more than 1
    layer = sum(t for op, t in mlp.op_times_s.items() if op not in ("emb", "lm_head"))
    np.testing.assert_allclose(mlp.total_s(4), mlp.op_times_s["emb"] + 4 * layer)   # LM head kept apart
    att = load_attention_profile(tiny_profile)
    assert len(att.decode_batch) == 6 and len(att.prefill_chunk) == 4
    assert np.all(att.decode_time_s > 0) and np.all(att.prefill_time_s > 0)


def test_laps_add_up_to_the_whole_pass():
    """Every operator of a pass is timed in place: the laps sum to the pass, none is left out (timed with a
    counting clock, not the machine's: the test checks the bookkeeping, not the times)."""
    import itertools

    import torch

    from infermax.costmodel.profiler import PER_FORWARD_OPS, _Net, _time_passes
    from infermax.costmodel.specs import get_model_spec
    spec = get_model_spec("llama-tiny")
    net = _Net(spec, "cpu", 0, num_blocks=64, max_positions=256)
    mixed = net.batch(np.array([1, 1, 1, 32]), np.array([40, 70, 15, 64]), np.array([True, True, True, False]))
    with torch.inference_mode():
        (samples,) = _time_passes(net, [mixed], repeats=2, warmup=1,
                                  clock=lambda ticks=itertools.count(): float(next(ticks)))
    expected = {"emb", "lm_head", "attn_decode", "attn_prefill", "attn_kv_cache_save", "attn_input_reshape",
                "attn_output_reshape", "input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add", "total"}
    assert set(samples) == expected
    for rep in range(2):
        ops = sum(v[rep] * (1 if op in PER_FORWARD_OPS else spec.num_layers) for op, v in samples.items()
                  if op != "total")
        assert ops == pytest.approx(samples["total"][rep], rel=1e-9)


def test_fit_and_predict_from_cpu_profile(tiny_profile):
    data = operator_data(tiny_profile, "llama-tiny", stat="min")
    assert data.head_rows.tolist() == list(ProfileGrid.tiny().num_tokens)
    coefficients = fit_operators(data)
    assert coefficients.request_s > 0
    model = LinearCostModel(coefficients)
    small = model.batch_time(np.array([1]), np.array([32]), np.array([True]))
    large = model.batch_time(np.r_[np.ones(16, np.int64), [128]], np.r_[np.full(16, 256), [256]],
                             np.r_[np.ones(16, bool), [False]])
    assert 0 < small < large < 1.0
    report, _ = accuracy_report(str(tiny_profile), k=2, stat="min")
    assert report["gpu"] is None and report["non_attention"]["n"] == 5 and "roofline" not in report


def test_cuda_path_reports_missing_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="cuda"):
        profile_model("llama-tiny", device="cuda", out_dir=tmp_path, grid=ProfileGrid.tiny())
    with pytest.raises(ValueError, match="device must be"):
        profile_model("llama-tiny", device="tpu", out_dir=tmp_path, grid=ProfileGrid.tiny())


def test_grid_validates():
    with pytest.raises(ValueError, match="ProfileGrid.decode_batch"):
        ProfileGrid(decode_batch=(0, 4))
    with pytest.raises(ValueError, match="ProfileGrid.repeats"):
        ProfileGrid(repeats=0)


def test_costmodel_import_does_not_import_torch():
    code = "import sys, infermax.costmodel, infermax.costmodel.cli; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.mark.slow
def test_fit_predict_measure_loop_on_cpu(tiny_profile):
    """Whole batches measured on this CPU vs the fit's predictions.

    (Timings on a shared CPU drift with the other processes' load: the bound is loose.)
    """
    model = LinearCostModel(fit_operators(operator_data(tiny_profile, "llama-tiny", stat="min")))
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(6):
        n = int(rng.integers(1, 16))
        batches.append((np.r_[np.ones(n, np.int64), [64]], np.r_[rng.integers(32, 256, n), [128]],
                        np.r_[np.ones(n, bool), [False]]))
    measured = measure_batch_s(batches, "llama-tiny", stat="min")
    predicted = np.array([model.batch_time(*b) for b in batches])
    assert np.median(np.abs(predicted / measured - 1)) < 0.5


def test_min_and_median_are_whole_passes():
    """Operators of the fastest (median) pass, not each operator's own minimum (median)."""
    from infermax.costmodel.profiler import _stat_cells
    samples = {"a": [1e-3, 3e-3, 2e-3], "b": [5e-3, 1e-3, 9e-3], "total": [6e-3, 4e-3, 11e-3]}
    a_min, a_max, a_mean, a_median, _, b_min, _, _, b_median, _ = _stat_cells(("a", "b"), samples)
    assert (a_min, b_min) == pytest.approx((3.0, 1.0)) and (a_median, b_median) == pytest.approx((1.0, 5.0))
    assert a_max == pytest.approx(3.0) and a_mean == pytest.approx(2.0)
