"""WAIT and Nested WAIT (Ao, Luo, Simchi-Levi, Wang, "Optimizing LLM Inference: Fluid-Guided Online
Scheduling with Memory Constraints", arXiv 2504.11320, 2025): admission in cohorts at fluid thresholds.

Both are GetNextBatch schedulers with decode priority, hybrid batches and chunked prefill (the running
requests decode every batch, new prompts fill what is left of C), which gate *who may be admitted*:

- ``wait`` (output lengths known): the prompts of each request type (its tag; untagged requests form one
  type) accumulate in an inventory; the type's inventory is released as a cohort once it holds its
  threshold n_j, and admitted, in arrival order, while the look-ahead check of :mod:`.lookahead` (exact,
  output lengths known) keeps the predicted KV within M at every future batch — no evictions. What the
  check does not take waits in the inventory for the next release.
- ``nested-wait`` (output lengths unknown: it never reads O): the decode is cut into segments at
  boundaries k_1 < k_2 < ... (k_1 = ``first_segment``, then ×``growth``). New prompts form segment 1's
  inventory; a request still running when it has generated k_s tokens pauses (holding its KV) and joins
  segment s + 1's inventory, which is released as a cohort at its threshold, so short requests leave
  early and long ones continue together. Memory: each running request *reserves* the KV it holds at the
  end of its segment (it cannot grow past it without a new release), so the reservations bound the KV
  exactly; new prompts are admitted while the reservations stay within (1 − ``buffer``)·M and resumed
  cohorts while they stay within M: the buffer is kept for requests already running.

Thresholds (the papers' "derived from the fluid equilibrium"; the abstracts leave the rule open, this is
ours): n_j = ⌊scale · x_j⌋, at least 1, where x_j = λ_j·τ* is the number of type-j prompts the fluid
equilibrium (:mod:`infermax.fluid`) admits per batch at the workload's rates (``rate``: the total rate
to assume instead) — one batch's worth of arrivals. Past the stability limit the equilibrium at the limit
is used. A threshold is capped by the cohort that fits M (⌊M / E[I + O − 1]⌋; nested: E[I] + k_1 − 1).
Nested WAIT's segment s + 1 threshold is n_1 times the share of requests with O > k_s (the output length
*distribution* is taken as known, the lengths are not). ``threshold=N`` fixes every threshold instead
(needed with a cost model that is not linear, where the fluid model does not apply).

Choices of ours that keep every instance finishing: an inventory below its threshold is released when no
request is running (the end of a trace, a quiet period), requests evicted by a fallback re-enter at once,
and when every running request is paused and no release fits, the oldest paused request resumes anyway
(the framework then evicts younger ones if its next token finds no KV). ``first_segment`` defaults to half
the workload's median output length, ``growth`` to 2, ``buffer`` to 0.05.
"""
from __future__ import annotations

import math

import numpy as np

from infermax.fluid import binding, equilibrium, fluid_types, stability_limit
from infermax.policy import Policy
from infermax.state import ServingState

from .framework import GetNextBatch
from .registry import register_scheduler


def _check(name: str, value, low: float, integer: bool = False, allow_none: bool = True) -> None:
    if value is None and allow_none:
        return
    ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) and value > low
    if not ok or (integer and not isinstance(value, int)):
        kind = "an integer" if integer else "a number"
        raise ValueError(f"{name} must be {kind} > {low:g}, got {value!r}")


def fluid_admissions(state: ServingState, rate: float | None) -> dict[str, float]:
    """Per type (tag), the prompts the fluid equilibrium admits per batch at the workload's rates (or at
    ``rate`` requests/s in all); inf for an offline workload; at the stability limit beyond it."""
    types = fluid_types(state.workload, rate)
    if any(math.isinf(t.rate_per_s) for t in types):
        return {t.name: math.inf for t in types}
    point = equilibrium(types, state.cost)
    if binding(point, state.limits) is not None:
        rho, _ = stability_limit(types, state.limits, state.cost)
        point = equilibrium(types, state.cost, rho * (1 - 1e-3))
    if point is None:
        return {t.name: math.inf for t in types}
    if point.scale == 0:                # no positive rate fits the limits: the admissions per batch at scale -> 0
        return {t.name: point.batch_time_s * t.rate_per_s for t in types}
    return {t.name: x / point.scale for t, x in zip(types, point.admissions.values())}


