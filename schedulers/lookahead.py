"""Look-ahead admission: admit a request only if the KV cache never overflows later.

Output lengths are known (as in infermax.txt §3.3), so the KV each running
request will hold in every future batch is predictable: it grows by one token
per batch until it completes and frees everything. A waiting request is admitted
when the *future* profile of the running requests plus its own ramp stays within
M at every future batch — the memory use of eviction-free scheduling without its
waste (reserving I+O-1 for the whole life of every request), and without the
refills of evicting schedulers. The profile assumes every running request takes
part in every batch (true for decode-priority schedulers with C to spare); if
that fails the usual eviction of GotoNextGroupOrEvict still keeps every schedule
valid.
"""
from __future__ import annotations

import math

import numpy as np


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


def admit_prefix(profile: np.ndarray, base: np.ndarray, f: np.ndarray, r: np.ndarray, M: int) -> int:
    """Admit candidates in order while the profile plus their ramps stays <= M at every s.

    Updates ``profile`` in place with the admitted ramps; returns how many were admitted.
    """
    for q in range(base.size):
        end = min(int(r[q]), profile.size)
        s = np.arange(end)
        trial = profile[:end] + (int(base[q]) + np.maximum(0, s - int(f[q]) + 1))
        if end and int(trial.max()) > M:
            return q
        profile[:end] = trial
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
