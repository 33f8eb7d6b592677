"""Medha as its authors implemented it: Vidur 0.0.26's ``mnemosyne_fcfs``, ``mnemosyne_edf`` and
``mnemosyne_lrs`` replica schedulers (Medha's earlier name was Mnemosyne), one KV-parallel group.

Learned from the released wheel (``vidur/scheduler/replica_scheduler/mnemosyne_*``); what it does:

- **Queues.** New (and evicted) requests wait in one queue, requests whose prefill has started in a
  second (*partial*) queue, decoding requests in a third list. Each batch takes every decode (the
  list's order), then the partial queue, then the new queue — each sorted first: by (arrival, id)
  (``fcfs``), by (deadline, id) (``edf``) or by least remaining slack fraction, ``(deadline - now -
  remaining prefill time) / (deadline - arrival)`` (``lrs``). Slack orders requests *inside* a queue
  only: a short prompt that arrives during a long prefill waits behind it.
- **Deadline.** ``arrival + max(prefill_time, min_deadline_s)``, prefill_time the predicted time of
  the whole prompt in target-sized chunks (below). The code also computes ``deadline_multiplier ·
  prefill_time`` and then overwrites it; ``deadline_multiplier=<x>`` here restores the intent,
  ``max(x · prefill_time, min_deadline_s)``; None (default) is the code as released.
- **Prefill time.** A table over prompt lengths in steps of 256 tokens: each entry is the sum of
  the predicted times of one request's chunks, each the chunk size a bisection over multiples of
  32 tokens (at most 1024 at first, 4096 ever) finds within ±10 % of the target batch time;
  a remaining prefill is ``table[ceil256(prompt)] - table[floor256(done)]``.
- **Chunks.** A prefill joins the batch with the largest chunk a bisection (the same steps,
  starting from 1024; the code means to start from twice the request's last chunk, but its
  ``hasattr`` never sees the name-mangled attribute) finds whose batch time lands within ±10 %
  of ``target_batch_s``, or the closest it tried; none once the batch's predicted time exceeds
  90 % of the target — a prediction the code updates only when a prefill of more than one token
  joins (so with decodes alone it is 0).
- **Admission.** The first chunk allocates the whole prompt's KV blocks, if ``watermark`` of the
  blocks stay free; a request is skipped (not admitted) when the allocated requests number
  ``R_max`` (Vidur's ``batch_size_cap``), when its blocks do not fit, or when its chunk is 0 —
  after 10 skips the queue is left. An allocated request keeps its blocks while it waits.
- **Eviction.** A decode takes a new block when its KV fills its last one; when every block is
  allocated, it evicts the last decode of the list (recomputation: the victim rejoins the new
  queue with its deadline) until one is free, or itself if none is left.

Where this departs from the code: the batch's request order is the order requests joined it
(decodes, partial, new) where Vidur's ``KVParallelBatch`` keeps them in a ``set`` (the decode
list's order after a batch is then that of object addresses: it only decides which decode an
eviction picks); a decode whose KV needs no new block may run in a full cache when it is the only
request holding blocks (Vidur evicts it and refills it forever: never seen on a realistic cache);
C and P cap the batch (Vidur has no token budget; give a large C to compare). Every schedule is
judged by ``replay`` like any other; batch times come from the cost model it is given — with
Vidur's own predictor (``benchmarks/vidur_harness.py``) the batches are Vidur's.
"""
from __future__ import annotations

import numpy as np

from infermax.state import DONE, WAITING, ServingState

from .base import Plan, Scheduler
from .registry import register_scheduler

SLACK = 0.1                   # a chunk's batch time within ±10 % of the target is taken at once
START_CHUNK, GRANULE, MAX_CHUNK = 512, 32, 4096
TABLE_STEP = 256              # the prefill-time table's step in prompt tokens
MAX_SKIPS = 10


