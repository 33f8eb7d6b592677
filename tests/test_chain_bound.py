"""The chain bound (`infermax.bounds.chains`) against schedules at a scale the oracle cannot reach.

The exhaustive oracle checks it on tiny instances (test_bounds_objectives); here it must also stay
below the mean e2e every registered scheduler reaches on random offline workloads of 5–120 requests
(identical requests half the time: where the bound is tightest), across cost models and limits.
210 such workloads measured 0 above, the closest at 0.957 of the best scheduler, and again after the
relaxation's window was sized to its optimum (2026-11-27): 0 above, the closest at 0.983.
"""
from __future__ import annotations

import numpy as np
import pytest
from factories import ALL_SCHEDULERS

from infermax import Limits, Workload, simulate
from infermax.bounds import lower_bound
from infermax.bounds.chains import _tent_values, _tents
from infermax.types import Request

COSTS = ("default", "a100/llama2-70b", "h100/llama2-7b")


def random_offline(seed: int) -> tuple[Workload, Limits, str]:
    rng = np.random.default_rng([19, seed])
    B = int(rng.integers(5, 120))
    I, O = rng.integers(1, 600, B), rng.integers(1, 120, B)
    if rng.random() < 0.5:
        I[:], O[:] = I[0], O[0]
    w = Workload(requests=[Request(id=k, input_len=int(I[k]), output_len=int(O[k])) for k in range(B)])
    limits = Limits(M=int(max(I + O) * rng.uniform(1.5, 40)), C=int(rng.choice([256, 512, 2048, 4096])))
    return w, limits, COSTS[seed % len(COSTS)]


def _best_e2e(w: Workload, limits: Limits, cost: str) -> float:
    values = []
    for name in ALL_SCHEDULERS:
        try:
            values.append(simulate(w, name, limits, cost).metrics["e2e_mean_s"])
        except ValueError:          # e.g. a scheduler without chunking and a prompt over C
            pass
    return min(values)


@pytest.mark.parametrize("seed", [0, 1] + [pytest.param(s, marks=pytest.mark.slow) for s in range(2, 40)])
def test_below_every_scheduler(seed):
    w, limits, cost = random_offline(seed)
    bound = lower_bound(w, limits, cost, "e2e", methods=("chains",)).value
    assert bound <= _best_e2e(w, limits, cost), (seed, w.to_dict()["requests"][:3], limits, cost)


def test_tents_stay_under_the_profile():
    rng = np.random.default_rng(5)
    for _ in range(50):
        D = np.concatenate((np.sort(rng.random(int(rng.integers(1, 40))))[::-1] * 10 ** rng.uniform(-6, 3), [0.0]))
        tents = _tents(D)
        assert all(c > 0 and k >= 1 for c, k in tents)
        assert np.all(_tent_values(tents, D.size) <= D)


def test_the_relaxation_may_spread_completions_beyond_one_a_batch(monkeypatch):
    """Memory binds (M = 4,000 for 64 requests of 16 + 256 tokens): the relaxation's optimum finishes
    requests ~5 batches apart. Confined to one batch apart (the window before 2026-11-27) it stayed
    below the order bound (3.79 s against 3.85 s measured); sized to its optimum it is 4.57 s, and still
    below every schedule (5.46 s the best of these five)."""
    import infermax.bounds.chains as chains

    w = Workload.from_spec("fixed:I=16,O=256,B=64")
    limits = Limits(M=4000, C=4096)
    b = lower_bound(w, limits, objective="e2e")
    assert b.method == "chains" and b.values["chains"] > 1.15 * b.values["order"]
    best = min(simulate(w, name, limits).metrics["e2e_mean_s"]
               for name in ("sarathi-la", "vllm", "sarathi", "sarathi-ef", "bound-e2e-ef"))
    assert b.value <= best
    monkeypatch.setattr(chains, "SPREAD_SAFETY", 0.0)          # the window of N batches
    assert lower_bound(w, limits, objective="e2e", methods=("chains",)).value < b.values["order"]
