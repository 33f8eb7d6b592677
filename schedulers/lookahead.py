"""Look-ahead admission: admit a request only if the KV cache never overflows later.

Output lengths are known (as in InferMax §3.3), so the KV each running
request will hold in every future batch is predictable: it grows by one token
per batch until it completes and frees everything. A waiting request is admitted
when the *future* profile of the running requests plus its own ramp stays within
M at every future batch — the memory use of eviction-free scheduling without its
waste (reserving I+O-1 for the whole life of every request), and without the
refills of evicting schedulers. The profile assumes every running request takes
part in every later batch, so admission keeps the running requests within C; the
running decodes that the admitting batch itself leaves out (a prefill batch
without hybrid batching, or prefills that leave too little of C) are pushed back
one batch (:func:`pushback`). A (re)fill is predicted at P tokens per batch; a
prompt admitted with only a first chunk (decode priority) fills on with what
the decodes leave of C (:func:`fill_batches`).
"""
from __future__ import annotations

import math

import numpy as np

from infermax.state import WAITING


def ramps(state, idx: np.ndarray, prefill_tokens_per_batch: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Predicted KV of each request in future batches s = 0, 1, ...: ``base + max(0, s - f + 1)``
    for ``s < r``, then 0 (freed).

    A request with a (re)fill to finish needs f = ceil(left / P) more fill batches,
    holding at most ``inp`` KV, then grows by one per decode; a decode-phase request
    holds m + 1 + s (f = 1, base = m + 1). Returns (base, f, r).
    """
    m, inp = state.m[idx], state.inp[idx]
    left = inp - m
    decoding = left <= 0
    f = np.where(decoding, 1, -(-np.maximum(left, 1) // prefill_tokens_per_batch))
    base = np.where(decoding, m + 1, inp)
    to_generate = state.output_lens[idx] - state.gen[idx]
    r = np.where(decoding, to_generate, f + to_generate - 1)
    return base, f, r


def future_profile(base: np.ndarray, f: np.ndarray, r: np.ndarray, horizon: int) -> np.ndarray:
    """P(s) = Σ_i [s < r_i] (base_i + max(0, s - f_i + 1)) for s in [0, horizon), by difference arrays."""
    n = horizon + 1
    r, f = np.minimum(r, horizon), np.minimum(f, horizon)
    level = np.bincount(np.zeros_like(r), weights=base, minlength=n) - np.bincount(r, weights=base, minlength=n)
    slope = np.bincount(f, minlength=n) - np.bincount(r, minlength=n)
    shift = np.bincount(r, weights=f - 1, minlength=n) - np.bincount(f, weights=f - 1, minlength=n)
    s = np.arange(n)
    out = np.cumsum(level) + s * np.cumsum(slope) + np.cumsum(shift)
    return out[:horizon]


def decoding_counts(f: np.ndarray, r: np.ndarray, horizon: int) -> np.ndarray:
    """How many of the requests decode in each batch s in [1, horizon): those with f <= s < r."""
    n = horizon + 1
    return np.cumsum(np.bincount(np.minimum(f, horizon), minlength=n)
                     - np.bincount(np.minimum(r, horizon), minlength=n))[:horizon]


def fill_batches(left: int, busy: np.ndarray, P: int, C: int) -> int:
    """Batches s = 1, 2, ... that a (re)fill with ``left`` tokens to go takes when batch s gives it
    what its ``busy[s]`` decodes leave of C, at most P (decodes first); past ``busy``, P a batch."""
    done = np.cumsum(np.clip(np.minimum(P, C - busy[1:]), 0, None))
    s = int(np.searchsorted(done, left))
    if s < done.size:
        return s + 1
    return done.size + math.ceil((left - int(done[-1] if done.size else 0)) / P)


def pushback(base: np.ndarray, f: np.ndarray, r: np.ndarray, horizon: int) -> np.ndarray:
    """Change of the profile when decoding requests with ramps (base, f, r) sit out batch s = 0:
    each holds its m = base - 1 tokens there, then grows as before, one batch later."""
    return future_profile(base - 1, f, r + 1, horizon) - future_profile(base, f, r, horizon)


def admit_prefix(profile: np.ndarray, base: np.ndarray, f: np.ndarray, r: np.ndarray, M: int,
                 shifts: list | None = None) -> int:
    """Admit candidates in order while the profile plus their ramps stays <= M at every s.

    ``shifts[q]`` (None or an array the size of ``profile``) is the change admitting
    candidate q brings to the running requests (:func:`pushback`). Updates ``profile`` in
    place with what is admitted; returns how many were admitted.
    """
    for q in range(base.size):
        end = min(int(r[q]), profile.size)
        s = np.arange(end)
        ramp = int(base[q]) + np.maximum(0, s - int(f[q]) + 1)
        shift = shifts[q] if shifts is not None else None
        if shift is None:
            trial = profile[:end] + ramp
            if end and int(trial.max()) > M:
                return q
            profile[:end] = trial
        else:
            trial = profile + shift
            trial[:end] += ramp
            if int(trial.max()) > M:
                return q
            profile[:] = trial
    return int(base.size)


def stagger_gap(state, head: int) -> int:
    """Batches between admissions that spread request ages evenly.

    A full cache of requests like ``head`` holds about n = M / (I + O/2) of them when
    their ages are spread over [0, O); admitting one every ⌈O / n⌉ batches keeps it so
    (rounding up: admitting faster than completions free KV only bunches requests
    behind the look-ahead check).
    """
    out_left = int(state.output_lens[head] - state.gen[head])
    target = state.limits.M / (int(state.inp[head]) + out_left / 2)
    return math.ceil(out_left / max(target, 1.0))

class Admission:
    """Look-ahead admission for one scheduler run: prefill tokens per batch ``P``, running cap ``R``,
    the scheduler's ``priority`` ("prefill" or "decode"), whether it batches hybrid and whether it
    staggers admissions (``stagger``; without it every candidate that passes the check is admitted at once)."""

    def __init__(self, P: int, R: int, priority: str, hybrid: bool, stagger: bool = True) -> None:
        self.P, self.R, self.priority, self.hybrid, self.stagger = P, R, priority, hybrid, stagger
        self._last_admit = -(1 << 40)

    def admit(self, state, b, running: np.ndarray, cand: np.ndarray, tok: np.ndarray) -> int:
        """How many of ``cand`` (waiting, in order, taking ``tok`` tokens now) keep the predicted KV
        within M in every future batch, given the ``running`` requests (priority order) and the batch
        ``b`` under construction (its budgets, its choices so far, and the profile it caches).

        Admissions are also staggered: one per ``gap`` batches, where ``gap`` spreads the
        ages of the running requests evenly over their output length, so that completions
        (and the KV they free) arrive steadily instead of in waves (unless ``stagger`` is off). The prediction needs
        every
        running request to decode in every batch, so at most C requests run.
        """
        gap = stagger_gap(state, int(cand[0])) if running.size and self.stagger else 0
        if gap > 1:
            if b.j - self._last_admit < gap:
                b.future_refusal = True
                return 0
            cand, tok = cand[:1], tok[:1]
        room = state.limits.C - (self.R - b.run)   # R - b.run: running after this batch's changes
        if room < cand.size:
            cand, tok = cand[:max(room, 0)], tok[:max(room, 0)]
            if not cand.size:
                return 0
        running = running[~np.isin(running, b.evicted)] if b.evicted else running
        if b.profile is None:
            base, f, r = ramps(state, running, self.P)
            horizon = int(max(r.max(initial=0) + 1, (state.output_lens[cand] + state.inp[cand]).max()))
            b.profile = future_profile(base, f, r, horizon + 1)
        base, f, r = ramps(state, cand, self.P)
        partial = tok < state.inp[cand] - state.m[cand]
        if partial.any() and self.priority == "decode":
            f, r = self._partial_fills(state, b, running, cand, tok, partial)
        q = admit_prefix(b.profile, base, f, r, state.limits.M, self._left_out(state, b, running, tok))
        if q < cand.size or gap > 1:
            b.future_refusal = True
        if q:
            self._last_admit = b.j
        return q

    def _partial_fills(self, state, b, running: np.ndarray, cand: np.ndarray,
                       tok: np.ndarray, partial: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Fill batches f and lifetimes r of candidates that get only part of their (re)fill now: with
        decode priority they fill on with what the decodes (running, admitted now) leave of C."""
        taken = np.concatenate(b.idx) if b.idx else np.zeros(0, dtype=np.int64)
        others = np.concatenate((running, taken[state.status[taken] == WAITING]))
        busy = decoding_counts(*ramps(state, others, self.P)[1:], b.profile.size)
        left = state.inp[cand] - state.m[cand] - tok
        f = np.ones(cand.size, dtype=np.int64)
        for q in np.flatnonzero(partial).tolist():
            f[q] += fill_batches(int(left[q]), busy, self.P, state.limits.C)
        return f, f + state.output_lens[cand] - state.gen[cand] - 1

    def _left_out(self, state, b, running: np.ndarray, tok: np.ndarray) -> list | None:
        """Per candidate, the profile change from the running decodes its admission leaves out of
        this batch (prefill priority, where they come after the waiting candidates: all of them
        without hybrid batching, those past the C the prefills leave with it); None for none."""
        if self.priority != "prefill":
            return None
        pending = running[(b.stamp[running] != b.j) & (state.m[running] >= state.inp[running])]
        if not pending.size:
            return None
        slots = np.maximum(b.C - np.cumsum(tok), 0) if self.hybrid else np.zeros(tok.size, dtype=np.int64)
        shifts, kept = [], pending.size
        for q, d in enumerate(np.minimum(slots, pending.size).tolist()):
            shifts.append(None)
            if d < kept:
                shifts[q] = pushback(*ramps(state, pending[d:kept], self.P), b.profile.size)
                kept = d
        return shifts
