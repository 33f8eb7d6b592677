"""Serving state: the arrays of every request's KV and progress, the clock, and the views schedulers read.

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

``ServingState`` is this module's state (its arrays, their construction, the arrivals and the active set)
and, inherited along its seams, the rest: the transition (`state_transitions`: ``apply``, a batch's
steps), the judge's rule checks (`state_rules`: ``ScheduleError`` and every check a batch meets), the
closed-form runs of the simulator's fast path (`state_runs`: ``apply_decode_run``, ``apply_hybrid_run``),
and what the cluster engine uses to bring requests to a replica and take them away (`replica_inbox`).
Beside it: the request statuses (`status`) and the read-only view a scheduler may be handed (`state_view`).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from .compiled import timer_arrays, wanted
from .costmodel import CostModel
from .replica_inbox import ReplicaInbox
from .state_rules import JudgeRules, ScheduleError, _count_nonzero  # noqa: F401  (re-exported: the schedulers use it)
from .state_runs import DecodeRuns, DecodeSegment, HybridSegment
from .state_transitions import BatchRecord, Transitions
from .status import DONE, FUTURE, RUNNING, WAITING, Status
from .types import Limits, Workload

_DONE_BYTE = bytes([DONE])      # a DONE status among the statuses' bytes (ServingState._not_done)


class ServingState(Transitions, DecodeRuns, JudgeRules, ReplicaInbox):
    """KV and progress state of every request of a workload, plus the clock.

    Arrays are indexed by request index (position in the workload). ``status``
    is FUTURE (not arrived), WAITING (arrived, holds no KV), RUNNING (holds KV)
    or DONE. :attr:`active` lists the WAITING and RUNNING requests: per-batch work
    (the schedulers' scans, the checks here) is proportional to it, not to the
    workload, so a trace of millions of requests costs per batch what its
    concurrently active requests cost.
    """

    def __init__(self, workload: Workload, limits: Limits, cost: CostModel, dispatched: bool = False,
                 compiled: bool | None = None) -> None:
        if not dispatched:
            workload.check_fits(limits)
        self.workload, self.limits, self.cost = workload, limits, cost
        # whether compiled paths may run on this state (None: each by its run's size; :mod:`infermax.compiled`)
        self.compiled = compiled
        # the cost model's batch time from the sums apply has (a batch of decodes and at most one (re)fill),
        # when it has one: the same floats as ``cost.batch_time``
        timer = getattr(cost, "work_timer", None)
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
        # the limits as plain ints, read by every batch's checks (Limits.num_blocks and max_running are properties)
        self._lim_C, self._lim_P, self._lim_M, self._max_running = limits.C, limits.P, limits.M, limits.max_running
        self.num_running = 0        # requests holding KV
        self.num_done = 0
        self.num_batches = 0
        self.version = 0            # bumped whenever a status changes
        self._slot = np.zeros(n, dtype=np.int64)      # scratch for the duplicate check
        self._arange = np.arange(n, dtype=np.int64)
        self._init_queue(workload, dispatched, n)
        self._init_records(workload, dispatched, n)
        self._kernel = _compiled_apply(self, cost, dispatched)     # (None: apply in Python)
        self.admit_arrivals()

    def _init_queue(self, workload: Workload, dispatched: bool, n: int) -> None:
        """(``__init__``) The admission queue of the ``n`` requests and the active set, empty."""
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

    def _init_records(self, workload: Workload, dispatched: bool, n: int) -> None:
        """(``__init__``) The per-request records, the cluster layer's fields and the work left."""
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


#: a run with fewer prompt + output tokens than this applies its batches in Python (numba's load costs more)
MIN_COMPILED_TOKENS = 500_000


def _compiled_apply(state: "ServingState", cost: CostModel, dispatched: bool) -> "_CompiledSteps | None":
    """The compiled steps of ``apply`` (:mod:`infermax.state_kernel`) and their buffers, where they cover this state:
    a cost model timed by the linear model's own sums, blocks of a power of two (or none), not a cluster replica's
    state, and :func:`infermax.compiled.wanted` (``state.compiled``; by size, at least :data:`MIN_COMPILED_TOKENS`
    tokens). Else None."""
    if dispatched or state._timer is None:
        return None
    if state._block > 1 and not state._mask:
        return None
    arrays = timer_arrays(cost)
    if arrays is None:
        return None
    if not wanted(state.compiled, int(state.input_lens.sum()) + int(state.output_lens.sum()), MIN_COMPILED_TOKENS):
        return None
    from . import state_kernel as K
    sc = K.make_scalars()
    lim = state.limits
    sc[[K.S_C, K.S_P, K.S_M, K.S_NUM_BLOCKS, K.S_MAX_RUN, K.S_MASK, K.S_SHIFT, K.S_WAITING, K.S_RUNNING,
        K.S_DONE_CODE]] = (lim.C, lim.P, lim.M, lim.num_blocks, lim.max_running, state._mask,
                           state._shift if state._mask else 0, WAITING, RUNNING, DONE)
    return _CompiledSteps(K.apply_batch, sc, np.zeros(2), *arrays)


class _CompiledSteps:
    """The compiled steps of ``apply`` and their buffers: scratch, rewritten by every batch (no part of the state's
    value: a copy of the state may share them)."""

    __slots__ = ("kernel", "sc", "fs", "la", "lb", "co")

    def __init__(self, kernel: Any, sc: np.ndarray, fs: np.ndarray, la: np.ndarray, lb: np.ndarray,
                 co: np.ndarray) -> None:
        self.kernel, self.sc, self.fs, self.la, self.lb, self.co = kernel, sc, fs, la, lb, co


__all__ = ["BatchRecord", "DONE", "DecodeSegment", "FUTURE", "HybridSegment", "RUNNING", "ScheduleError",
           "ServingState", "Status", "WAITING"]
