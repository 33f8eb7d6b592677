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

import numpy as np

from infermax.state import RUNNING, WAITING, ServingState

from .base import Plan

LONG_THRESHOLD_TOKENS = 32_768


class BatchDraft:
    """The batch under construction and its remaining budgets."""

    def __init__(self, state: ServingState, R_max: int) -> None:
        lim = state.limits
        self.state = state
        act = state.active
        running = act[state.status[act] == RUNNING]
        self.peak = peak = state.peak_kv_blocks                 # I + O - 1, in blocks
        self.mem = lim.num_blocks - int(peak[running].sum())
        self.run = R_max - running.size
        self.C, self.P = lim.C, lim.P
        self.idx: list[int] = []
        self.tok: list[int] = []
        self.kv: list[int] = []
        self.dec: list[bool] = []
        self._probe: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None    # the draft + one slot, as arrays

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
        hundreds of decodes from lists at each probe was Medha's hot path. Same arrays, same result."""
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
        if target_s == float("inf") or self.time_with(x, limit) <= target_s:
            return limit
        lo, hi = 0, limit          # time_with grows with the chunk: bisect
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.time_with(x, mid) <= target_s:
                lo = mid
            else:
                hi = mid
        return min(limit, max(lo, min_chunk))

    def add_prefill(self, x: int, chunk: int) -> None:
        st = self.state
        if st.status[x] == WAITING:
            self.mem -= int(self.peak[x])
            self.run -= 1
        self.idx.append(x)
        self.tok.append(chunk)
        self.kv.append(int(st.m[x]))
        self.dec.append(False)
        self.C -= chunk
        self.P -= chunk
        self._probe = None

    def plan(self) -> Plan:
        z = np.zeros(0, dtype=np.int64)
        return Plan(np.array(self.idx, dtype=np.int64), np.array(self.tok, dtype=np.int64), z)


def decoding(state: ServingState) -> np.ndarray:
    """Running decode-phase requests, oldest arrival first (ties by index: the active set's order)."""
    act = state.active
    return act[(state.status[act] == RUNNING) & (state.m[act] >= state.inp[act])]


def prefilling(state: ServingState) -> np.ndarray:
    """Running requests with an unfinished (re)fill plus waiting ones, oldest arrival first."""
    act = state.active
    st = state.status[act]
    return act[((st == RUNNING) & (state.m[act] < state.inp[act])) | (st == WAITING)]


def long_mask(state: ServingState, threshold_tokens: int | None) -> np.ndarray:
    """Which requests are long: the workload's ``long`` tags if any, else prompt >= threshold."""
    tags = np.array([r.tag == "long" for r in state.workload.requests])
    if threshold_tokens is None and tags.any():
        return tags
    return state.input_lens >= (threshold_tokens or LONG_THRESHOLD_TOKENS)
