"""The cluster judge: it accepts every schedule the cluster engine writes and rejects a catalogue of broken ones.

Each broken schedule is a valid one's JSON document with one thing changed; the
judge must name the rule it breaks (``CATALOGUE``: mutation -> rule).
"""
from __future__ import annotations

import copy

import numpy as np
import pytest

from infermax import Workload
from infermax.cluster import Cluster, ClusterSchedule, get_policy, simulate_cluster
from infermax.cluster.judge import ClusterScheduleError, replay_cluster

CLUSTER = Cluster.from_spec("a100:nodes=2,gpus_per_node=4,model=mistral-7b-v0.3")
SPEC = "pecsched:splitwise_conv,n=60,hi=300000"
POLICIES = ("fifo", "reservation", "priority", "pecsched", "pecsched-pe", "pecsched-dis", "pecsched-col",
            "pecsched-fsp")


def _options(policy: str) -> dict:
    return {"sp_replicas": 2, **({"decode_replicas": 2} if get_policy(policy).disaggregate else {})}


@pytest.fixture(scope="module")
def workload():
    return Workload.from_spec(SPEC)


@pytest.fixture(scope="module")
def runs(workload):
    class Lazy(dict):              # each policy simulated when a test first asks for it
        def __missing__(self, p):
            self[p] = simulate_cluster(workload, CLUSTER, p, "vllm", **_options(p))
            return self[p]
    return Lazy()


@pytest.mark.parametrize("policy", [p if p in ("fifo", "pecsched", "pecsched-dis") else
                                    pytest.param(p, marks=pytest.mark.slow) for p in POLICIES])
def test_the_engines_schedules_replay_through_json(runs, workload, policy):
    res = runs[policy]
    schedule = ClusterSchedule.from_json(res.cluster_schedule().to_json())
    out = replay_cluster(schedule, workload)
    for key in ("first_scheduled_s", "first_token_s", "completion_s"):
        np.testing.assert_array_equal(out.requests[key], res.trace.requests[key], err_msg=key)
    assert out.num_migrations == len(res.migrations)
    assert out.num_suspensions == res.num_preemptions or policy == "pecsched-col"   # /CoL also yields decodes
    assert out.metrics()["e2e_mean_s"] == res.metrics["e2e_mean_s"]


# --- the catalogue: one change to a valid document each, and the rule it breaks ---------------------------
def _gang(doc, suspended=False, colocated=False):
    for g in doc["gangs"]:
        if suspended and not any(s.get("suspended") for s in g["steps"]):
            continue
        if colocated and not any(s.get("colocated") for s in g["steps"]):
            continue
        return g
    raise AssertionError("no such gang in the base schedule")


def _phase(g, phase):
    return [s for s in g["steps"] if s["phase"] == phase]


def _event(doc, kind):
    for r, events in enumerate(doc["events"]):
        for e in events:
            if e[2] == kind:
                return r, e
    raise AssertionError(f"no {kind} event in the base schedule")


def _migration_of(doc, e):
    return next(m for m in doc["migrations"] if m["request"] == e[3])


def _suspension_hold(doc):
    """The hold event that adds a suspended gang's saved activations, and its replica."""
    g = _gang(doc, suspended=True)
    stop = _phase(g, "prefill")[0]["end_s"]
    r = g["members"][0]
    return g, r, next(e for e in doc["events"][r] if e[2] == "hold" and e[1] == stop)


def receive_early(doc, w):
    _, e = _event(doc, "receive")
    e[1] = _migration_of(doc, e)["arrive_s"] - 1e-3


def migration_too_fast(doc, w):
    m = doc["migrations"][0]
    m["arrive_s"] = m["sent_s"]


def kv_sent_before_first_token(doc, w):
    doc["migrations"][0]["sent_s"] -= 1e-3


def receive_without_migration(doc, w):
    del doc["migrations"][0]


def receive_wrong_generated(doc, w):
    _, e = _event(doc, "receive")
    e[5] = 2


def batch_into_prefill_segment(doc, w):
    """A member's batch after a suspension moved back to the short request's dispatch, inside the segment."""
    g = _gang(doc, suspended=True)
    seg = _phase(g, "prefill")[0]
    for r in g["members"]:
        disp = [e for e in doc["events"][r] if e[2] == "dispatch" and seg["start_s"] < e[1] < seg["end_s"]]
        if disp:
            j = disp[0][0]
            doc["replicas"][r]["batches"][j]["not_before_s"] = disp[0][1]
            return
    raise AssertionError("no dispatch during a prefill segment")


def colocated_undeclared(doc, w):
    step = next(s for s in _phase(_gang(doc, colocated=True), "decode") if s["colocated"])
    step["colocated"] = []


def colocated_outside_step(doc, w):
    step = next(s for s in _phase(_gang(doc, colocated=True), "decode") if s["colocated"])
    step["start_s"] += 1e-4


