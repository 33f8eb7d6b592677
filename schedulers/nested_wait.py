"""Nested WAIT (Ao et al. 2025, output lengths unknown): segment inventories and KV reservations.

The rules are in :mod:`.wait`'s docstring. Per batch (:meth:`NestedWait.group_requests`), from the state
alone (nothing is remembered between batches):

1. each running request's reservation: the KV it will hold when it reaches the end e of its segment
   (the first boundary above the tokens g it has generated): ``m + e − g`` in decode phase,
   ``inp + e − g − 1`` in a (re)fill; a request *at* a boundary (g = k_s, decode phase) is paused and
   reserves what it holds, m;
2. the paused requests of each boundary, oldest boundary first, are released (resume) when there are
   at least the next segment's threshold of them, or when no request runs unpaused, for as many as keep
   the reservations within M (each one's grows by k_{s+1} − k_s);
3. waiting prompts (segment 1's inventory) are released when there are at least n_1 of them, or when no
   request runs unpaused, for as many as keep the reservations within (1 − buffer)·M; with no request
   running at all, the first is admitted whatever its reservation (alone it fits: I + O − 1 <= M);
4. when every running request is paused and nothing was released, the oldest paused request resumes.

The output length O of a request is never read (only the share of requests longer than each boundary,
for the thresholds, as the distribution is taken as known).
"""
from __future__ import annotations

import numpy as np

from infermax.state import ServingState

from .framework import DECODE_GROUP, PREFILL_GROUP, WAITING_GROUP
from .registry import register_scheduler
from .wait import _check, _Gated


def boundaries(first: int, growth: float, top: int) -> np.ndarray:
    """Segment ends k_1 = first, k_{s+1} = max(k_s + 1, ⌈k_s · growth⌉), up to the first >= top."""
    out = [first]
    while out[-1] < top:
        out.append(max(out[-1] + 1, int(np.ceil(out[-1] * growth))))
    return np.array(out, dtype=np.int64)


@register_scheduler("nested-wait", "Nested WAIT (Ao et al. 2025): output lengths unknown; decode in segments, "
                    "requests past a segment wait for the next segment's cohort; KV reserved per segment")
class NestedWait(_Gated):
    """Nested WAIT; options: first_segment, growth, buffer, scale, rate, threshold, R_max, P."""

    def __init__(self, R_max: int | None = None, P: int | None = None, scale: float = 1.0,
                 rate: float | None = None, threshold: int | None = None, first_segment: int | None = None,
                 growth: float = 2.0, buffer: float = 0.05) -> None:
        _check("first_segment", first_segment, 0, integer=True)
        _check("growth", growth, 1.0, allow_none=False)
        if isinstance(buffer, bool) or not isinstance(buffer, (int, float)) or not 0 <= buffer < 1:
            raise ValueError(f"buffer must be a fraction of M in [0, 1), got {buffer!r}")
        super().__init__("nested-wait", R_max, P, scale, rate, threshold, lookahead=False)
        self.first_segment, self.growth, self.buffer = first_segment, growth, buffer

    def describe(self) -> dict:
        return {**super().describe(), "first_segment": self.first_segment, "growth": self.growth,
                "buffer": self.buffer}

    def reset(self, state: ServingState) -> None:
        super().reset(state)
        out = state.output_lens
        first = self.first_segment or max(1, int(np.median(out)) // 2)
        self._k = boundaries(first, self.growth, int(state.limits.M) + 1)
        self._names = [""]                                   # one inventory a segment, all types together
        n1 = int(self._thresholds(state, np.array([float(state.input_lens.mean()) + first - 1]), pooled=True)[0])
        survive = (out[None, :] > self._k[:, None]).mean(axis=1)      # share longer than each boundary
        self._n = np.maximum(np.floor(n1 * np.concatenate(([1.0], survive[:-1]))), 1).astype(np.int64)
        self._kv_room = int(state.limits.M)
        self._new_kv_room = int(state.limits.M * (1 - self.buffer))

    def _segment_end(self, g: np.ndarray) -> np.ndarray:
        """The first boundary above ``g`` generated tokens."""
        return self._k[np.minimum(np.searchsorted(self._k, g, side="right"), self._k.size - 1)]

    def group_requests(self, state: ServingState, all_decode: bool | None = None):
        running, waiting, _ = self._sets(state)
        m, inp, g = state.m[running], state.inp[running], state.gen[running]
        dec = m >= inp
        at = dec & np.isin(g, self._k)                       # paused at a boundary
        e = self._segment_end(g)
        total = int(np.where(at, m, np.where(dec, m + e - g, inp + e - g - 1)).sum())
        live = int((~at).sum())
        resumed, total = self._resume(running[at], g[at], total, live)
        if not live and not resumed.size and at.any():       # everyone paused, nothing fits: the oldest goes on
            resumed = running[at][:1]
        admitted = self._admit(state, waiting, total, bool(live or resumed.size), running.size)
        decodes = running[dec & ~at]
        if resumed.size:
            decodes = running[dec & (~at | np.isin(running, resumed))]
        return [(decodes, DECODE_GROUP), (running[~dec], PREFILL_GROUP), (admitted, WAITING_GROUP)]

    def _resume(self, paused: np.ndarray, g: np.ndarray, total: int, live: int) -> tuple[np.ndarray, int]:
        """Paused requests released into their next segment (step 2), and the reservations after."""
        out = []
        for k in np.unique(g).tolist():
            cohort = paused[g == k]
            s = int(np.searchsorted(self._k, k))                # at boundary k_s: it joins segment s + 1
            if cohort.size < self._n[min(s + 1, self._n.size - 1)] and live:
                continue
            grow = int(self._k[min(s + 1, self._k.size - 1)] - k)
            fits = int(min(cohort.size, max(self._kv_room - total, 0) // max(grow, 1)))
            out.append(cohort[:fits])
            total += fits * grow
        return (np.concatenate(out) if out else paused[:0]), total

    def _admit(self, state: ServingState, waiting: np.ndarray, total: int, busy: bool, num_running: int
               ) -> np.ndarray:
        """Waiting requests released (step 3): a prefix of ``waiting`` (arrival order)."""
        if not waiting.size:
            return waiting
        fresh = state.gen[waiting] == 0
        if busy and fresh.sum() < self._n[0]:
            waiting = waiting[~fresh]                         # segment 1 keeps collecting; refills go on
            if not waiting.size:
                return waiting
        g = state.gen[waiting]
        need = state.inp[waiting] + self._segment_end(g) - g - 1
        k = int(np.searchsorted(np.cumsum(need), self._new_kv_room - total, side="right"))
        if not k and not num_running:
            k = 1                                             # an empty cache takes any single request
        return waiting[:k]

    def decode_run(self, state: ServingState, plan):
        """The framework's decode runs, cut where the first running request reaches a segment end (it pauses
        or is released there, a decision taken batch by batch)."""
        run, k = super().decode_run(state, plan)
        if not k:
            return run, k
        g = state.gen[run]
        if np.isin(g, self._k).any():
            return run[:0], 0
        return run, min(k, int((self._segment_end(g) - g).min()))
