"""Executed TP × SPP × KVP plans (infermax/cluster/plans.py, kvp.py) and their judge (judge_plans.py)."""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermax.cluster import Cluster, simulate_cluster
from infermax.cluster.judge import replay_cluster
from infermax.cluster.judge_gangs import ClusterScheduleError
from infermax.cluster.kvp import KVLayout
from infermax.cluster.schedule import ClusterSchedule

NODE = "h100:nodes={n},gpus_per_node=8,model=llama3-8b,tp=4"


def spec(spp: int = 1, kvp: int = 1) -> str:
    n = max(1, 4 * spp * kvp // 8)
    return NODE.format(n=n) + (f",spp={spp}" if spp > 1 else "") + (f",kvp={kvp}" if kvp > 1 else "")


def one(spp: int, kvp: int, prompt: int, output: int, chunk: int, policy: str = "medha-3d", **kw):
    return simulate_cluster(f"fixed:I={prompt},O={output},B=1", spec(spp, kvp), policy, "sarathi-pc",
                            limits=f"C={prompt},P={chunk}", **kw)


# --- SPP -------------------------------------------------------------------------------------------
def test_spp_ttft_falls_near_linearly_with_stages():
    ttft = {p: one(p, 1, 400_000, 2, 4096).metrics["ttft_mean_s"] for p in (1, 4)}
    assert 0.8 < ttft[1] / (4 * ttft[4]) <= 1.0 + 1e-9


def test_decode_pays_one_pipeline_pass_and_plain_pp_pays_one_per_chunk():
    r = one(4, 1, 40_000, 6, 4096)
    plan = r.plans[0]
    stage, starts = np.array(plan["stage_s"]), np.array(plan["stage_start_s"])
    decode = slice(-4, None)                       # the last four batches: one token each
    exits = starts[:, -1] + stage
    # each decode enters when its previous token left the last stage: one whole pass per token
    assert np.allclose(starts[decode, 0], exits[-5:-1], rtol=1e-12)
    pp = one(4, 1, 40_000, 6, 4096, policy="medha-3d-pp").metrics["ttft_mean_s"]
    assert pp > 2 * r.metrics["ttft_mean_s"]      # chunks no longer overlap across stages


def test_stage_intervals_never_overlap():
    plan = one(4, 2, 60_000, 4, 2048).plans[0]
    starts, stage = np.array(plan["stage_start_s"]), np.array(plan["stage_s"])
    for q in range(starts.shape[1]):
        assert np.all(starts[1:, q] >= starts[:-1, q] + stage[:-1] - 1e-12)
        if q:
            assert np.all(starts[:, q] >= starts[:, q - 1] + stage - 1e-12)


def test_spp_and_kvp_one_is_the_old_path():
    a = simulate_cluster("fixed:I=3000,O=5,B=4", spec(), "fifo", "sarathi")
    b = simulate_cluster("fixed:I=3000,O=5,B=4", spec(), "medha-2d", "sarathi")
    assert a.plans == () and b.plans == ()
    assert np.array_equal(a.trace.requests["completion_s"], b.trace.requests["completion_s"])


# --- KVP -------------------------------------------------------------------------------------------
def test_kvp_groups_onboarded_as_kv_grows_and_never_above_capacity():
    r = one(1, 4, 50_000, 4, 4096, kvp_group_tokens=15_000)
    plan = r.plans[0]
    kv = np.array(plan["group_kv"])
    assert kv.max() <= plan["group_capacity"]
    groups_in_use = (kv > 0).sum(axis=1)
    assert groups_in_use[0] == 1 and groups_in_use.max() == 4           # one group first, all four at the end
    assert np.all(np.diff(groups_in_use[:-1]) >= 0)
    assert [o[3] for o in plan["onboard"]] == [0, 15_000, 30_000, 45_000]


def test_merge_cost_is_paid_only_when_kv_spans_groups():
    spread = one(1, 4, 40_000, 4, 8192)                                # default limit: 10,001 tokens a group
    alone = one(1, 4, 40_000, 4, 8192, kvp_group_tokens=40_003)        # the whole request on one group
    assert np.array(alone.plans[0]["group_kv"]).astype(bool).sum(axis=1).max() == 1
    # on one group there is no merge and no split of attention: the decode equals the KVP-1 plan's
    kvp1 = one(1, 1, 40_000, 4, 8192)
    assert alone.metrics["tpot_mean_s"] == pytest.approx(kvp1.metrics["tpot_mean_s"], rel=1e-12)
    assert spread.metrics["tpot_mean_s"] != pytest.approx(kvp1.metrics["tpot_mean_s"], rel=1e-6)


def test_a_request_no_plan_can_hold_is_refused_naming_the_limit():
    with pytest.raises(ValueError, match="raise spp or kvp"):
        simulate_cluster("fixed:I=10000000,O=2,B=1", "h100:nodes=1,gpus_per_node=8,model=llama3-8b,tp=8,kvp=1",
                         "medha-3d")
    with pytest.raises(ValueError, match="kvp_group_tokens"):
        one(1, 4, 50_000, 2, 4096, kvp_group_tokens=1000)
    with pytest.raises(ValueError, match="kvp = 4"):
        one(1, 4, 5_000, 2, 4096, policy="medha-2d")
    with pytest.raises(ValueError, match="spp"):
        Cluster.from_spec("h100:nodes=2,gpus_per_node=8,model=llama3-8b,tp=4,pp=2,spp=2")


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(100, 5000), st.lists(st.integers(1, 3000), min_size=1, max_size=12),
       st.sampled_from(["dynamic", "static"]))