def two_gangs_on_one_replica(doc, w):
    """A member of one gang swapped for a same-node replica of a gang alive at the same time (same price)."""
    node = CLUSTER.gpus_per_node // CLUSTER.replica_gpus
    for a in doc["gangs"]:
        for b in doc["gangs"]:
            overlap = a is not b and b["steps"][0]["start_s"] < a["steps"][-1]["end_s"] and \
                a["steps"][0]["start_s"] < b["steps"][-1]["end_s"]
            same = [(k, r) for k, x in enumerate(b["members"]) for r in a["members"] if r // node == x // node]
            if overlap and same:
                k, r = same[0]
                b["members"][k] = r
                return
    raise AssertionError("no two gangs alive at once on one node")


def decode_before_prefill_ends(doc, w):
    g = doc["gangs"][0]
    _phase(g, "decode")[0]["start_s"] = _phase(g, "prefill")[-1]["end_s"] - 1e-3


def decode_steps_swapped(doc, w):
    d = _phase(doc["gangs"][0], "decode")
    d[0]["gen"], d[1]["gen"] = d[1]["gen"], d[0]["gen"]


def resume_wrong_unit(doc, w):
    _phase(_gang(doc, suspended=True), "prefill")[1]["units"][0] += 1


def resume_without_switch(doc, w):
    g = _gang(doc, suspended=True)
    _phase(g, "prefill")[1]["start_s"] += 2 * g["switch_s"]


def suspended_never_resumed(doc, w):
    g = _gang(doc, suspended=True)
    segs = _phase(g, "prefill")
    g["steps"] = [segs[0]] + _phase(g, "decode")


def suspension_unmarked(doc, w):
    _phase(_gang(doc, suspended=True), "prefill")[0]["suspended"] = False


def segment_too_short(doc, w):
    seg = _phase(doc["gangs"][0], "prefill")[0]
    seg["end_s"] = seg["start_s"] + 0.5 * (seg["end_s"] - seg["start_s"])


def prefill_stops_short(doc, w):
    _phase(doc["gangs"][0], "prefill")[-1]["units"][1] -= 1


def hold_over_M(doc, w):
    _, _, e = _suspension_hold(doc)
    e[4] = doc["meta"]["limits"]["M"]


def M_shrunk(doc, w):
    doc["meta"]["limits"]["M"] = 1000


def hold_below_share(doc, w):
    g = doc["gangs"][0]
    r = g["members"][0]
    e = next(e for e in doc["events"][r] if e[2] == "hold")
    e[4] = g["share_tokens"] - 1


def saved_state_not_held(doc, w):
    g, _, e = _suspension_hold(doc)
    e[4] = g["share_tokens"]


def colocated_over_cap(doc, w):
    r, j = next(s for s in _phase(_gang(doc, colocated=True), "decode") if s["colocated"])["colocated"][0]
    doc["meta"]["options"]["colocate_tokens"] = sum(doc["replicas"][r]["batches"][j]["tokens"]) - 1


def _dispatch_at_end(doc, r, rid, t):
    doc["events"][r].append([len(doc["replicas"][r]["batches"]), t, "dispatch", rid])


def dispatched_to_two_replicas(doc, w):
    r, e = _event(doc, "dispatch")
    other = next(x for x in range(len(doc["replicas"])) if x != r and doc["replicas"][x]["batches"])
    last = max(x[1] for x in doc["events"][other] if x[2] == "dispatch")
    _dispatch_at_end(doc, other, e[3], max(last, e[1]))


def dispatched_twice_to_one_replica(doc, w):
    r, e = _event(doc, "dispatch")
    doc["events"][r].insert(doc["events"][r].index(e) + 1, list(e))


def long_request_also_on_a_replica(doc, w):
    g = doc["gangs"][0]
    other = next(x for x in range(len(doc["replicas"])) if x not in g["members"])
    last = max(x[1] for x in doc["events"][other] if x[2] == "dispatch")
    _dispatch_at_end(doc, other, g["request"], max(last, g["steps"][0]["start_s"]))


def gang_listed_twice(doc, w):
    doc["gangs"].append(copy.deepcopy(doc["gangs"][0]))


def long_request_never_served(doc, w):
    del doc["gangs"][0]


def last_decode_step_missing(doc, w):
    doc["gangs"][0]["steps"].pop()


def dispatch_before_arrival(doc, w):
    for events in doc["events"]:
        for e in events:
            if e[2] == "dispatch" and w.arrivals_s[w.index_of(e[3])] > 1:
                e[1] = float(w.arrivals_s[w.index_of(e[3])]) - 1
                return
    raise AssertionError("no dispatch after 1 s")


def dispatches_out_of_order(doc, w):
    for events in doc["events"]:
        disp = [e for e in events if e[2] == "dispatch"]
        if len(disp) > 1:
            disp[0][1] = disp[1][1] + 1
            return
    raise AssertionError("no replica with two dispatches")


def prefill_underpriced(doc, w):
    doc["gangs"][0]["prefill_s"] /= 2


def shares_miss_tokens(doc, w):
    _phase(doc["gangs"][0], "decode")[0]["shares"][0] -= 1


def decode_step_too_short(doc, w):
    step = _phase(doc["gangs"][0], "decode")[0]
    step["end_s"] = step["start_s"]


def C_shrunk(doc, w):
    doc["meta"]["limits"].update(C=8, P=8)


def unknown_event(doc, w):
    _, e = _event(doc, "dispatch")
    e[2] = "teleport"


CATALOGUE = [   # (mutation, base policy, rule)
    (receive_early, "pecsched", "kv-arrival"),
    (migration_too_fast, "pecsched", "kv-arrival"),
    (kv_sent_before_first_token, "pecsched", "kv-arrival"),
    (receive_without_migration, "pecsched", "kv-arrival"),
    (receive_wrong_generated, "pecsched", "kv-arrival"),
    (batch_into_prefill_segment, "pecsched", "gang-busy"),
    (colocated_undeclared, "pecsched-pe", "gang-busy"),
    (colocated_outside_step, "pecsched-pe", "gang-busy"),
    (two_gangs_on_one_replica, "fifo", "gang-busy"),
    (decode_before_prefill_ends, "fifo", "gang-busy"),
    (decode_steps_swapped, "fifo", "gang-busy"),
    (resume_wrong_unit, "pecsched", "resume"),
    (resume_without_switch, "pecsched", "resume"),
    (suspended_never_resumed, "pecsched", "resume"),
    (suspension_unmarked, "pecsched", "resume"),
    (segment_too_short, "fifo", "resume"),
    (prefill_stops_short, "fifo", "resume"),
    (hold_over_M, "pecsched", "M"),
    (M_shrunk, "fifo", "M"),
    (hold_below_share, "fifo", "hold"),
    (saved_state_not_held, "pecsched", "hold"),
    (colocated_over_cap, "pecsched-pe", "colocate-cap"),
    (dispatched_to_two_replicas, "fifo", "once"),
    (dispatched_twice_to_one_replica, "fifo", "once"),
    (long_request_also_on_a_replica, "fifo", "once"),
    (gang_listed_twice, "fifo", "once"),
    (long_request_never_served, "fifo", "once"),
    (last_decode_step_missing, "fifo", "once"),
    (dispatch_before_arrival, "fifo", "arrival"),
    (dispatches_out_of_order, "fifo", "dispatch"),
    (prefill_underpriced, "fifo", "gang-price"),
    (shares_miss_tokens, "fifo", "gang-price"),
    (decode_step_too_short, "fifo", "gang-time"),
    (C_shrunk, "fifo", "C"),
    (unknown_event, "fifo", "format"),
]


@pytest.fixture(scope="module")
def documents(runs):
    return {p: runs[p].cluster_schedule().to_dict() for p in ("fifo", "pecsched", "pecsched-pe")}


@pytest.mark.parametrize("mutate, policy, rule", CATALOGUE, ids=[m.__name__ for m, _, _ in CATALOGUE])
def test_a_broken_schedule_is_rejected_with_its_rule(documents, workload, mutate, policy, rule):
    doc = copy.deepcopy(documents[policy])
    mutate(doc, workload)
    with pytest.raises(ClusterScheduleError) as exc:
        replay_cluster(ClusterSchedule.from_dict(doc), workload)
    assert exc.value.rule == rule, str(exc.value)


def test_the_catalogue_covers_the_issues_rules():
    rules = {rule for _, _, rule in CATALOGUE}
    assert {"kv-arrival", "gang-busy", "resume", "hold", "M", "colocate-cap", "once"} <= rules
    counts = {rule: sum(r == rule for _, _, r in CATALOGUE) for rule in sorted(rules)}
    print(f"judge catalogue: {len(CATALOGUE)} mutations over {len(rules)} rules: {counts}")


@pytest.mark.slow
@pytest.mark.parametrize("policy", POLICIES)
def test_larger_runs_replay(policy):
    w = Workload.from_spec("pecsched:splitwise_conv,n=160,hi=300000")
    res = simulate_cluster(w, CLUSTER, policy, "vllm", **_options(policy))
    out = replay_cluster(res.cluster_schedule(), w)
    np.testing.assert_array_equal(out.requests["completion_s"], res.trace.requests["completion_s"])


def test_the_cli_judges_a_cluster_schedule(documents, tmp_path, capsys):
    import json

    from infermax.cli import main
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(json.dumps(documents["pecsched"]))
    doc = copy.deepcopy(documents["pecsched"])
    resume_wrong_unit(doc, None)
    bad.write_text(json.dumps(doc))
    assert main(["replay", str(good), "--workload", SPEC, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["valid"] is True
    assert main(["replay", str(bad), "--workload", SPEC, "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and out["rule"] == "resume"
