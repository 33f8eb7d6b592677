"""The cluster engine: one discrete-event loop over replicas, gangs, migrations and a global queue.

Every replica is a :class:`~infermax.state.ServingState` (``dispatched=True``: a
request reaches it when the engine dispatches it there) driven by the simulator's
own :class:`~infermax.engine.ReplicaRunner`, so batch construction, the rules the
state checks and the trace are the single-replica simulator's, line for line. A
one-replica cluster with FIFO dispatch gives the simulator's schedule, trace and
metrics bit for bit (DESIGN.md invariant 5; ``tests/cluster/test_engine.py``).

Events, in time order (one heap; arrivals from the sorted trace):

- an **arrival** joins the global queue, and the policy dispatches from it
  (pecsched.txt §6.2 "Scheduling": FIFO local queues, the shortest local queue in
  tokens, same-node replicas first for a gang);
- a **replica** whose clock is earliest runs its next batch; before it does, its
  fast-forward of identical decode batches is bounded by the next event anywhere
  (``horizon_s``), so nothing dispatched or migrated to it is admitted late;
- a **gang step** ends: a long request (tag ``long``) runs on a gang of replicas
  (:mod:`~infermax.cluster.gang`): a sequence-parallel prefill, then decode steps
  over its sharded KV. Under PecSched a short request dispatched to a gang member
  *suspends* the gang's prefill at the next kernel boundary (§5.1), and the gang
  resumes where it stopped once its members have no short work left; the long
  decode is *colocated* with short prefills of at most ``colocate_tokens`` tokens
  per member and step (§5.2, Fig. 7);
- a **migration** arrives: with disaggregation a short request leaves its prefill
  replica after its first token and its KV, sent layer by layer during the
  prefill, reaches a dedicated decode replica (§5.2).

The policies are :mod:`~infermax.cluster.policies`. What the run did — per-replica
batches, dispatches, migrations, gang steps with their suspensions — is the
:class:`~infermax.cluster.schedule.ClusterSchedule`, which
:func:`~infermax.cluster.judge.replay_cluster` checks independently.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermax.engine import ReplicaRunner, SchedulerStuckError, _BatchList
from infermax.metrics import metrics as compute_metrics
from infermax.metrics import metrics_by_tag
from infermax.state import DONE, WAITING
from infermax.trace import Trace, TraceRecorder
from infermax.types import Limits, Schedule, Workload

from .gang import DECODE, PREFILL, WAIT, Gang, decode_comm_s, make_gang
from .placement import choose_elastic_gang, replicas_needed, reservation_split, shortest_queue
from .policies import DECODE_REPLICAS, POLICIES, ClusterPolicy, get_policy
from .spec import Cluster

__all__ = ["POLICIES", "ClusterEngine", "ClusterResult", "simulate_cluster"]

_REPLICA, _GANG, _MIGRATE = 0, 1, 2


@dataclass(frozen=True, eq=False)
class ClusterResult:
    """A cluster run: per-replica schedules, the merged trace, metrics, per-tag metrics, dispatches."""

    cluster: Cluster
    policy: str
    schedules: tuple[Schedule, ...]
    trace: Trace
    metrics: dict[str, Any]
    by_tag: dict[str, dict[str, float]]
    replica_of: np.ndarray          # request index -> replica it was dispatched to (a gang: its first member)
    dispatch_s: np.ndarray          # request index -> dispatch time
    replica_busy_s: np.ndarray      # per replica: seconds of batches and gang steps
    decision_s: np.ndarray = field(default_factory=lambda: np.zeros(0))   # per dispatch decision: CPU time
    decode_replica_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gangs: tuple[Gang, ...] = ()
    migrations: tuple[dict, ...] = ()
    events: tuple[tuple[tuple, ...], ...] = ()      # per replica: (before_batch, time, kind, request, ...)
    options: dict = field(default_factory=dict)     # the engine's options (sp_replicas, decode_replicas, ...)

    @property
    def num_preemptions(self) -> int:
        """Suspensions of long requests (pecsched.txt Table 6)."""
        return int(sum(g.num_suspensions for g in self.gangs))

    @property
    def utilization(self) -> np.ndarray:
        """Busy share of each replica over the makespan."""
        span = self.metrics["latency_s"]
        return self.replica_busy_s / span if span > 0 else np.zeros_like(self.replica_busy_s)

    def cluster_schedule(self):
        """The run as a :class:`~infermax.cluster.schedule.ClusterSchedule` (JSON, replayable)."""
        from .schedule import ClusterSchedule
        return ClusterSchedule.from_result(self)


def _local_limits(cluster: Cluster, workload: Workload, limits: "Limits | str | None", short: np.ndarray) -> Limits:
    """The replicas' limits: M from the cluster; C and P at least the longest short prompt unless given."""
    base = Limits.from_spec(limits) if limits is None or isinstance(limits, str) else limits
    if not isinstance(base, Limits):
        raise ValueError(f"limits must be a Limits or a spec string, got {limits!r}")
    M = cluster.replica_kv_capacity_tokens
    if limits is None and short.any():
        longest = int(workload.input_lens[short].max())
        return base.replace(M=M, C=max(base.C, longest), P=max(base.P, longest))
    return base.replace(M=M)


