"""DESIGN invariant 6 for the cluster (issue 36 §4): every cluster policy finishes every instance it accepts, and
the cluster judge — ``infermax replay`` too — accepts the schedule it writes.

The property test draws where the cluster engine once crashed, got stuck or wrote schedules the judge refused:
tp = 1 with kvp = 2 (medha-3d*), two-request instances, every request on a gang, a small ``util`` whose M makes
a short request not fit beside a gang's KV share (pecsched*).
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax import Request, Workload
from infermax.cli import main
from infermax.cluster import Cluster, ClusterSchedule, replay_cluster, simulate_cluster
from infermax.cluster.policies import POLICIES, get_policy

CLUSTER_POLICIES = tuple(p for p in POLICIES if get_policy(p).name == p)
SPECS = ("a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3", "a100:nodes=1,gpus_per_node=3,model=llama2-7b,util=0.25",
         "a100:nodes=1,gpus_per_node=4,tp=1,kvp=2,model=mistral-7b-v0.3",
         "a100:nodes=1,gpus_per_node=2,tp=1,kvp=2,model=llama2-7b",
         "a100:nodes=2,gpus_per_node=2,model=mistral-7b-v0.3")
LOCALS = (None, "vllm", "sarathi", "vllm-hy", "medha")


def finishes_or_refuses(w: Workload, spec: str, policy: str, local=None, **options):
    """Run the policy: None if it refused (a ValueError), else the result, after checking that the judge,
    reading the schedule back from JSON, recomputes every request's times."""
    try:
        res = simulate_cluster(w, spec, policy, local, **options)
    except ValueError:
        return None
    out = replay_cluster(ClusterSchedule.from_json(res.cluster_schedule().to_json()), w)
    for key in ("first_token_s", "completion_s"):
        np.testing.assert_array_equal(out.requests[key], res.trace.requests[key], err_msg=key)
    out.metrics()
    return res


# --- the instances the issue names --------------------------------------------------------------------------
PEC_TWO = Workload(requests=(Request(id=0, input_len=10132, output_len=17, arrival_s=0.0606, tag="long"),
                             Request(id=1, input_len=8663, output_len=9, arrival_s=0.9439, tag="short")))


@pytest.mark.parametrize("policy", ["fifo", "pecsched", "pecsched-col", "pecsched-fsp", "pecsched-pe"])
def test_a_short_request_that_cannot_fit_beside_a_gang_does_not_preempt_it(policy):
    # M = 15254: the gang of one replica holds 10148 KV tokens; the short request needs 8671. Sent there, it
    # suspended the gang's prefill and then waited for KV the gang held while the gang waited for it
    res = finishes_or_refuses(PEC_TWO, SPECS[1], policy, "sarathi", sp_replicas=2, decode_replicas=2)
    assert res is not None and np.isfinite(res.trace.requests["completion_s"]).all()


@pytest.mark.parametrize("policy", ["medha-3d", "medha-3d-pp", "medha-3d-static"])
def test_medha_runs_kvp_groups_of_one_gpu(policy):
    # tp = pp = 1: the replica's per-group cost model prices no communication (it had no 'comm'), the merge does
    w = Workload.from_lengths([300, 1200, 64, 5000], [4, 3, 8, 2], [0.0, 0.01, 0.02, 0.05], name="kvp")
    res = finishes_or_refuses(w, SPECS[2], policy)
    assert res is not None and res.plans and res.plans[0]["groups"] == 2


def test_replay_accepts_a_schedule_whose_every_request_ran_on_a_gang(tmp_path, capsys):
    w = Workload(requests=tuple(Request(id=k, input_len=20000 + 1000 * k, output_len=3, arrival_s=0.01 * k, tag="long")
                                for k in range(2)), name="all-gang")
    res = finishes_or_refuses(w, SPECS[0], "fifo", sp_replicas=2)
    assert len(res.gangs) == 2 and not any(s.batches for s in res.schedules)
    (tmp_path / "w.json").write_text(json.dumps(w.to_dict()))
    res.cluster_schedule().to_json(tmp_path / "s.json")
    assert main(["replay", str(tmp_path / "s.json"), "--workload", str(tmp_path / "w.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is True and out["num_gangs"] == 2 and out["num_batches"] == 0


def test_a_replica_of_an_executed_plan_that_ran_no_batch_replays():
    # reservation keeps replica 0 for short requests; with long ones only it runs nothing, and its plan record
    # (no batch) was read as a table of -1 columns
    w = Workload(requests=tuple(Request(id=k, input_len=i, output_len=o, arrival_s=0.01 * k, tag="long")
                                for k, (i, o) in enumerate([(22440, 2), (9542, 4), (2989, 11)])), name="reserved")
    res = finishes_or_refuses(w, "a100:nodes=1,gpus_per_node=4,kvp=2,model=mistral-7b-v0.3", "reservation",
                              sp_replicas=1)
    assert not res.schedules[0].batches and res.plans[0]


# --- the property ------------------------------------------------------------------------------------------
@st.composite
def cluster_instances(draw):
    """(workload, spec, policy, local, options): 1-4 requests (two, half the time), all of them long (on
    gangs) a quarter of the time; clusters of 1-4 replicas, with tp = 1 and kvp = 2 among them."""
    spec = draw(st.sampled_from(SPECS))
    policy = draw(st.sampled_from(CLUSTER_POLICIES))
    n = draw(st.sampled_from([2, 2, 1, 3, 4]))
    plan = Cluster.from_spec(spec).executes_plan and draw(st.integers(0, 3)) > 0   # (plans take no gangs)
    all_gang = not plan and draw(st.integers(0, 3)) == 0
    reqs = []
    for k in range(n):
        long = not plan and (all_gang or draw(st.booleans()))
        I = draw(st.integers(4000, 30000) if long else st.integers(1, 9000))
        reqs.append(Request(id=k, input_len=I, output_len=draw(st.integers(1, 12)),
                            arrival_s=draw(st.sampled_from([0.0, 0.001, 0.05, 0.5])) * k, tag="long" if long else None))
    R = Cluster.from_spec(spec).num_replicas
    options = {"sp_replicas": draw(st.integers(1, R))}
    if get_policy(policy).disaggregate and R > 1:
        options["decode_replicas"] = draw(st.integers(1, R - 1))
    return Workload(requests=tuple(reqs), name="prop"), spec, policy, draw(st.sampled_from(LOCALS)), options


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=cluster_instances())
def test_every_policy_finishes_or_refuses_and_its_schedule_replays(inst):
    w, spec, policy, local, options = inst
    finishes_or_refuses(w, spec, policy, local, **options)


@pytest.mark.slow
@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inst=cluster_instances())
def test_every_policy_finishes_or_refuses_many(inst):
    w, spec, policy, local, options = inst
    finishes_or_refuses(w, spec, policy, local, **options)
