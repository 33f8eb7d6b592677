"""The cluster judge: replays a :class:`~infermax.cluster.schedule.ClusterSchedule` on its own.

It shares no decision with the cluster engine. Every replica is rebuilt as a
:class:`~infermax.state.ServingState` (the single-replica judge's state, docs/design.md)
from its batches and its logged events — dispatches, hand-offs, received decodes,
held KV — so every replica rule (C, P, M with the KV it holds for gangs, R_max,
arrival, ...) is checked and every batch time recomputed; a batch that carries a
colocated long decode is timed with that decode's share. The gangs and the
migrations are then checked against the replayed times and the cluster's own
prices (:mod:`~infermax.cluster.gang`, :mod:`~infermax.cluster.fastsp`,
``Cluster.transfer_s``). Each violation raises :class:`ClusterScheduleError`
with one of these rules (the replica rules keep their ServingState names, the
message prefixed by the replica; the gang rules live in
:mod:`~infermax.cluster.judge_gangs`):

- ``format``: the document's structure (ids, members, indices, event order);
- ``arrival``: a dispatch or a gang's first segment before the request arrives;
- ``dispatch``: a replica's dispatches out of time order;
- ``kv-arrival``: a received decode matches a migration (same request and
  destination) that arrived by then, was sent at the request's first token on
  the replica that handed it off, and took at least the last layer's KV transfer
  (and the whole KV's, counted from the prefill's first batch);
- ``gang-price``: a gang priced below its plan (prefill time, kernel units,
  resume switch, KV share; a CSPS gang's SP plan: kind, GPUs, micro-partitions,
  transfer times and bytes) or a decode step over fewer KV tokens than cached;
- ``gang-busy``: no batch of a member overlaps its gang's prefill segments or
  decode steps except the colocated batch inside its step; one gang per replica
  at a time; decode steps after the prefill, in time order, gen = 1, 2, ...;
- ``gang-time``: a decode step no shorter than its slowest member plus the Q and
  partial-output exchange (``decode_comm_s``);
- ``q-ship`` (CSPS): a decode step ships the token's Q (``q_ship``, at least the
  priced first-layer transfer) before any member attends; the rest of the Q
  transfers and the merges follow the members' attention (``gang-time``);
- ``resume``: prefill segments cover the kernel units contiguously from 0, in
  time order, each as long as its units (plus the switch when resuming), every
  suspended one followed by another, the last one not suspended;
- ``hold``: a member holds at least its KV share while its gang is alive, plus
  the saved activations while the gang is suspended;
- ``colocate-cap``: a colocated batch processes at most ``colocate_tokens``;
- ``once``: every request is served and finishes exactly once (on a gang, or on
  one replica — for a disaggregated one, its decode replica);
- on a cluster that executes its plan (spp or kvp > 1), the stage, KVP-group and
  pipeline-order rules of :mod:`~infermax.cluster.judge_plans`.

Checks that read the document alone run first (gangs, migrations), then the
replica replays, then the checks that need replayed times.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from infermax.clock import on_relative_clock
from infermax.metrics import metrics as compute_metrics
from infermax.state import DONE, ScheduleError, ServingState
from infermax.trace import Trace, TraceRecorder
from infermax.types import Limits, Workload

from .judge_gangs import (
    REL_TOL,
    ClusterScheduleError,
    JudgedGang,
    at_least,
    attended_tokens,
    check_gang_on_replicas,
    check_one_gang_at_a_time,
    colocated_batches,
    read_gang,
)
from .schedule import ClusterSchedule
from .spec import Cluster

__all__ = ["ClusterReplay", "ClusterScheduleError", "replay_cluster"]


@dataclass(frozen=True, eq=False)
class ClusterReplay:
    """What the judge recomputed: per-request records (the engine's ``trace.requests`` keys) and per-replica
    traces (the replicas' own batches; gang steps are not batches of any replica)."""

    requests: dict[str, np.ndarray]
    traces: tuple[Trace, ...]
    num_suspensions: int          # suspended gang prefill segments
    num_migrations: int
    cost_name: str

    def metrics(self) -> dict[str, Any]:
        """The request metrics of the run (batch statistics over the replicas' own batches)."""
        starts = np.concatenate([t.batches["start_s"] for t in self.traces])
        order = np.argsort(starts, kind="stable")
        batches = {k: np.concatenate([t.batches[k] for t in self.traces])[order] for k in self.traces[0].batches}
        M = sum(t.M for t in self.traces)
        return compute_metrics(Trace(batches=batches, requests=self.requests, M=M, cost_name=self.cost_name))

@dataclass
class _Run:
    """One replica replayed."""

    state: ServingState
    trace: Trace
    held: np.ndarray              # per batch: external KV held while it ran
    events: tuple                 # its logged events
    dispatched: set
    received: set
    handed: set

    @property
    def ends(self) -> np.ndarray:
        return self.trace.batches["start_s"] + self.trace.batches["duration_s"]

# complexity: the cluster judge's rules, one check per rule, read in order
def replay_cluster(schedule: ClusterSchedule, workload: "Workload | str", cost: Any = None) -> ClusterReplay:
    """Check ``schedule`` on ``workload`` rule by rule (raises :class:`ClusterScheduleError`) and return the
    recomputed per-request records. Times, the schedule's and the records', are seconds since the workload's
    first arrival (:mod:`infermax.clock`)."""
    if not isinstance(schedule, ClusterSchedule):
        raise ValueError(f"schedule must be a ClusterSchedule, got {type(schedule).__name__}")
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    schedule.check()            # every field's type (as the document's reader checks them)
    workload = on_relative_clock(workload)       # the schedule's times are on it (infermax.clock)
    meta = schedule.meta
    try:
        cluster = Cluster.from_spec(meta["cluster"])
        limits = Limits(**meta["limits"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ClusterScheduleError("format", f"meta needs a cluster spec and limits: {exc}") from None
    R = len(schedule.replicas)
    if R != cluster.num_replicas:
        raise ClusterScheduleError("format", f"{R} replica schedules for {cluster.num_replicas} replicas of "
                                   f"{cluster.to_spec()}")
    cost_model = _cost_model(meta, cluster, cost)
    pos = {int(x): k for k, x in enumerate(workload.ids)}
    gangs = [read_gang(k, g, workload, pos, cluster, meta) for k, g in enumerate(schedule.gangs)]
    on_gang = np.zeros(len(workload), dtype=bool)
    for g in gangs:
        if on_gang[g.i]:
            raise ClusterScheduleError("once", f"request {int(workload.ids[g.i])} runs on two gangs")
        on_gang[g.i] = True
    colocated = colocated_batches(gangs, R)
    scaled = {g.i: g for g in gangs if g.scaled_down}      # their KV moves to a decode replica (LoongServe)
    gang_only = on_gang.copy()
    gang_only[list(scaled)] = False
    migrations = _read_migrations(schedule, workload, pos, cluster, gang_only)
    plans = [None] * R
    if cluster.executes_plan:               # spp or kvp > 1: stages and KVP groups (judge_plans.py)
        from .judge_plans import PlanJudge
        plans = [PlanJudge(r, schedule, cluster, workload) for r in range(R)]
    runs = [_replay_replica(r, schedule, workload, pos, limits, cost_model if plans[r] is None else plans[r],
                            gang_only, colocated[r], plans[r]) for r in range(R)]
    check_one_gang_at_a_time(gangs)
    for g in gangs:
        check_gang_on_replicas(g, runs, cost_model, cluster, meta)
    _check_migrations(migrations, runs, cluster, workload, scaled)
    return _records(workload, runs, gangs, on_gang, len(migrations), cost_model.name)


def _cost_model(meta: dict, cluster: Cluster, cost: Any) -> Any:
    """The given cost model, else the one the schedule names (its meta), else the cluster's."""
    from infermax.costmodel import get_cost_model
    if cost is not None:
        return get_cost_model(cost)
    model = cluster.cost_model()
    named = (meta.get("cost") or {}).get("name") if isinstance(meta.get("cost"), dict) else None
    if named and named != model.name:
        try:
            return get_cost_model(named)
        except (ValueError, KeyError) as exc:
            raise ClusterScheduleError("format", f"the schedule was timed with cost model {named!r}, which cannot "
                                       f"be loaded ({exc}); pass cost=") from None
    return model


# --- migrations: what the document says ----------------------------------------------------------------
# complexity: one check per migration rule (known, once, after arrival, no faster than the link)
def _read_migrations(schedule: ClusterSchedule, workload: Workload, pos: dict, cluster: Cluster,
                     on_gang: np.ndarray) -> dict[tuple[int, int], dict]:
    """(request index, destination) -> migration, each received once, after it arrived, no faster than
    its last layer's KV can travel."""
    R, L = cluster.num_replicas, cluster.model.num_layers
    out: dict[tuple[int, int], dict] = {}
    for k, m in enumerate(schedule.migrations):
        try:
            i, src, dst = pos[int(m["request"])], int(m["src"]), int(m["dst"])
            sent, arrive = float(m["sent_s"]), float(m["arrive_s"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ClusterScheduleError("format", f"migration {k}: {exc!r} (request, src, dst, sent_s, arrive_s)"
                                       ) from None
        where = f"migration {k} of request {int(workload.ids[i])} from replica {src} to {dst}"
        if not (0 <= src < R and 0 <= dst < R) or src == dst or on_gang[i] or (i, dst) in out:
            raise ClusterScheduleError("format", f"{where}: needs two distinct replicas, a request no gang serves, "
                                       f"one migration per request and destination")
        last_layer = cluster.transfer_s(cluster.kv_bytes(int(workload.input_lens[i])) / L, src, dst)
        if not at_least(arrive - sent, last_layer):
            raise ClusterScheduleError("kv-arrival", f"{where}: arrives {arrive - sent!r} s after it is sent, "
                                       f"faster than its last layer's KV can travel ({last_layer!r} s)")
        out[(i, dst)] = dict(m, index=k, src=src, dst=dst, sent_s=sent, arrive_s=arrive, where=where)
    received = set()
    for r, events in enumerate(schedule.events):
        for e in events:
            if len(e) < 4 or e[2] != "receive":
                continue
            try:
                i, t = pos.get(int(e[3])), float(e[1])
            except (TypeError, ValueError):
                raise ClusterScheduleError("format", f"replica {r}: receive event {list(e)} is not "
                                           f"[before_batch, time_s, 'receive', request, kv_tokens, generated]"
                                           ) from None
            m = out.get((i, r))
            if m is None:
                raise ClusterScheduleError("kv-arrival", f"replica {r} receives request {e[3]} at {t!r} s but no "
                                           f"migration sends its KV there")
            if t < m["arrive_s"]:
                raise ClusterScheduleError("kv-arrival", f"replica {r} receives request {e[3]} at {t!r} s, before "
                                           f"its KV arrives at {m['arrive_s']!r} s ({m['where']})")
            if tuple(int(x) for x in e[4:6]) != (int(workload.input_lens[i]), 1):
                raise ClusterScheduleError("kv-arrival", f"replica {r} receives request {e[3]} with (kv, generated) "
                                           f"= {tuple(e[4:6])}; a hand-off leaves after the first token: "
                                           f"({int(workload.input_lens[i])}, 1)")
            received.add((i, r))
    for key, m in out.items():
        if key not in received:
            raise ClusterScheduleError("kv-arrival", f"{m['where']}: never received")
    return out


# --- replicas: the single-replica judge per replica ---------------------------------------------------
_ONE = np.ones(1, dtype=np.int64)
_DECODE = np.ones(1, dtype=bool)


# complexity: one replica's replay: one branch per event, colocation and plan kind a batch may carry
def _replay_replica(r: int, schedule: ClusterSchedule, workload: Workload, pos: dict, limits: Limits, cost: Any,
                    on_gang: np.ndarray, colocated: dict, plan: Any = None) -> _Run:
    state = ServingState(workload, limits, cost, dispatched=True)
    state.serves = ~on_gang
    events, k = schedule.events[r], 0
    run = _Run(state, None, np.zeros(len(schedule.replicas[r].batches), dtype=np.int64), events, set(), set(), set())
    recorder = TraceRecorder()
    for j, batch in enumerate(schedule.replicas[r].batches):
        k = _apply_events(r, run, events, k, j, workload, pos, on_gang)
        try:
            idx = workload.indices_of(batch.ids)
            evict = workload.indices_of(batch.evict)
        except ValueError as exc:
            raise ClusterScheduleError("unknown-request", f"replica {r}, batch {j}: {exc}") from None
        extra = None
        if j in colocated:
            g, step, member = colocated[j]
            tokens = attended_tokens(g.decodes[step], member, g.gather)
            extra = (_ONE, np.array([tokens], dtype=np.int64), _DECODE)
        run.held[j] = state.external_kv
        if plan is not None:
            plan.before(j, state, idx, batch.tokens, evict)
        try:
            start, duration, record = state.apply(idx, batch.tokens, evict, batch.not_before_s, extra)
        except ScheduleError as exc:
            raise ClusterScheduleError(exc.rule, f"replica {r}: {exc}") from None
        if plan is not None:
            plan.after(j, state, start)
        recorder.add(start, duration, record)
    k = _apply_events(r, run, events, k, len(schedule.replicas[r].batches), workload, pos, on_gang)
    if k < len(events):
        raise ClusterScheduleError("format", f"replica {r}: event {k} {list(events[k])} is out of order or after "
                                   f"batch {len(schedule.replicas[r].batches)}, its last + 1")
    left = [i for i in state.arrival_order if state.status[i] != DONE]
    if left or state.pending.size:
        i = int((left or state.pending.tolist())[0])
        raise ClusterScheduleError("once", f"replica {r}: request {int(workload.ids[i])} never finishes there "
                                   f"({int(state.gen[i])} of {int(workload.output_lens[i])} tokens)")
    stray = sorted(run.handed - run.dispatched)
    if stray:
        raise ClusterScheduleError("format", f"replica {r}: hand_off of request {int(workload.ids[stray[0]])}, "
                                   f"which was never dispatched to it")
    for j in colocated:
        if j >= state.num_batches:
            raise ClusterScheduleError("format", f"replica {r}: colocated batch {j} does not exist")
    run.trace = recorder.finish(state)
    return run


# complexity: one branch per event kind of the schedule document, each checked by its rule
def _apply_events(r: int, run: _Run, events: tuple, k: int, j: int, workload: Workload, pos: dict,
                  on_gang: np.ndarray) -> int:
    """Apply replica r's events logged before its batch j (events[k:] onwards); returns the next k."""
    state = run.state
    while k < len(events) and int(events[k][0]) == j:
        e = events[k]
        try:
            t, kind, rid = float(e[1]), str(e[2]), int(e[3])
        except (IndexError, TypeError, ValueError):
            raise ClusterScheduleError("format", f"replica {r}: event {k} {list(e)} is not "
                                       f"[before_batch, time_s, kind, request, ...]") from None
        where = f"replica {r}, event {k} ({kind} at {t!r} s before batch {j})"
        if kind == "hold":
            _hold(state, int(e[4]), where)
            k += 1
            continue
        if rid not in pos:
            raise ClusterScheduleError("format", f"{where}: request {rid} is not in the workload")
        i = pos[rid]
        if kind in ("dispatch", "receive"):
            if on_gang[i]:
                raise ClusterScheduleError("once", f"{where}: request {rid} runs on a gang and on replica {r}")
            if i in run.dispatched or i in run.received:
                raise ClusterScheduleError("once", f"{where}: request {rid} reaches replica {r} twice")
            if kind == "dispatch" and t < float(workload.arrivals_s[i]):
                raise ClusterScheduleError("arrival", f"{where}: request {rid} arrives at "
                                           f"{float(workload.arrivals_s[i])!r} s")
            try:
                if kind == "dispatch":
                    state.dispatch(i, t)
                else:
                    state.receive(i, t, int(e[4]), int(e[5]))
            except ValueError as exc:
                raise ClusterScheduleError("dispatch" if kind == "dispatch" else "kv-arrival",
                                           f"{where}: {exc}") from None
            (run.dispatched if kind == "dispatch" else run.received).add(i)
        elif kind == "hand_off":
            if i in run.handed:
                raise ClusterScheduleError("format", f"{where}: request {rid} is handed off twice")
            state.hand_off(i)
            run.handed.add(i)
        else:
            raise ClusterScheduleError("format", f"{where}: unknown kind {kind!r}")
        k += 1
    if k < len(events) and int(events[k][0]) < j:
        raise ClusterScheduleError("format", f"replica {r}: event {k} {list(events[k])} is out of order")
    return k


def _hold(state: ServingState, tokens: int, where: str) -> None:
    """Rule ``M`` (``M-blocks``) at every change of the KV a replica holds for gangs, not only at its batches:
    a member of a gang under fifo, reservation or priority holds its share while running no batch at all."""
    lim = state.limits
    if tokens + state.kv_used > lim.M:
        raise ClusterScheduleError("M", f"{where}: holds {tokens} KV tokens for gangs besides the {state.kv_used} "
                                   f"its requests hold: {tokens + state.kv_used} > M = {lim.M}")
    if lim.block_size > 1 and int(lim.kv_blocks(tokens)) + state.blocks_used > lim.num_blocks:
        raise ClusterScheduleError("M-blocks", f"{where}: holds {int(lim.kv_blocks(tokens))} blocks for gangs "
                                   f"besides the {state.blocks_used} its requests hold > M // block_size = "
                                   f"{lim.num_blocks} (block_size = {lim.block_size})")
    state.external_kv = tokens


# --- migrations against the replayed replicas ----------------------------------------------------------
def _check_migrations(migrations: dict, runs: list[_Run], cluster: Cluster, workload: Workload,
                      scaled: dict) -> None:
    for (i, dst), m in migrations.items():
        if i in scaled:
            _check_scale_down(m, scaled[i], cluster, workload)
            continue
        src = runs[m["src"]]
        if i not in src.handed or i not in src.dispatched:
            raise ClusterScheduleError("kv-arrival", f"{m['where']}: replica {m['src']} did not prefill it and "
                                       f"hand it off")
        first = float(src.state.first_token_s[i])
        if not math.isclose(m["sent_s"], first, rel_tol=REL_TOL, abs_tol=1e-12):
            raise ClusterScheduleError("kv-arrival", f"{m['where']}: sent at {m['sent_s']!r} s, but its first token "
                                       f"there is at {first!r} s")
        began = float(src.state.first_scheduled_s[i])
        whole = cluster.transfer_s(cluster.kv_bytes(int(workload.input_lens[i])), m["src"], dst)
        if not at_least(m["arrive_s"] - began, whole):
            raise ClusterScheduleError("kv-arrival", f"{m['where']}: arrives at {m['arrive_s']!r} s, sooner than "
                                       f"its whole KV ({whole!r} s) can travel after its prefill began at {began!r} s")


def _check_scale_down(m: dict, g: JudgedGang, cluster: Cluster, workload: Workload) -> None:
    """A gang's KV to a decode replica (LoongServe): from a member, sent at or after the first token, no
    sooner than its whole KV can travel after the prefill began (after the sending, if it waited for room)."""
    if m["src"] not in g.members:
        raise ClusterScheduleError("kv-arrival", f"{m['where']}: replica {m['src']} is not a member of gang {g.gid} "
                                   f"{list(g.members)}, which prefilled it")
    first = float(g.segments[-1]["end_s"])
    if m["sent_s"] < first and not math.isclose(m["sent_s"], first, rel_tol=REL_TOL, abs_tol=1e-12):
        raise ClusterScheduleError("kv-arrival", f"{m['where']}: sent at {m['sent_s']!r} s, before its first token "
                                   f"at {first!r} s")
    began = g.start_s if math.isclose(m["sent_s"], first, rel_tol=REL_TOL, abs_tol=1e-12) else m["sent_s"]
    whole = cluster.transfer_s(cluster.kv_bytes(int(workload.input_lens[g.i])), m["src"], m["dst"])
    if not at_least(m["arrive_s"] - began, whole):
        raise ClusterScheduleError("kv-arrival", f"{m['where']}: arrives at {m['arrive_s']!r} s, sooner than its "
                                   f"whole KV ({whole!r} s) can travel from {began!r} s")


# --- once, and the merged record -----------------------------------------------------------------------
def _records(workload: Workload, runs: list[_Run], gangs: list[JudgedGang], on_gang: np.ndarray, num_migrations: int,
             cost_name: str) -> ClusterReplay:
    n = len(workload)
    requests = {k: v.copy() for k, v in runs[0].trace.requests.items()}
    for key in ("num_evictions", "refill_tokens", "num_suspensions"):
        requests[key] = sum(run.trace.requests[key] for run in runs)
    served = np.zeros(n, dtype=np.int64)
    finished = np.zeros(n, dtype=np.int64)
    for run in runs:
        mine = np.fromiter(run.dispatched, dtype=np.int64, count=len(run.dispatched))
        served[mine] += 1
        for key in ("first_scheduled_s", "first_token_s", "completion_s"):
            requests[key][mine] = run.trace.requests[key][mine]
        done = np.flatnonzero(run.state.gen == workload.output_lens)
        finished[done] += 1
        requests["completion_s"][done] = run.trace.requests["completion_s"][done]
    for g in gangs:
        served[g.i] += 1
        requests["first_scheduled_s"][g.i] = g.start_s
        requests["first_token_s"][g.i] = float(g.segments[-1]["end_s"])
        if not g.scaled_down:          # (else it finishes on its decode replica)
            finished[g.i] += 1
            requests["completion_s"][g.i] = g.end_s
        requests["num_suspensions"][g.i] = len(g.gaps)
    for what, counts in (("served", served), ("finishes", finished)):
        bad = np.flatnonzero(counts != 1)
        if bad.size:
            i = int(bad[0])
            raise ClusterScheduleError("once", f"request {int(workload.ids[i])} {what} {int(counts[i])} times "
                                       f"({bad.size} request(s) not exactly once)")
    return ClusterReplay(requests=requests, traces=tuple(run.trace for run in runs),
                         num_suspensions=sum(len(g.gaps) for g in gangs), num_migrations=num_migrations,
                         cost_name=cost_name)