def _down(v: int, k: int) -> int:
    return (v // k) * k


def _up(v: int, k: int) -> int:
    return -(-v // k) * k


def best_chunk(time_of, remaining: int, target_s: float) -> tuple[int, float | None]:
    """The bisection both the prefill-time table and the batch builder use: the chunk (<= remaining)
    whose ``time_of(chunk)`` lands within ±10 % of ``target_s``, else the closest one tried."""
    high, low = min(2 * START_CHUNK, remaining, MAX_CHUNK), 0
    best, best_t, seen = 0, None, set()
    lo_t, hi_t = target_s * (1 - SLACK), target_s * (1 + SLACK)
    while low <= high:
        mid = (low + high) // 2
        if mid < remaining:
            mid = _down(mid, GRANULE) or min(remaining, GRANULE)
        else:
            mid = remaining
        mid = min(mid, MAX_CHUNK)
        if mid in seen or mid == 0:
            break
        seen.add(mid)
        t = time_of(mid)
        if lo_t <= t <= hi_t:
            return mid, t
        if t < lo_t:
            low = mid
        else:
            high = mid
        if best_t is None or abs(t - target_s) < abs(best_t - target_s):
            best, best_t = mid, t
    return best, best_t


class PrefillTimes:
    """Vidur's table of predicted whole-prefill times, filled on demand (one entry per 256 tokens)."""

    def __init__(self, cost, target_s: float) -> None:
        self.cost, self.target_s, self._table = cost, target_s, {0: 0.0}

    def total(self, n: int) -> float:
        if n not in self._table:
            total, done = 0, 0
            while done < n:
                def time_of(c, kv=done):
                    return self.cost.batch_time(np.array([c]), np.array([kv]), np.array([False]))
                chunk, t = best_chunk(time_of, n - done, self.target_s)
                if chunk == 0:
                    break
                total += t
                done += chunk
            self._table[n] = total
        return self._table[n]

    def remaining(self, prompt: int, done: int) -> float:
        return self.total(_up(prompt, TABLE_STEP)) - self.total(_down(done, TABLE_STEP))


class _Draft:
    """The batch under construction: requests, tokens, KV before, phases; and its predicted time, which
    (as Vidur's tracker does) is updated only when a prefill of more than one token joins."""

    def __init__(self, state: ServingState, cap: int) -> None:
        self.state, self.cap = state, cap
        self.idx: list[int] = []
        self.tok: list[int] = []
        self.kv: list[int] = []
        self.dec: list[bool] = []
        self.predicted_s = 0.0
        self.C, self.P = state.limits.C, state.limits.P

    def can_add(self) -> bool:
        return len(self.idx) < self.cap and self.C > 0

    def time_with(self, m: int, chunk: int) -> float:
        """Predicted time with one more prefill of ``chunk`` tokens over ``m`` cached."""
        return self.state.cost.batch_time(np.array(self.tok + [chunk]), np.array(self.kv + [m]),
                                          np.array(self.dec + [False]))

    def add(self, x: int, tokens: int, decode: bool, m: int) -> None:
        self.idx.append(x)
        self.tok.append(tokens)
        self.kv.append(m)
        self.dec.append(decode)
        self.C -= tokens
        if not decode:
            self.P -= tokens
            if tokens != 1:
                st = self.state
                self.predicted_s = st.cost.batch_time(np.array(self.tok), np.array(self.kv), np.array(self.dec))


class Mnemosyne(Scheduler):
    """Vidur 0.0.26's Mnemosyne (Medha) replica scheduler, ``order`` fcfs, edf or lrs; see the module."""

    block_size = 16            # Vidur's KV blocks (applied to the Limits by simulate)

    def __init__(self, *, order: str = "lrs", target_batch_s: float = 0.05, min_deadline_s: float = 0.5,
                 deadline_multiplier: float | None = None, watermark: float = 0.01, R_max: int | None = None,
                 name: str | None = None) -> None:
        if order not in ("fcfs", "edf", "lrs"):
            raise ValueError(f"Mnemosyne.order must be fcfs, edf or lrs, got {order!r}")
        for field, v in (("target_batch_s", target_batch_s), ("min_deadline_s", min_deadline_s)):
            if not v > 0:
                raise ValueError(f"Mnemosyne.{field} must be > 0, got {v!r}")
        if deadline_multiplier is not None and not deadline_multiplier > 0:
            raise ValueError(f"Mnemosyne.deadline_multiplier must be > 0 or None, got {deadline_multiplier!r}")
        if not 0 <= watermark < 1:
            raise ValueError(f"Mnemosyne.watermark must be in [0, 1), got {watermark!r}")
        if R_max is not None and (isinstance(R_max, bool) or not isinstance(R_max, int) or R_max < 1):
            raise ValueError(f"Mnemosyne.R_max must be an integer >= 1 or None, got {R_max!r}")
        self.order, self.target_batch_s, self.min_deadline_s = order, target_batch_s, min_deadline_s
        self.deadline_multiplier, self.watermark, self.R_max = deadline_multiplier, watermark, R_max
        self.name = name or f"mnemosyne-{order}"

    def reset(self, state: ServingState) -> None:
        lim, n = state.limits, state.num_requests
        self._bs, self._blocks = lim.block_size, lim.num_blocks
        self._wm = int(self.watermark * self._blocks)
        self._cap = min(self.R_max or lim.max_running, lim.max_running)
        served = np.flatnonzero(True if state.serves is None else state.serves)
        need = -(-state.peak_kv[served] // self._bs)     # an evicted request refills up to I + O - 1 tokens
        if need.size and int(need.max()) > self._blocks - self._wm:
            i = int(served[int(np.argmax(need))])
            raise ValueError(f"scheduler {self.name!r}: request {int(state.workload.ids[i])} may need "
                             f"{int(need.max())} KV blocks at once, more than M = {lim.M} leaves beside the "
                             f"watermark of {self._wm} blocks")
        self._times = PrefillTimes(state.cost, self.target_batch_s)
        self._queue: list[int] = []          # new and evicted requests
        self._partial: list[int] = []        # started prefills
        self._decodes: list[int] = []        # decoding requests, in Vidur's list order
        self._alloc: dict[int, int] = {}     # request -> KV blocks allocated to it
        self._allocated = 0
        self._seen = np.zeros(n, dtype=bool)
        self._deadline = np.zeros(n)
        self._window = np.zeros(n)           # deadline - arrival
        self._last: list[int] = []           # the last batch's requests, in batch order
        self._last_batch = -1                # its number
        self._restarted: dict[int, tuple[int, int]] = {}   # evicted by the batch being planned: (m, inp) after
        self.num_liveness_waivers = 0

    # --- Vidur's events, replayed from the state at the next call -----------------------------------
    def _on_batch_end(self, state: ServingState) -> None:
        if self._last_batch >= 0 and state.num_batches != self._last_batch + 1:
            raise RuntimeError(f"scheduler {self.name!r} keeps Vidur's queues and needs every batch it plans "
                               f"to run (batch {self._last_batch} did not)")
        for x in self._last:
            if state.status[x] == DONE:
                self._free(x)
            elif state.m[x] < state.inp[x]:
                self._partial.append(x)
            else:
                self._decodes.append(x)
        self._last, self._last_batch = [], -1

    def _arrivals(self, state: ServingState) -> None:
        act = state.active
        new = act[~self._seen[act] & (state.status[act] == WAITING)]
        for x in new.tolist():
            self._seen[x] = True
            self._queue.append(x)
            if self.order == "fcfs":     # (Vidur's FCFS sets no deadline)
                continue
            prefill = self._times.remaining(int(state.inp[x]), 0)
            window = prefill * self.deadline_multiplier if self.deadline_multiplier is not None else prefill
            window = max(window, self.min_deadline_s)
            self._deadline[x] = state.arrivals_s[x] + window
            self._window[x] = window

    def _mi(self, state: ServingState, x: int) -> tuple[int, int]:
        """(m, inp) of request x as Vidur sees it while planning: an eviction of this batch restarts it."""
        return self._restarted.get(x) or (int(state.m[x]), int(state.inp[x]))

    def _free(self, x: int) -> None:
        self._allocated -= self._alloc.pop(x, 0)

    def _sort(self, state: ServingState, queue: list[int]) -> None:
        if self.order == "fcfs":
            queue.sort(key=lambda x: (state.arrivals_s[x], x))
        elif self.order == "edf":
            queue.sort(key=lambda x: (self._deadline[x], x))
        else:
            now = state.clock_s
            queue.sort(key=lambda x: (self._deadline[x] - now - self._left_s(state, x)) / self._window[x])

    def _left_s(self, state: ServingState, x: int) -> float:
        """Predicted time of request x's remaining prefill (Vidur's ``get_prefill_time``)."""
        m, inp = self._mi(state, x)
        return self._times.remaining(inp, m)

    # --- the batch ---------------------------------------------------------------------------------
    def next_batch(self, state: ServingState) -> Plan:
        self._on_batch_end(state)
        self._arrivals(state)
        draft, evicted = _Draft(state, self._cap), []
        self._restarted = {}
        self._add_decodes(state, draft, evicted)
        self._sort(state, self._queue)
        self._sort(state, self._partial)
        self._add_prefills(state, draft, self._partial)
        self._add_prefills(state, draft, self._queue)
        z = np.zeros(0, dtype=np.int64)
        if draft.idx:
            self._last, self._last_batch = list(draft.idx), state.num_batches
        return Plan(np.array(draft.idx, dtype=np.int64), np.array(draft.tok, dtype=np.int64),
                    np.array(evicted, dtype=np.int64) if evicted else z)

    def _can_append(self, state: ServingState, x: int) -> bool:
        if self._allocated < self._blocks:
            return True
        if len(self._alloc) == 1 and self._alloc[x] * self._bs >= int(state.m[x]) + 1:
            self.num_liveness_waivers += 1       # alone in a full cache, and no new block needed
            return True
        return False

    def _evict(self, state: ServingState, x: int, evicted: list[int]) -> None:
        m = int(state.m[x])
        self._restarted[x] = (0, m + 1 if m >= int(state.inp[x]) else int(state.inp[x]))   # (recompute)
        self._free(x)
        evicted.append(x)
        self._queue.append(x)                   # keeps its deadline

    def _add_decodes(self, state: ServingState, draft: _Draft, evicted: list[int]) -> None:
        decodes = self._decodes
        while decodes and draft.can_add():
            x = decodes.pop(0)
            while not self._can_append(state, x):
                if decodes:
                    self._evict(state, decodes.pop(), evicted)
                else:
                    self._evict(state, x, evicted)
                    break
            else:
                if self._alloc[x] * self._bs < int(state.m[x]) + 1:      # its KV fills its last block
                    self._alloc[x] += 1
                    self._allocated += 1
                draft.add(x, 1, True, int(state.m[x]))

    def _allocate(self, state: ServingState, x: int) -> bool:
        if x in self._alloc:
            return True
        need = -(-self._mi(state, x)[1] // self._bs)
        if self._blocks - self._allocated - need < self._wm:
            return False
        self._alloc[x] = need
        self._allocated += need
        return True

    def _chunk(self, state: ServingState, draft: _Draft, x: int) -> int:
        target = self.target_batch_s
        if draft.predicted_s > target * (1 - SLACK):
            return 0
        m, inp = self._mi(state, x)
        chunk = best_chunk(lambda c: draft.time_with(m, c), max(inp - m, 0), target)[0]
        return min(chunk, draft.C, draft.P)

    def _add_prefills(self, state: ServingState, draft: _Draft, queue: list[int]) -> None:
        skipped = 0
        while len(queue) > skipped and skipped < MAX_SKIPS:
            x = queue[skipped]
            if (x not in self._alloc and len(self._alloc) == self._cap) or not draft.can_add() \
                    or not self._allocate(state, x):
                skipped += 1
                continue
            chunk = self._chunk(state, draft, x)
            if chunk <= 0:
                skipped += 1
                continue
            queue.pop(skipped)
            draft.add(x, chunk, False, self._mi(state, x)[0])

    def describe(self) -> dict:
        out = {"name": self.name, "order": self.order, "target_batch_s": self.target_batch_s,
               "min_deadline_s": self.min_deadline_s, "watermark": self.watermark, "R_max": self.R_max}
        if self.deadline_multiplier is not None:
            out["deadline_multiplier"] = self.deadline_multiplier
        return out


def _factory(order: str):
    def make(target_batch_s: float = 0.05, min_deadline_s: float = 0.5, deadline_multiplier: float | None = None,
             watermark: float = 0.01, R_max: int | None = None) -> Mnemosyne:
        return Mnemosyne(order=order, target_batch_s=target_batch_s, min_deadline_s=min_deadline_s,
                         deadline_multiplier=deadline_multiplier, watermark=watermark, R_max=R_max)
    return make


for _order, _what in (("fcfs", "first come first served"), ("edf", "earliest deadline first"),
                      ("lrs", "least remaining slack first")):
    register_scheduler(f"mnemosyne-{_order}", f"Medha as its authors released it (Vidur 0.0.26 mnemosyne_{_order}): "
                       f"decodes, then started prefills, then new ones, {_what} inside each; "
                       f"target-time chunks; KV blocks of 16, evicts")(_factory(_order))
