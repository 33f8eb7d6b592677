"""The must-show numbers: held-out error of the fit to Vidur's A100 + Llama-2-7B measurements."""
import numpy as np
import pytest

from infermax.costmodel.accuracy import (
    accuracy_report,
    compose_batches,
    cross_validate,
    error_stats,
    group_folds,
    plot_accuracy,
)
from infermax.costmodel.fitting import fit_operators, operator_data
from infermax.costmodel.linear import prefill_attention_work


@pytest.fixture(scope="module")
def a100_report():
    return accuracy_report("a100/Llama-2-7b-hf")


def test_held_out_error_meets_targets(a100_report):
    report, _ = a100_report
    assert report["protocol"]["split"] == "clump"
    assert report["non_attention"]["median_ape"] <= 0.05
    assert report["attention"]["median_ape"] <= 0.10
    assert report["batch"]["median_ape"] <= 0.05
    for key in ("non_attention", "attention", "decode_attention", "prefill_attention", "batch"):
        assert report[key]["n"] > 100 and report[key]["p90_ape"] >= report[key]["median_ape"]


def test_config_split_errors_within_targets():
    """Decode within 10 %; prefill within 25 %: Vidur's Llama-2-7B prefills grow with c² about as fast as
    with c·m, so the causal W = c·m + c(c+1)/2 (half the c² weight) fits them worse than the old c·(m + c)
    did (7 % then, 20 % now); the model keeps the causal W for its structure (issue 19)."""
    report, _ = accuracy_report("a100/Llama-2-7b-hf", split="config")
    assert report["prefill_attention"]["median_ape"] <= 0.25 and report["decode_attention"]["median_ape"] <= 0.10


def test_report_json_shape_and_roofline(a100_report):
    report, _ = a100_report
    for key in ("non_attention", "attention", "batch"):
        assert set(report[key]) >= {"median_ape", "p90_ape"} and 0 <= report[key]["median_ape"] < 1
    assert report["roofline"]["violations"] == 0 and report["roofline"]["points"] > 2000


def test_plot_is_written(a100_report, tmp_path):
    _, held = a100_report
    assert plot_accuracy(held, tmp_path / "acc.png").stat().st_size > 10_000


def test_group_folds_keep_groups_together():
    groups = np.repeat(np.arange(13), 7)
    folds = group_folds(groups, 5, seed=3)
    for g in range(13):
        assert np.unique(folds[groups == g]).size == 1
    assert set(folds.tolist()) == set(range(5))


def test_composed_batches_sum_their_measurements():
    data = operator_data("a100/Llama-2-7b-hf", "llama2-7b")
    na = dict(zip(data.nonattn_tokens.tolist(), data.nonattn_s.tolist()))
    batches = compose_batches(data, np.random.default_rng(0), per_kind=30)
    assert len(batches) == 90
    for tokens, _kv, _is_decode, measured in batches:
        assert measured > na[int(tokens.sum())]          # non-attention at exactly N, plus attention


def test_cross_validation_on_exact_data_is_exact():
    data = operator_data("a100/Llama-2-7b-hf", "llama2-7b")
    truth = fit_operators(data)
    exact = data.__class__(**{**vars(data),
                              "nonattn_s": truth.nonattention_s(data.nonattn_tokens),
                              "decode_s": truth.decode_s(data.decode_batch * (data.decode_kv + 1.0)),
                              "prefill_s": truth.prefill_s(prefill_attention_work(data.prefill_chunk,
                                                                                  data.prefill_kv))})
    stats = cross_validate(exact, lambda d: fit_operators(d), k=4).stats()
    for key in ("decode_attention", "prefill_attention", "batch"):
        assert stats[key]["max_ape"] < 1e-6
    assert stats["non_attention"]["median_ape"] < 1e-6


def test_error_stats():
    st = error_stats(np.array([1.1, 0.9, 2.0]), np.array([1.0, 1.0, 1.0]))
    assert st["median_ape"] == pytest.approx(0.1) and st["n"] == 3 and st["max_ape"] == pytest.approx(1.0)
    assert error_stats(np.array([]), np.array([]))["median_ape"] is None


def test_profile_without_attention_reports_non_attention_only():
    report, _ = accuracy_report("h100/Llama-2-7b-hf", k=3)
    assert report["non_attention"]["median_ape"] < 0.05 and report["attention"]["n"] == 0
    assert report["roofline"]["violations"] == 0


def test_lm_head_rows_enter_composed_batches_and_cross_validation():
    """With an LM head (t = 1 ms + 20 us per row), composed batches pay it per request and an exact
    linear ground truth with request_s is recovered exactly out of fold."""
    import dataclasses
    data = operator_data("a100/Llama-2-7b-hf", "llama2-7b")
    rows = data.nonattn_tokens
    truth = dataclasses.replace(fit_operators(data), request_s=2e-5)
    exact = dataclasses.replace(
        data, nonattn_s=truth.nonattention_s(rows) - 1e-3, head_rows=rows, head_s=1e-3 + 2e-5 * rows,
        decode_s=truth.decode_s(data.decode_batch * (data.decode_kv + 1.0)),
        prefill_s=truth.prefill_s(prefill_attention_work(data.prefill_chunk, data.prefill_kv)))
    na = dict(zip(rows.tolist(), exact.nonattn_s.tolist()))
    for tokens, _kv, _is_decode, measured in compose_batches(exact, np.random.default_rng(0), per_kind=10):
        assert measured > na[int(tokens.sum())] + 1e-3 + 2e-5 * tokens.size * (1 - 1e-9)
    stats = cross_validate(exact, lambda d: fit_operators(d), k=4).stats()
    assert stats["batch"]["max_ape"] < 1e-6 and stats["non_attention"]["median_ape"] < 1e-6
