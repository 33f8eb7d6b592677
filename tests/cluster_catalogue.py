"""A catalogue of broken cluster schedules (issue 36 §3): each a valid document with one thing broken, the rule
the cluster judge must name, and the text its message must contain (the field's path for a ``format`` case).

Base documents (:func:`bases`) are small runs of the cluster engine on :data:`WORKLOAD` (two long requests
on gangs, six short ones): ``fifo``, ``reservation`` and ``priority`` (gang members hold KV and run no batch),
``pecsched`` (suspensions, hand-offs, migrations), ``pecsched-pe`` (colocated long decodes), ``csps`` (an SP
plan, Q shipping), ``loongserve`` (a gang's KV moves to a decode instance) and ``medha-3d`` (executed plans).
Cases are (name, base, mutation, rule, text); ``mutation(doc)`` edits the JSON document in place.
"""
from __future__ import annotations

import json
from functools import lru_cache
from typing import Any, Callable, NamedTuple

from infermax import Request, Workload
from infermax.cluster import simulate_cluster

C4 = "a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3"
PLAN4 = "a100:nodes=1,gpus_per_node=4,kvp=2,spp=2,model=mistral-7b-v0.3"
_LENGTHS = [(120, 4, 0.0, "short"), (30000, 4, 0.001, "long"), (200, 5, 0.05, "short"), (80, 3, 0.3, "short"),
            (40000, 3, 0.31, "long"), (150, 6, 0.5, "short"), (60, 2, 1.2, "short"), (90, 4, 1.5, "short")]
WORKLOAD = Workload(requests=tuple(Request(id=k, input_len=i, output_len=o, arrival_s=t, tag=tag)
                                   for k, (i, o, t, tag) in enumerate(_LENGTHS)), name="catalogue")
#: medha-3d runs no gangs: the same requests, prompts cut to 3000 tokens, untagged
PLAN_WORKLOAD = Workload(requests=tuple(Request(id=k, input_len=min(i, 3000), output_len=o, arrival_s=t)
                                        for k, (i, o, t, _) in enumerate(_LENGTHS)), name="catalogue-plan")
#: csps: long prompts that its plans spread over several GPUs (SPTs), so that its gangs communicate
CSPS_WORKLOAD = Workload(requests=tuple(Request(id=k, input_len=i * 5 if tag == "long" else i, output_len=o,
                                                arrival_s=t, tag=tag)
                                        for k, (i, o, t, tag) in enumerate(_LENGTHS)), name="catalogue-csps")
RUNS = {"fifo": (C4, "vllm", {"sp_replicas": 2}), "reservation": (C4, "vllm", {"sp_replicas": 2}),
        "priority": (C4, "vllm", {"sp_replicas": 2}),
        "pecsched": (C4, "vllm", {"sp_replicas": 2, "decode_replicas": 1}),
        "pecsched-pe": (C4, "vllm", {"sp_replicas": 2, "decode_replicas": 1}),
        "csps": (C4, "vllm", {}), "loongserve": (C4, "sarathi", {"decode_replicas": 1}),
        "medha-3d": (PLAN4, None, {})}


def workload_of(base: str) -> Workload:
    return PLAN_WORKLOAD if base.startswith("medha") else CSPS_WORKLOAD if base == "csps" else WORKLOAD


@lru_cache(maxsize=None)
def _base_json(base: str) -> str:
    spec, scheduler, options = RUNS[base]
    return simulate_cluster(workload_of(base), spec, base, scheduler, **options).cluster_schedule().to_json()


def base_document(base: str) -> dict:
    """A fresh copy of the base run's document (JSON, as a file holds it)."""
    return json.loads(_base_json(base))


class Case(NamedTuple):
    name: str
    base: str
    mutate: Callable[[dict], Any]
    rule: str
    text: str            # what the message names (a field's path, a rule's subject)


# --- locating parts of a document -------------------------------------------------------------------------
def event(doc: dict, kind: str) -> list:
    return next(e for ev in doc["events"] for e in ev if e[2] == kind)


