"""The cluster engine: one discrete-event loop over replicas, a global queue and a dispatch policy.

Every replica is a :class:`~infermax.state.ServingState` (``dispatched=True``: a
request reaches it when the engine dispatches it there) driven by the simulator's
own :class:`~infermax.engine.ReplicaRunner`, so batch construction, the rules the
state checks and the trace are the single-replica simulator's, line for line.
Events are processed in time order: arrivals join the global queue; the policy
dispatches from it (pecsched.txt §6.2 "Scheduling": a global queue, FIFO local
queues, the shortest local queue in tokens); the replica whose clock is earliest
runs its next batch. Before a replica runs a batch at time t every arrival up to
t has been dispatched, and its fast-forward of identical decode batches stops
before the next time anything may be dispatched to it (``horizon_s``).

A one-replica cluster with FIFO dispatch gives the simulator's schedule, trace and
metrics bit for bit (DESIGN.md invariant 5; ``tests/cluster/test_engine.py``).

Dispatch (the global policies below) decides *where and when* a request starts;
it never preempts. PecSched's suspension, prefill/decode disaggregation with KV
migration, colocation and multi-replica sequence-parallel gangs are not part of
this engine yet: a request whose KV does not fit one replica is refused before
simulating, with a message naming it.
"""
from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from infermax.engine import ReplicaRunner, SchedulerStuckError, _BatchList
from infermax.metrics import metrics as compute_metrics
from infermax.metrics import metrics_by_tag
from infermax.state import DONE, WAITING, ServingState
from infermax.trace import Trace, TraceRecorder
from infermax.types import Limits, Schedule, Workload

from .placement import reservation_split, shortest_queue
from .spec import Cluster

POLICIES = ("fifo", "reservation", "priority")


@dataclass(frozen=True, eq=False)
class ClusterResult:
    """A cluster run: per-replica schedules, the merged trace, metrics, per-tag metrics, dispatches."""

    cluster: Cluster
    policy: str
    schedules: tuple[Schedule, ...]
    trace: Trace
    metrics: dict[str, Any]
    by_tag: dict[str, dict[str, float]]
    replica_of: np.ndarray          # request index -> replica
    dispatch_s: np.ndarray          # request index -> dispatch time
    replica_busy_s: np.ndarray      # per replica: seconds of batches
    decision_s: np.ndarray = field(default_factory=lambda: np.zeros(0))   # per dispatch: policy CPU time

    @property
    def utilization(self) -> np.ndarray:
        """Busy share of each replica over the makespan."""
        span = self.metrics["latency_s"]
        return self.replica_busy_s / span if span > 0 else np.zeros_like(self.replica_busy_s)


def _local_limits(cluster: Cluster, workload: Workload, limits: "Limits | str | None") -> Limits:
    """The replicas' limits: M from the cluster; C and P at least the longest prompt unless given."""
    base = Limits.from_spec(limits) if limits is None or isinstance(limits, str) else limits
    if not isinstance(base, Limits):
        raise ValueError(f"limits must be a Limits or a spec string, got {limits!r}")
    M = cluster.replica_kv_capacity_tokens
    if limits is None:
        longest = int(workload.input_lens.max())
        return base.replace(M=M, C=max(base.C, longest), P=max(base.P, longest))
    return base.replace(M=M)


