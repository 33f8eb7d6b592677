"""Shared machinery of the long-context schedulers (Medha, PecSched).

Both never preempt a decode and never evict: a request is admitted only if its
peak KV (I + O - 1) still fits next to the peaks of the running requests, so the
schedules they produce are eviction-free. A batch is assembled in a
``BatchDraft``: decodes first, then prefill chunks, each checked against C, P,
R_max and, when asked, a target batch time predicted by the cost model (the
scheduler's only way to reason about time). KV is counted in whole blocks of
``Limits.block_size`` tokens (out of M // block_size).
"""
from __future__ import annotations

import os
from typing import Callable

import numpy as np

from infermax.state import RUNNING, WAITING, ServingState

from .base import Plan

_sum = np.add.reduce

LONG_THRESHOLD_TOKENS = 32_768


class BatchDraft:
    """The batch under construction and its remaining budgets."""

    #: the cost model's batch time from sums (:class:`SumsDraft`); None: priced on the draft's arrays
    _timer: "Callable[[int, int, int, int, int, int], float] | None" = None

    def __init__(self, state: ServingState, R_max: int, running: np.ndarray | None = None) -> None:
        """``running``: the running requests, when the caller has them (:func:`phases`)."""
        self._init_budgets(state, R_max, running)
        self.idx: list[int] = []
        self.tok: list[int] = []
        self.kv: list[int] = []
        self.dec: list[bool] = []
        self._probe: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None    # the draft + one slot, as arrays

    def _init_budgets(self, state: ServingState, R_max: int, running: np.ndarray | None) -> None:
        """The budgets of an empty draft: KV blocks less the running requests' peaks, running slots, C and P."""
        lim = state.limits
        self.state = state
        if running is None:
            act = state.active
            running = act[state.status[act] == RUNNING]
        self.peak = peak = state.peak_kv_blocks                 # I + O - 1, in blocks
        self.mem = lim.num_blocks - int(_sum(peak[running]))
        self.run = R_max - running.size
        self.C, self.P = lim.C, lim.P

    def _take(self, x: int, chunk: int) -> None:
        """The budgets after ``x`` joins with a prefill chunk of ``chunk`` tokens (a waiting ``x`` takes its peak)."""
        if self.state.status[x] == WAITING:
            self.mem -= int(self.peak[x])
            self.run -= 1
        self.C -= chunk
        self.P -= chunk

    def add_decodes(self, idx: np.ndarray) -> None:
        idx = idx[: self.C]
        self.idx += idx.tolist()
        self.tok += [1] * idx.size
        self.kv += self.state.m[idx].tolist()
        self.dec += [True] * idx.size
        self.C -= int(idx.size)
        self._probe = None

    def time_with(self, x: int, chunk: int) -> float:
        """Predicted batch time if request ``x`` joins with ``chunk`` prefill tokens.

        The draft's arrays are built once and kept, with one more slot for the probe, until the draft
        changes: a bisection (:meth:`largest_chunk`) probes a dozen chunks of one request, and converting
        hundreds of decodes from lists at each probe was Medha's hot path. Same arrays, same result.
        (:class:`SumsDraft`: from the draft's sums and the probe's.)"""
        st = self.state
        if self._probe is None:
            self._probe = (np.array(self.tok + [0]), np.array(self.kv + [0]), np.array(self.dec + [False]))
        tok, kv, dec = self._probe
        tok[-1], kv[-1] = chunk, int(st.m[x])
        return st.cost.batch_time(tok, kv, dec)

    def room(self, x: int) -> int:
        """Most prefill tokens ``x`` may take now (0 if it cannot be admitted)."""
        st = self.state
        if st.status[x] == WAITING and (self.peak[x] > self.mem or self.run < 1):
            return 0
        return max(0, min(int(st.inp[x] - st.m[x]), self.C, self.P))

    def largest_chunk(self, x: int, limit: int, target_s: float, min_chunk: int) -> int:
        """Largest chunk <= limit keeping the predicted batch time <= target (at least min_chunk)."""
        if limit <= 0:
            return 0
        if target_s == float("inf"):
            return limit
        guess = self.state.cost.chunk_bound(tuple(self._sums), int(self.state.m[x]), target_s) \
            if self._timer is not None else None
        lo, hi = 0, limit          # time_with grows with the chunk: bisect
        if guess is not None and 1 <= guess and int(guess) + 1 < limit:
            # The time does not decrease as the chunk grows (chunk_bound checked the slopes; each float operation
            # rounds monotonically). So the answer is the largest chunk below ``limit`` within the target (or
            # ``limit`` itself if it is within), any bracket holding it bisects to it — the chunk the bisection
            # from (0, limit) finds — and a chunk over the target puts ``limit`` over it too. The solved bound
            # brackets the answer within one token, usually: two probes then instead of a dozen.
            e = int(guess)
            if self.time_with(x, e) > target_s:
                hi = e
                if e > 1:
                    lo, hi = (e - 1, hi) if self.time_with(x, e - 1) <= target_s else (lo, e - 1)
            elif self.time_with(x, e + 1) > target_s:
                lo, hi = e, e + 1
            elif self.time_with(x, limit) <= target_s:
                return limit
            else:
                lo = e + 1
        elif self.time_with(x, limit) <= target_s:
            return limit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.time_with(x, mid) <= target_s:
                lo = mid
            else:
                hi = mid
        return min(limit, max(lo, min_chunk))

    def add_prefill(self, x: int, chunk: int) -> None:
        self._take(x, chunk)
        self.idx.append(x)
        self.tok.append(chunk)
        self.kv.append(int(self.state.m[x]))
        self.dec.append(False)
        self._probe = None

    @property
    def size(self) -> int:
        """Requests in the draft."""
        return len(self.idx)

    def plan(self) -> Plan:
        z = np.zeros(0, dtype=np.int64)
        return Plan(np.array(self.idx, dtype=np.int64), np.array(self.tok, dtype=np.int64), z)


