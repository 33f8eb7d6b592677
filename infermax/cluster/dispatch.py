"""The global queue and the dispatcher: which waiting request goes to which replica or gang, and when.

PecSched §6.2 "Scheduling": local queues are FIFO; a request one replica serves
goes to the eligible replica with the shortest local queue in tokens; a long request
takes an elastic gang of one node's replicas where it can. The policies
(:mod:`~infermax.cluster.policies`) differ in the order of the global queue and in
what a short request may land on; the dispatcher asks the policy's queue discipline
(:mod:`~infermax.cluster.disciplines`: walk order, tiers, what a blocked request does):

- ``fifo``: first come, first served; the head blocks the queue;
- ``reservation``: first come, first served, but long requests only on the reserved
  replicas and short ones only on the others, neither blocking the other;
- ``priority`` and the PecSched variants: short requests first (by index); a long
  request is dispatched only when every short one was;
- ``csps``: first come, first served; a long request that finds no gang lets the next
  one try;
- PecSched's placement of a short request (Fig. 6 steps 2-5): a replica no gang
  holds; else one colocated with a long decode; else one whose gang's prefill it
  preempts (or, under /CoL, whose long decode it preempts) — only if the request
  fits beside what the gang holds there (else it waits for a replica no gang holds).

Only a replica with no request waiting to start *accepts* work. A decision reads the
local queues once, at its start (:mod:`~infermax.cluster.loads`), and its CPU time is
recorded for every request it dispatched (the decision time / JCT ratio of §6.6).
"""
from __future__ import annotations

import bisect
import time
from itertools import chain
from typing import Iterator

import numpy as np

from infermax.types import Workload

from .elastic import choose_elastic
from .gang import DECODE, PREFILL, WAIT
from .gang_runner import GangRunner
from .loads import FREE, Loads
from .placement import choose_elastic_gang
from .policies import ClusterPolicy
from .replicas import Replicas
from .roles import Roles
from .routers import Router
from .spec import Cluster


class GlobalQueue:
    """The requests that arrived and wait for a replica, in the order the policy considers them.

    First come, first served (``fifo``, ``reservation``): one list in arrival order. Short first
    (``priority``, PecSched): the short requests by index, then the long ones by index.
    """

    def __init__(self, short_first: bool, is_long: np.ndarray, on_gang: np.ndarray) -> None:
        self._short_first = short_first
        self._is_long, self._on_gang = is_long, on_gang
        self._main: list[int] = []          # all of them (FCFS), or the short ones (short first)
        self._long: list[int] = []          # short first: the long ones
        self.num_local = 0                  # requests one replica serves (not on a gang)

    def __len__(self) -> int:
        return len(self._main) + len(self._long)

    def push(self, i: int) -> None:
        if not self._short_first:
            self._main.append(i)
        else:
            bisect.insort(self._long if self._is_long[i] else self._main, i)
        self.num_local += not self._on_gang[i]

    def __iter__(self) -> Iterator[int]:
        return chain(self._main, self._long)

    def remove(self, sent: list[int]) -> None:
        """Drop the dispatched requests ``sent`` (in the order they were considered)."""
        if not sent:
            return
        main, k = self._main, 0
        while k < len(sent) and k < len(main) and main[k] == sent[k]:
            k += 1                           # the usual case: a prefix of the queue went
        del main[:k]
        if k < len(sent):
            gone = set(sent[k:])
            self._main = [i for i in main if i not in gone]
            self._long = [i for i in self._long if i not in gone]
        self.num_local -= sum(not self._on_gang[i] for i in sent)