class ClusterEngine:
    """Runs ``workload`` on ``cluster`` under a global ``policy`` and a local ``scheduler`` per replica."""

    def __init__(self, workload: Workload, cluster: Cluster, policy: str = "fifo", scheduler: Any = "vllm",
                 limits: "Limits | str | None" = None, cost: Any = None, fast_forward: bool = True,
                 long_tag: str = "long") -> None:
        from infermax.costmodel import get_cost_model
        from infermax.schedulers import get_scheduler

        if policy not in POLICIES:
            from difflib import get_close_matches
            near = get_close_matches(str(policy), POLICIES, n=1)
            hint = f" (did you mean {near[0]}?)" if near else ""
            raise ValueError(f"unknown cluster policy {policy!r}{hint}; known: {', '.join(POLICIES)}")
        self.workload, self.cluster, self.policy = workload, cluster, policy
        self.limits = _local_limits(cluster, workload, limits)
        self.cost = get_cost_model(cost if cost is not None else cluster.cost_model_name())
        peak = workload.input_lens + workload.output_lens - 1
        too_big = np.flatnonzero(peak > self.limits.M)
        if too_big.size:
            i = int(too_big[0])
            raise ValueError(f"request {int(workload.ids[i])} (input {int(workload.input_lens[i])}, output "
                             f"{int(workload.output_lens[i])}) needs {int(peak[i])} KV tokens, more than one replica's "
                             f"M = {self.limits.M} on {cluster.to_spec()}; requests spread over several replicas "
                             f"(sequence parallelism) are not simulated yet ({too_big.size} such requests)")
        too_long = np.flatnonzero(workload.input_lens > self.limits.C)
        if too_long.size:
            i = int(too_long[0])
            raise ValueError(f"request {int(workload.ids[i])} has input {int(workload.input_lens[i])} > C = "
                             f"{self.limits.C}: a replica could never prefill it in one batch")
        n, R = len(workload), cluster.num_replicas
        self.is_long = np.array([r.tag == long_tag for r in workload.requests], dtype=bool)
        self.runners: list[ReplicaRunner] = []
        self.schedulers = []
        for _ in range(R):
            sched = get_scheduler(scheduler)
            state = ServingState(workload, self.limits, self.cost, dispatched=True)
            sched.reset(state)
            self.schedulers.append(sched)
            self.runners.append(ReplicaRunner(state, sched, _BatchList(), TraceRecorder(), workload.ids,
                                              fast_forward))
        self.replica_of = np.full(n, -1, dtype=np.int64)
        self.dispatch_s = np.full(n, np.nan)
        self.eligible_long = np.ones(R, dtype=bool)
        self.eligible_short = np.ones(R, dtype=bool)
        if policy == "reservation":
            longest = int(peak[self.is_long].max()) if self.is_long.any() else 1
            self.eligible_long, self.eligible_short = reservation_split(cluster, longest)
        self.decisions: list[float] = []

    # --- local queues --------------------------------------------------------------------
    def queue_tokens(self) -> np.ndarray:
        """Per replica: tokens still to process for the requests dispatched there (prefill left + decodes left)."""
        out = np.zeros(len(self.runners), dtype=np.int64)
        for r, runner in enumerate(self.runners):
            st = runner.state
            act = st.active
            pending = st.pending
            idx = np.concatenate((act, pending)) if pending.size else act
            if idx.size:
                out[r] = int(((st.inp[idx] - st.m[idx]).clip(min=0) + st.output_lens[idx] - st.gen[idx]).sum())
        return out

    def _accepting(self) -> np.ndarray:
        """Replicas with no request waiting to start (their local queue holds running requests only)."""
        ok = np.zeros(len(self.runners), dtype=bool)
        for r, runner in enumerate(self.runners):
            st = runner.state
            act = st.active
            ok[r] = st.pending.size == 0 and not bool((st.status[act] == WAITING).any())
        return ok

    # --- the global policies ---------------------------------------------------------------
    def _dispatch_ready(self, queue: list[int], now: float) -> None:
        """Send requests from the global queue to replicas: FIFO order (priority: short ones first)."""
        if not queue:
            return
        t0 = time.process_time()
        if self.policy == "fifo" and len(self.runners) == 1:
            for i in queue:           # one replica: every request goes there on arrival
                self._send(i, 0, now)
            queue.clear()
            self.decisions.append(time.process_time() - t0)
            return
        accepting = self._accepting()
        qt = self.queue_tokens()
        order = queue if self.policy != "priority" else sorted(queue, key=lambda i: (self.is_long[i], i))
        sent = []
        for i in order:
            elig = accepting & (self.eligible_long if self.is_long[i] else self.eligible_short)
            r = shortest_queue(qt, elig)
            if r is None:
                if self.policy == "priority" and not self.is_long[i]:
                    break          # a short request waits: no long one may overtake it
                if self.policy == "fifo":
                    break          # head-of-line: FIFO never reorders
                continue
            self._send(i, r, now)
            sent.append(i)
            accepting[r] = False
            qt[r] += int(self.workload.input_lens[i] + self.workload.output_lens[i])
        if sent:
            gone = set(sent)
            queue[:] = [i for i in queue if i not in gone]
        self.decisions.append(time.process_time() - t0)

    def _send(self, i: int, r: int, now: float) -> None:
        self.replica_of[i] = r
        self.dispatch_s[i] = now
        runner = self.runners[r]
        if runner.state.clock_s < now and not runner.state.has_work:
            runner.wait_until(now)        # an idle replica wakes at the dispatch
        runner.state.dispatch(int(i), now)

    # --- the loop --------------------------------------------------------------------------
    def run(self, progress: Callable[[int, int], None] | None = None) -> ClusterResult:
        w = self.workload
        order = np.argsort(w.arrivals_s, kind="stable")
        arrivals = w.arrivals_s
        n, k = len(w), 0
        queue: list[int] = []
        ready: list[tuple[float, int]] = []        # (clock, replica) of replicas that can run a batch
        idle = set(range(len(self.runners)))
        done = 0
        while True:
            t_arr = float(arrivals[order[k]]) if k < n else np.inf
            t_run = ready[0][0] if ready else np.inf
            if t_arr == np.inf and t_run == np.inf:
                if not queue and all(not r.state.has_work for r in self.runners):
                    break
                if queue:
                    # nothing runs and nothing arrives: dispatch whatever the policy would hold back
                    now = max(r.state.clock_s for r in self.runners)
                    before = len(queue)
                    self._dispatch_ready(queue, now)
                    self._wake(idle, ready)
                    if len(queue) == before and not ready:
                        raise SchedulerStuckError(f"cluster policy {self.policy!r} holds {len(queue)} requests "
                                                  f"and no replica can take them")
                    continue
                stuck = [r for r, x in enumerate(self.runners) if x.state.has_work]
                raise SchedulerStuckError(f"cluster: replicas {stuck[:5]} hold unfinished requests but "
                                          f"scheduled nothing and nothing arrives")
            if t_arr <= t_run:                     # arrivals first at equal times (the simulator admits them)
                while k < n and float(arrivals[order[k]]) <= t_arr:
                    queue.append(int(order[k]))
                    k += 1
                horizon = float(arrivals[order[k]]) if k < n else None
                for x in self.runners:
                    x.state.horizon_s = horizon
                self._dispatch_ready(queue, t_arr)
                self._wake(idle, ready)
                continue
            clock, r = heapq.heappop(ready)         # replica r is free at ``clock``: decide, then run
            runner = self.runners[r]
            if queue:
                self._dispatch_ready(queue, clock)
                self._wake(idle, ready)
            if runner.step():
                heapq.heappush(ready, (runner.state.clock_s, r))
            else:
                nxt = runner.state.next_arrival_s
                own_pending = runner.state.pending.size > 0
                if own_pending and nxt is not None:
                    runner.wait_until(nxt)
                    heapq.heappush(ready, (runner.state.clock_s, r))
                else:
                    idle.add(r)
                    if queue:
                        self._dispatch_ready(queue, max(clock, runner.state.clock_s))
                        self._wake(idle, ready)
            if progress is not None:
                now_done = sum(x.state.num_done for x in self.runners)
                if now_done - done >= 256:
                    done = now_done
                    progress(done, n)
        return self._result()

    def _wake(self, idle: set[int], ready: list[tuple[float, int]]) -> None:
        for r in [r for r in idle if self.runners[r].state.has_work]:
            idle.discard(r)
            heapq.heappush(ready, (self.runners[r].state.clock_s, r))

    # --- results ---------------------------------------------------------------------------
    def _result(self) -> ClusterResult:
        w, R = self.workload, len(self.runners)
        traces = [x.recorder.finish(x.state) for x in self.runners]
        requests = {k: v.copy() for k, v in traces[0].requests.items()}
        for r, tr in enumerate(traces):
            mine = self.replica_of == r
            for key in ("first_scheduled_s", "first_token_s", "completion_s", "num_evictions", "refill_tokens",
                        "num_suspensions"):
                requests[key][mine] = tr.requests[key][mine]
        if (self.replica_of < 0).any() or any((x.state.status[self.replica_of == r] != DONE).any()
                                              for r, x in enumerate(self.runners)):
            raise SchedulerStuckError("cluster: a request was never finished (an engine bug)")
        starts = np.concatenate([t.batches["start_s"] for t in traces])
        order = np.argsort(starts, kind="stable")
        batches = {k: np.concatenate([t.batches[k] for t in traces])[order] for k in traces[0].batches}
        merged = Trace(batches=batches, requests=requests, M=self.limits.M * R, cost_name=self.cost.name)
        busy = np.array([float(t.batches["duration_s"].sum()) for t in traces])
        schedules = tuple(Schedule(tuple(x.out.batches), {"scheduler": s.describe(), "replica": r,
                                                          "workload": w.name, "limits": self.limits.to_dict(),
                                                          "cost": self.cost.describe()})
                          for r, (x, s) in enumerate(zip(self.runners, self.schedulers)))
        out = compute_metrics(merged) if len(traces) > 1 else compute_metrics(traces[0])
        out["scheduling_decision_p99_s"] = float(np.percentile(self.decisions, 99)) if self.decisions else 0.0
        return ClusterResult(cluster=self.cluster, policy=self.policy, schedules=schedules,
                             trace=merged if len(traces) > 1 else traces[0], metrics=out,
                             by_tag=metrics_by_tag(merged), replica_of=self.replica_of.copy(),
                             dispatch_s=self.dispatch_s.copy(), replica_busy_s=busy,
                             decision_s=np.array(self.decisions))


def simulate_cluster(workload: "Workload | str", cluster: "Cluster | str", policy: str = "fifo",
                     scheduler: Any = "vllm", limits: "Limits | str | None" = None, cost: Any = None,
                     progress: Callable[[int, int], None] | None = None, fast_forward: bool = True) -> ClusterResult:
    """Simulate ``workload`` on ``cluster`` (a :class:`Cluster` or its spec string) under ``policy``."""
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    return ClusterEngine(workload, Cluster.from_spec(cluster), policy, scheduler, limits, cost,
                         fast_forward).run(progress)