class ClusterEngine:
    """Runs ``workload`` on ``cluster`` under a global ``policy`` and a local ``scheduler`` per replica.

    ``sp_replicas``: the most replicas of a long request's gang (default: one node's
    worth); a gang takes as many free replicas of one node as it finds up to that, at
    least what its KV needs (elastic, as free GPUs allow); ``decode_replicas``: replicas dedicated to short
    decodes under disaggregation (default: §6.2's 4/4/1/1 for its four models, else
    one per node); ``colocate_tokens``: short prefill tokens per member and step
    colocated with a long decode (§5.2's threshold).
    """

    def __init__(self, workload: Workload, cluster: Cluster, policy: "str | ClusterPolicy" = "fifo",
                 scheduler: Any = "vllm", limits: "Limits | str | None" = None, cost: Any = None,
                 fast_forward: bool = True, long_tag: str = "long", sp_replicas: int | None = None,
                 decode_replicas: int | None = None, colocate_tokens: int = 512) -> None:
        from infermax.costmodel import get_cost_model
        from infermax.schedulers import get_scheduler

        self.pol = pol = get_policy(policy)
        self.workload, self.cluster, self.policy = workload, cluster, pol.name
        n, R = len(workload), cluster.num_replicas
        self.is_long = np.array([r.tag == long_tag for r in workload.requests], dtype=bool)
        self.cost = get_cost_model(cost if cost is not None else cluster.cost_model_name())
        peak = workload.input_lens + workload.output_lens - 1
        for name, v in (("colocate_tokens", colocate_tokens),):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")
        self.colocate_tokens = colocate_tokens
        per_node = max(1, cluster.gpus_per_node // cluster.replica_gpus)
        if sp_replicas is not None and (isinstance(sp_replicas, bool) or not isinstance(sp_replicas, int)
                                        or not 1 <= sp_replicas <= R):
            raise ValueError(f"sp_replicas must be an integer in [1, {R}], got {sp_replicas!r}")
        self.sp_replicas = sp_replicas or per_node
        self.gang_size = np.zeros(n, dtype=np.int64)      # least replicas a long request's KV needs
        for i in np.flatnonzero(self.is_long):
            self.gang_size[i] = replicas_needed(cluster, int(peak[i]))
        if self.sp_replicas < int(self.gang_size.max(initial=0)):
            raise ValueError(f"sp_replicas = {self.sp_replicas} < {int(self.gang_size.max())} replicas, what the "
                             f"largest long request's KV needs on {cluster.to_spec()}")
        # long requests run on gangs of gang_size..sp_replicas replicas (sequence parallelism), unless one
        # replica is all they may have: then they run there like any other request
        self.on_gang = self.is_long & (self.sp_replicas > 1)
        self.limits = _local_limits(cluster, workload, limits, ~self.on_gang)
        too_big = np.flatnonzero((peak > self.limits.M) & ~self.on_gang)
        if too_big.size:
            i = int(too_big[0])
            raise ValueError(f"request {int(workload.ids[i])} (input {int(workload.input_lens[i])}, output "
                             f"{int(workload.output_lens[i])}) needs {int(peak[i])} KV tokens, more than one replica's "
                             f"M = {self.limits.M} on {cluster.to_spec()}, and is not tagged {long_tag!r} (only "
                             f"long requests run on gangs of replicas; {too_big.size} such requests)")
        too_long = np.flatnonzero((workload.input_lens > self.limits.C) & ~self.on_gang)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"request {int(workload.ids[i])} has input {int(workload.input_lens[i])} > C = "
                             f"{self.limits.C}: a replica could never prefill it in one batch")
        # replica roles
        self.prefill_pool = np.ones(R, dtype=bool)
        if pol.disaggregate:
            d = decode_replicas if decode_replicas is not None else DECODE_REPLICAS.get(cluster.model.name, cluster.nodes)
            if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < R:
                raise ValueError(f"decode_replicas must be an integer in [1, {R - 1}] on {cluster.to_spec()} "
                                 f"({R} replicas), got {d!r}")
            self.prefill_pool[R - d:] = False
        self.decode_pool = ~self.prefill_pool
        self.eligible_long = self.prefill_pool.copy()
        self.eligible_short = self.prefill_pool.copy()
        if pol.queue == "reservation" and self.is_long.any():
            longest = int(peak[self.is_long].max())
            long_only, _ = reservation_split(cluster, longest)
            k = max(int(long_only.sum()), self.sp_replicas if self.on_gang.any() else 1)
            if k >= R:
                raise ValueError(f"reservation for long requests needs {k} replicas, leaving none of the {R} "
                                 f"on {cluster.to_spec()} for short requests")
            self.eligible_long = np.zeros(R, dtype=bool)
            self.eligible_long[R - k:] = True
            self.eligible_short = ~self.eligible_long
        if self.on_gang.any() and int(self.gang_size[self.is_long].max()) > int(self.eligible_long.sum()):
            raise ValueError(f"a long request needs a gang of {int(self.gang_size[self.is_long].max())} replicas "
                             f"but only {int(self.eligible_long.sum())} may serve long requests under policy "
                             f"{pol.name!r} on {cluster.to_spec()}")
        self.runners: list[ReplicaRunner] = []
        self.schedulers = []
        from infermax.state import ServingState
        for _ in range(R):
            sched = get_scheduler(scheduler)
            state = ServingState(workload, self.limits, self.cost, dispatched=True)
            state.serves = ~self.on_gang
            sched.reset(state)
            self.schedulers.append(sched)
            self.runners.append(ReplicaRunner(state, sched, _BatchList(), TraceRecorder(), workload.ids,
                                              fast_forward))
        self.replica_of = np.full(n, -1, dtype=np.int64)
        self.decode_of = np.full(n, -1, dtype=np.int64)
        self.dispatch_s = np.full(n, np.nan)
        self.decision_of = np.zeros(n)                 # CPU time of the decision that dispatched each request
        self.gang_of = np.full(R, -1, dtype=np.int64)
        self.held = np.zeros(R, dtype=bool)           # under a gang's control (in a gang step / colocated decode)
        self.in_heap = np.zeros(R, dtype=bool)
        self.inflight = np.zeros(R, dtype=np.int64)   # decode tokens migrating to each replica
        self.gangs: list[Gang] = []
        self.gang_rec = [TraceRecorder() for _ in range(R)]
        self.gang_busy = np.zeros(R)
        self.migrations: list[dict] = []
        self.events: list[list[tuple]] = [[] for _ in range(R)]
        self.link_bytes = {"nvlink": 0.0, "network": 0.0}
        self.decisions: list[float] = []
        self._heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self._next_arrival = math.inf
        self._now = 0.0                                # the time of the event being processed

    # --- the heap ----------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, payload))

    def _wake(self, r: int) -> None:
        """Put replica r on the heap if it has work and no gang holds it (decode replicas run on demand)."""
        if not self.in_heap[r] and not self.held[r] and not self.decode_pool[r] and self.runners[r].state.has_work:
            self.in_heap[r] = True
            self._push(self.runners[r].state.clock_s, _REPLICA, r)

    # --- local queues --------------------------------------------------------------------------
    def queue_tokens(self) -> np.ndarray:
        """Per replica: tokens still to process for the requests dispatched there (prefill left + decodes
        left), plus a gang's long request split over its members, plus decodes migrating there."""
        out = self.inflight.copy()
        for r, runner in enumerate(self.runners):
            st = runner.state
            if not st.has_work:
                continue
            act = st.active
            pending = st.pending
            idx = np.concatenate((act, pending)) if pending.size else act
            if idx.size:
                left = (st.inp[idx] - st.m[idx]).clip(min=0)
                if st._stop is None:
                    left = left + st.output_lens[idx] - st.gen[idx]
                out[r] += int(left.sum())
        for g in self.gangs:
            if g.phase != "done":
                left = (g.units - g.units_done) * g.input_len // g.units + g.output_len - g.gen
                for r in g.members:
                    out[r] += left // len(g.members)
        return out

    def _accepts(self, r: int) -> bool:
        st = self.runners[r].state    # active = waiting + running: none waits when all of it runs
        return not st.has_work or (st.pending.size == 0 and st.active.size == st.num_running)

    def _may_take(self, r: int, queue: list[int]) -> bool:
        """Whether accepting replica r could take something from the queue: a short request (if no gang holds
        r, or the policy lets short requests onto gangs), or a long one (if r is free to join a gang)."""
        free = self.gang_of[r] < 0
        if free and self.eligible_long[r]:
            return True
        return (free or not self.pol.exclusive) and not self.on_gang[queue].all()

    def _accepting(self) -> np.ndarray:
        """Replicas with no request waiting to start (their local queue holds running requests only)."""
        return np.fromiter((self._accepts(r) for r in range(len(self.runners))), dtype=bool,
                           count=len(self.runners))

    # --- the global policies -----------------------------------------------------------------------
    def _dispatch(self, queue: list[int], now: float) -> None:
        """Send requests from the global queue to replicas and gangs, as the policy says."""
        if not queue:
            return
        t0 = time.perf_counter()
        pol = self.pol
        if pol.queue == "fifo" and len(self.runners) == 1 and not self.on_gang.any():
            for i in queue:           # one replica: every request goes there on arrival
                self._send(i, 0, now)
            queue.clear()
            self._decided(t0, [])
            return
        accepting = self._accepting()
        qt: np.ndarray | None = None              # the local queues, computed once something can be placed
        free = self.gang_of < 0
        order = queue if pol.queue in ("fifo", "reservation") else sorted(queue, key=lambda i: (self.is_long[i], i))
        sent: list[int] = []
        for i in order:
            if self.on_gang[i]:
                elig = free & self.eligible_long & (accepting if pol.exclusive else True)
                k = int(self.gang_size[i])
                if int(elig.sum()) >= k:
                    qt = self.queue_tokens() if qt is None else qt
                    members = choose_elastic_gang(self.cluster, k, self.sp_replicas, qt, elig)
                else:
                    members = None
                if members is None:
                    if pol.queue == "fifo":
                        break
                    continue
                self._form_gang(i, members, now)
                for r in members:
                    free[r] = accepting[r] = False
                    qt[r] += int(self.workload.input_lens[i]) // len(members)
            else:
                r, qt = self._place_short(qt, accepting, free, bool(self.is_long[i]))
                if r is None:
                    if pol.queue == "reservation":
                        continue
                    break          # FIFO among short requests; under priority no long one overtakes them
                self._send(i, r, now)
                accepting[r] = False
                qt[r] += int(self.workload.input_lens[i] + self.workload.output_lens[i])
            sent.append(i)
        if sent:
            gone = set(sent)
            queue[:] = [i for i in queue if i not in gone]
        self._decided(t0, sent)

    def _decided(self, t0: float, sent: list[int]) -> None:
        dt = time.perf_counter() - t0
        self.decisions.append(dt)
        if sent:
            self.decision_of[sent] = dt

    def _place_short(self, qt: np.ndarray | None, accepting: np.ndarray, free: np.ndarray,
                     long: bool) -> tuple[int | None, np.ndarray | None]:
        """The replica for a request one replica serves (pecsched.txt Fig. 6 steps 2-5 under PecSched),
        and the local queues (computed here the first time a replica qualifies)."""
        pol = self.pol
        base = accepting & (self.eligible_long if long else self.eligible_short)
        tiers = [base & free]                                  # step 2: a replica no long request holds
        if pol.queue == "pecsched":
            phase = np.array([self.gangs[g].phase if g >= 0 else "" for g in self.gang_of])
            if pol.colocate:                                   # steps 3-4: colocate with a long decode
                tiers.append(base & (phase == DECODE))
            preemptible = np.zeros_like(base)
            if pol.preempt_prefill:                            # step 5: preempt a long prefill
                preemptible |= (phase == PREFILL) | (phase == WAIT)
            if not pol.colocate:                               # /CoL: a long decode is preempted too
                preemptible |= phase == DECODE
            tiers.append(base & preemptible)
        for mask in tiers:
            if mask.any():
                qt = self.queue_tokens() if qt is None else qt
                return shortest_queue(qt, mask), qt
        return None, qt

    def _send(self, i: int, r: int, now: float) -> None:
        self.replica_of[i] = r
        self.dispatch_s[i] = now
        runner = self.runners[r]
        g = self.gang_of[r]
        if g >= 0 and self.gangs[g].phase == PREFILL and self.held[r]:
            self._suspend(self.gangs[g], now)
        if runner.state.clock_s < now and not runner.state.has_work and not self.held[r]:
            runner.wait_until(now)        # an idle replica wakes at the dispatch
        if self.pol.disaggregate and self.workload.output_lens[i] > 1 and not self.is_long[i]:
            runner.state.hand_off(int(i))
            self._event(r, now, "hand_off", int(i))
        runner.state.dispatch(int(i), now)
        self._event(r, now, "dispatch", int(i))
        self._wake(r)

    def _event(self, r: int, t: float, kind: str, i: int, *args: int) -> None:
        """Log what replica r was told between its batches (the cluster schedule replays it)."""
        self.events[r].append((self.runners[r].state.num_batches, float(t), kind, i, *args))

    # --- gangs ---------------------------------------------------------------------------------------
    def _form_gang(self, i: int, members: tuple[int, ...], now: float) -> None:
        w = self.workload
        g = make_gang(self.cluster, len(self.gangs), int(i), members, int(w.input_lens[i]), int(w.output_lens[i]),
                      self.pol.fast_sp)
        self.gangs.append(g)
        self.replica_of[i] = members[0]
        self.dispatch_s[i] = now
        for r in members:
            self.gang_of[r] = g.gid
        self._try_gang(g, now)

    def _hold(self, r: int, tokens: int, now: float) -> None:
        """Change what replica r holds for its gang by ``tokens`` (KV share, saved state)."""
        st = self.runners[r].state
        st.external_kv += tokens
        self.schedulers[r].set_kv_budget(st, st.external_kv)
        self._event(r, now, "hold", -1, int(st.external_kv))

    def _members_idle(self, g: Gang) -> bool:
        return not any(self.runners[r].state.has_work for r in g.members)

    def _try_gang(self, g: Gang, now: float) -> None:
        """Start the gang's next step if it may run now."""
        if g.phase == WAIT:
            if not self._members_idle(g):
                return
            start = max([now] + [self.runners[r].state.clock_s for r in g.members])
            if math.isnan(g.first_scheduled_s):
                g.first_scheduled_s = start
                for r in g.members:
                    self._hold(r, g.share_tokens, start)
            switch = 0.0
            if g.suspended:
                switch = g.switch_s
                saved = self._saved_tokens(g)
                for r in g.members:
                    self._hold(r, -saved, start)
                g.suspended = False
            g.phase = PREFILL
            self._begin(g, start, start + switch + (g.units - g.units_done) * g.unit_s, switch=switch)
        elif g.phase == DECODE and (not g.suspended or self._members_idle(g)):
            g.suspended = False             # a yielded decode resumes once its members have no work
            self._decode_step(g, now)

    def _saved_tokens(self, g: Gang) -> int:
        return math.ceil(g.saved_bytes / self.cluster.model.kv_bytes_per_token)

    def _begin(self, g: Gang, start: float, end: float, switch: float = 0.0) -> None:
        for r in g.members:
            self.held[r] = True
        g.step_start, g.step_end = start, end
        g.step_seq += 1
        g.switch_applied = switch
        self._push(end, _GANG, (g.gid, g.step_seq))

    def _suspend(self, g: Gang, now: float) -> None:
        """A short request preempts the gang's prefill at the next kernel boundary after ``now``."""
        compute_start = g.step_start + g.switch_applied
        done = max(0, math.ceil((now - compute_start) / g.unit_s - 1e-9)) if now > compute_start else 0
        stop = compute_start + done * g.unit_s
        if g.units_done + done >= g.units or stop >= g.step_end:
            return                          # the prefill ends first: nothing to suspend
        g.steps.append({"phase": PREFILL, "start_s": g.step_start, "end_s": stop, "units": [g.units_done,
                        g.units_done + done], "switch_s": g.switch_applied, "suspended": True})
        self._record_prefill(g, g.step_start, stop, done)
        g.units_done += done
        g.step_seq += 1                     # its end event is void
        g.phase, g.suspended = WAIT, True
        g.num_suspensions += 1
        saved = self._saved_tokens(g)
        for r in g.members:
            self.held[r] = False
            self.runners[r].wait_until(stop)
            self._hold(r, saved, stop)
            self._wake(r)

    def _decode_step(self, g: Gang, now: float) -> None:
        pol = self.pol
        if not pol.colocate and not self._members_idle(g):      # short work first: the long decode yields
            g.suspended = True
            g.num_suspensions += 1
            for r in g.members:
                self.held[r] = False
                self._wake(r)
            return
        start = max([now] + [self.runners[r].state.clock_s for r in g.members])
        shares = g.decode_shares()
        ends = []
        colocated = []
        for j, r in enumerate(g.members):
            self.held[r] = True
            runner = self.runners[r]
            if runner.state.clock_s < start or runner.not_before < start:
                runner.wait_until(start)
            extra = (np.ones(1, dtype=np.int64), shares[j:j + 1], np.ones(1, dtype=bool))
            ran = False
            if pol.colocate and runner.state.has_work:
                self.schedulers[r].set_token_budget(runner.state, self.colocate_tokens)
                ran = runner.step(extra)
                self.schedulers[r].set_token_budget(runner.state, None)
            if ran:
                ends.append(runner.state.clock_s)
                colocated.append((r, runner.state.num_batches - 1))
                self._handoffs(r)
            else:
                d = float(self.cost.batch_time(*extra))
                ends.append(start + d)
                self.gang_rec[r].add(start, d, (1, 1, 0, 1, int(shares[j]), 1, 0))
                self.gang_busy[r] += d
        end = max(ends) + decode_comm_s(self.cluster, g.members)
        g.steps.append({"phase": DECODE, "start_s": start, "end_s": end, "gen": g.gen,
                        "shares": shares.tolist(), "colocated": colocated})
        self._begin(g, start, end)

    def _record_prefill(self, g: Gang, start: float, end: float, units: int) -> None:
        """A prefill segment as a batch row on every member (its share of the prompt's tokens)."""
        tokens = max(1, round(g.input_len * units / g.units / len(g.members)))
        for r in g.members:
            self.gang_rec[r].add(start, end - start, (1, tokens, tokens, 0, g.share_tokens, 1, 0))
            self.gang_busy[r] += end - start

    def _gang_step_done(self, gid: int, seq: int, t: float) -> None:
        g = self.gangs[gid]
        if seq != g.step_seq:
            return                           # the step was cut by a suspension
        if g.phase == PREFILL:
            g.steps.append({"phase": PREFILL, "start_s": g.step_start, "end_s": t,
                            "units": [g.units_done, g.units], "switch_s": g.switch_applied, "suspended": False})
            self._record_prefill(g, g.step_start, t, g.units - g.units_done)
            g.units_done = g.units
            g.gen = 1
            g.first_token_s = t
            g.phase = DECODE
        else:
            g.gen += 1
        for r in g.members:
            self.runners[r].wait_until(t)
        if g.gen >= g.output_len:
            g.completion_s = t
            g.phase = "done"
            for r in g.members:
                self.held[r] = False
                self.gang_of[r] = -1
                self._hold(r, -g.share_tokens, t)
                self._wake(r)
            return
        self._try_gang(g, t)

    # --- migrations ------------------------------------------------------------------------------------
    def _handoffs(self, r: int) -> None:
        """Short requests that left replica r after their first token: send their KV to a decode replica."""
        st = self.runners[r].state
        if not st.handoffs:
            return
        qt = None
        for i in st.handoffs:
            if qt is None:
                for d in np.flatnonzero(self.decode_pool):
                    self._advance(int(d), self._now)
                qt = self.queue_tokens()
            dst = shortest_queue(qt, self.decode_pool)
            I = int(self.workload.input_lens[i])
            kv = self.cluster.kv_bytes(I)
            L = self.cluster.model.num_layers
            end = float(st.first_token_s[i])
            # layer by layer while the prefill runs: the last layer's KV is the exposed part
            arrive = max(end + self.cluster.transfer_s(kv / L, r, dst),
                         float(st.first_scheduled_s[i]) + self.cluster.transfer_s(kv, r, dst))
            self.link_bytes["nvlink" if self.cluster.same_node(r, dst) else "network"] += kv
            left = int(self.workload.output_lens[i]) - 1
            self.inflight[dst] += left
            qt[dst] += left
            self.decode_of[i] = dst
            self.migrations.append({"request": int(i), "src": r, "dst": int(dst), "sent_s": end,
                                    "arrive_s": arrive, "bytes": kv})
            self._push(arrive, _MIGRATE, (int(i), int(dst)))
        st.handoffs.clear()

    def _advance(self, r: int, t: float) -> None:
        """Run decode replica r's batches that start before ``t``.

        A decode replica receives work only by migrations, and nothing else depends on its progress but
        the choice of a migration's destination; so it runs on demand — up to a migration's arrival,
        up to the time a destination is chosen, and to the end — in fast-forwarded runs bounded by that
        time, instead of one batch per event of the whole cluster."""
        runner = self.runners[r]
        st = runner.state
        st.horizon_s = None if t == math.inf else t
        while st.has_work and st.clock_s < t:
            if runner.step():
                continue
            own = st.next_arrival_s
            if st.pending.size and own is not None and own < t:
                runner.wait_until(own)
                continue
            break

    def _arrive(self, i: int, dst: int, t: float) -> None:
        runner = self.runners[dst]
        self._advance(dst, t)
        self.inflight[dst] -= int(self.workload.output_lens[i]) - 1
        if runner.state.clock_s < t and not runner.state.has_work:
            runner.wait_until(t)
        I = int(self.workload.input_lens[i])
        runner.state.receive(i, t, I, 1)
        self._event(dst, t, "receive", int(i), I, 1)
        self._wake(dst)

    # --- the loop ------------------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> ClusterResult:
        w = self.workload
        order = np.argsort(w.arrivals_s, kind="stable")
        arrivals = w.arrivals_s
        n, k = len(w), 0
        queue: list[int] = []
        heap = self._heap
        done = 0
        while True:
            t_arr = float(arrivals[order[k]]) if k < n else math.inf
            t_ev = heap[0][0] if heap else math.inf
            if t_arr == math.inf and t_ev == math.inf:
                if not queue:
                    for d in np.flatnonzero(self.decode_pool):
                        self._advance(int(d), math.inf)
                if not queue and self._finished():
                    break
                if queue:
                    now = max(r.state.clock_s for r in self.runners)
                    before = len(queue)
                    self._dispatch(queue, now)
                    if len(queue) == before and not heap:
                        raise SchedulerStuckError(f"cluster policy {self.policy!r} holds {len(queue)} requests "
                                                  f"and no replica can take them")
                    continue
                stuck = [r for r, x in enumerate(self.runners) if x.state.has_work]
                waiting = [g.request for g in self.gangs if g.phase != "done"]
                raise SchedulerStuckError(f"cluster: replicas {stuck[:5]} and gangs of requests {waiting[:5]} hold "
                                          f"unfinished work but nothing is scheduled and nothing arrives")
            if t_arr <= t_ev:                      # arrivals first at equal times (the simulator admits them)
                self._now = t_arr
                while k < n and float(arrivals[order[k]]) <= t_arr:
                    queue.append(int(order[k]))
                    k += 1
                self._next_arrival = float(arrivals[order[k]]) if k < n else math.inf
                self._dispatch(queue, t_arr)
                continue
            t, _, kind, payload = heapq.heappop(heap)
            self._now = t
            if kind == _GANG:
                self._gang_step_done(payload[0], payload[1], t)
                if queue:
                    self._dispatch(queue, t)
                continue
            if kind == _MIGRATE:
                self._arrive(payload[0], payload[1], t)
                continue
            r = payload
            self.in_heap[r] = False
            if self.held[r]:
                continue                              # a gang holds it; it is woken when released
            runner = self.runners[r]
            if queue and self._accepts(r) and self._may_take(r, queue):
                # only a replica that may take work can unblock the queue
                self._dispatch(queue, t)
                if self.held[r]:
                    continue
            # the next time anything may be dispatched here: only arrivals fill the queue, so with an empty
            # queue the next arrival; otherwise any event (a replica freed, a gang done) may dispatch
            nxt = min(self._next_arrival, heap[0][0] if heap and queue else math.inf)
            runner.state.horizon_s = None if nxt == math.inf else nxt
            if runner.step():
                self._handoffs(r)
                if runner.state.has_work:
                    self._wake(r)
                else:
                    self._idle(r, runner.state.clock_s, queue)
            else:
                own = runner.state.next_arrival_s
                if runner.state.pending.size and own is not None:
                    runner.wait_until(own)
                    self._wake(r)
                else:
                    self._idle(r, max(t, runner.state.clock_s), queue)
            if progress is not None:
                now_done = sum(x.state.num_done for x in self.runners)
                if now_done - done >= 256:
                    done = now_done
                    progress(done, n)
        return self._result()

    def _idle(self, r: int, now: float, queue: list[int]) -> None:
        """Replica r has no work left: its gang may start, the global queue may send it work."""
        g = self.gang_of[r]
        if g >= 0:
            self._try_gang(self.gangs[g], now)
        if queue:
            self._dispatch(queue, now)

    def _finished(self) -> bool:
        return (all(not r.state.has_work for r in self.runners)
                and all(g.phase == "done" for g in self.gangs)) and not self._heap

    # --- results ---------------------------------------------------------------------------------------
    def _result(self) -> ClusterResult:
        w, R = self.workload, len(self.runners)
        traces = [x.recorder.finish(x.state) for x in self.runners]
        gtraces = [rec.finish(x.state) for rec, x in zip(self.gang_rec, self.runners)]
        requests = {k: v.copy() for k, v in traces[0].requests.items()}
        for key in ("num_evictions", "refill_tokens", "num_suspensions"):
            requests[key] = sum(t.requests[key] for t in traces)
        for r, tr in enumerate(traces):
            mine = (self.replica_of == r) & ~self.is_long
            for key in ("first_scheduled_s", "first_token_s", "completion_s"):
                requests[key][mine] = tr.requests[key][mine]
            dec = self.decode_of == r
            requests["completion_s"][dec] = tr.requests["completion_s"][dec]
        for g in self.gangs:
            i = g.request
            requests["first_scheduled_s"][i] = g.first_scheduled_s
            requests["first_token_s"][i] = g.first_token_s
            requests["completion_s"][i] = g.completion_s
            requests["num_suspensions"][i] = g.num_suspensions
        unfinished = np.flatnonzero(~np.isfinite(requests["completion_s"]))
        if (self.replica_of < 0).any() or unfinished.size:
            raise SchedulerStuckError(f"cluster: {unfinished.size} requests never finished (an engine bug)")
        allt = traces + [t for t in gtraces if t.num_batches]
        starts = np.concatenate([t.batches["start_s"] for t in allt])
        order = np.argsort(starts, kind="stable")
        batches = {k: np.concatenate([t.batches[k] for t in allt])[order] for k in traces[0].batches}
        one = R == 1 and not self.gangs
        merged = traces[0] if one else Trace(batches=batches, requests=requests, M=self.limits.M * R,
                                             cost_name=self.cost.name)
        busy = np.array([float(t.batches["duration_s"].sum()) for t in traces]) + self.gang_busy
        schedules = tuple(Schedule(tuple(x.out.batches), {"scheduler": s.describe(), "replica": r,
                                                          "workload": w.name, "limits": self.limits.to_dict(),
                                                          "cost": self.cost.describe()})
                          for r, (x, s) in enumerate(zip(self.runners, self.schedulers)))
        out = compute_metrics(merged)
        out["scheduling_decision_p99_s"] = float(np.percentile(self.decisions, 99)) if self.decisions else 0.0
        if not one:
            out["num_preemptions"] = int(sum(g.num_suspensions for g in self.gangs))
            out["num_migrations"] = len(self.migrations)
            out["nvlink_bytes"] = self.link_bytes["nvlink"] + sum(self._gang_bytes(g)[0] for g in self.gangs)
            out["network_bytes"] = self.link_bytes["network"] + sum(self._gang_bytes(g)[1] for g in self.gangs)
            jct = requests["completion_s"] - requests["arrival_s"]
            share = self.decision_of / np.where(jct > 0, jct, np.inf)
            for tag, sel in (("short", ~self.is_long), ("long", self.is_long)):
                if sel.any():
                    out[f"decision_share_p99_{tag}"] = float(np.percentile(share[sel], 99))
        return ClusterResult(cluster=self.cluster, policy=self.policy, schedules=schedules, trace=merged,
                             metrics=out, by_tag=metrics_by_tag(merged), replica_of=self.replica_of.copy(),
                             dispatch_s=self.dispatch_s.copy(), replica_busy_s=busy,
                             decision_s=np.array(self.decisions), decode_replica_of=self.decode_of.copy(),
                             gangs=tuple(self.gangs), migrations=tuple(self.migrations),
                             events=tuple(tuple(e) for e in self.events),
                             options={"sp_replicas": self.sp_replicas, "colocate_tokens": self.colocate_tokens,
                                      "decode_replicas": int(self.decode_pool.sum()), "fast_forward":
                                      self.runners[0].fast_forward})

    def _gang_bytes(self, g: Gang) -> tuple[float, float]:
        from .fastsp import fast_sp_prefill
        p = fast_sp_prefill(self.cluster, g.input_len, g.members, ring_only=not self.pol.fast_sp)
        return p.nvlink_bytes, p.network_bytes


def simulate_cluster(workload: "Workload | str", cluster: "Cluster | str", policy: str = "fifo",
                     scheduler: Any = "vllm", limits: "Limits | str | None" = None, cost: Any = None,
                     progress: Callable[[int, int], None] | None = None, fast_forward: bool = True,
                     **options: Any) -> ClusterResult:
    """Simulate ``workload`` on ``cluster`` (a :class:`Cluster` or its spec string) under ``policy``.

    ``options``: ``sp_replicas``, ``decode_replicas``, ``colocate_tokens`` (:class:`ClusterEngine`)."""
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    return ClusterEngine(workload, Cluster.from_spec(cluster), policy, scheduler, limits, cost,
                         fast_forward, **options).run(progress)