def gang_hold(doc: dict) -> list:
    """The first hold event of the first gang's first member (its share)."""
    r = doc["gangs"][0]["members"][0]
    return next(e for e in doc["events"][r] if e[2] == "hold")


def step(doc: dict, phase: str, colocated: bool = False) -> dict:
    return next(s for g in doc["gangs"] for s in g["steps"]
                if s["phase"] == phase and (not colocated or s.get("colocated")))


def first_batch(doc: dict) -> dict:
    return next(r for r in doc["replicas"] if r["batches"])["batches"][0]


def _set(obj: Any, key: Any, value: Any) -> None:
    obj[key] = value


def _cases_format() -> list[Case]:
    """Wrongly typed or shaped fields: rule ``format``, the field named."""
    g0 = lambda d: d["gangs"][0]
    m0 = lambda d: d["migrations"][0]
    f = "format"
    return [
        Case("format_missing", "fifo", lambda d: d.pop("format"), f, "format must be"),
        Case("format_wrong", "fifo", lambda d: _set(d, "format", "infermax.schedule/1"), f, "format must be"),
        Case("unknown_top_field", "fifo", lambda d: _set(d, "extra", 1), f, "'extra'"),
        *[Case(f"missing_{k}", "fifo", lambda d, k=k: d.pop(k), f, repr(k))
          for k in ("meta", "replicas", "events", "gangs", "migrations")],
        Case("meta_as_array", "fifo", lambda d: _set(d, "meta", []), f, "meta must be an object"),
        Case("unknown_policy", "fifo", lambda d: _set(d["meta"], "policy", "fifoo"), f, "meta.policy"),
        Case("policy_as_number", "fifo", lambda d: _set(d["meta"], "policy", 3), f, "meta.policy"),
        Case("policy_missing", "fifo", lambda d: d["meta"].pop("policy"), f, "'policy'"),
        Case("cluster_as_object", "fifo", lambda d: _set(d["meta"], "cluster", {}), f, "meta.cluster"),
        Case("limits_M_as_string", "fifo", lambda d: _set(d["meta"]["limits"], "M", "479227"), f, "meta.limits.M"),
        Case("limits_C_as_float", "fifo", lambda d: _set(d["meta"]["limits"], "C", 4096.0), f, "meta.limits.C"),
        Case("limits_unknown_key", "fifo", lambda d: _set(d["meta"]["limits"], "Q", 1), f, "'Q'"),
        Case("colocate_tokens_as_string", "pecsched-pe", lambda d: _set(d["meta"]["options"], "colocate_tokens",
                                                                        "512"), f, "meta.options.colocate_tokens"),
        Case("fast_forward_as_string", "fifo", lambda d: _set(d["meta"]["options"], "fast_forward", "yes"), f,
             "meta.options.fast_forward"),
        Case("replicas_as_object", "fifo", lambda d: _set(d, "replicas", {"0": d["replicas"][0]}), f,
             "replicas must be an array"),
        Case("batch_tokens_as_floats", "fifo", lambda d: _set(first_batch(d), "tokens",
                                                               [float(x) for x in first_batch(d)["tokens"]]),
             f, "batches[0].tokens[0]"),
        Case("batch_ids_as_strings", "fifo", lambda d: _set(first_batch(d), "ids",
                                                             [str(x) for x in first_batch(d)["ids"]]),
             f, "batches[0].ids[0]"),
        Case("events_as_object", "fifo", lambda d: _set(d, "events", {"0": d["events"][0]}), f,
             "events must be an array"),
        Case("replica_events_as_object", "fifo", lambda d: _set(d["events"], 0, {"a": 1}), f, "events[0]"),
        Case("event_as_object", "fifo", lambda d: _set(d["events"][0], 0, dict(zip(
            ("before_batch", "time_s", "kind", "request"), d["events"][0][0]))), f, "events[0][0]"),
        Case("event_too_short", "fifo", lambda d: d["events"][0][0].pop(), f, "events[0][0]"),
        Case("event_time_as_string", "fifo", lambda d: _set(d["events"][0][0], 1, str(d["events"][0][0][1])), f,
             "events[0][0][1] (time_s)"),
        Case("event_time_infinite", "fifo", lambda d: _set(d["events"][0][0], 1, float("inf")), f, "(time_s)"),
        Case("event_time_nan", "fifo", lambda d: _set(d["events"][0][0], 1, float("nan")), f, "(time_s)"),
        Case("event_time_negative", "fifo", lambda d: _set(d["events"][0][0], 1, -1.0), f, "(time_s)"),
        Case("before_batch_as_float", "fifo", lambda d: _set(d["events"][0][0], 0, float(d["events"][0][0][0])),
             f, "(before_batch)"),
        Case("before_batch_as_string", "fifo", lambda d: _set(d["events"][0][0], 0, "0"), f, "(before_batch)"),
        Case("before_batch_as_bool", "fifo", lambda d: _set(d["events"][0][0], 0, False), f, "(before_batch)"),
        Case("event_kind_as_number", "fifo", lambda d: _set(d["events"][0][0], 2, 1), f, "(kind)"),
        Case("request_id_as_string", "fifo", lambda d: _set(event(d, "dispatch"), 3, str(event(d, "dispatch")[3])),
             f, "(request)"),
        Case("request_id_as_float", "fifo", lambda d: _set(event(d, "dispatch"), 3,
                                                            float(event(d, "dispatch")[3])), f, "(request)"),
        Case("hold_tokens_as_float", "fifo", lambda d: _set(gang_hold(d), 4, float(gang_hold(d)[4])), f,
             "(tokens)"),
        Case("hold_tokens_as_string", "fifo", lambda d: _set(gang_hold(d), 4, str(gang_hold(d)[4])), f,
             "(tokens)"),
        Case("hold_tokens_negative", "fifo", lambda d: _set(gang_hold(d), 4, -5), f, "(tokens)"),
        Case("hold_names_a_request", "fifo", lambda d: _set(gang_hold(d), 3, 0), f, "(request)"),
        Case("receive_kv_as_float", "pecsched", lambda d: _set(event(d, "receive"), 4,
                                                                float(event(d, "receive")[4])), f, "(kv_tokens)"),
        Case("receive_without_args", "pecsched", lambda d: event(d, "receive").__delitem__(slice(4, None)), f,
             "'receive'"),
        Case("dispatch_with_extra_arg", "fifo", lambda d: event(d, "dispatch").append(1), f, "'dispatch'"),
        Case("events_for_fewer_replicas", "fifo", lambda d: d["events"].pop(), f, "event lists"),
        Case("gangs_as_object", "fifo", lambda d: _set(d, "gangs", {"0": d["gangs"][0]}), f,
             "gangs must be an array"),
        Case("gang_as_array", "fifo", lambda d: _set(d["gangs"], 0, list(d["gangs"][0].items())), f, "gangs[0]"),
        Case("members_as_strings", "fifo", lambda d: _set(g0(d), "members", [str(r) for r in g0(d)["members"]]), f,
             "gangs[0].members[0]"),
        Case("members_as_floats", "fifo", lambda d: _set(g0(d), "members", [float(r) for r in g0(d)["members"]]),
             f, "gangs[0].members[0]"),
        Case("members_as_number", "fifo", lambda d: _set(g0(d), "members", 0), f, "gangs[0].members"),
        Case("gang_request_as_string", "fifo", lambda d: _set(g0(d), "request", str(g0(d)["request"])), f,
             "gangs[0].request"),
        Case("gang_request_as_float", "fifo", lambda d: _set(g0(d), "request", float(g0(d)["request"])), f,
             "gangs[0].request"),
        Case("share_tokens_as_float", "fifo", lambda d: _set(g0(d), "share_tokens", g0(d)["share_tokens"] + 0.5),
             f, "gangs[0].share_tokens"),
        Case("units_as_string", "fifo", lambda d: _set(g0(d), "units", str(g0(d)["units"])), f, "gangs[0].units"),
        Case("units_as_float", "fifo", lambda d: _set(g0(d), "units", float(g0(d)["units"])), f, "gangs[0].units"),
        Case("input_len_as_float", "fifo", lambda d: _set(g0(d), "input_len", float(g0(d)["input_len"])), f,
             "gangs[0].input_len"),
        Case("prefill_s_as_string", "fifo", lambda d: _set(g0(d), "prefill_s", str(g0(d)["prefill_s"])), f,
             "gangs[0].prefill_s"),
        Case("prefill_s_infinite", "fifo", lambda d: _set(g0(d), "prefill_s", float("inf")), f,
             "gangs[0].prefill_s"),
        Case("switch_s_nan", "fifo", lambda d: _set(g0(d), "switch_s", float("nan")), f, "gangs[0].switch_s"),
        Case("gang_without_steps", "fifo", lambda d: g0(d).pop("steps"), f, "'steps'"),
        Case("gang_unknown_field", "fifo", lambda d: _set(g0(d), "speed", 2), f, "'speed'"),
        Case("step_as_array", "fifo", lambda d: _set(g0(d)["steps"], 0, [1, 2]), f, "gangs[0].steps[0]"),
        Case("step_phase_unknown", "fifo", lambda d: _set(g0(d)["steps"][0], "phase", "warmup"), f,
             "gangs[0].steps[0]"),
        Case("segment_units_as_strings", "fifo", lambda d: _set(g0(d)["steps"][0], "units",
                                                                 [str(u) for u in g0(d)["steps"][0]["units"]]),
             f, "gangs[0].steps[0].units[0]"),
        Case("segment_units_three", "fifo", lambda d: g0(d)["steps"][0]["units"].append(1), f,
             "gangs[0].steps[0].units"),
        Case("segment_suspended_as_number", "fifo", lambda d: _set(g0(d)["steps"][0], "suspended", 0), f,
             "gangs[0].steps[0].suspended"),
        Case("segment_unknown_field", "fifo", lambda d: _set(g0(d)["steps"][0], "gen", 1), f, "'gen'"),
        Case("decode_gen_as_float", "fifo", lambda d: _set(step(d, "decode"), "gen", 1.0), f, ".gen"),
        Case("shares_as_floats", "fifo", lambda d: _set(step(d, "decode"), "shares",
                                                         [x + 0.5 for x in step(d, "decode")["shares"]]),
             f, ".shares[0]"),
        Case("colocated_pair_as_strings", "pecsched-pe", lambda d: _set(step(d, "decode", True), "colocated",
                                                                         [["0", "1"]]), f, ".colocated[0]"),
        Case("step_start_as_string", "fifo", lambda d: _set(step(d, "decode"), "start_s",
                                                             str(step(d, "decode")["start_s"])), f, ".start_s"),
        Case("step_end_infinite", "fifo", lambda d: _set(step(d, "decode"), "end_s", float("inf")), f, ".end_s"),
        Case("migrations_as_object", "pecsched", lambda d: _set(d, "migrations", {"0": m0(d)}), f,
             "migrations must be an array"),
        Case("migration_src_as_string", "pecsched", lambda d: _set(m0(d), "src", str(m0(d)["src"])), f,
             "migrations[0].src"),
        Case("migration_dst_as_float", "pecsched", lambda d: _set(m0(d), "dst", float(m0(d)["dst"])), f,
             "migrations[0].dst"),
        Case("migration_request_as_string", "pecsched", lambda d: _set(m0(d), "request", str(m0(d)["request"])),
             f, "migrations[0].request"),
        Case("migration_sent_as_string", "pecsched", lambda d: _set(m0(d), "sent_s", str(m0(d)["sent_s"])), f,
             "migrations[0].sent_s"),
        Case("migration_arrival_nan", "pecsched", lambda d: _set(m0(d), "arrive_s", float("nan")), f,
             "migrations[0].arrive_s"),
        Case("migration_without_dst", "pecsched", lambda d: m0(d).pop("dst"), f, "'dst'"),
        Case("plans_as_object", "medha-3d", lambda d: _set(d, "plans", {"0": d["plans"][0]}), f,
             "plans must be an array"),
        Case("plan_entry_as_strings", "medha-3d", lambda d: _set(d["plans"][0], "entry_s",
                                                                  [str(x) for x in d["plans"][0]["entry_s"]]),
             f, "plans[0].entry_s[0]"),
        Case("plan_onboard_as_floats", "medha-3d", lambda d: _set(d["plans"][0]["onboard"], 0,
                                                                   [float(x) for x in d["plans"][0]["onboard"][0]]),
             f, "plans[0].onboard[0]"),
        Case("csps_plan_gpus_as_float", "csps", lambda d: _set(g0(d)["plan"], "num_gpus",
                                                                float(g0(d)["plan"]["num_gpus"])), f,
             "gangs[0].plan.num_gpus"),
        Case("csps_q_ship_as_strings", "csps", lambda d: _set(step(d, "decode"), "q_ship",
                                                               [str(x) for x in step(d, "decode")["q_ship"]]),
             f, ".q_ship"),
    ]


