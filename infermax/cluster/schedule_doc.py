"""Reading a cluster schedule document: every field's type checked, nothing coerced.

The cluster judge reads the document the way the single-replica loader reads a
schedule (:mod:`infermax.schedule`): counts and indices are JSON integers (``8.5``,
``"8"`` and ``true`` are refused, never rounded or cast), times and prices finite
numbers (``Infinity`` and ``NaN`` refused), flags ``true``/``false``, arrays arrays
and objects objects, with no unknown fields; the policy in ``meta`` is a known one.
Every refusal is a :class:`ClusterScheduleError` of rule ``format`` that names the
field as a path (``gangs[0].steps[3].units[1]``) and shows its value.

Rule checks (M, hold, gang prices, ...) are the judge's (:mod:`~infermax.cluster.judge`);
this module only says whether the document is one it can read.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from infermax.schedule import show_json

from .policies import RING_ATTENTION, get_policy


class ClusterScheduleError(ValueError):
    """A cluster schedule broke ``rule``; the message names the replica, request, batch, gang step or field."""

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


def _bad(where: str, want: str, value: Any) -> ClusterScheduleError:
    return ClusterScheduleError("format", f"{where} must be {want}, got {show_json(value)}")


def is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def is_num(v: Any) -> bool:
    return (isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
            and math.isfinite(v))


def check_int(v: Any, where: str, low: int | None = None) -> None:
    if not is_int(v) or (low is not None and v < low):
        raise _bad(where, "an integer" + (f" >= {low}" if low is not None else ""), v)


def check_num(v: Any, where: str, low: float | None = 0.0) -> None:
    if not is_num(v) or (low is not None and v < low):
        raise _bad(where, "a finite number" + (f" >= {low:g}" if low is not None else ""), v)


def check_array(v: Any, where: str, size: int | None = None) -> None:
    if not isinstance(v, (list, tuple)) or (size is not None and len(v) != size):
        raise _bad(where, "an array" + (f" of {size}" if size is not None else ""), v)


def check_object(v: Any, where: str, required: tuple = (), optional: tuple = ()) -> None:
    if not isinstance(v, Mapping):
        raise _bad(where, "an object", v)
    missing = [k for k in required if k not in v]
    if missing:
        raise ClusterScheduleError("format", f"{where} misses field(s) {', '.join(map(repr, missing))}")
    unknown = [k for k in v if k not in required and k not in optional]
    if unknown:
        raise ClusterScheduleError("format", f"{where} has unknown field(s) {', '.join(map(repr, unknown))}; "
                                   f"it has {', '.join(required + optional)}")


def check_ints(v: Any, where: str, low: int | None = None, size: int | None = None) -> None:
    check_array(v, where, size)
    for k, x in enumerate(v):
        check_int(x, f"{where}[{k}]", low)


def check_nums(v: Any, where: str, low: float | None = 0.0, size: int | None = None) -> None:
    check_array(v, where, size)
    for k, x in enumerate(v):
        check_num(x, f"{where}[{k}]", low)


# --- the parts ---------------------------------------------------------------------------------------------
_META_INTS = ("sp_replicas", "colocate_tokens", "decode_replicas", "kvp_group_tokens", "reserved_replicas")


# complexity: one check per key of the document's meta, each naming the key and value
def check_meta(meta: Any) -> None:
    """``meta``: the cluster spec (a string), a known policy, the limits (an object), the engine's options;
    any other key is provenance, free-form."""
    if not isinstance(meta, Mapping):
        raise _bad("meta", "an object", meta)
    missing = [k for k in ("cluster", "policy", "limits") if k not in meta]
    if missing:            # (other keys are free-form provenance, as a schedule's meta)
        raise ClusterScheduleError("format", f"meta misses field(s) {', '.join(map(repr, missing))}")
    if not isinstance(meta["cluster"], str):
        raise _bad("meta.cluster", "a cluster spec string", meta["cluster"])
    policy = meta["policy"]
    if not isinstance(policy, str):
        raise _bad("meta.policy", "a cluster policy name", policy)
    try:
        get_policy(policy)
    except ValueError as exc:
        raise ClusterScheduleError("format", f"meta.policy: {exc}") from None
    check_object(meta["limits"], "meta.limits", ("M",), ("C", "P", "R_max", "block_size"))
    for key, value in meta["limits"].items():
        if value is not None or key == "M":
            check_int(value, f"meta.limits.{key}", 1)
    options = meta.get("options", {})
    check_object(options, "meta.options", (), _META_INTS + ("fast_forward", "max_num_seqs", "ring_attention"))
    for key in _META_INTS:
        if options.get(key) is not None:
            check_int(options[key], f"meta.options.{key}", 0)
    if options.get("max_num_seqs") is not None:
        check_int(options["max_num_seqs"], "meta.options.max_num_seqs", 1)
    if "ring_attention" in options and options["ring_attention"] not in RING_ATTENTION:
        raise _bad("meta.options.ring_attention", f"one of {', '.join(RING_ATTENTION)}", options["ring_attention"])
    if "fast_forward" in options and not isinstance(options["fast_forward"], bool):
        raise _bad("meta.options.fast_forward", "true or false", options["fast_forward"])
    if meta.get("workload") is not None and not isinstance(meta["workload"], str):
        raise _bad("meta.workload", "a workload spec string", meta["workload"])
    if meta.get("cost") is not None and not isinstance(meta["cost"], Mapping):
        raise _bad("meta.cost", "an object (the cost model's description)", meta["cost"])


#: per event kind, the arguments after [before_batch, time_s, kind, request]
EVENT_ARGS = {"dispatch": (), "hand_off": (), "receive": ("kv_tokens", "generated"), "hold": ("tokens",)}


# complexity: one check per field of an event row, each naming the replica, row and value
def check_events(events: Any, num_replicas: int) -> None:
    """Per replica an array of ``[before_batch, time_s, kind, request, *args]`` (EVENT_ARGS)."""
    check_array(events, "events")
    if len(events) != num_replicas:
        raise ClusterScheduleError("format", f"events: {len(events)} event lists for {num_replicas} replicas")
    for r, ev in enumerate(events):
        check_array(ev, f"events[{r}]")
        last = 0
        for k, e in enumerate(ev):
            where = f"events[{r}][{k}]"
            if not isinstance(e, (list, tuple)) or len(e) < 4:
                raise _bad(where, "an array [before_batch, time_s, kind, request, ...]", e)
            check_int(e[0], f"{where}[0] (before_batch)", 0)
            if e[0] < last:
                raise ClusterScheduleError("format", f"{where}[0] (before_batch) = {e[0]} is out of order: the "
                                           f"event before it comes before batch {last}")
            last = e[0]
            check_num(e[1], f"{where}[1] (time_s)")
            if not isinstance(e[2], str) or e[2] not in EVENT_ARGS:
                raise _bad(f"{where}[2] (kind)", f"one of {', '.join(EVENT_ARGS)}", e[2])
            args = EVENT_ARGS[e[2]]
            if len(e) != 4 + len(args):
                raise _bad(where, f"[before_batch, time_s, {e[2]!r}, request{''.join(', ' + a for a in args)}]", e)
            if e[2] == "hold" and (not is_int(e[3]) or e[3] != -1):
                raise _bad(f"{where}[3] (request)", "-1 (a hold is the replica's, no request's)", e[3])
            check_int(e[3], f"{where}[3] (request)", -1 if e[2] == "hold" else 0)
            for a, (name, value) in enumerate(zip(args, e[4:])):
                check_int(value, f"{where}[{4 + a}] ({name})", 0)


_GANG_REQUIRED = ("request", "members", "share_tokens", "prefill_s", "units", "switch_s", "steps")
_GANG_OPTIONAL = ("input_len", "output_len", "sp_plan", "plan")
_PLAN_NUMS = ("comm_in_s", "comm_out_s", "exposed_comm_s", "attention_s", "bytes_per_gpu", "csa_moved",
              "csa_attended")


def check_gangs(gangs: Any) -> None:
    check_array(gangs, "gangs")
    for k, g in enumerate(gangs):
        where = f"gangs[{k}]"
        check_object(g, where, _GANG_REQUIRED, _GANG_OPTIONAL)
        check_int(g["request"], f"{where}.request", 0)
        check_ints(g["members"], f"{where}.members", 0)
        for key in ("share_tokens", "units", "input_len", "output_len"):
            if key in g:
                check_int(g[key], f"{where}.{key}", 1 if key != "share_tokens" else 0)
        check_num(g["prefill_s"], f"{where}.prefill_s")
        check_num(g["switch_s"], f"{where}.switch_s")
        if g.get("sp_plan") is not None and not isinstance(g["sp_plan"], str):
            raise _bad(f"{where}.sp_plan", "a string", g["sp_plan"])
        if "plan" in g:
            p = g["plan"]
            check_object(p, f"{where}.plan", ("kind", "num_gpus", "per_node", "micro") + _PLAN_NUMS)
            if not isinstance(p["kind"], str):
                raise _bad(f"{where}.plan.kind", "a string", p["kind"])
            for key in ("num_gpus", "per_node", "micro"):
                check_int(p[key], f"{where}.plan.{key}", 1)
            for key in _PLAN_NUMS:
                check_num(p[key], f"{where}.plan.{key}")
        check_array(g["steps"], f"{where}.steps")
        for s, step in enumerate(g["steps"]):
            _check_step(step, f"{where}.steps[{s}]")


def _check_step(step: Any, where: str) -> None:
    if not isinstance(step, Mapping) or step.get("phase") not in ("prefill", "decode"):
        raise _bad(where, 'an object with phase "prefill" or "decode"', step)
    if step["phase"] == "prefill":
        check_object(step, where, ("phase", "start_s", "end_s", "units", "switch_s", "suspended"))
        check_ints(step["units"], f"{where}.units", 0, size=2)
        check_num(step["switch_s"], f"{where}.switch_s")
        if not isinstance(step["suspended"], bool):
            raise _bad(f"{where}.suspended", "true or false", step["suspended"])
    else:
        check_object(step, where, ("phase", "start_s", "end_s", "gen", "shares", "colocated"),
                     ("q_ship", "kv_gather", "attend"))
        check_int(step["gen"], f"{where}.gen", 1)
        check_ints(step["shares"], f"{where}.shares", 0)
        check_array(step["colocated"], f"{where}.colocated")
        for c, pair in enumerate(step["colocated"]):
            check_ints(pair, f"{where}.colocated[{c}] ([replica, batch])", 0, size=2)
        for key in ("q_ship", "kv_gather"):
            if key in step:
                check_nums(step[key], f"{where}.{key} ([sent_s, arrived_s])", size=2)
        if "attend" in step:
            check_ints(step["attend"], f"{where}.attend", 0)
    check_num(step["start_s"], f"{where}.start_s")
    check_num(step["end_s"], f"{where}.end_s")


def check_migrations(migrations: Any) -> None:
    check_array(migrations, "migrations")
    for k, m in enumerate(migrations):
        where = f"migrations[{k}]"
        check_object(m, where, ("request", "src", "dst", "sent_s", "arrive_s"), ("bytes",))
        for key in ("request", "src", "dst"):
            check_int(m[key], f"{where}.{key}", 0)
        for key in ("sent_s", "arrive_s", "bytes"):
            if key in m:
                check_num(m[key], f"{where}.{key}")


_PLAN_REQUIRED = ("pipeline", "onboarding", "stages", "groups", "group_tokens", "group_capacity", "entry_s",
                  "stage_s", "stage_start_s", "group_kv", "onboard")


def check_plans(plans: Any) -> None:
    """Per replica its executed plan's record (cluster/plans.py), ``{}`` for a replica that ran no batch."""
    check_array(plans, "plans")
    for r, rec in enumerate(plans):
        where = f"plans[{r}]"
        if isinstance(rec, Mapping) and not rec:
            continue
        check_object(rec, where, _PLAN_REQUIRED)
        for key in ("pipeline", "onboarding"):
            if not isinstance(rec[key], str):
                raise _bad(f"{where}.{key}", "a string", rec[key])
        for key in ("stages", "groups", "group_tokens", "group_capacity"):
            check_int(rec[key], f"{where}.{key}", 1 if key in ("stages", "groups") else 0)
        check_nums(rec["entry_s"], f"{where}.entry_s")
        check_nums(rec["stage_s"], f"{where}.stage_s")
        check_array(rec["stage_start_s"], f"{where}.stage_start_s")
        for j, row in enumerate(rec["stage_start_s"]):
            check_nums(row, f"{where}.stage_start_s[{j}]")
        check_array(rec["group_kv"], f"{where}.group_kv")
        for j, row in enumerate(rec["group_kv"]):
            check_ints(row, f"{where}.group_kv[{j}]", 0)
        check_array(rec["onboard"], f"{where}.onboard")
        for j, row in enumerate(rec["onboard"]):
            check_ints(row, f"{where}.onboard[{j}] ([batch, request, group, first position])", 0, size=4)


def check_parts(meta: Any, num_replicas: int, events: Any, gangs: Any, migrations: Any, plans: Any) -> None:
    """Every part of a cluster schedule (its replicas' batches are read by ``Schedule.from_dict``)."""
    check_meta(meta)
    check_events(events, num_replicas)
    check_gangs(gangs)
    check_migrations(migrations)
    check_plans(plans)
