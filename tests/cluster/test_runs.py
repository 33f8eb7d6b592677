"""The decisions of ``simulate --cluster`` (infermax.cluster.runs), tested without the command line."""
from __future__ import annotations

import pytest

from infermax.cluster import POLICIES, Cluster, get_policy, simulate_cluster
from infermax.cluster.runs import (
    DEFAULT_LOCAL,
    check_cluster_name,
    check_limits_without_M,
    cluster_runs,
    engine_options,
    rescale_to_load,
    reserved_options,
    run_record,
)
from infermax.types import Workload

CLUSTER = Cluster.from_spec("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3")


def test_replica_schedulers_run_under_each_policy_default_fifo():
    assert cluster_runs(["vllm", "sarathi"]) == [("fifo", "vllm"), ("fifo", "sarathi")]
    assert cluster_runs(["vllm", "sarathi"], "fifo,reservation") == [
        ("fifo", "vllm"), ("fifo", "sarathi"), ("reservation", "vllm"), ("reservation", "sarathi")]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_a_cluster_policy_as_scheduler_runs_local_else_its_own_else_sarathi(policy):
    assert cluster_runs([policy]) == [(policy, get_policy(policy).local or DEFAULT_LOCAL)]
    assert cluster_runs([policy], local="sarathi-pc") == [(policy, "sarathi-pc")]


def test_policies_as_schedulers_and_replica_schedulers_mix_only_with_policy():
    with pytest.raises(ValueError, match=r"mixes cluster policies \(fifo\) with replica schedulers \(vllm\)"):
        cluster_runs(["fifo", "vllm"])
    assert cluster_runs(["fifo", "vllm"], "reservation") == [("fifo", DEFAULT_LOCAL), ("reservation", "vllm")]


def test_unknown_names_are_refused_before_any_work():
    with pytest.raises(ValueError, match=r"--policy: unknown cluster policy 'fifoo' \(did you mean fifo\?\)"):
        cluster_runs(["vllm"], "fifoo")
    with pytest.raises(ValueError, match=r"unknown name 'fifoo' under --cluster \(did you mean fifo\?\)"):
        cluster_runs(["fifoo"])
    with pytest.raises(ValueError, match="neither a cluster policy"):
        check_cluster_name("nope")
    check_cluster_name("sarathi:P=64")                    # options and import paths are names
    check_cluster_name("package.module:Class")


def test_reserved_replicas_go_to_the_reserving_policies_only():
    runs = [("fifo", "vllm"), ("reservation", "vllm"), ("pecsched-reservation", "vllm")]
    assert reserved_options(runs, 1) == [{}, {"reserved_replicas": 1}, {"reserved_replicas": 1}]
    assert reserved_options(runs, None) == [{}, {}, {}]
    with pytest.raises(ValueError, match=r"--reserved-replicas 1 .* no run uses it \(policies: fifo, priority\)"):
        reserved_options([("fifo", "vllm"), ("priority", "vllm")], 1)


def test_limits_take_no_M_from_the_command_line():
    with pytest.raises(ValueError, match=f"M comes from --cluster .*{CLUSTER.replica_kv_capacity_tokens} tokens"):
        check_limits_without_M("C=256, M =100", CLUSTER)
    check_limits_without_M("C=256,P=64", CLUSTER)
    check_limits_without_M(None, CLUSTER)


def test_engine_options_keep_what_was_given():
    assert engine_options(sp_replicas=None, decode_replicas=1, colocate_tokens=0) == {"decode_replicas": 1,
                                                                                      "colocate_tokens": 0}


def test_rescale_to_load_and_run_record():
    mix = Workload.from_spec("pecsched:splitwise_conv,n=16,hi=200000")
    scaled, cap = rescale_to_load(mix, CLUSTER, 0.5, "sarathi", {})
    assert cap > 0 and len(scaled) == len(mix) and scaled.name.endswith("load=0.5")
    span = float(scaled.arrivals_s.max() - scaled.arrivals_s.min())
    assert (len(mix) - 1) / span == pytest.approx(0.5 * cap, rel=0.2)      # the mean rate is load x capacity
    workload = Workload.from_spec("fixed:I=32,O=4,B=8")
    result = simulate_cluster(workload, CLUSTER, "fifo", "sarathi")
    record = run_record("fifo", "sarathi", result)
    assert list(record) == ["policy", "scheduler", "metrics", "by_tag", "num_preemptions", "num_overtakes",
                            "utilization"]
    assert record["metrics"] == result.metrics and len(record["utilization"]) == CLUSTER.num_replicas