class Dispatcher:
    """Sends requests from the global queue to replicas and gangs, as the policy says."""

    def __init__(self, workload: Workload, cluster: Cluster, pol: ClusterPolicy, roles: Roles, replicas: Replicas,
                 loads: Loads, gangs: GangRunner) -> None:
        self.workload, self.cluster, self.pol, self.roles = workload, cluster, pol, roles
        self.replicas, self.loads, self.gangs = replicas, loads, gangs
        n = len(workload)
        self.discipline = disc = pol.discipline             # walk order, tiers, what a blocked request does
        self.queue = GlobalQueue(disc.short_first, roles.is_long, roles.on_gang)
        self.replica_of = np.full(n, -1, dtype=np.int64)   # a gang's request: its first member
        self.dispatch_s = np.full(n, np.nan)
        self.decision_of = np.zeros(n)                     # CPU time of the decision that dispatched each request
        self.decisions: list[float] = []
        self._tiers_short = self._tiers(roles.eligible_short)
        self._tiers_long = self._tiers(roles.eligible_long)
        self._lens = (workload.input_lens.tolist(), workload.output_lens.tolist())
        self._smallest_gang = int(roles.gang_size[roles.on_gang].min(initial=0))
        # per request, as Python lists: the queue walk reads them once per queued request and decision
        self._on_gang, self._gang_size = roles.on_gang.tolist(), roles.gang_size.tolist()
        self._is_long = roles.is_long.tolist()
        self._router = Router(pol.route, len(replicas), self._num_waiting, pol.route_seed) if pol.route else None

    def _tiers(self, eligible: np.ndarray) -> list[list[int]]:
        """Buckets of the load index to try in turn for a request these replicas may serve (Fig. 6 steps 2-5)."""
        classes = sorted({c for c in self.roles.classes[0][eligible].tolist() if c >= 0})
        steps = self.discipline.tiers(self.pol)
        return [[Loads.bucket(c, t) for c in classes for t in tiers] for tiers in steps]

    def may_take(self, r: int) -> bool:
        """Whether accepting replica r could take something from the (non-empty) queue: a short request (if no
        gang holds r, or the policy lets short requests onto gangs), or a long one (if r is free to join a gang)."""
        free = self.gangs.gang_of[r] < 0
        if free and self.roles.eligible_long[r]:
            return True
        return (free or not self.pol.exclusive) and self.queue.num_local > 0

    def dispatch(self, now: float) -> None:
        """One decision: send what the policy allows from the global queue, at ``now``."""
        queue = self.queue
        if not len(queue):
            return
        t0 = time.perf_counter() - self.replicas.build_s       # (building a replica is not deciding)
        if self.discipline.at_once and len(self.replicas) == 1 and not self.roles.on_gang.any():
            sent = list(queue)        # one replica: every request goes there on arrival
            for i in sent:
                self._send(i, 0, now)
            queue.remove(sent)
            self._decided(t0, [])
            return
        self.loads.refresh(self.replicas.local_queue)
        sent = self._choose(now)
        queue.remove(sent)
        self._decided(t0, sent)

    # complexity: one walk of the queue with one branch per reason a request is held back, in policy order
    def _choose(self, now: float) -> list[int]:
        """Walk the queue in policy order, sending what finds room; the requests sent, in order."""
        disc, loads = self.discipline, self.loads
        on_gang, gang_size, is_long = self._on_gang, self._gang_size, self._is_long
        inp, out = self._lens
        blocked = {False: False, True: False}   # per long/short: a request one replica serves found none
        smallest_refused = None                 # the smallest gang no longer found (fewer replicas stay free)
        sent: list[int] = []
        for i in self.queue:
            if on_gang[i]:
                k = gang_size[i]
                members = None
                if smallest_refused is None or k < smallest_refused:
                    members = self._gang_for(k, i)
                    if members is None:
                        smallest_refused = k
                if members is None:
                    if disc.stops_at_gang(smallest_refused, self._smallest_gang):
                        break
                    continue
                self.replica_of[i] = members[0]
                self.dispatch_s[i] = now
                self.gangs.form(i, members, inp[i], out[i], now)
                for r in members:
                    loads.take(r, inp[i] // len(members))
            else:
                long = is_long[i]
                if self._router is not None:       # Vidur's global schedulers: sent at once, accepting or not
                    r = None if blocked[long] else self._router.choose(self._routable(long))
                else:
                    r = None if blocked[long] else loads.shortest(self._tiers_long if long else self._tiers_short)
                    if r is not None and not self._fits_beside_gang(i, r):
                        r = loads.shortest(self._tiers_long[:1] if long else self._tiers_short[:1])   # (no gang's)
                if r is None:
                    blocked[long] = True
                    if disc.stops_at_replica():
                        break      # FIFO among short requests; under priority no long one overtakes them
                    continue
                self._send(i, r, now)
                loads.take(r, inp[i] + out[i])
            sent.append(i)
        return sent

    def _fits_beside_gang(self, i: int, r: int) -> bool:
        """Whether request i, sent to replica r, can finish there beside what r's gang holds (its KV share and,
        suspended, the saved activations): the gang waits for its members' short work, so a short request
        that could never be admitted beside it would wait for a gang that waits for it."""
        g = self.gangs.of(r)
        if g is None:
            return True
        lim, held = self.roles.limits, self.gangs.most_held(g)
        peak = self._lens[0][i] + self._lens[1][i] - 1
        if lim.block_size > 1:
            return int(lim.kv_blocks(peak)) + int(lim.kv_blocks(held)) <= lim.num_blocks
        return peak + held <= lim.M

    def _routable(self, long: bool) -> np.ndarray:
        """The replicas a router may send a long (or short) request to: eligible, and free of gangs under an
        exclusive policy."""
        eligible = self.roles.eligible_long if long else self.roles.eligible_short
        return eligible & (self.gangs.gang_of < 0) if self.pol.exclusive else eligible

    def _num_waiting(self, r: int) -> int:
        """Requests dispatched to replica r that wait to start there (the ``lor`` router's count)."""
        if not self.replicas.is_built(r):
            return 0
        st = self.replicas.state(r)
        return st.num_pending + st.num_waiting

    def _gang_for(self, k: int, i: int) -> tuple[int, ...] | None:
        """An elastic gang of at least k replicas that are free (and accepting, under exclusive policies) for
        request i: up to ``sp_replicas`` of one node, or up to its own most (LoongServe, across nodes)."""
        loads, roles = self.loads, self.roles
        elig = (loads.tier == FREE) & roles.eligible_long
        if self.pol.exclusive:
            elig &= loads.accepting
        if int(np.count_nonzero(elig)) < k:
            return None
        if roles.gang_max is not None:
            return choose_elastic(self.cluster, k, int(roles.gang_max[i]), loads.tokens, elig)
        k_max = k if self.pol.csps is not None else roles.sp_replicas      # CSPS: one GPU per SPT, exactly
        return choose_elastic_gang(self.cluster, k, k_max, loads.tokens, elig)

    def _send(self, i: int, r: int, now: float) -> None:
        reps = self.replicas
        self.replica_of[i] = r
        self.dispatch_s[i] = now
        g = self.gangs.of(r)
        if g is not None and g.phase == PREFILL and reps.held[r]:
            self.gangs.suspend(g, now)     # (unless its prefill ends within the kernel running now)
        if g is not None and (g.phase == WAIT or (g.phase == DECODE and not self.pol.colocate)):
            g.num_overtaken += 1           # the long request yields its replicas to this short one
        if reps.clock_s(r) < now and not reps.has_work(r) and not reps.held[r]:
            reps.wait_until(r, now)        # an idle replica wakes at the dispatch
        hand_off = self.pol.disaggregate and self.workload.output_lens[i] > 1 and not self.roles.is_long[i]
        reps.dispatch(r, int(i), now, bool(hand_off))
        reps.wake(r)

    def _decided(self, t0: float, sent: list[int]) -> None:
        dt = time.perf_counter() - self.replicas.build_s - t0
        self.decisions.append(dt)
        if sent:
            self.decision_of[sent] = dt
