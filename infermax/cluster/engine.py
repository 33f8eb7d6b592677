"""The cluster engine: one discrete-event loop over replicas, gangs, migrations and a global queue.

Every replica is the single-replica simulator's state and runner
(:mod:`~infermax.cluster.replicas`), so a one-replica cluster with FIFO dispatch gives
the simulator's schedule, trace and metrics bit for bit (docs/design.md invariant 5;
``tests/cluster/test_engine.py``).

Events, in time order (one heap; arrivals from the sorted trace):

- an **arrival** joins the global queue, and the policy dispatches from it
  (:mod:`~infermax.cluster.dispatch`; PecSched §6.2 "Scheduling");
- a **replica** whose clock is earliest runs its next batch; before it does, its
  fast-forward of identical decode batches is bounded by the next event anywhere
  (``horizon_s``), so nothing dispatched or migrated to it is admitted late;
- a **gang step** ends (:mod:`~infermax.cluster.gang_runner`): a long request's
  sequence-parallel prefill — suspended by short requests under PecSched (§5.1) —
  or one of its decode steps, colocated with short prefills (§5.2);
- a **migration** arrives (:mod:`~infermax.cluster.migration`): with disaggregation
  a short request's KV reaches a decode replica after its first token (§5.2).

Who serves what is settled before the run (:mod:`~infermax.cluster.roles`); the local
queue lengths the dispatcher compares are kept as replicas change
(:mod:`~infermax.cluster.loads`). What the run did is a
:class:`~infermax.cluster.result.ClusterResult`, whose
:class:`~infermax.cluster.schedule.ClusterSchedule`
:func:`~infermax.cluster.judge.replay_cluster` checks independently.
"""
from __future__ import annotations

import heapq
import math
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from infermax.clock import on_relative_clock
from infermax.engine import SchedulerStuckError
from infermax.types import Limits, Workload

from .dispatch import Dispatcher
from .gang_runner import GangRunner
from .loads import Loads
from .migration import Migrations
from .policies import MEDHA_CHUNK_TOKENS, POLICIES, ClusterPolicy, get_policy
from .replicas import DISPATCH, GANG, MIGRATE, Replicas
from .result import ClusterResult, assemble
from .spec import Cluster

if TYPE_CHECKING:
    from .window import WindowResult

__all__ = ["MEDHA_CHUNK_TOKENS", "POLICIES", "ClusterEngine", "ClusterResult", "simulate_cluster"]

MAX_NUM_SEQS = 256             # vLLM's default max_num_seqs: running requests per replica (R_max)