_NO_IDX = np.zeros(0, dtype=np.int64)
_NO_IDX.setflags(write=False)


class SumsDraft(BatchDraft):
    """A :class:`BatchDraft` kept as its sums alone, for a cost model that prices a batch from them
    (:func:`work_timer`): the decodes stay the array they came as, the chunks two short lists, and nothing
    is converted per request; the plan is the one :class:`BatchDraft` builds from the same calls (the same
    requests, order and tokens), and every probe the same float. ``INFERMAX_PURE=1`` selects
    :class:`BatchDraft` (no timer), the reference that tests/test_medha_speed.py compares this with."""

    def __init__(self, state: ServingState, R_max: int, running: np.ndarray | None,
                 timer: "Callable[[int, int, int, int, int, int], float]") -> None:
        self._init_budgets(state, R_max, running)
        self._timer = timer
        # requests, tokens, decodes, the decodes' Σ (m + 1), the chunks' Σ c (2 m + c + 1) and Σ c
        self._sums = [0, 0, 0, 0, 0, 0]
        self._dec = _NO_IDX
        self._pf_idx: list[int] = []
        self._pf_tok: list[int] = []

    @property
    def size(self) -> int:
        return self._sums[0]

    def add_decodes(self, idx: np.ndarray) -> None:
        idx = idx[: self.C]
        k = int(idx.size)
        if not k:
            return
        self._dec = idx if not self._dec.size else np.concatenate((self._dec, idx))
        self.C -= k
        s = self._sums
        s[0] += k
        s[1] += k
        s[2] += k
        s[3] += int(_sum(self.state.m[idx])) + k

    def time_with(self, x: int, chunk: int) -> float:
        n, tokens, num_decode, decode_kv, work2, prefill = self._sums
        m = int(self.state.m[x])
        return self._timer(n + 1, tokens + chunk, num_decode, decode_kv, work2 + chunk * (2 * m + chunk + 1),
                           prefill + chunk)

    def add_prefill(self, x: int, chunk: int) -> None:
        self._take(x, chunk)
        self._pf_idx.append(x)
        self._pf_tok.append(chunk)
        m, s = int(self.state.m[x]), self._sums
        s[0] += 1
        s[1] += chunk
        s[4] += chunk * (2 * m + chunk + 1)
        s[5] += chunk

    def plan(self) -> Plan:
        dec, k = self._dec, int(self._dec.size)
        if not self._pf_idx:
            return Plan(dec, np.ones(k, dtype=np.int64), _NO_IDX)
        tok = np.ones(k + len(self._pf_tok), dtype=np.int64)
        tok[k:] = self._pf_tok
        return Plan(np.concatenate((dec, np.array(self._pf_idx, dtype=np.int64))), tok, _NO_IDX)


def work_timer(cost) -> "Callable[[int, int, int, int, int, int], float] | None":
    """``cost``'s batch time from a batch's sums (:meth:`~infermax.costmodel.LinearCostModel.work_timer`), or None
    (a cost model without one; ``INFERMAX_PURE=1`` in the environment: always None, the array path)."""
    if os.environ.get("INFERMAX_PURE") == "1":
        return None
    get = getattr(cost, "work_timer", None)
    return get() if get is not None else None


def phases(state: ServingState) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """From one look at the active set, oldest arrival first (ties by index: the active set's order): the running
    requests, the running decode-phase ones, and the prefill candidates (running with an unfinished (re)fill, and
    waiting)."""
    act = state.active
    st = state.status[act]
    running = st == RUNNING
    dec = running & (state.m[act] >= state.inp[act])
    return act[running], act[dec], act[(running & ~dec) | (st == WAITING)]


def long_mask(state: ServingState, threshold_tokens: int | None) -> np.ndarray:
    """Which requests are long: the workload's ``long`` tags if any, else prompt >= threshold."""
    tags = np.array([r.tag == "long" for r in state.workload.requests])
    if threshold_tokens is None and tags.any():
        return tags
    return state.input_lens >= (threshold_tokens or LONG_THRESHOLD_TOKENS)
