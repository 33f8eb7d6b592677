"""The replicas of a cluster run, the engine's one event heap, and what the engine told each replica.

A replica is a :class:`~infermax.state.ServingState` made with ``dispatched=True`` (a
request reaches it when the engine sends it there) and driven by the simulator's own
:class:`~infermax.engine.ReplicaRunner`, so batch construction, the rules the state
checks and the trace are the single-replica simulator's, line for line.

A replica is built when the engine first touches it: at thousands of replicas most
never hold a request (the shortest-queue rule fills the lowest-indexed idle ones
first), and each state and scheduler is sized to the whole workload. An untouched
replica is indistinguishable from a built one that was never used (clock 0, no
work), so building it late changes nothing — and the time it takes is the simulator's, not
part of a dispatch decision's (``build_s``). Replica 0 and the first decode replica are built at
once, so a local scheduler that refuses the workload does so before the run; a scheduler given as an
instance (shared by every replica, as before) builds them all at once.

Every call that changes a replica's work goes through :class:`Replicas`, which tells
the load index (:mod:`~infermax.cluster.loads`) which replicas changed.

Events on the heap are ``(time_s, seq, kind, payload)``: the sequence number breaks
ties in the order of pushing (SimPy's rule), so the run is deterministic.
"""
from __future__ import annotations

import heapq
import time
from typing import Any, Callable

import numpy as np

from infermax.engine import ReplicaRunner, _BatchList
from infermax.state import ServingState
from infermax.trace import TraceRecorder
from infermax.types import Limits, Workload

REPLICA, GANG, MIGRATE, DISPATCH = 0, 1, 2, 3   # event kinds: a replica's next batch, a gang step's end,
                                                # a KV arrival, a dispatch decision due then