class ClusterEngine:
    """Runs ``workload`` on ``cluster`` under a global ``policy`` and a local ``scheduler`` per replica.

    ``scheduler``: each replica's (default: the policy's own — ``medha`` under the medha-* policies —,
    else ``vllm``); ``sp_replicas``: the most replicas of a long request's gang (default: one node's
    worth); a gang takes as many free replicas of one node as it finds up to that, at
    least what its KV needs (elastic, as free GPUs allow); ``decode_replicas``: replicas dedicated to short
    decodes under disaggregation (default: §6.2's 4/4/1/1 for its four models, else
    one per node); ``colocate_tokens``: short prefill tokens per member and step
    colocated with a long decode (§5.2's threshold); ``kvp_group_tokens``: on a plan
    with kvp > 1, the most KV tokens of one request per KVP group before it onboards
    the next (:mod:`~infermax.cluster.plans`); ``reserved_replicas``: under the reservation policy,
    the replicas that serve long requests only (default: the majority, in whole gangs —
    :func:`~infermax.cluster.placement.reservation_split`); ``max_num_seqs``: every replica's R_max, the
    running requests it holds at once (vLLM's ``max_num_seqs``, 256 by default; ``None``: no cap), unless
    the given ``limits`` set R_max; ``ring_attention``: how the policies whose gangs run plain ring
    attention (the PecSched baselines and ``pecsched-fsp``) shard the sequence — ``striped`` (default:
    token t on member t mod k, every member the balanced share of the causal attention, as striped or
    zig-zag ring attention) or ``contiguous`` (one block per member: the last does (2k − 1)/k of the
    balanced share; :mod:`~infermax.cluster.fastsp`). LoongServe's ring is striped by its own design.
    """

    def __init__(self, workload: Workload, cluster: Cluster, policy: "str | ClusterPolicy" = "fifo",
                 scheduler: Any = None, limits: "Limits | str | None" = None, cost: Any = None,
                 fast_forward: bool = True, long_tag: str = "long", sp_replicas: int | None = None,
                 decode_replicas: int | None = None, colocate_tokens: int = 512,
                 kvp_group_tokens: int | None = None, reserved_replicas: int | None = None,
                 max_num_seqs: int | None = MAX_NUM_SEQS, ring_attention: str = "striped") -> None:
        from infermax.costmodel import get_cost_model

        workload = on_relative_clock(workload)     # every time of the run is on it (infermax.clock)
        self.pol = pol = get_policy(policy).sharded(ring_attention)   # (its ring as the option shards it)
        if max_num_seqs is not None and (isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)
                                         or max_num_seqs < 1):
            raise ValueError(f"max_num_seqs must be an integer >= 1 or None, got {max_num_seqs!r}")
        scheduler = pol.scheduler(scheduler)
        self.workload, self.cluster, self.policy = workload, cluster, pol.name
        self.cost = get_cost_model(cost if cost is not None else cluster.cost_model_name())
        if isinstance(colocate_tokens, bool) or not isinstance(colocate_tokens, int) or colocate_tokens < 1:
            raise ValueError(f"colocate_tokens must be an integer >= 1, got {colocate_tokens!r}")
        self.roles = roles = pol.roles(workload, cluster, limits, long_tag, sp_replicas, decode_replicas,
                                       reserved_replicas)
        self.plans = pol.plans(workload, cluster, roles, kvp_group_tokens)
        self.limits = pol.replica_limits(roles.limits, limits, scheduler, max_num_seqs, self.plans)
        self.loads = Loads(*roles.classes, roles.decode_pool)
        self.replicas = Replicas(workload, self.limits, self.cost, scheduler, ~roles.on_gang, fast_forward,
                                 roles.decode_pool, self.loads.touch, self.plans, pol.decode_serves(len(workload)))
        gangs = bool(roles.on_gang.any())
        self.replicas.check_local_scheduler(gangs, gangs and pol.colocate)
        self.migrations = Migrations(workload, cluster, self.replicas, self.loads)
        self.gangs = GangRunner(cluster, pol, self.cost, self.replicas, self.loads, colocate_tokens,
                                self.migrations.handoffs)
        pol.attach(self)
        self.dispatcher = Dispatcher(workload, cluster, pol, roles, self.replicas, self.loads, self.gangs)
        if gangs:
            cluster.cost_model()           # built once, before the run: fast SP prices every gang with it
        self.options = {"sp_replicas": roles.sp_replicas, "colocate_tokens": colocate_tokens,
                        "decode_replicas": int(roles.decode_pool.sum()), "fast_forward": fast_forward,
                        "max_num_seqs": self.limits.R_max, **pol.run_options(roles, ring_attention, self.plans)}
        self._next_arrival = math.inf      # the next arrival not yet in the global queue

    def queue_tokens(self) -> np.ndarray:
        """Per replica: its local queue length in tokens (:mod:`~infermax.cluster.loads`), as of now."""
        self.loads.refresh(self.replicas.local_queue)
        return self.loads.tokens.copy()

    # --- the loop ------------------------------------------------------------------------------------
    # complexity: the cluster engine's event loop: arrivals, then one branch per event kind (gang, dispatch, migrate)
    def run(self, progress: Callable[[int, int], None] | None = None,
            until_s: float = math.inf) -> "ClusterResult | WindowResult":
        """Run to the end, or (``until_s`` finite) stop at that time: then a
        :class:`~infermax.cluster.window.WindowResult` (the measurement window of a capacity sweep).
        ``until_s`` and every time of the result are seconds since the workload's first arrival
        (:mod:`infermax.clock`)."""
        w, reps, disp = self.workload, self.replicas, self.dispatcher
        order = np.argsort(w.arrivals_s, kind="stable")
        arrivals = w.arrivals_s[order].tolist()
        n, k, heap, queue = len(w), 0, reps.heap, disp.queue
        events = done = 0
        while True:
            t_arr = arrivals[k] if k < n else math.inf
            t_ev = heap[0][0] if heap else math.inf
            if min(t_arr, t_ev) > until_s:
                from .window import windowed
                return windowed(self, until_s)
            if t_arr == math.inf and t_ev == math.inf:
                if self._drained():
                    break
                continue
            if t_arr <= t_ev:                      # arrivals first at equal times (the simulator admits them)
                reps.now_s = t_arr
                while k < n and arrivals[k] <= t_arr:
                    queue.push(int(order[k]))
                    k += 1
                self._next_arrival = arrivals[k] if k < n else math.inf
                disp.dispatch(t_arr)
                continue
            t, _, kind, payload = heapq.heappop(heap)
            reps.now_s = t
            if kind == GANG:
                self.gangs.step_done(payload[0], payload[1], t)
                disp.dispatch(t)
            elif kind == DISPATCH:
                disp.dispatch(t)
            elif kind == MIGRATE:
                self.migrations.arrive(payload[0], payload[1], t)
            else:
                self._replica_event(payload, t)
                events += 1
                if progress is not None and events % 64 == 0:
                    now_done = sum(reps.state(r).num_done for r in reps.built)
                    if now_done - done >= 256:
                        done = now_done
                        progress(done, n)
        return assemble(self)

    def _replica_event(self, r: int, t: float) -> None:
        """Replica r's turn: the queue may send it work first, then it runs its next batch (or idles)."""
        reps, disp = self.replicas, self.dispatcher
        reps.in_heap[r] = False
        if reps.held[r]:
            return                                # a gang holds it; it is woken when released
        if len(disp.queue) and reps.accepts(r) and disp.may_take(r):
            disp.dispatch(t)                      # only a replica that may take work can unblock the queue
            if reps.held[r]:
                return
        # the next time anything may be dispatched here: only arrivals fill the queue, so with an empty
        # queue the next arrival; otherwise any event (a replica freed, a gang done) may dispatch
        heap = reps.heap
        nxt = min(self._next_arrival, heap[0][0] if heap and len(disp.queue) else math.inf)
        state = reps.state(r)
        state.horizon_s = None if nxt == math.inf else nxt
        if reps.step(r):
            self.migrations.handoffs(r)
            if state.has_work:
                reps.wake(r)
            else:
                self._idle(r, state.clock_s)
        else:
            own = state.next_arrival_s
            if state.num_pending and own is not None:
                reps.wait_until(r, own)
                reps.wake(r)
            else:
                self._idle(r, max(t, state.clock_s))

    def _idle(self, r: int, now: float) -> None:
        """Replica r has no work left: its gang may start, the global queue may send it work. Idle from a time
        after the loop's (its last batch ends later), it asks the queue then, after the events before it:
        a dispatch at ``now`` would come before arrivals that precede it."""
        g = self.gangs.of(r)
        if g is not None:
            self.gangs.try_start(g, now)
        if now > self.replicas.now_s and len(self.dispatcher.queue):
            self.replicas.push(now, DISPATCH, None)
            return
        self.dispatcher.dispatch(now)

    def _drained(self) -> bool:
        """Nothing is scheduled and nothing arrives: finish the decode replicas and the queue, or find the
        run stuck. True when the run is over."""
        reps, queue = self.replicas, self.dispatcher.queue
        if not len(queue):
            self.migrations.advance_all(math.inf)
            if self._finished():
                return True
            stuck = [r for r in range(len(reps)) if reps.has_work(r)]
            waiting = [g.request for g in self.gangs.gangs if g.phase != "done"]
            raise SchedulerStuckError(f"cluster: replicas {stuck[:5]} and gangs of requests {waiting[:5]} hold "
                                      f"unfinished work but nothing is scheduled and nothing arrives")
        now = max(reps.clock_s(r) for r in reps.built)
        before = len(queue)
        self.dispatcher.dispatch(now)
        if len(queue) == before and not reps.heap:
            raise SchedulerStuckError(f"cluster policy {self.policy!r} holds {len(queue)} requests "
                                      f"and no replica can take them")
        return False

    def _finished(self) -> bool:
        reps = self.replicas
        return not any(reps.has_work(r) for r in reps.built) and self.gangs.all_done and not reps.heap


def simulate_cluster(workload: "Workload | str", cluster: "Cluster | str", policy: str = "fifo",
                     scheduler: Any = None, limits: "Limits | str | None" = None, cost: Any = None,
                     progress: Callable[[int, int], None] | None = None, fast_forward: bool = True,
                     **options: Any) -> ClusterResult:
    """Simulate ``workload`` on ``cluster`` (a :class:`Cluster` or its spec string) under ``policy``.

    ``options``: ``sp_replicas``, ``decode_replicas``, ``colocate_tokens``, ``kvp_group_tokens``
    (:mod:`~infermax.cluster.plans`), ``reserved_replicas``, ``max_num_seqs``, ``ring_attention``
    (:class:`ClusterEngine`)."""
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    return ClusterEngine(workload, Cluster.from_spec(cluster), policy, scheduler, limits, cost,
                         fast_forward, **options).run(progress)