def test_layout_places_every_token_once_and_work_sums_to_the_unsplit(k, limit, chunks, mode):
    lay = KVLayout(k, 10**9, limit, mode)
    m = 0
    for c in chunks:
        _, work = lay.place(0, c, False)
        assert work.sum() == pytest.approx(c * m + c * (c + 1) / 2, rel=1e-12)
        m += c
        assert lay.tokens_of(0).sum() == m == lay.kv.sum()
    lay.free(0)
    assert lay.kv.sum() == 0


# --- the judge -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def judged():
    r = one(4, 2, 30_000, 4, 4096)
    return r, r.cluster_schedule(), "fixed:I=30000,O=4,B=1"


def test_judge_reproduces_an_executed_plan(judged):
    r, sched, w = judged
    rep = replay_cluster(ClusterSchedule.from_json(sched.to_json()), w)
    assert np.allclose(rep.requests["first_token_s"], r.trace.requests["first_token_s"], rtol=1e-12)
    assert np.allclose(rep.requests["completion_s"], r.trace.requests["completion_s"], rtol=1e-12)


def _doctored(sched: ClusterSchedule, edit) -> ClusterSchedule:
    doc = copy.deepcopy(sched.to_dict())
    edit(doc["plans"][0])
    return ClusterSchedule.from_dict(doc)


def test_judge_rejects_a_stage_running_two_batches(judged):
    _, sched, w = judged

    def overlap(plan):
        plan["stage_start_s"][3] = list(plan["stage_start_s"][2])     # batch 3 where batch 2 runs
    with pytest.raises(ClusterScheduleError, match="stage-busy"):
        replay_cluster(_doctored(sched, overlap), w)


def test_judge_rejects_an_over_full_group(judged):
    _, sched, w = judged

    def shrink(plan):
        plan["group_capacity"] = 1000
    with pytest.raises(ClusterScheduleError, match="capacity"):
        replay_cluster(_doctored(sched, shrink), w)


def test_judge_rejects_an_early_decode(judged):
    _, sched, w = judged
    doc = copy.deepcopy(sched.to_dict())
    doc["replicas"][0]["batches"][-1]["not_before_s"] = 0.0
    with pytest.raises(ClusterScheduleError, match="pipeline-order|previous batch|plan-time"):
        replay_cluster(ClusterSchedule.from_dict(doc), w)


def test_judge_follows_evictions_and_refills_on_kvp_groups():
    w = "fixed:I=1500,O=500,B=200"
    r = simulate_cluster(w, "h100:nodes=1,gpus_per_node=8,model=llama3-8b,tp=2,spp=2,kvp=2,util=0.1", "medha-3d",
                         "vllm")
    assert r.metrics["num_evictions"] > 0
    plan = r.plans[0]
    assert np.array(plan["group_kv"]).max() <= plan["group_capacity"]
    rep = replay_cluster(r.cluster_schedule(), w)
    assert np.allclose(rep.requests["completion_s"], r.trace.requests["completion_s"], rtol=1e-12)


def test_cli_takes_the_medha_policies_as_schedulers(capsys):
    import json

    from infermax.cli import main
    argv = ["simulate", "--cluster", "h100:nodes=8,gpus_per_node=8,model=llama3-8b,tp=4,spp=4,kvp=4",
            "--scheduler", "medha-3d,medha-3d-static", "--workload", "fixed:I=50000,O=4,B=1", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert [(r["policy"], r["scheduler"]) for r in out["results"]] == [("medha-3d", "medha"),
                                                                        ("medha-3d-static", "medha")]
    assert all(r["metrics"]["tpot_mean_s"] > 0 for r in out["results"])
