"""``solve_optimal`` over one tag's requests (``ttft:short``, ``completion:short``, ``ttft:long``), judged by the
exhaustive oracle (issue 23 item 3: optimal preemption plans).

On the tagged tiny instances of ``test_bounds_objectives`` (online and offline, requests tagged short or long at
random, the cost model rotating): the solver's certified bound never exceeds the oracle's optimum, its replayed
schedule never beats it, and a plan called optimal has the oracle's value. The default run checks a few seeds;
``-m slow`` checks ``NUM_FULL``.
"""
from __future__ import annotations

import pytest
from test_bounds_objectives import _oracle, tagged_instance

from infermax import replay
from infermax.bounds import parse_objective
from infermax.bounds.objectives import trace_value
from infermax.costmodel import get_cost_model
from infermax.optimal import solve_optimal

#: csp's name -> the oracle's name of the same objective
OBJECTIVES = {"ttft:short": "ttft:short", "completion:short": "e2e:short", "ttft:long": "ttft:long"}
NUM_QUICK = 1
NUM_FULL = 100
REL = 1e-6


def _check(seed: int) -> list[str]:
    workload, limits, cost = tagged_instance(seed)
    failures = []
    for objective, oracle_name in OBJECTIVES.items():
        if objective.endswith(":long") and not any(r.tag == "long" for r in workload.requests):
            continue
        best = _oracle(seed).solve(oracle_name)
        res = solve_optimal(workload, limits, cost, objective=objective, time_limit_s=60)
        where = f"seed {seed} [{cost}] {objective} ({workload.to_dict()}, {limits})"
        value = trace_value(parse_objective(oracle_name), replay(res.schedule, workload, limits,
                                                                  get_cost_model(cost)))
        if abs(value - res.objective) > REL * abs(value):
            failures.append(f"{where}: result says {res.objective!r}, its schedule replays to {value!r}")
        if res.bound is not None and res.bound > best.value:
            failures.append(f"{where}: bound {res.bound!r} > optimum {best.value!r}")
        if res.objective < best.value * (1 - REL):
            failures.append(f"{where}: schedule {res.objective!r} beats the oracle's optimum {best.value!r}")
        if res.status == "optimal" and res.objective > best.value * (1 + 1e-4):
            failures.append(f"{where}: called optimal at {res.objective!r}, the optimum is {best.value!r}")
    return failures


@pytest.mark.solver
@pytest.mark.parametrize("seed", range(NUM_QUICK))
def test_tagged_optimum_matches_the_oracle(seed):
    failures = _check(seed)
    assert not failures, "\n".join(failures)


@pytest.mark.solver
@pytest.mark.slow
def test_tagged_optimum_matches_the_oracle_everywhere():
    failures = [f for seed in range(NUM_QUICK, NUM_FULL) for f in _check(seed)]
    assert not failures, f"{len(failures)} failures:\n" + "\n".join(failures)


def test_tagged_objective_errors_name_the_value():
    workload, limits, cost = tagged_instance(0)
    with pytest.raises(ValueError, match="latency is a property of the whole schedule"):
        solve_optimal(workload, limits, cost, objective="latency:short")
    with pytest.raises(ValueError, match="no request .* has tag 'medium'"):
        solve_optimal(workload, limits, cost, objective="ttft:medium")
    with pytest.raises(ValueError, match="'jct:short' has no bound"):
        solve_optimal(workload, limits, cost, objective="jct:short")
    with pytest.raises(ValueError, match="solve_optimal has no objective 'ttft_p99'"):
        solve_optimal(workload, limits, cost, objective="ttft_p99")