def _rule(name: str, base: str, mutate: Callable[[dict], Any], rule: str, text: str) -> Case:
    return Case(name, base, mutate, rule, text)


def _M(d: dict) -> int:
    return d["meta"]["limits"]["M"]


def _out_of_order(d: dict) -> None:
    """A replica's later event moved before an earlier one's batch."""
    ev = next(ev for ev in d["events"] if len({e[0] for e in ev}) > 1)
    last = max(e[0] for e in ev)
    e = next(e for e in ev if e[0] == last)
    ev.remove(e)
    ev.insert(0, e)


def _extra_decode(d: dict) -> None:
    g = d["gangs"][0]
    s = dict(g["steps"][-1], gen=g["steps"][-1]["gen"] + 1)
    s["start_s"] = s["end_s"] = g["steps"][-1]["end_s"] + 1.0
    g["steps"].append(s)


def _drop_replica(d: dict) -> None:
    d["replicas"].pop()
    d["events"].pop()


def _flip_kind(d: dict) -> None:
    p = d["gangs"][0]["plan"]
    p["kind"] = "tp" if p["kind"] == "ntp" else "ntp"


def _shares_over(d: dict) -> None:
    s = step(d, "decode")
    extra = d["gangs"][0]["share_tokens"] - s["shares"][0] + 1     # one token over the share
    s["shares"][0] += extra
    s["shares"][1] -= extra