class Replicas:
    """The replicas (built on first use), their flags, the event heap and the per-replica event logs."""

    def __init__(self, workload: Workload, limits: Limits, cost: Any, scheduler: Any, serves: np.ndarray,
                 fast_forward: bool, decode_pool: np.ndarray, touched: Callable[[int], None],
                 plans: Any = None, decode_serves: np.ndarray | None = None) -> None:
        from infermax.schedulers import get_scheduler

        R = int(decode_pool.size)
        self.workload, self.limits, self.cost = workload, limits, cost
        self._scheduler_spec, self._get_scheduler = scheduler, get_scheduler
        self._serves = serves                       # read-only, shared by every replica's state
        self._decode_serves = serves if decode_serves is None else decode_serves    # ... of the decode pool
        self.fast_forward = fast_forward
        self.decode_pool = decode_pool
        self.touched = touched                      # the load index's "replica r changed"
        self.plans = plans                          # executed plans (cluster/plans.py), or None
        self._runners: list[ReplicaRunner | None] = [None] * R
        self._schedulers: list[Any] = [None] * R
        self.built: list[int] = []                  # indices of the built replicas, in order of building
        self.build_s = 0.0                          # time spent building them (perf_counter seconds)
        self.held = np.zeros(R, dtype=bool)         # under a gang's control (in a gang step / colocated decode)
        self.in_heap = np.zeros(R, dtype=bool)
        self.events: list[list[tuple]] = [[] for _ in range(R)]
        self.heap: list[tuple[float, int, int, Any]] = []
        self._seq = 0
        self.now_s = 0.0                            # the time of the event being processed
        self._fresh: dict | None = None             # an unused scheduler's description
        decode = np.flatnonzero(decode_pool)[:1].tolist()      # (its scheduler reads another serves mask)
        for r in (range(R) if not isinstance(scheduler, str) else [0] + decode):
            self.runner(r)

    def check_local_scheduler(self, gangs: bool, colocate: bool) -> None:
        """Refuse, before the run, a local scheduler that cannot take its part in it: admit around the KV a gang
        holds (``gangs``), cap its batches beside a long decode (``colocate``). Each setter is tried on replica
        0 and set back (a scheduler that cannot raises, naming itself) — rather than when a gang first holds KV."""
        sched, state = self.scheduler(0), self.state(0)
        if gangs:
            sched.set_kv_budget(state, 1)
            sched.set_kv_budget(state, 0)
        if colocate:
            sched.set_token_budget(state, 1)
            sched.set_token_budget(state, None)

    def __len__(self) -> int:
        return len(self._runners)

    # --- building ------------------------------------------------------------------------------------
    def runner(self, r: int) -> ReplicaRunner:
        """Replica r's runner, built on first use."""
        runner = self._runners[r]
        if runner is None:
            t0 = time.perf_counter()
            sched = self._get_scheduler(self._scheduler_spec)
            plans = self.plans
            cost = self.cost if plans is None else plans.executor(r).cost
            state = ServingState(self.workload, self.limits, cost, dispatched=True)
            state.serves = self._decode_serves if self.decode_pool[r] else self._serves
            sched.reset(state)
            if plans is None:
                runner = ReplicaRunner(state, sched, _BatchList(), TraceRecorder(), self.workload.ids,
                                       self.fast_forward)
            else:
                runner = plans.runner(r, state, sched, _BatchList(), TraceRecorder(), self.workload.ids)
            self._runners[r], self._schedulers[r] = runner, sched
            self.built.append(r)
            self.build_s += time.perf_counter() - t0
        return runner

    def state(self, r: int) -> ServingState:
        return self.runner(r).state

    def scheduler(self, r: int) -> Any:
        self.runner(r)
        return self._schedulers[r]

    def is_built(self, r: int) -> bool:
        return self._runners[r] is not None

    def has_work(self, r: int) -> bool:
        """Requests dispatched to replica r and not finished (an unbuilt replica has none)."""
        runner = self._runners[r]
        return runner is not None and runner.state.has_work

    def clock_s(self, r: int) -> float:
        runner = self._runners[r]
        return 0.0 if runner is None else runner.state.clock_s

    def accepts(self, r: int) -> bool:
        """No request waits to start on replica r: every one dispatched there is admitted and running."""
        runner = self._runners[r]
        if runner is None:
            return True
        st = runner.state
        return not st.has_work or (st.num_pending == 0 and st.num_waiting == 0)

    def local_queue(self, r: int) -> tuple[int, bool]:
        """(Tokens left of the requests dispatched to replica r — prefill, and decode unless they leave after
        their first token —, whether it accepts work): what the load index reads."""
        runner = self._runners[r]
        if runner is None:
            return 0, True
        st = runner.state
        tokens = st.prefill_tokens_left + (0 if st.hands_off else st.decode_tokens_left)
        return tokens, not st.has_work or (st.num_pending == 0 and st.num_waiting == 0)

    # --- what changes a replica's work (each tells the load index) ------------------------------------
    def step(self, r: int, extra: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None) -> bool:
        """Replica r runs its next batch (``ReplicaRunner.step``); False if nothing can run now."""
        self.touched(r)
        return self.runner(r).step(extra)

    def wait_until(self, r: int, time_s: float) -> None:
        self.touched(r)
        self.runner(r).wait_until(time_s)

    def dispatch(self, r: int, i: int, time_s: float, hand_off: bool) -> None:
        """Request i joins replica r's local queue at ``time_s`` (leaving after its first token if ``hand_off``)."""
        self.touched(r)
        state = self.state(r)
        if hand_off:
            state.hand_off(i)
            self.event(r, time_s, "hand_off", i)
        state.dispatch(i, time_s)
        self.event(r, time_s, "dispatch", i)

    def receive(self, r: int, i: int, time_s: float, kv_tokens: int, generated: int) -> None:
        """Request i arrives at replica r holding its KV (a migrated decode)."""
        self.touched(r)
        self.state(r).receive(i, time_s, kv_tokens, generated)
        self.event(r, time_s, "receive", i, kv_tokens, generated)

    # --- the heap and the log -------------------------------------------------------------------------
    def push(self, time_s: float, kind: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self.heap, (time_s, self._seq, kind, payload))

    def wake(self, r: int) -> None:
        """Put replica r on the heap if it has work and no gang holds it (decode replicas run on demand)."""
        if not self.in_heap[r] and not self.held[r] and not self.decode_pool[r] and self.has_work(r):
            self.in_heap[r] = True
            self.push(self.clock_s(r), REPLICA, r)

    def event(self, r: int, time_s: float, kind: str, i: int, *args: int) -> None:
        """Log what replica r was told between its batches (the cluster schedule replays it)."""
        self.events[r].append((self.state(r).num_batches, float(time_s), kind, i, *args))

    def describe_scheduler(self, r: int) -> dict:
        """Replica r's scheduler's description (an unbuilt replica's is a fresh scheduler's: the same)."""
        sched = self._schedulers[r]
        if sched is not None:
            return sched.describe()
        if self._fresh is None:
            self._fresh = self._get_scheduler(self._scheduler_spec).describe()
        return dict(self._fresh)
