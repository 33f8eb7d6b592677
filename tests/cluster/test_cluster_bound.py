"""The fluid cluster bound (infermax.bounds.cluster): below every cluster policy's value, for every objective it
takes, overall and per tag; ``infermax bound --cluster`` reports it and the gaps."""
from __future__ import annotations

import json

import numpy as np
import pytest

from infermax import Workload
from infermax.bounds.cluster import attention_kept, cluster_lower_bound, measured_value
from infermax.cli import main
from infermax.cluster import POLICIES, Cluster, simulate_cluster

CLUSTER = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3")
OBJECTIVES = ("latency", "throughput", "ttft", "e2e", "ttft_p99", "e2e_p50", "ttft:short", "e2e:long",
              "ttft_p90:short")


@pytest.fixture(scope="module")
def workload():
    return Workload.from_spec("pecsched:splitwise_conv,n=40,hi=300000")


def _valid(objective: str, value: float, bound: float) -> bool:
    return value <= bound * (1 + 1e-12) if objective == "throughput" else value >= bound * (1 - 1e-12)


@pytest.mark.parametrize("policy", [p if p in ("fifo", "pecsched", "csps") else
                                    pytest.param(p, marks=pytest.mark.slow) for p in POLICIES])
def test_no_cluster_policy_beats_the_bound(workload, policy):
    disaggregates = policy.startswith("pecsched") and policy not in ("pecsched-dis", "pecsched-fifo",
                                                                     "pecsched-reservation", "pecsched-priority")
    local = "sarathi-pc" if policy.startswith("loongserve") else "vllm"   # a dropped long KV refills in chunks
    res = simulate_cluster(workload, CLUSTER, policy, local, sp_replicas=2,
                           **({"decode_replicas": 2} if disaggregates else {}))
    for objective in OBJECTIVES:
        bound = cluster_lower_bound(workload, CLUSTER, objective, attention=attention_kept(policy)).value
        value = measured_value(objective, res)
        assert np.isfinite(bound) and bound > 0, objective
        assert _valid(objective, value, bound), (objective, value, bound)


def test_offline_and_more_replicas():
    """Offline, the bound is the fluid order statistic; doubling the replicas never raises it."""
    w = Workload.from_lengths([4000, 300, 300, 20000], [8, 8, 8, 8])
    small = Cluster.from_spec("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3")
    big = Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3")
    for objective in ("latency", "ttft", "e2e_p90"):
        b2, b4 = (cluster_lower_bound(w, c, objective).value for c in (small, big))
        assert 0 < b4 <= b2, objective
        for policy, opts in (("fifo", {}), ("pecsched", {"decode_replicas": 1})):
            res = simulate_cluster(w, small, policy, **opts)
            assert _valid(objective, measured_value(objective, res), b2), objective


def test_bad_objectives_are_named(workload):
    with pytest.raises(ValueError, match="objective 'tpot' has no cluster bound"):
        cluster_lower_bound(workload, CLUSTER, "tpot")
    with pytest.raises(ValueError, match="has tag 'nope'"):
        cluster_lower_bound(workload, CLUSTER, "ttft:nope")


def test_bound_cli_with_a_cluster(capsys):
    args = ["bound", "--cluster", "a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3", "--scheduler", "fifo",
            "--workload", "pecsched:splitwise_conv,n=20,hi=200000", "--objective", "ttft,latency", "--json"]
    assert main(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["objective"] for r in out["results"]] == ["ttft", "latency"]
    assert all(r["value"] >= r["bound"] and 0 <= r["certified_gap_%"] < 100 for r in out["results"])
    assert main(args[:4] + ["vllm"] + args[5:]) == 2
    assert "--scheduler 'vllm' is not a cluster policy" in capsys.readouterr().err


@pytest.mark.parametrize("spec, policy", [("h100:nodes=2,gpus_per_node=8,model=llama3-8b,tp=4,spp=2,kvp=2", "medha-3d"),
                                          ("h100:nodes=1,gpus_per_node=8,model=llama3-8b,tp=2,spp=4", "medha-3d-pp")])
def test_executed_pipelines_count_a_machine_per_stage(spec, policy):
    """A pipelined replica holds a batch per stage: the bound counts replicas x stages and stays below."""
    w = Workload.from_lengths([200000, 4000, 3000, 120000, 500, 800], [16, 32, 32, 8, 64, 64],
                              [0, 0.5, 1.0, 2.0, 2.5, 3.0])
    cluster = Cluster.from_spec(spec)
    res = simulate_cluster(w, cluster, policy)
    for objective in ("latency", "ttft", "e2e", "ttft_p90"):
        b = cluster_lower_bound(w, cluster, objective)
        assert b.certificate["stages"] == max(cluster.spp, cluster.plan.pp) > 1
        assert _valid(objective, measured_value(objective, res), b.value), objective


def test_token_dropping_policies_lower_the_attention_share():
    """CSA keeps 1, 0.75 of its rings (2 levels, drop 0.25); a 3-key ring keeps 2 (halves up): 2/3."""
    assert attention_kept(["fifo", "pecsched", "medha-3d", "csps-nocsa"]) == 1.0
    assert attention_kept(["fifo", "csps"]) == pytest.approx(2 / 3)
    w = Workload.from_lengths([300000, 1000], [4, 4])
    dense, sparse = (cluster_lower_bound(w, CLUSTER, "ttft", attention=a).value for a in (1.0, 2 / 3))
    assert sparse < dense
    with pytest.raises(ValueError, match="attention must be a share in \\[0, 1\\], got 1.5"):
        cluster_lower_bound(w, CLUSTER, "ttft", attention=1.5)