def _hand_off_elsewhere(d: dict) -> None:
    """A hand-off logged on a replica the request never reached."""
    e = event(d, "hand_off")
    r = next(r for r, ev in enumerate(d["events"]) if e in ev)
    other = next(x for x in range(len(d["events"])) if x != r and d["replicas"][x]["batches"])
    d["events"][other].insert(0, [0, 0.0, "hand_off", e[3]])


def _receive_gang_request(d: dict) -> None:
    e = event(d, "receive")
    e[3] = d["gangs"][0]["request"]


def _cases_rules() -> list[Case]:
    """Documents that read well but break a rule of the judge (judge.py, judge_gangs.py, judge_plans.py)."""
    g0 = lambda d: d["gangs"][0]
    return [
        *[_rule(f"hold_over_M_{p}", p, lambda d: _set(gang_hold(d), 4, _M(d) + 1), "M", "> M =")
          for p in ("fifo", "reservation", "priority", "csps", "pecsched")],
        *[_rule(f"share_over_M_{p}", p, lambda d: _set(g0(d), "share_tokens", _M(d) + 1), "M", "share_tokens")
          for p in ("fifo", "pecsched", "loongserve")],
        _rule("gang_request_unknown", "fifo", lambda d: _set(g0(d), "request", 999), "unknown-request",
              "gangs[0].request = 999"),
        _rule("batch_request_unknown", "fifo", lambda d: _set(first_batch(d), "ids", [999] + first_batch(d)["ids"][1:]),
              "unknown-request", "999"),
        _rule("members_out_of_range", "fifo", lambda d: _set(g0(d)["members"], 0, 17), "format", "members"),
        _rule("members_repeated", "fifo", lambda d: _set(g0(d), "members", [g0(d)["members"][0]] * 2), "format",
              "members"),
        _rule("gang_input_len_wrong", "fifo", lambda d: _set(g0(d), "input_len", g0(d)["input_len"] + 1), "format",
              "input/output"),
        _rule("migration_to_itself", "pecsched", lambda d: _set(d["migrations"][0], "dst", d["migrations"][0]["src"]),
              "format", "distinct replicas"),
        _rule("event_after_the_last_batch", "fifo", lambda d: _set(d["events"][0][-1], 0,
                                                                   len(d["replicas"][0]["batches"]) + 1),
              "format", "out of order"),
        _rule("events_out_of_order", "fifo", _out_of_order, "format", "out of order"),
        _rule("dispatch_unknown_request", "fifo", lambda d: _set(event(d, "dispatch"), 3, 999), "format",
              "not in the workload"),
        _rule("colocated_batch_missing", "pecsched-pe", lambda d: _set(step(d, "decode", True)["colocated"][0], 1,
                                                                       9999), "format", "does not exist"),
        _rule("decode_beyond_O", "fifo", _extra_decode, "once", "O = "),
        _rule("prefill_before_arrival", "fifo", lambda d: _set(g0(d)["steps"][0], "start_s", 0.0), "arrival",
              "before the request arrives"),
        _rule("switch_underpriced", "pecsched", lambda d: _set(g0(d), "switch_s", 0.0), "gang-price", "switch_s"),
        _rule("units_wrong", "fifo", lambda d: _set(g0(d), "units", g0(d)["units"] + 1), "gang-price", "units"),
        _rule("share_too_small", "fifo", lambda d: _set(g0(d), "share_tokens", 1), "gang-price", "share_tokens"),
        _rule("shares_over_share", "fifo", _shares_over, "gang-price", "shares"),
        _rule("csps_plan_kind_wrong", "csps", _flip_kind, "gang-price", "plan kind"),
        _rule("csps_comm_underpriced", "csps", lambda d: _set(g0(d)["plan"], "comm_in_s", 0.0), "gang-price",
              "comm_in_s"),
        _rule("csps_q_ship_too_fast", "csps", lambda d: _set(step(d, "decode"), "q_ship",
                                                              [step(d, "decode")["q_ship"][0]] * 2), "q-ship",
              "q_ship"),
        _rule("plan_stage_time_wrong", "medha-3d", lambda d: _set(d["plans"][0]["stage_s"], 1,
                                                                  d["plans"][0]["stage_s"][1] * 0.5),
              "plan-time", "stage time"),
        _rule("plan_group_kv_wrong", "medha-3d", lambda d: _set(d["plans"][0]["group_kv"][1], 0,
                                                                d["plans"][0]["group_kv"][1][0] + 1),
              "kvp-placement", "KV per group"),
        _rule("plan_group_capacity_too_big", "medha-3d", lambda d: _set(d["plans"][0], "group_capacity", 10**9),
              "kvp-capacity", "group capacity"),
        _rule("plans_missing", "medha-3d", lambda d: d.pop("plans"), "format", "plans[0]"),
        _rule("decode_on_a_scaled_down_gang", "loongserve", lambda d: g0(d)["steps"].append(
            {"phase": "decode", "start_s": 100.0, "end_s": 100.1, "gen": 1, "shares": [1], "colocated": []}),
              "once", "decode instance"),
        _rule("cost_model_unknown", "fifo", lambda d: _set(d["meta"]["cost"], "name", "no-such-model"), "format",
              "no-such-model"),
        _rule("replica_missing", "fifo", _drop_replica, "format", "replica schedules"),
        _rule("P_shrunk", "fifo", lambda d: _set(d["meta"]["limits"], "P", 8), "P", "P = 8"),
        _rule("R_max_shrunk", "fifo", lambda d: _set(d["meta"]["limits"], "R_max", 1), "R_max", "R_max = 1"),
        _rule("migration_never_received", "pecsched", lambda d: next(
            ev for ev in d["events"] if event(d, "receive") in ev).remove(event(d, "receive")), "kv-arrival",
              "never received"),
        _rule("hand_off_elsewhere", "pecsched", _hand_off_elsewhere, "format", "hand_off"),
        _rule("receive_of_a_gang_request", "pecsched", _receive_gang_request, "kv-arrival", "receive"),
        _rule("decode_step_ends_before_it_starts", "fifo", lambda d: _set(step(d, "decode"), "end_s",
                                                                          step(d, "decode")["start_s"] - 1e-3),
              "gang-busy", "decode step"),
        _rule("segment_ends_before_it_starts", "fifo", lambda d: _set(g0(d)["steps"][0], "end_s",
                                                                      g0(d)["steps"][0]["start_s"] - 1e-3),
              "resume", "prefill segment"),
    ]