class _Gated(GetNextBatch):
    """The shared part: options, the type of every request, thresholds."""

    def __init__(self, name: str, R_max: int | None, P: int | None, scale: float, rate: float | None,
                 threshold: int | None, lookahead: bool) -> None:
        _check("scale", scale, 0.0, allow_none=False)
        _check("rate", rate, 0.0)
        _check("threshold", threshold, 0, integer=True)
        super().__init__(Policy(priority="decode", hybrid=True, chunked_prefill=True, rank_key="arrival",
                                lookahead=lookahead, stagger=False, P=P, R_max=R_max), name=name)
        self.scale, self.rate, self.threshold = scale, rate, threshold

    def describe(self) -> dict:
        return {**super().describe(), "scale": self.scale, "rate": self.rate, "threshold": self.threshold}

    def _thresholds(self, state: ServingState, mean_peak: np.ndarray, pooled: bool = False) -> np.ndarray:
        """n_j per type (in the order of ``self._names``), from the fluid model unless fixed by hand;
        ``pooled``: one threshold for all types together (their admissions per batch summed)."""
        if self.threshold is not None:
            return np.full(len(self._names), self.threshold, dtype=np.int64)
        try:
            x = fluid_admissions(state, self.rate)
        except ValueError as exc:
            raise ValueError(f"scheduler {self.name!r}: {exc}; give threshold=N to fix the thresholds by hand") \
                from None
        cap = np.maximum(np.floor(state.limits.M / np.maximum(mean_peak, 1.0)), 1.0)
        want = np.array([self.scale * sum(x.values())] if pooled else [self.scale * x[n] for n in self._names])
        return np.minimum(np.maximum(np.floor(np.minimum(want, cap)), 1.0), cap).astype(np.int64)

    def _types(self, state: ServingState) -> None:
        tags = [r.tag or "" for r in state.workload.requests]
        self._names = list(dict.fromkeys(tags))
        index = {n: k for k, n in enumerate(self._names)}
        self._type = np.array([index[t] for t in tags], dtype=np.int64)


@register_scheduler("wait", "WAIT (Ao et al. 2025): per-type inventories admitted as cohorts at fluid thresholds, "
                    "look-ahead KV check (no evictions)")
class Wait(_Gated):
    """WAIT; options: scale, rate, threshold (see the module docstring), R_max, P."""

    def __init__(self, R_max: int | None = None, P: int | None = None, scale: float = 1.0,
                 rate: float | None = None, threshold: int | None = None) -> None:
        super().__init__("wait", R_max, P, scale, rate, threshold, lookahead=True)

    def reset(self, state: ServingState) -> None:
        super().reset(state)
        self._types(state)
        peak = np.bincount(self._type, weights=state.peak_kv) / np.bincount(self._type)
        self.thresholds = self._thresholds(state, peak)

    def group_requests(self, state: ServingState, all_decode: bool | None = None):
        groups = super().group_requests(state, all_decode)
        waiting, kind = groups[-1]
        running = self._sets(state)[0]
        if waiting.size and running.size:     # with nothing running, every inventory is released
            fresh = state.gen[waiting] == 0   # (a request evicted by the fallback re-enters at once)
            counts = np.bincount(self._type[waiting[fresh]], minlength=len(self._names))
            waiting = waiting[~fresh | (counts >= self.thresholds)[self._type[waiting]]]
            groups[-1] = (waiting, kind)
        return groups
