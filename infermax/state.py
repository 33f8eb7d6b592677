"""Serving state and the one state transition every schedule obeys.

``ServingState.apply`` moves the state across one batch and checks every rule of
docs/design.md on the way (the judge's rules): it is the only place where request
progress changes. The simulator calls it after each scheduler decision; `replay`
calls it for each batch of a schedule it is handed. Schedulers only read the
state.

Per request i: ``m`` KV tokens cached, ``inp`` current input size, ``gen`` tokens
generated. Prefill/refill while m < inp (chunk c <= inp - m; when m reaches inp a
token is generated); decode when m >= inp (exactly one token, m += 1, one token
generated); eviction sets m = 0 and, in decode phase, inp = m + 1; at gen == O the
request completes and frees its KV.

KV capacity: Σ m <= M (rule ``M``); with ``Limits.block_size`` > 1 a request also
takes whole blocks, Σ ceil(m / block_size) <= M // block_size (rule ``M-blocks``).

Beside it: the request statuses (`status`), what the cluster engine uses to bring requests to a replica
and take them away (`replica_inbox`, inherited), and the read-only view a scheduler may be handed
(`state_view`).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from .costmodel import CostModel
from .replica_inbox import ReplicaInbox
from .status import DONE, FUTURE, RUNNING, WAITING, Status
from .types import Limits, Workload

# the reductions behind ndarray.sum/min/max, called directly: the methods' per-call overhead shows on the
# small arrays of the hot paths (the same reduction, so the same results)
_sum, _min, _max = np.add.reduce, np.minimum.reduce, np.maximum.reduce
try:        # np.count_nonzero without its Python-level wrapper (the same count, a quarter of the call's cost)
    from numpy._core._multiarray_umath import count_nonzero as _count_nonzero
except ImportError:     # pragma: no cover - another NumPy layout
    _count_nonzero = np.count_nonzero
# the is_decode of a batch of one request, read-only (ServingState._apply_one)
_ONE_DECODE, _ONE_PREFILL = np.ones(1, dtype=bool), np.zeros(1, dtype=bool)
_DONE_BYTE = bytes([DONE])      # a DONE status among the statuses' bytes (ServingState._not_done)
_ONE_DECODE.setflags(write=False)
_ONE_PREFILL.setflags(write=False)


class ScheduleError(ValueError):
    """A schedule broke a rule; names the batch, the request and the rule."""

    def __init__(self, batch: int, rule: str, message: str, request_id: int | None = None) -> None:
        self.batch, self.rule, self.request_id = batch, rule, request_id
        who = f", request {request_id}" if request_id is not None else ""
        super().__init__(f"batch {batch}{who}: [{rule}] {message}")


class BatchRecord(NamedTuple):
    """What one batch did, as :meth:`ServingState.apply` returns it (the trace's batch columns after
    start and duration, :data:`infermax.trace.BATCH_FIELDS`)."""

    num_requests: int
    num_tokens: int
    num_prefill_tokens: int
    num_decode: int
    kv_tokens: int
    num_running: int
    num_evicted: int


class DecodeSegment(NamedTuple):
    """``num_batches`` identical decode batches of requests ``idx`` (one token each), as
    :meth:`ServingState.apply_decode_run` applied them: per batch its start and duration (s)
    and the KV tokens held during it; ``num_running`` requests held KV during each."""

    idx: np.ndarray
    num_batches: int
    starts_s: list[float]
    durations_s: list[float]
    kv_tokens: range
    num_running: int


class HybridSegment(NamedTuple):
    """``num_batches`` identical hybrid batches, as :meth:`ServingState.apply_hybrid_run` applied them: the
    decodes ``idx[:-1]`` (a token each) and the (re)fill ``idx[-1]`` (``tokens[-1]`` tokens a batch); per
    batch its start and duration (s) and the KV tokens held during it; ``num_running`` requests held KV."""

    idx: np.ndarray
    tokens: np.ndarray
    num_batches: int
    starts_s: list[float]
    durations_s: list[float]
    kv_tokens: range
    num_running: int


class ServingState(ReplicaInbox):
    """KV and progress state of every request of a workload, plus the clock.

    Arrays are indexed by request index (position in the workload). ``status``
    is FUTURE (not arrived), WAITING (arrived, holds no KV), RUNNING (holds KV)
    or DONE. :attr:`active` lists the WAITING and RUNNING requests: per-batch work
    (the schedulers' scans, the checks here) is proportional to it, not to the
    workload, so a trace of millions of requests costs per batch what its
    concurrently active requests cost.
    """

    def __init__(self, workload: Workload, limits: Limits, cost: CostModel, dispatched: bool = False) -> None:
        if not dispatched:
            workload.check_fits(limits)
        self.workload, self.limits, self.cost = workload, limits, cost
        # the cost model's batch time from the sums apply has (a batch of decodes and at most one (re)fill),
        # when it has one: the same floats as ``cost.batch_time``
        timer = getattr(cost, "sums_timer", None)
        self._timer = timer() if timer is not None else None
        timer = getattr(cost, "decode_run_timer", None)     # (and a decode run's, from the run's Σ m)
        self._run_timer = timer() if timer is not None else None
        n = len(workload)
        self.input_lens = workload.input_lens
        self.output_lens = workload.output_lens
        self.arrivals_s = workload.arrivals_s
        self.peak_kv = workload.input_lens + workload.output_lens - 1   # I + O - 1, KV before the last token
        # the same in blocks (what M counts when block_size > 1); the same array when block_size == 1
        self.peak_kv_blocks = limits.kv_blocks(self.peak_kv) if limits.block_size > 1 else self.peak_kv
        self.m = np.zeros(n, dtype=np.int64)
        self.inp = workload.input_lens.copy()
        self.gen = np.zeros(n, dtype=np.int64)
        self.status = np.full(n, FUTURE, dtype=np.int8)
        self.clock_s = 0.0
        self.kv_used = 0            # Σ m over requests holding KV
        self.blocks_used = 0        # Σ ceil(m / block_size) (kept only when block_size > 1)
        self._block = limits.block_size
        # block_size - 1 and its log2 when it is a power of two > 1 (blocks counted by masks and shifts), else 0
        self._mask = self._block - 1 if self._block > 1 and not self._block & (self._block - 1) else 0
        self._shift = self._block.bit_length() - 1
        self._num_blocks = limits.num_blocks
        self.num_running = 0        # requests holding KV
        self.num_done = 0
        self.num_batches = 0
        self.version = 0            # bumped whenever a status changes
        self._slot = np.zeros(n, dtype=np.int64)      # scratch for the duplicate check
        self._arange = np.arange(n, dtype=np.int64)
        self._offline = workload.is_offline
        # requests become WAITING at their admission time: the arrival, or (dispatched=True, one replica of
        # a cluster) the time the cluster engine dispatches them here; _arrival_order[:_num_queued] is
        # sorted by it and _next_arrival points at the first not yet admitted
        self._dispatched = dispatched
        if dispatched:
            self._admit_s = np.full(n, np.inf)
            self._arrival_order = np.zeros(n, dtype=np.int64)
            self._num_queued = 0
            self._offline = False
        else:
            self._admit_s = workload.arrivals_s
            self._arrival_order = np.argsort(workload.arrivals_s, kind="stable")
            self._num_queued = n
        self._next_arrival = 0
        # the admission time of the request at _next_arrival (inf: none queued), as a Python float; good while
        # _num_queued is _head_key (a dispatch queues a request; only admit_arrivals moves _next_arrival)
        self._head_s, self._head_key = math.inf, -1
        self.horizon_s: float | None = None   # dispatched: the next time the engine may dispatch here
        self._active = np.zeros(0, dtype=np.int64)   # arrived, unfinished, as of _active_version
        self._active_upto = 0                        # arrivals (in arrival order) already in _active
        self._active_version = 0
        self._active_done = 0                        # num_done as of _active
        self._active_lo = 0     # _active is _arrival_order[_active_lo:_active_upto] (-1: not a slice of it)
        # per-request records
        self.first_scheduled_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.completion_s = np.full(n, np.nan)
        self.num_evictions = np.zeros(n, dtype=np.int64)
        self.refill_tokens = np.zeros(n, dtype=np.int64)   # KV discarded by evictions, recomputed later
        self.num_suspensions = np.zeros(n, dtype=np.int64)  # a started (re)fill paused for >= 1 batch
        self._last_batch = np.full(n, -2, dtype=np.int64)   # a (re)filling request's last batch (suspensions)
        # the cluster layer (infermax.cluster): KV this replica holds for work it does not schedule itself
        # (a gang's share of a long request, a suspended prefill's saved state) counts against M; requests
        # may arrive holding KV (``receive``: a migrated decode) or leave after their first token
        # (``hand_off``: disaggregated prefill), listed in ``handoffs`` for the engine to migrate
        self.external_kv = 0
        self.handoffs: list[int] = []
        self._stop: np.ndarray | None = None         # per request: the gen at which it leaves this replica
        self._received: dict[int, tuple[int, int]] = {}
        self.serves: np.ndarray | None = None        # mask of the requests that may reach this replica (None: all)
        # the work left of the requests queued here and not finished (the cluster's local queue length):
        # Σ max(inp - m, 0) and Σ (O - gen), kept by every transition instead of summed when asked
        self.prefill_tokens_left = int(workload.input_lens.sum()) if not dispatched else 0
        self.decode_tokens_left = int(workload.output_lens.sum()) if not dispatched else 0
        self.admit_arrivals()

    # --- queries --------------------------------------------------------------
    @property
    def num_requests(self) -> int:
        return int(self.m.size)

    @property
    def is_finished(self) -> bool:
        return self.num_done == self.m.size

    @property
    def next_arrival_s(self) -> float | None:
        """Arrival time of the next request not yet arrived (None if all arrived)."""
        if self._head_key != self._num_queued:
            self._note_head()
        own = self._head_s if self._next_arrival < self._num_queued else None
        if self.horizon_s is None:
            return own
        return self.horizon_s if own is None else min(own, self.horizon_s)

    @property
    def num_pending(self) -> int:
        """Requests dispatched (or arriving) but not yet admitted."""
        return self._num_queued - self._next_arrival

    @property
    def num_waiting(self) -> int:
        """Admitted, unfinished requests that hold no KV (the WAITING part of :attr:`active`)."""
        return self._next_arrival - self.num_done - self.num_running

    @property
    def hands_off(self) -> bool:
        """Some request leaves this replica after its first token (:meth:`hand_off`)."""
        return self._stop is not None

    @property
    def arrival_order(self) -> np.ndarray:
        """Request indices by arrival (admission) time, ties by index (first come, first served)."""
        return self._arrival_order[:self._num_queued]

    @property
    def active(self) -> np.ndarray:
        """Indices of the arrived, unfinished requests (WAITING or RUNNING), by arrival then index.

        Rebuilt only when a status changed (``version``), from the previous active set and
        the new arrivals: O(active + arrived), never O(workload). Read-only; do not modify.
        """
        if self._active_version != self.version:
            same_done = self._active_done == self.num_done
            if same_done and self._active_upto == self._next_arrival:
                self._active_version = self.version     # only WAITING <-> RUNNING changes: the same set
                return self._active
            kept, lo = self._active, self._active_lo
            if not same_done:   # some finished: only then can a listed or a newly admitted request be DONE
                self._active_done = self.num_done
                kept, lo = self._not_done(kept, lo)
            upto = self._active_upto
            if upto < self._next_arrival:
                new = self._arrival_order[upto:self._next_arrival]
                if not same_done:
                    new, new_lo = self._not_done(new, upto)
                    lo = lo if new_lo == upto else -1
                if lo >= 0:     # the arrival order from lo on: a slice of it, nothing copied
                    kept = self._arrival_order[lo:self._next_arrival]
                else:
                    kept = np.concatenate((kept, new)) if kept.size else new.copy()
                self._active_upto = self._next_arrival
            self._active_lo = lo
            kept.setflags(write=False)
            self._active, self._active_version = kept, self.version
        return self._active

    def _not_done(self, idx: np.ndarray, lo: int) -> tuple[np.ndarray, int]:
        """``idx`` (``_arrival_order[lo:]`` up to its size, or lo = -1) without its DONE requests, and where
        the rest starts in the arrival order (-1: not a slice of it): a slice when they lead (the oldest
        finish first, usually), else a mask (the statuses' bytes counted and searched, without a NumPy call)."""
        st = self.status[idx]
        codes = st.tobytes()
        num_done = codes.count(DONE)
        if codes.startswith(_DONE_BYTE * num_done):
            return idx[num_done:], lo + num_done if lo >= 0 else -1
        return idx[st != DONE], -1

    def admit_arrivals(self) -> None:
        """Mark requests with arrival <= clock as WAITING."""
        if self._head_key == self._num_queued and self._head_s > self.clock_s:
            return      # (the next one is not due: known without indexing the arrays)
        order, k, n = self._arrival_order, self._next_arrival, self._num_queued
        while k < n and self._admit_s[order[k]] <= self.clock_s:
            self.status[order[k]] = WAITING
            if self._received:
                self._take_kv(int(order[k]))
            k += 1
        if k != self._next_arrival:
            self._next_arrival = k
            self.version += 1
        self._note_head()

    def _note_head(self) -> None:
        """Remember when the request at ``_next_arrival`` is admitted, and for which queue."""
        k, n = self._next_arrival, self._num_queued
        self._head_s, self._head_key = float(self._admit_s[self._arrival_order[k]]) if k < n else math.inf, n

    def advance_clock(self, time_s: float) -> None:
        """Idle until ``time_s`` (never backwards), then admit arrivals."""
        self.clock_s = max(self.clock_s, time_s)
        self.admit_arrivals()

    def _external_blocks(self) -> int:
        """Blocks of the KV held for work scheduled elsewhere (rounded on its own, as ``apply`` counts it)."""
        return int(self.limits.kv_blocks(self.external_kv)) if self.external_kv and self._block > 1 else 0

    # --- the transition -------------------------------------------------------
    def apply(self, idx: np.ndarray, tokens: np.ndarray, evict: np.ndarray,
              not_before_s: float = 0.0, extra: "tuple[np.ndarray, np.ndarray, np.ndarray] | None" = None
              ) -> tuple[float, float, BatchRecord]:
        """Run one batch: evict ``evict``, then process ``tokens[k]`` for request ``idx[k]``.

        ``extra`` = (tokens, cached, is_decode) of work riding in the same batch that this state
        does not track (a colocated long decode's share, infermax.cluster): it is timed with the
        batch and nothing else.

        Returns (start_s, duration_s, :class:`BatchRecord`). Raises ScheduleError on any rule violation.
        """
        j = self.num_batches
        n = int(idx.size)
        start = max(self.clock_s, not_before_s)
        st = self.status[idx] if n else None
        # a batch waits for its requests' admission; only a request not yet admitted (FUTURE) can be admitted
        # after the clock (a status other than FUTURE is set at an admission at or before the clock)
        if n and not self._offline and FUTURE in st.tobytes():
            start = max(start, float(_max(self._admit_s[idx])))
        if start > self.clock_s:
            self.advance_clock(start)
            st = self.status[idx] if n else None     # (arrivals admitted)
        # 1. evictions
        num_ev = int(evict.size)
        if num_ev:
            self._evict(j, evict)
            st = self.status[idx] if n else None
        if n == 0:
            raise ScheduleError(j, "empty", "a batch must process at least one token")
        if n == 1 and extra is None:
            return self._apply_one(j, idx, tokens, int(st[0]), start, num_ev)
        # 2. who may run, and how many tokens
        num_new = self._check_requests(j, idx, tokens, st)
        m0 = self.m[idx]
        inp0 = self.inp[idx]
        is_decode = m0 >= inp0
        m1 = m0 + tokens
        flags = is_decode.tobytes()      # (a byte each: counted and searched without a NumPy call)
        num_decode = flags.count(1)
        one = flags.index(0) if num_decode == n - 1 else -1    # the one (re)fill among decodes
        if one >= -(num_decode == n) and tokens.dtype.kind == "i" and (tokens == 1).tobytes() == flags:
            num_tokens = num_decode + (int(tokens[one]) if one >= 0 else 0)    # (a 1 for each decode alone)
        else:
            num_tokens = int(_sum(tokens))
        self._check_chunks(j, idx, tokens, m0, inp0, m1, is_decode, num_tokens, num_decode, one)
        # 3. per-batch limits
        num_prefill_tokens = num_tokens - num_decode
        kv, running = self.kv_used + num_tokens, self.num_running + num_new
        new_blocks = None
        if self._mask and one >= -(num_decode == n) and tokens.dtype.kind == "i":   # (decodes: 1 token each, checked)
            new_blocks = self._new_blocks(m0, num_decode == n, one, int(tokens[one]) if one >= 0 else 0)
        blocks = self._check_limits(j, num_tokens, num_prefill_tokens, kv, running, m0, tokens, new_blocks)
        # 4. time
        if extra is None:
            if self._timer is not None and one >= -(num_decode == n) and tokens.dtype.kind == "i":
                # Σ (m + c), less the (re)fill's below; Σ m is kv_used when every running request is in the batch
                # (the others in it wait, holding no KV)
                kv_read = num_tokens + (self.kv_used if n - num_new == self.num_running else int(_sum(m0)))
                c, m = (int(tokens[one]), int(m0[one])) if one >= 0 else (0, 0)
                duration = self._timer(n, num_tokens, num_decode, kv_read - c - m, c, m)
            else:
                duration = self.cost.batch_time(tokens, m0, is_decode)
        else:
            duration = self.cost.batch_time(np.concatenate((tokens, extra[0])), np.concatenate((m0, extra[1])),
                                            np.concatenate((is_decode, extra[2])))
        end = start + duration
        # 5. commit progress
        if num_new == 1:    # (mostly: its index alone, found in the statuses' bytes, in Python ints, as _apply_one)
            self._start_running(int(idx[st.tobytes().index(WAITING)]), start)
        elif num_new:
            new_idx = idx[st == WAITING]
            self.status[new_idx] = RUNNING
            # the first time: NaN until now (fmin ignores NaN; an earlier time is never later than start)
            self.first_scheduled_s[new_idx] = np.fmin(self.first_scheduled_s[new_idx], start)
            self.version += 1
        self.m[idx] = m1
        self.kv_used, self.blocks_used, self.num_running = kv, blocks, running
        self.prefill_tokens_left -= num_prefill_tokens
        self._generate(j, idx, m0, inp0, m1, is_decode, num_decode, one, end)
        self._last_batch[idx] = j
        self.clock_s = end
        self.num_batches = j + 1
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return start, duration, BatchRecord(n, num_tokens, num_prefill_tokens, num_decode, kv, running, num_ev)

    def _apply_one(self, j: int, idx: np.ndarray, tokens: np.ndarray, status: int, start: float,
                   num_ev: int) -> tuple[float, float, BatchRecord]:
        """``apply``, steps 2-5, for a batch of one request ``idx[0]`` (status ``status``) starting at
        ``start``: most batches of a prefill-first scheduler admit one new request. The same checks in
        the same order, the same errors and the same commits as for any batch, on Python ints rather
        than one-element arrays (each NumPy call costs more than the arithmetic it does here)."""
        i, c = int(idx[0]), int(tokens[0])
        ids = self.workload.ids
        if status != WAITING and status != RUNNING:
            done = status == DONE
            raise ScheduleError(j, "finished" if done else "arrival",
                                "request is finished" if done else "request has not arrived", int(ids[i]))
        if c < 1:
            raise ScheduleError(j, "tokens", f"c = {c} < 1", int(ids[i]))
        m0, inp0 = int(self.m[i]), int(self.inp[i])
        decode = m0 >= inp0
        m1 = m0 + c
        if m1 > max(inp0, m0 + 1):
            if decode:
                raise ScheduleError(j, "decode-chunk", f"decode phase processes exactly 1 token, got c = {c}",
                                    int(ids[i]))
            raise ScheduleError(j, "prefill-chunk", f"chunk c = {c} exceeds the {inp0 - m0} input tokens left",
                                int(ids[i]))
        new = status == WAITING
        num_prefill_tokens = 0 if decode else c
        kv, running = self.kv_used + c, self.num_running + new
        m0_arr = self.m[idx]
        new_blocks = ((m1 + self._mask) >> self._shift) - ((m0 + self._mask) >> self._shift) if self._mask else None
        blocks = self._check_limits(j, c, num_prefill_tokens, kv, running, m0_arr, tokens, new_blocks)
        if self._timer is not None and tokens.dtype.kind == "i":
            duration = self._timer(1, c, int(decode), m1, c, m0) if decode else self._timer(1, c, 0, 0, c, m0)
        else:
            duration = self.cost.batch_time(tokens, m0_arr, _ONE_DECODE if decode else _ONE_PREFILL)
        end = start + duration
        if new:
            self._start_running(i, start)
        self.m[i] = m1
        self.kv_used, self.blocks_used, self.num_running = kv, blocks, running
        self.prefill_tokens_left -= num_prefill_tokens
        if not decode and m0 and self._last_batch[i] < j - 1:   # a (re)fill resumed after a pause
            self.num_suspensions[i] += 1
        if m1 >= inp0:      # a token: a decode, or a (re)fill that reaches its input
            g = int(self.gen[i]) + 1
            self.gen[i] = g
            if g == 1 and not decode:
                self.first_token_s[i] = end
            self.decode_tokens_left -= 1
            if g == int(self.output_lens[i] if self._stop is None else self._stop[i]):
                if self._stop is not None:
                    if g < int(self.output_lens[i]):
                        self.handoffs.append(i)
                    self.decode_tokens_left -= int(self.output_lens[i]) - g     # left elsewhere
                self._complete(idx, end)
        self._last_batch[i] = j
        self.clock_s = end
        self.num_batches = j + 1
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return start, duration, BatchRecord(1, c, num_prefill_tokens, int(decode), kv, running, num_ev)

    def _start_running(self, i: int, start: float) -> None:
        """Waiting request ``i`` runs from a batch starting at ``start`` (its first time: NaN until now;
        an earlier first time is kept, as ``np.fmin`` does for several)."""
        self.status[i] = RUNNING
        if not self.first_scheduled_s[i] <= start:
            self.first_scheduled_s[i] = start
        self.version += 1

    def _evict(self, j: int, evict: np.ndarray) -> None:
        """Batch ``j``'s evictions (``apply``, step 1): drop the KV of the running requests ``evict``."""
        status, m, inp = self.status, self.m, self.inp
        num_ev = int(evict.size)
        bad = status[evict] != RUNNING
        if bad.any():
            k = int(evict[bad][0])
            raise ScheduleError(j, "evict", f"cannot evict a request that holds no KV "
                                f"(status {_STATUS[status[k]]})", int(self.workload.ids[k]))
        if num_ev > 1 and np.unique(evict).size != num_ev:
            raise ScheduleError(j, "evict", "a request is evicted twice")
        m_ev = m[evict]
        dec = m_ev >= inp[evict]
        inp[evict[dec]] = m_ev[dec] + 1
        m[evict] = 0
        status[evict] = WAITING
        self.num_evictions[evict] += 1
        self.refill_tokens[evict] += m_ev
        freed = int(_sum(m_ev))
        self.kv_used -= freed
        self.prefill_tokens_left += freed + int(np.count_nonzero(dec))   # all of it again (+1: a refill)
        if self._block > 1:
            self.blocks_used -= int(_sum(self.limits.kv_blocks(m_ev)))
        self.num_running -= num_ev
        self.version += 1

    def _check_requests(self, j: int, idx: np.ndarray, tokens: np.ndarray, st: np.ndarray) -> int:
        """Batch ``j``'s requests ``idx`` (statuses ``st``) are arrived, unfinished and distinct, and each
        processes >= 1 token (``apply``, step 2); returns how many of them are new (WAITING)."""
        n = int(idx.size)
        codes = st.tobytes()       # the statuses, a byte each: counted without a NumPy call
        num_new = codes.count(WAITING)
        if num_new + codes.count(RUNNING) != n:   # some are finished or not arrived
            k = int(idx[(st == DONE) | (st == FUTURE)][0])
            done = self.status[k] == DONE
            raise ScheduleError(j, "finished" if done else "arrival",
                                "request is finished" if done else "request has not arrived",
                                int(self.workload.ids[k]))
        if n > 1:  # duplicates: the last write of a repeated index wins, so an earlier slot reads back a later one
            slots = self._arange[:n] if n <= self._arange.size else np.arange(n)
            self._slot[idx] = slots
            back = self._slot[idx]
            if back.tobytes() != slots.tobytes():     # (compared as bytes: no NumPy call)
                k = int(idx[np.argmax(back != slots)])
                raise ScheduleError(j, "duplicate", "request appears twice in the batch", int(self.workload.ids[k]))
        if 1 in (tokens < 1).tobytes():       # (a flag byte searched: no reduction)
            k = int(np.argmin(tokens))
            raise ScheduleError(j, "tokens", f"c = {int(tokens[k])} < 1", int(self.workload.ids[idx[k]]))
        return num_new

    def _new_blocks(self, m0: np.ndarray, all_decode: bool, one: int, c: int) -> int:
        """The KV blocks a batch of decodes (one token each) and, unless ``all_decode``, one (re)fill at
        position ``one`` processing ``c`` tokens adds, for a power-of-two block size (``_mask``): a decode
        takes a new block exactly when its KV fills whole blocks (m mod b = 0), the (re)fill
        ceil((m + c) / b) - ceil(m / b). The same count as Σ kv_blocks(m0 + tokens) - kv_blocks(m0)."""
        mask = self._mask
        full = _count_nonzero((m0 & mask) == 0)
        if all_decode:
            return full
        m = int(m0[one])
        return full - (not m & mask) + ((m + c + mask) >> self._shift) - ((m + mask) >> self._shift)

    def _check_chunks(self, j: int, idx: np.ndarray, tokens: np.ndarray, m0: np.ndarray, inp0: np.ndarray,
                      m1: np.ndarray, is_decode: np.ndarray, num_tokens: int, num_decode: int, one: int) -> None:
        """Each decode of batch ``j`` processes exactly 1 token and each (re)fill at most the input tokens
        it has left (``apply``, step 2). When all decode, or all but request ``one``, the sums settle it
        without an array operation: the decodes' tokens (each >= 1) are all 1 exactly when they add up to
        their count; otherwise the first offender is found and named."""
        if num_decode == idx.size:
            if num_tokens == num_decode:
                return
        elif one >= 0:
            c = int(tokens[one])
            if num_tokens - c == num_decode and int(m0[one]) + c <= int(inp0[one]):
                return
        over = m1 > np.maximum(inp0, m0 + 1)
        if np.count_nonzero(over):
            k = int(np.argmax(over))
            ids = self.workload.ids
            if is_decode[k]:
                raise ScheduleError(j, "decode-chunk", f"decode phase processes exactly 1 token, "
                                    f"got c = {int(tokens[k])}", int(ids[idx[k]]))
            raise ScheduleError(j, "prefill-chunk", f"chunk c = {int(tokens[k])} exceeds the "
                                f"{int(inp0[k] - m0[k])} input tokens left", int(ids[idx[k]]))

    def _check_limits(self, j: int, num_tokens: int, num_prefill_tokens: int, kv: int, running: int,
                      m0: np.ndarray, tokens: np.ndarray, new_blocks: int | None = None) -> int:
        """Batch ``j`` keeps C, P, M (and M in blocks) and R_max (``apply``, step 3); returns the blocks in
        use after it (0 when block_size is 1). ``new_blocks``: the blocks the batch adds, when the caller
        has them (:meth:`_new_blocks`); else counted from ``m0`` and ``tokens``."""
        lim = self.limits
        if num_tokens > lim.C:
            raise ScheduleError(j, "C", f"{num_tokens} tokens > C = {lim.C}")
        if num_prefill_tokens > lim.P:
            raise ScheduleError(j, "P", f"{num_prefill_tokens} prefill tokens > P = {lim.P}")
        if kv + self.external_kv > lim.M:
            held = f" (+ {self.external_kv} held for work scheduled elsewhere)" if self.external_kv else ""
            raise ScheduleError(j, "M", f"KV cache would hold {kv} tokens{held} > M = {lim.M}")
        blocks = 0
        if self._block > 1:
            if new_blocks is None:
                new_blocks = int(_sum(lim.kv_blocks(m0 + tokens) - lim.kv_blocks(m0)))
            blocks = self.blocks_used + new_blocks
            if blocks + self._external_blocks() > lim.num_blocks:
                raise ScheduleError(j, "M-blocks", f"KV cache would hold {blocks + self._external_blocks()} "
                                    f"blocks of block_size = "
                                    f"{lim.block_size} tokens > M // block_size = {lim.num_blocks} "
                                    f"({kv} tokens, M = {lim.M})")
        if running > lim.max_running:
            raise ScheduleError(j, "R_max", f"{running} running requests > R_max = {lim.R_max}")
        return blocks

    def _generate(self, j: int, idx: np.ndarray, m0: np.ndarray, inp0: np.ndarray, m1: np.ndarray,
                  is_decode: np.ndarray, num_decode: int, one: int, end: float) -> None:
        """Batch ``j`` (ending at ``end``) moved requests ``idx`` (``num_decode`` of them decoding; ``one``: the
        position of the only one that does not, else -1) from ``m0`` to ``m1`` KV tokens: count the tokens
        generated, suspensions and first tokens, and free the KV of the requests it completes."""
        gen = self.gen
        if num_decode == idx.size:   # each generates a token, none its first (a decode follows one)
            g_idx = idx
            g = gen[g_idx] + 1
            gen[g_idx] = g
        elif one >= 0:   # one (re)fill among decodes (a hybrid batch): it alone in Python ints
            i = int(idx[one])
            if m0[one] and self._last_batch[i] < j - 1:     # a (re)fill that skipped a batch was suspended
                self.num_suspensions[i] += 1
            g_idx = idx if m1[one] >= inp0[one] else idx[is_decode]   # (the decodes generate, and it if it ends)
            g = gen[g_idx] + 1
            gen[g_idx] = g
            if g_idx is idx and gen[i] == 1:      # (a decode never generates its first token)
                self.first_token_s[i] = end
        else:
            pf = ~is_decode
            if np.count_nonzero(m0[pf]):   # a (re)fill that skipped at least one batch was suspended (preempted)
                r_idx = idx[pf & (m0 > 0)]
                self.num_suspensions[r_idx] += self._last_batch[r_idx] < j - 1
            g_idx = idx[m1 >= inp0]     # decodes (m1 > inp0) and (re)fills that reach their input
            g = gen[g_idx] + 1
            gen[g_idx] = g
            first = g_idx[g == 1]
            if first.size:
                self.first_token_s[first] = end
        self.decode_tokens_left -= int(g_idx.size)
        if self._stop is None:
            done = g == self.output_lens[g_idx]
            if 1 in done.tobytes():     # (mostly none completes: looked for without a NumPy call)
                self._complete(g_idx[done], end)
            return
        fin = g_idx[g == self._stop[g_idx]]
        if fin.size:
            self.handoffs.extend(fin[g[g == self._stop[g_idx]] < self.output_lens[fin]].tolist())
            self.decode_tokens_left -= int(_sum(self.output_lens[fin] - gen[fin]))   # left elsewhere
            self._complete(fin, end)


    def apply_decode_run(self, idx: np.ndarray, num_steps: int) -> list[DecodeSegment]:
        """Run up to ``num_steps`` decode batches of the requests ``idx`` (the simulator's fast path).

        Equivalent, batch for batch and bit for bit, to calling :meth:`apply` with
        ``tokens = 1`` for the requests of ``idx`` not yet finished, that many times: a
        request leaves the batches after the one that completes it. Stops early at the
        first batch that would start at or after the next arrival, and when every request
        of ``idx`` is done. Returns the batches as segments of identical ones (a new
        segment starts after each batch that completes a request).
        """
        m0 = self.m[idx]
        # (the statuses and the flags as bytes: counted and searched without a NumPy call)
        if self.status[idx].tobytes().count(RUNNING) != idx.size or 1 in (m0 < self.inp[idx]).tobytes():
            raise ScheduleError(self.num_batches, "decode-run",
                                "a decode run may hold only running decode-phase requests")
        if self._stop is not None and np.count_nonzero(self._stop[idx] < self.output_lens[idx]):
            raise ScheduleError(self.num_batches, "decode-run", "a decode run may not hold a request that "
                                "leaves this replica after its first token (hand_off)")
        run = idx
        left = self.output_lens[run] - self.gen[run]      # batches until each request completes (>= 1)
        ends = sorted(left.tolist())    # the same, in order: the next completion read off in Python ints
        nxt = self.next_arrival_s
        # Σ m of the run's requests, then kept in Python ints: kv_used when they are every running request
        kv_sum = self.kv_used if idx.size == self.num_running else int(_sum(m0))
        done, e = 0, 0                  # batches applied; ends[e], the first completion after them
        segments: list[DecodeSegment] = []
        while num_steps > 0:
            first_done = ends[e] - done
            steps = min(num_steps, first_done)            # the last of these may complete requests
            segment = self._decode_segment(idx, m0, kv_sum, steps, nxt)
            if segment is None:
                break
            segments.append(segment)
            if segment.num_batches < steps or steps < first_done:   # an arrival, or the run's end
                break
            num_steps -= steps
            done += steps
            kv_sum += idx.size * steps - self._complete(run[left == done], self.clock_s)
            idx = run[left > done]      # (in the run's order)
            if not idx.size:
                break
            while ends[e] <= done:
                e += 1
            m0 = self.m[idx]
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return segments

    def apply_hybrid_run(self, idx: np.ndarray, chunk: int, num_steps: int) -> HybridSegment | None:
        """Run up to ``num_steps`` batches of the decodes ``idx[:-1]`` (a token each) and the (re)fill ``idx[-1]``
        (``chunk`` tokens each batch) — a prefill chunk advancing alongside decodes, in closed form (the
        simulator's fast path, as :meth:`apply_decode_run` is for decodes alone).

        Equivalent, batch for batch and bit for bit, to calling :meth:`apply` with these requests and tokens
        that many times, stopping before the first batch that would start at or after the next arrival. Only
        its last batch may complete requests, and none may end the (re)fill (``ScheduleError`` "hybrid-run"
        otherwise). None,
        with nothing applied, when the batches are not timed from their sums (a cost model with its own
        ``batch_time``) or one of them would break a rule: then apply them one by one (which names it).
        """
        j, n = self.num_batches, int(idx.size) - 1
        m0, inp0 = self.m[idx], self.inp[idx]
        mx, ix = int(m0[n]), int(inp0[n])
        # (the statuses and the flags as bytes: counted and searched without a NumPy call)
        if (n < 1 or chunk < 1 or self.status[idx].tobytes().count(RUNNING) != n + 1
                or 1 in (m0[:n] < inp0[:n]).tobytes() or mx >= ix):
            raise ScheduleError(j, "hybrid-run", "a hybrid run holds running decode-phase requests and, last, one "
                                "running request in (re)fill, and processes at least one token of it")
        dec = idx[:n]
        if mx + num_steps * chunk >= ix:
            raise ScheduleError(j, "hybrid-run", f"the (re)fill of request {int(self.workload.ids[idx[n]])} "
                                f"would reach its input within the run")
        left = self.output_lens[dec] - self.gen[dec]      # batches until each decode completes (>= 1)
        first_done = int(_min(left))
        if num_steps > first_done:
            raise ScheduleError(j, "hybrid-run", "a request would complete before the last batch of a hybrid run")
        if self._stop is not None and np.count_nonzero(self._stop[idx] < self.output_lens[idx]):
            raise ScheduleError(j, "hybrid-run", "a hybrid run may not hold a request that leaves this replica "
                                "after its first token (hand_off)")
        lim, timer, width = self.limits, self._timer, n + chunk
        kv0 = self.kv_used
        if (timer is None or width > lim.C or chunk > lim.P or self.num_running > lim.max_running
                or kv0 + num_steps * width + self.external_kv > lim.M or self._repeats(idx)):
            return None
        blocks = self._hybrid_blocks(m0, mx, chunk, num_steps) if self._block > 1 else 0
        if self._block > 1 and blocks + self._external_blocks() > self._num_blocks:
            return None        # (the blocks only grow along the run: the last batch holds the most)
        nxt = self.next_arrival_s
        stop = math.inf if nxt is None else nxt
        s_dec = int(_sum(m0[:n]))
        t, starts, durations = self.clock_s, [], []
        for k in range(num_steps):
            if t >= stop:
                break
            # apply's timer arguments: n + 1 requests, n + chunk tokens, n decodes reading Σ (m + 1), the chunk
            d = timer(n + 1, width, n, n + s_dec + k * n, chunk, mx + k * chunk)
            starts.append(t)
            durations.append(d)
            t = t + d        # (apply's end = start + duration)
        k = len(durations)
        tokens = np.ones(n + 1, dtype=np.int64)
        tokens[n] = chunk
        tokens.setflags(write=False)
        if not k:
            return HybridSegment(idx, tokens, 0, starts, durations, range(0), self.num_running)
        x = int(idx[n])
        if mx and self._last_batch[x] < j - 1:     # a (re)fill resumed after a pause (apply's first batch)
            self.num_suspensions[x] += 1
        if self._block > 1:
            self.blocks_used = blocks if k == num_steps else self._hybrid_blocks(m0, mx, chunk, k)
        self.m[dec] = m0[:n] + k
        self.m[x] = mx + k * chunk
        self.gen[dec] += k
        self.decode_tokens_left -= n * k
        self.prefill_tokens_left -= chunk * k
        self._last_batch[idx] = j + k - 1
        kv = range(kv0 + width, kv0 + width * k + 1, width)     # held during each batch
        self.kv_used = kv[-1]
        running = self.num_running
        if k == first_done:     # the last batch completes decodes (apply's _generate, at its end)
            self._complete(dec[left == k], t)
        self.clock_s = t
        self.num_batches = j + k
        if self._next_arrival < self._num_queued:
            self.admit_arrivals()
        return HybridSegment(idx, tokens, k, starts, durations, kv, running)

    def _repeats(self, idx: np.ndarray) -> bool:
        """Whether a request appears twice in ``idx`` (``_check_requests``' test: the last write of a repeated
        index wins, so an earlier slot reads back a later one)."""
        n = int(idx.size)
        slots = self._arange[:n] if n <= self._arange.size else np.arange(n)
        self._slot[idx] = slots
        return self._slot[idx].tobytes() != slots.tobytes()

    def _hybrid_blocks(self, m0: np.ndarray, mx: int, chunk: int, num_steps: int) -> int:
        """Blocks in use after ``num_steps`` batches of the decodes holding ``m0[:-1]`` and a (re)fill of ``chunk``
        tokens a batch from ``mx`` (``m0[-1]``): the decodes' as :meth:`_blocks_after_decodes` counts them, the
        (re)fill's ceil((mx + steps · chunk) / b) - ceil(mx / b) more."""
        kv_blocks = self.limits.kv_blocks
        dec_blocks = self._blocks_after_decodes(m0[:-1], num_steps)[0]
        return dec_blocks + kv_blocks(mx + num_steps * chunk) - kv_blocks(mx)

    def _decode_segment(self, idx: np.ndarray, m0: np.ndarray, kv_sum: int, num_steps: int,
                        next_arrival_s: float | None) -> DecodeSegment | None:
        """Up to ``num_steps`` identical decode batches of ``idx`` (holding ``m0``, ``kv_sum`` in all) completing
        no request before the last, stopping before the first that would start at or after ``next_arrival_s``."""
        j = self.num_batches
        n = int(idx.size)
        if self._run_timer is not None:
            durations, starts = self._run_timer(n, kv_sum, num_steps, self.clock_s, next_arrival_s)
        else:
            durations, starts = self._run_starts(m0, num_steps, next_arrival_s)
        num_steps = len(durations)
        if num_steps <= 0:
            return None
        kv = range(self.kv_used + n, self.kv_used + n * num_steps + 1, n)   # held during each batch
        blocks, bad_step = self._blocks_after_decodes(m0, num_steps) if self._block > 1 else (0, None)
        if kv[-1] + self.external_kv > self.limits.M:
            s = max(0, (self.limits.M - self.external_kv - self.kv_used) // n)     # the first batch over M
            if bad_step is None or s <= bad_step:    # the step that breaks a rule first, as apply would
                held = f" (+ {self.external_kv} held for work scheduled elsewhere)" if self.external_kv else ""
                raise ScheduleError(j + s, "M", f"KV cache would hold {kv[s]} tokens{held} > M = {self.limits.M}")
        if bad_step is not None:
            lim = self.limits
            held = int(self.blocks_used + (lim.kv_blocks(m0 + bad_step + 1) - lim.kv_blocks(m0)).sum()
                       + self._external_blocks())
            raise ScheduleError(j + bad_step, "M-blocks", f"KV cache would hold {held} blocks of block_size = "
                                f"{lim.block_size} tokens > M // block_size = {lim.num_blocks} (M = {lim.M})")
        if n > self.limits.C:
            raise ScheduleError(j, "C", f"{n} tokens > C = {self.limits.C}")
        if self._block > 1:
            self.blocks_used = blocks
        self.m[idx] = m0 + num_steps
        self.gen[idx] += num_steps
        self.decode_tokens_left -= n * num_steps
        # (``_last_batch`` is not kept here: it is read only for a (re)fill, and a decoding request starts
        # one only after an eviction, from m = 0, its first batch setting it before any read)
        self.kv_used = kv[-1]
        self.clock_s = starts.pop()      # (the end of the last batch; the rest are their starts)
        self.num_batches = j + num_steps
        return DecodeSegment(idx, num_steps, starts, durations, kv, self.num_running)

    def _run_starts(self, m0: np.ndarray, num_steps: int, next_arrival_s: float | None
                    ) -> tuple[list[float], list[float]]:
        """The durations of up to ``num_steps`` decode batches of requests holding ``m0`` from the clock on,
        stopping before the first that would start at or after ``next_arrival_s``, and their starts followed
        by the end of the last: the cost model's ``decode_run_starts`` (:class:`CostModel`'s, for a cost
        object that only has ``decode_run_times``)."""
        starts_of = getattr(self.cost, "decode_run_starts", None)
        if starts_of is None:
            return CostModel.decode_run_starts(self.cost, m0, num_steps, self.clock_s, next_arrival_s)
        return starts_of(m0, num_steps, self.clock_s, next_arrival_s)

    def _complete(self, fin: np.ndarray, end_s: float) -> int:
        """Requests ``fin`` (running) got their last token in the batch ending at ``end_s``: free their KV
        (returned, in tokens)."""
        m = self.m
        self.completion_s[fin] = end_s
        held = m[fin].tolist()
        freed = sum(held)     # (a few: Python ints cost less than a reduction)
        self.kv_used -= freed
        if self._mask:        # (their blocks, ceil(m / b), by shifts)
            mask, shift = self._mask, self._shift
            self.blocks_used -= sum([(x + mask) >> shift for x in held])
        elif self._block > 1:
            self.blocks_used -= int(self.limits.kv_blocks(m[fin]).sum())
        m[fin] = 0
        self.status[fin] = DONE
        self.num_running -= int(fin.size)
        self.num_done += int(fin.size)
        self.version += 1
        return freed

    def _blocks_after_decodes(self, m0: np.ndarray, num_steps: int) -> tuple[int, int | None]:
        """(blocks in use after ``num_steps`` decodes of requests holding ``m0``, the first step, from 0,
        whose blocks, with those of the external KV, exceed M // block_size, or None): the count only grows
        with the steps."""
        room = self._num_blocks - (self._external_blocks() if self.external_kv else 0)
        if self._mask:
            # a request with r = (-m) mod b free slots in its last block takes q new blocks in s = q b + t steps
            # (0 <= t < b), and one more if r < t: Σ kv_blocks(m0 + s) - Σ kv_blocks(m0) without the two sums
            q, t = divmod(num_steps, self._block)
            last = self.blocks_used + m0.size * q
            if t:
                last += int(_count_nonzero((-m0 & self._mask) < t))
            if last <= room:
                return last, None
        lim = self.limits
        base = self.blocks_used - int(lim.kv_blocks(m0).sum())

        def blocks(s: int) -> int:
            return base + int(lim.kv_blocks(m0 + s).sum())
        last = blocks(num_steps)
        if last <= room:
            return last, None
        lo, hi = 0, num_steps            # blocks(lo) fits, blocks(hi) does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if blocks(mid) <= room else (lo, mid)
        return last, hi - 1


_STATUS = {FUTURE: "not arrived", WAITING: "waiting", RUNNING: "running", DONE: "finished"}


__all__ = ["BatchRecord", "DONE", "DecodeSegment", "FUTURE", "HybridSegment", "RUNNING", "ScheduleError",
           "ServingState", "Status", "WAITING"]
