"""The model build keeps to its share of the time limit and to a size it can hold (issue 36 §5)."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from infermax import Request, Workload
from infermax.csp import api
from infermax.csp.budget import ModelTooLarge
from infermax.csp.milp.build import FLOW_NODES_MAX, MAX_MODEL_ROWS, Strengthening, check_size, flow_nodes
from infermax.csp.milp.strengthening import best_dff, best_dff_bound, dff_value, token_items
from infermax.optimal import solve_optimal

pytestmark = pytest.mark.solver


def _reference_bound(workload: Workload, M: int) -> int:
    """The bound as first written: one Fraction per token item and per Martello–Toth threshold."""
    items = token_items(workload)
    best = math.ceil(Fraction(sum(items), M))
    best = max(best, max(math.ceil(sum((dff_value(k, w, M) for w in items), Fraction(0))) for k in range(1, 13)))
    for eps in sorted(set(items)):
        if 2 * eps > M:
            break
        total = sum((Fraction(1) if w > M - eps else Fraction(w, M) for w in items if w >= eps), Fraction(0))
        best = max(best, math.ceil(total))
    return best


def test_the_integer_batch_count_bound_equals_the_fraction_one():
    rng = np.random.default_rng(36)
    for _ in range(60):
        n = int(rng.integers(1, 7))
        I, O = rng.integers(1, 50, n), rng.integers(1, 30, n)
        M = int(rng.integers(int((I + O).max()), 160))
        w = Workload(requests=[Request(id=i, input_len=int(I[i]), output_len=int(O[i])) for i in range(n)])
        assert best_dff_bound(w, M) == _reference_bound(w, M)
        ref = max(((k, sum((dff_value(k, x, M) for x in token_items(w)), Fraction(0))) for k in range(1, 13)),
                  key=lambda kv: (kv[1], -kv[0]))
        assert best_dff(w, M) == ref


def test_long_outputs_skip_the_class_flows_and_huge_models_are_refused_before_building():
    w = Workload.from_spec("mix:LILO+SISO,B=8,seed=1")       # outputs of 1024 tokens
    assert flow_nodes(w, 1401) > FLOW_NODES_MAX             # the flows would dominate: O x J per class
    with pytest.raises(ModelTooLarge, match=r"about [\d,]+ rows \(J = 4000 batches x 8 requests\)"):
        check_size(w, 4000, Strengthening(), "the per-request model")
    assert check_size(w, 100, Strengthening(), "the model") <= MAX_MODEL_ROWS


def test_a_build_that_overruns_its_share_stops_with_a_clear_status(monkeypatch):
    monkeypatch.setattr(api, "BUILD_SHARE", 1e-3)           # 0.06 s of 60 s: far too little for ~40,000 rows
    r = solve_optimal("fixed:I=8,O=64,B=8", "M=600,C=4096", time_limit_s=60, method="per-request",
                     warm_start="vllm")
    stopped = r.info["stopped"]
    assert "per-request model was not built within its share of the time limit" in stopped
    assert "rows" in stopped and r.status == "feasible" and r.schedule is not None and r.bound is not None
