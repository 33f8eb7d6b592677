"""The decisions behind ``infermax bound`` (infermax.bounds.check, infermax.cluster.check), tested without the
command line: objectives and methods parsed, the schedulers to check, claims, the exit code, the bound computed
once per objective for every scheduler or cluster policy."""
from __future__ import annotations

import pytest

import infermax.bounds.check as check
from infermax.bounds.check import (
    INVALID,
    REFUSED,
    CheckResult,
    check_claims,
    check_schedulers,
    exit_code,
    parse_methods,
    parse_objectives,
    schedulers_to_check,
)
from infermax.bounds.combine import METHODS
from infermax.bounds.objectives import ALL
from infermax.types import Limits, Workload


def test_objectives_all_and_lists():
    assert parse_objectives("all") == list(ALL)
    assert parse_objectives("all", cluster=True) == [o for o in ALL if o != "tpot"]
    assert parse_objectives("ttft, e2e_p99") == ["ttft", "e2e_p99"]
    assert parse_objectives("tpot", cluster=True) == ["tpot"]          # named, it is kept
    with pytest.raises(ValueError, match="nope"):
        parse_objectives("ttft,nope")


def test_methods_known_or_refused():
    assert parse_methods(None) is None
    assert parse_methods("work, lp") == ("work", "lp")
    with pytest.raises(ValueError, match=r"--methods 'work,foo': unknown method\(s\) \['foo'\]; known: " + METHODS[0]):
        parse_methods("work,foo")
    with pytest.raises(ValueError, match="unknown method"):
        parse_methods(",")


def test_schedulers_to_check_default_leaves_out_what_cannot_serve():
    small, long_ = Workload.from_spec("fixed:I=16,O=8,B=4"), Workload.from_spec("fixed:I=300,O=4,B=4")
    limits = Limits(M=4000, C=256)
    assert schedulers_to_check(None, small, limits, "vllm") == (["vllm"], [])
    names, notes = schedulers_to_check(None, long_, limits, "vllm")
    assert names == ["sarathi"] and "vllm left out of the default schedulers" in notes[0]
    assert schedulers_to_check("vllm,sarathi", long_, limits, "vllm") == (["vllm", "sarathi"], [])  # named: run
    with pytest.raises(ValueError, match="names no scheduler"):
        schedulers_to_check(",", small, limits, "vllm")
    with pytest.raises(ValueError, match="'nope'"):
        schedulers_to_check("vllm,nope", small, limits, "vllm")
    with pytest.raises(ValueError, match="cannot fit in M"):
        schedulers_to_check(None, long_, Limits(M=100, C=256), "vllm")


def test_claims_are_finite_and_single():
    check_claims(None, None, ["latency", "ttft"], ["vllm", "sarathi"])
    check_claims(1.0, None, ["latency"], ["vllm"])
    with pytest.raises(ValueError, match="--claimed-value must be a finite number"):
        check_claims(None, float("inf"), ["latency"], ["vllm"])
    with pytest.raises(ValueError, match=r"--claimed-latency 2 is one scheduler's claim .* 2 scheduler\(s\)"):
        check_claims(2.0, None, ["latency"], ["vllm", "sarathi"])


@pytest.mark.parametrize("codes, want", [((0, 0), 0), ((0, REFUSED), 4), ((REFUSED, REFUSED), 5),
                                         ((REFUSED, INVALID), 2), ((INVALID, 3, REFUSED), 3), ((), 0)])
def test_exit_code_is_the_most_serious_verdict(codes, want):
    results = [CheckResult(scheduler=f"s{i}", objective="latency", exit_code=c) for i, c in enumerate(codes)]
    assert exit_code(results) == want


def test_the_bound_is_computed_once_per_objective_for_all_schedulers(monkeypatch):
    calls = []
    real = check.reference_bound

    def counted(*args, **kw):
        calls.append(kw["objective"])
        return real(*args, **kw)

    monkeypatch.setattr(check, "reference_bound", counted)
    results = check_schedulers(["vllm", "sarathi", "sarathi-pc"], "fixed:I=16,O=8,B=8", "M=400,C=256",
                               objectives=["latency", "ttft"], optimum=False)
    assert sorted(calls) == ["latency", "ttft"] and len(results) == 6
    assert len({(r.objective, r.bound_s) for r in results}) == 2          # one bound per objective


def test_cluster_policies_share_one_bound_per_objective(monkeypatch):
    import infermax.bounds.cluster as cluster_bounds
    from infermax.cluster import Cluster
    from infermax.cluster.check import beats, certified_gap, check_policies, policies_to_check

    assert policies_to_check(None) == ["fifo"]
    with pytest.raises(ValueError, match="--scheduler 'vllm' is not a cluster policy"):
        policies_to_check("fifo,vllm")
    calls = []
    real = cluster_bounds.cluster_lower_bound
    monkeypatch.setattr(cluster_bounds, "cluster_lower_bound", lambda *a, **kw: calls.append(a[2]) or real(*a, **kw))
    cluster = Cluster.from_spec("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3")
    rows, code = check_policies(Workload.from_spec("fixed:I=32,O=4,B=8"), cluster, ["fifo", "priority"],
                                ["latency", "throughput"])
    assert calls == ["latency", "throughput"] and code == 0 and len(rows) == 4
    assert all(r["value"] >= r["bound"] if r["objective"] != "throughput" else r["value"] <= r["bound"]
               for r in rows)
    assert beats("latency", 1.0, 2.0) and not beats("latency", 2.0, 2.0) and beats("throughput", 3.0, 2.0)
    assert certified_gap("latency", 4.0, 3.0) == 0.25 and certified_gap("throughput", 3.0, 4.0) == 0.25
