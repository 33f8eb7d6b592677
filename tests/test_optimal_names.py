"""Names are read above csp (issue 38 item 1): ``infermax.optimal`` turns "best", "vllm" and "like=vllm" into
the Schedules, values and Policy that ``infermax.csp.solve_optimal`` takes."""
from __future__ import annotations

import pytest

import infermax
from infermax import Workload, simulate
from infermax.csp import solve_optimal as csp_solve_optimal
from infermax.optimal import policy_from_spec, policy_of, solve_optimal
from infermax.policy import Policy

W = Workload.from_lengths([3, 5, 2], [2, 3, 2])
LIMITS = "M=12,C=64"


def test_the_public_solve_optimal_is_the_layer_above_csp():
    assert infermax.solve_optimal is solve_optimal


def test_a_scheduler_class_is_read_above_the_policy():
    assert policy_from_spec("like=vllm") == policy_of("vllm")
    assert policy_from_spec("like=vllm,no-hybrid") == policy_of("vllm")     # the items after it: ignored, as ever
    assert policy_from_spec("no-eviction,P=8") == Policy.from_spec("no-eviction,P=8") == \
        Policy(allow_eviction=False, P=8)
    with pytest.raises(ValueError, match="unknown policy item 'bogus'"):
        policy_from_spec("bogus,like=vllm")
    with pytest.raises(ValueError, match="unknown scheduler|vlm"):
        policy_from_spec("like=vlm")
    with pytest.raises(ValueError, match="policy item 'like=vllm' names a scheduler"):
        Policy.from_spec("like=vllm")


def test_csp_takes_schedules_not_names():
    with pytest.raises(ValueError, match="warm_start 'vllm' names a scheduler"):
        csp_solve_optimal(W, LIMITS, warm_start="vllm", time_limit_s=5)
    with pytest.raises(ValueError, match="better_than 'vllm' names a scheduler"):
        csp_solve_optimal(W, LIMITS, better_than="vllm", time_limit_s=5)
    with pytest.raises(ValueError, match=r"warm_start must give \(name, Schedule\) pairs"):
        csp_solve_optimal(W, LIMITS, warm_start=[("vllm", "not a schedule")], time_limit_s=5)


def test_a_name_and_the_schedule_it_names_solve_alike():
    by_name = solve_optimal(W, LIMITS, warm_start="vllm", time_limit_s=20)
    given = csp_solve_optimal(W, LIMITS, time_limit_s=20,
                              warm_start=[("vllm", simulate(W, "vllm", LIMITS).schedule)])
    assert (by_name.status, by_name.objective) == (given.status, given.objective)
    assert by_name.info["solution_from"] == given.info["solution_from"]
    assert [b.to_dict() for b in by_name.schedule] == [b.to_dict() for b in given.schedule]


def test_the_combining_layer_runs_the_registered_methods_as_lower_bound_does():
    from infermax.bounds import lower_bound
    from infermax.bounds.combine import combine
    from infermax.bounds.methods import method_names

    assert "search" in method_names()          # csp (imported here) registers it; lower_bound registers milp
    with pytest.raises(ValueError, match=r"unknown bound method\(s\) \['nonesuch'\]"):
        combine(W, LIMITS, objective="latency", methods=("work", "nonesuch"))
    for methods in (("work", "lp"), ("work", "search")):
        alone = combine(W, LIMITS, objective="latency", methods=methods)
        public = lower_bound(W, LIMITS, objective="latency", methods=methods)
        assert (alone.value, alone.method, alone.values) == (public.value, public.method, public.values)