#: every case of the catalogue
CASES = _cases_format() + _cases_rules()
#: fragments of messages that come from Python, not from the judge: none may reach a user
INTERNAL = ("invalid literal", "dictionary update", "zero-size array", "has no attribute", "object is not",
            "KeyError", "TypeError", "IndexError", "unhashable", "not subscriptable", "not iterable")


def _stage_overlap(d: dict) -> None:
    row = d["plans"][0]["stage_start_s"][0]
    row[1] = row[0]                     # stage 1 starts with stage 0


def _decode_of_two(d: dict) -> None:
    """A decode batch (its requests all past their prompts) given a second token."""
    b = next(b for r in d["replicas"] for b in r["batches"][1:] if set(b["tokens"]) == {1})
    b["tokens"][0] = 2


def _evict_idle(d: dict) -> None:
    """The first batch evicts a request that holds no KV yet (the replica's last request)."""
    rep = next(r for r in d["replicas"] if r["batches"])
    last = rep["batches"][-1]["ids"][-1]
    if last in rep["batches"][0]["ids"]:
        raise AssertionError("the base's first batch already runs its replica's last request")
    rep["batches"][0]["evict"] = [last]


def _run_again(d: dict) -> None:
    rep = next(r for r in d["replicas"] if r["batches"])
    rep["batches"].append(dict(rep["batches"][-1]))


