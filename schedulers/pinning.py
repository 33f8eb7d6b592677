"""Pinned requests: what keeps a scheduler without chunked prefill from getting stuck.

Without chunked prefill, a request evicted in decode phase must later refill its
m + 1 tokens in *one* batch, which needs m + 1 <= min(C, P). A decoding request
with m >= min(C, P) is therefore *pinned*: it is never chosen as a victim and must
finish in place (the others can always be evicted to make room for it). A step
may pin a request only if the pinned requests can then all grow together to
their peaks I + O - 1 within M; otherwise a decode that would pin is preempted
instead (while its refill still fits) and a prompt that would is not admitted
yet. A pinned request grows only if the pinned requests stay *safe* (the
banker's test: taken smallest need first, each can reach its peak in the KV the
pinned ones left do not hold); otherwise it waits a batch. So they always finish.
With KV in blocks (``Limits.block_size`` > 1) both tests count whole blocks: M is
then the number of blocks, and a request holding m tokens takes ceil(m / block).

:class:`PinGuard` holds that rule for one scheduler run; :class:`.framework.GetNextBatch`
asks it which requests are pinned (never victims), which steps of a batch under
construction it allows, and how long a fast-forwarded decode run may go on.
"""
from __future__ import annotations

import numpy as np

from infermax.state import ServingState

Pins = dict[int, tuple[int, int]]     # pinned request index -> (m, peak = I + O - 1)


def _blocks(tokens: int, block: int) -> int:
    return -(-tokens // block)


def is_safe(M: int, pins: Pins, block: int = 1) -> bool:
    """Banker's test on pinned requests ``{index: (m, peak)}``: taken smallest need (peak - m)
    first, can each grow to its peak in the KV not held by the pinned requests left? (In blocks
    of ``block`` tokens, M counting blocks.)"""
    if block > 1:
        pins = {i: (_blocks(m, block), _blocks(peak, block)) for i, (m, peak) in pins.items()}
    free = M - sum(m for m, _ in pins.values())
    for need, m in sorted((peak - m, m) for m, peak in pins.values()):
        if need > free:
            return False
        free += m
    return True


def can_grow_together(M: int, pins: Pins, block: int = 1) -> bool:
    """Can the pinned requests ``{index: (m, peak)}`` all grow by one token a batch to their peaks
    at once within M? The KV peaks when one completes: s = its need batches on, the requests
    needing at least s hold m + s each (ceil((m + s) / block) blocks each, M counting blocks)."""
    if block > 1:
        items = sorted((peak - m, m) for m, peak in pins.values())
        return all(sum(_blocks(m + s, block) for _, m in items[k:]) <= M for k, (s, _) in enumerate(items))
    held, count = sum(m for m, _ in pins.values()), len(pins)
    for need, m in sorted((peak - m, m) for m, peak in pins.values()):
        if held + count * need > M:
            return False
        held, count = held - m, count - 1
    return True


class PinGuard:
    """The pin rule for one run: ``cap`` = min(C, P) without chunked prefill (None: nothing is ever
    pinned), ``peak`` = I + O - 1 per request; ``active``: whether steps are checked at all (only when
    some request can outgrow a one-batch refill, and never for the eviction-free and look-ahead
    variants, which never run short of KV). With ``block`` > 1, ``M`` counts KV blocks of that many tokens."""

    def __init__(self, cap: int | None, peak: np.ndarray, M: int, hybrid: bool, active: bool, block: int = 1) -> None:
        self.cap, self.peak, self.M, self.hybrid, self.block = cap, peak, M, hybrid, block
        self.active = active and cap is not None and bool((peak > cap).any())

    def pinned(self, state: ServingState, idx: np.ndarray) -> np.ndarray:
        """Which of ``idx`` can never be evicted: decoding, with a refill m + 1 > min(C, P)."""
        if self.cap is None:
            return np.zeros(idx.size, dtype=bool)
        m = state.m[idx]
        return (m >= state.inp[idx]) & (m >= self.cap)

    def start(self, state: ServingState, running: np.ndarray) -> Pins | None:
        """The pinned requests before a batch (None when the guard is off)."""
        if not self.active:
            return None
        p = running[self.pinned(state, running)]
        return dict(zip(p.tolist(), zip(state.m[p].tolist(), self.peak[p].tolist())))

    def after(self, state: ServingState, b, idx: np.ndarray, tok: np.ndarray,
                    check: bool = True) -> tuple[int, dict]:
        """Walk the steps of ``idx`` (taking ``tok`` tokens) that pin, grow or complete a pinned
        request, from ``b.pins``. With ``check``, stop before the first after which the pinned
        requests could no longer finish one after another (unsafe), or that pins a request beyond
        what they can grow together (from the end of this batch, the others taking their step in it
        too unless its prefills keep decodes out). Returns (steps allowed, pinned requests after them)."""
        m1 = state.m[idx] + tok
        moves = np.flatnonzero((m1 >= self.cap) & (m1 >= state.inp[idx]))
        if not moves.size:
            return idx.size, b.pins
        pins, stepped = dict(b.pins), set()
        stays = (state.output_lens[idx[moves]] - state.gen[idx[moves]] > 1).tolist()
        for k, i, m, stay in zip(moves.tolist(), idx[moves].tolist(), m1[moves].tolist(), stays):
            stepped.add(i)
            if not stay:
                pins.pop(i, None)          # completes: frees its KV
                continue
            before = pins.get(i)
            pins[i] = (m, int(self.peak[i]))
            ok = not check or (is_safe(self.M, pins, self.block) and (before is not None or can_grow_together(
                self.M, self._after_batch(b, pins, stepped, m > tok[k]), self.block)))
            if not ok:
                if before is None:
                    del pins[i]
                else:
                    pins[i] = before
                return k, pins
        return idx.size, pins

    def _after_batch(self, b, pins: dict, stepped: set, decoding: bool) -> dict:
        """The pinned requests at the end of this batch if the ones not yet in it take their step
        (in a batch of decodes, or of hybrid prefills) or not (a prefill batch without hybrid)."""
        if not (decoding or self.hybrid):
            return pins
        out = {}
        for i, (m, peak) in pins.items():
            if i not in stepped and b.stamp[i] != b.j:
                m += 1
                if m == peak:
                    continue                 # its last token: completes in this batch
            out[i] = (m, peak)
        return out

    def refuses(self, state: ServingState, b, x: int) -> bool:
        """Would the decode of ``x`` pin it or grow it beyond what the pin guard allows?"""
        return self.after(state, b, np.array([x]), np.ones(1, dtype=np.int64))[0] == 0

    def repeat_limit(self, state: ServingState, idx: np.ndarray, horizon: int) -> int:
        """How many of ``horizon`` identical decode batches of ``idx`` may run: stop before a decode
        pins a request, and before the first step after which the pinned ones are not safe."""
        if not self.active:
            return horizon
        m = state.m[idx]
        horizon = min(horizon, int((self.cap - 1 - m[m < self.cap]).min(initial=horizon)))
        if horizon > 0 and not self._safe_after(state, idx, horizon):
            lo, hi = 0, horizon
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if self._safe_after(state, idx, mid) else (lo, mid)
            horizon = lo
        return horizon

    def _safe_after(self, state: ServingState, idx: np.ndarray, num_steps: int) -> bool:
        """Are the pinned requests safe after ``num_steps`` decodes of ``idx`` (completing none)?"""
        m = state.m[idx] + num_steps
        p = m >= self.cap
        return is_safe(self.M, dict(zip(idx[p].tolist(), zip(m[p].tolist(), self.peak[idx[p]].tolist()))),
                       self.block)