def _no_wait(d: dict) -> None:
    """A batch that waited for its requests' previous batch to leave the last stage starts without waiting."""
    b = next(b for b in d["replicas"][0]["batches"][1:] if b.get("not_before_s"))
    del b["not_before_s"]


def _cases_replica_and_plan_rules() -> list[Case]:
    """The replica rules the judge checks through ServingState, and the executed plans' order rules."""
    return [
        _rule("prefill_chunk_too_long", "fifo", lambda d: _set(first_batch(d)["tokens"], 0,
                                                               first_batch(d)["tokens"][0] + 1),
              "prefill-chunk", "exceeds"),
        _rule("decode_of_two_tokens", "fifo", _decode_of_two, "decode-chunk", "exactly 1 token"),
        _rule("evict_a_request_holding_nothing", "fifo", _evict_idle, "evict", "evict"),
        _rule("finished_request_runs_again", "fifo", _run_again, "finished", "finished"),
        _rule("blocks_over_M", "fifo", lambda d: _set(d["meta"]["limits"], "block_size",
                                                      d["meta"]["limits"]["M"] // 2 + 1), "M-blocks", "block"),
        _rule("stage_starts_before_the_last_one_ends", "medha-3d", _stage_overlap, "stage-busy", "stage 1"),
        _rule("decode_enters_before_its_last_batch_left", "medha-3d", _no_wait, "pipeline-order", "enters"),
    ]


CASES += _cases_replica_and_plan_rules()
