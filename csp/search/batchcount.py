"""The least number of batches any schedule needs, by breadth-first search over class states.

Relax the problem to what fixes the batch count: every request i is a chain of
O_i *items*, item t holding I_i + t KV in the batch that generates token t + 1;
a batch holds items of distinct requests, at most one per request, of total KV
<= M (and at most R_max items); a request's items go to strictly later
batches in order. Every schedule induces such a packing with its own batch
count: idle requests only add KV, an evicted request's refill holds exactly the
item's KV, and — when M <= C and M <= P — a chunked (re)fill can be merged into
the batch that completes it without breaking a limit (the argument of
:mod:`.aggregate`). Arrivals, policies and costs only remove packings. So the
least batch count of the relaxation is a valid lower bound on the batch count
of every schedule, and it is exact when eviction is allowed and M <= C, P.

Requests of one class (same I, O) are interchangeable, so a state is, per
class, the sorted tuple of next levels. Layer k holds the states reachable in k
batches, pruned by dominance (a state whose requests are all at least as far
along needs no more batches: it can copy the other state's remaining schedule
item for item) and by the remaining-work bound ``k + rest(s) > upper``. The
search is anytime: stopped early, ``min_s k + rest(s)`` over the last layer is
still a valid bound. The same relaxation, tabulated backwards from the goal for
every state, is :mod:`.batchtable`. Where neither finishes, :func:`refute_batch_counts`
asks a solver whether the relaxation has a packing into Y batches at all.

    >>> from infermax import Limits, Workload
    >>> min_batch_count(Workload.from_lengths([16] * 7, [16] * 7), Limits(M=128, C=4096)).num_batches
    23
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from infermax.types import Limits, Workload

from ..milp.model import LinExpr, Model


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchCount:
    """num_batches: a lower bound on the batch count; is_exact: the least count of the relaxation
    (search finished); layers/states_max/wall_s: effort."""

    num_batches: int
    is_exact: bool
    layers: int
    states_max: int
    wall_s: float


def is_applicable(limits: Limits) -> bool:
    """Merging chunks keeps every limit only when a batch's KV bound M also bounds its tokens."""
    return limits.M <= limits.C and limits.M <= limits.P


# complexity: a layered search: one early exit per outcome (not applicable, too large, goal, budget, no packing)
def min_batch_count(workload: Workload, limits: Limits, upper: int | None = None,
                    time_budget_s: float = 10.0, max_states: int = 200_000) -> BatchCount:
    """Least batch count of the chain-packing relaxation (see module docstring), within a budget.

    upper: a known feasible batch count (e.g. a heuristic schedule's length), used to prune.
    Stops when a layer holds the finished state (exact), when the time budget or ``max_states``
    is exceeded (the anytime bound), or when every state is pruned (then ``upper + 1`` is a bound).
    Its branches are those stopping rules of one breadth-first loop.
    """
    if not is_applicable(limits):
        raise ValueError(f"min_batch_count needs M <= C and M <= P (chunk merging), got M={limits.M}, "
                         f"C={limits.C}, P={limits.P}")
    t0 = time.perf_counter()
    # classes by (I, O) only: the relaxation drops arrivals
    sizes = Counter(zip(workload.input_lens.tolist(), workload.output_lens.tolist()))
    classes = [(I, O, n) for (I, O), n in sizes.items()]
    for I, O, _ in classes:
        if I + O - 1 > limits.M:
            raise ValueError(f"a request with input_len={I}, output_len={O} needs {I + O - 1} KV > M={limits.M}")
    R_max = limits.R_max or sum(n for _, _, n in classes)
    rest = _RemainingBound(classes, limits.M, R_max)
    start = tuple((0,) * n for _, _, n in classes)
    goal = tuple((O,) * n for _, O, n in classes)
    layer, k, states_max = [start], 0, 1
    upper = upper if upper is not None else 10 ** 9
    while True:
        if goal in layer:
            return BatchCount(num_batches=k, is_exact=True, layers=k, states_max=states_max,
                              wall_s=time.perf_counter() - t0)
        bound = min(k + rest(s) for s in layer)
        if time.perf_counter() - t0 > time_budget_s or len(layer) > max_states:
            return BatchCount(num_batches=bound, is_exact=False, layers=k, states_max=states_max,
                              wall_s=time.perf_counter() - t0)
        nxt: set = set()
        for s in layer:
            nxt.update(_successors(s, classes, limits.M, R_max))
        k += 1
        nxt = {s for s in nxt if k + rest(s) <= upper}
        if not nxt:                       # no packing has <= ``upper`` batches
            return BatchCount(num_batches=upper + 1, is_exact=False, layers=k, states_max=states_max,
                              wall_s=time.perf_counter() - t0)
        layer = _pareto(nxt, len(classes))
        states_max = max(states_max, len(nxt))


class _RemainingBound:
    """Batches still needed from a state: the longest remaining chain, ⌈remaining KV / M⌉, items / R_max."""

    def __init__(self, classes, M: int, R_max: int):
        self.classes, self.M, self.R_max = classes, M, R_max

    def __call__(self, state) -> int:
        longest = kv = items = 0
        for (I, O, _), levels in zip(self.classes, state):
            for t in levels:              # a chain at level t still holds Σ_{u=t}^{O-1} (I + u) KV-batches
                longest = max(longest, O - t)
                kv += (O - t) * I + (O - 1 + t) * (O - t) // 2
                items += O - t
        return max(longest, math.ceil(kv / self.M), math.ceil(items / self.R_max))


def _successors(state, classes, M: int, R_max: int):
    """Every state one batch later: per (class, level) group, how many of its requests move."""
    groups = []                                   # (class index, level, count, KV per item)
    for c, ((I, O, _), lv) in enumerate(zip(classes, state)):
        for t in sorted(set(lv)):
            if t < O:
                groups.append((c, t, lv.count(t), I + t))
    out = set()
    moves = [0] * len(groups)

    def emit() -> None:
        levels = [list(lv) for lv in state]
        for k, (c, t, _, _) in zip(moves, groups):
            for _ in range(k):            # move k of the requests at level t up by one
                levels[c][levels[c].index(t)] = t + 1
        out.add(tuple(tuple(sorted(lv)) for lv in levels))

    def choose(g: int, kv_left: int, items_left: int) -> None:
        if g == len(groups):
            if any(moves):
                emit()
            return
        _, _, n, w = groups[g]
        for k in range(min(n, kv_left // w, items_left) + 1):
            moves[g] = k
            choose(g + 1, kv_left - k * w, items_left - k)
        moves[g] = 0

    choose(0, M, R_max)
    return out


def _pareto(states: set, num_classes: int) -> list:
    """States not dominated by another (every class's sorted levels >= elementwise)."""
    ordered = sorted(states, key=lambda s: -sum(map(sum, s)))
    flat = np.array([np.concatenate([np.asarray(lv, dtype=np.int16) for lv in s]) for s in ordered])
    kept = np.empty_like(flat)
    keep: list[int] = []
    for i, row in enumerate(flat):
        if keep and (kept[:len(keep)] >= row).all(axis=1).any():
            continue
        kept[len(keep)] = row
        keep.append(i)
    return [ordered[i] for i in keep]


# complexity: the packing model's row families side by side, one block per family
def packing_model(classes: list[tuple[int, int, int]], M: int, R_max: int | None, Y: int) -> Model:
    """Does the chain-packing relaxation fit in Y batches? A feasibility model over counts.

    n[c, t, j]: how many requests of class c (I, O, count) do their item t (KV I + t) in batch j.
    Requests of a class are interchangeable chains, so the counts describe a packing exactly when

        Σ_j n[c, t, j] = count                                  every item of every request, once
        Σ_{j' <= j} n[c, t+1, j'] <= Σ_{j' < j} n[c, t, j']     item t+1 strictly after item t
        Σ_{c, t} (I_c + t) n[c, t, j] <= M,  Σ_{c, t} n[c, t, j] <= R_max        per batch

    (the second is Hall's condition for matching item-t+1 slots to earlier item-t slots, first in
    first out). Item t can only run in batches t .. Y - O + t (t items before it, O - 1 - t after).
    Implied rows that help the solver refute: at most ⌊M/θ⌋ items of at least θ KV in a batch.
    Its branches are the index ranges of these rows.
    """
    m = Model(name=f"packing-Y{Y}")
    R_max = R_max or sum(n for _, _, n in classes)
    sized: list[list[tuple[int, object]]] = [[] for _ in range(Y)]     # per batch: (item KV, count variable)
    for c, (I, O, n) in enumerate(classes):
        prev = None
        for t in range(O):
            row = [m.int_var(0, min(n, M // (I + t), R_max) if t <= j <= Y - O + t else 0, f"n[{c},{t},{j}]")
                   for j in range(Y)]
            m.add(sum(row[1:], 1.0 * row[0]) == n, "packing-items")
            for j in range(Y):
                sized[j].append((I + t, row[j]))
            if prev is not None:
                done_prev, done = LinExpr(), LinExpr()
                for j in range(Y):
                    done = done + row[j]
                    m.add(done <= done_prev, "packing-order")
                    done_prev = done_prev + prev[j]
            prev = row
    for j in range(Y):
        m.add(sum((kv * x for kv, x in sized[j]), LinExpr()) <= M, "packing-memory")
        if R_max < sum(n for _, _, n in classes):
            m.add(sum((x for _, x in sized[j]), LinExpr()) <= R_max, "packing-running")
        for theta in sorted({kv for kv, _ in sized[j]}):     # at most ⌊M/θ⌋ items of >= θ KV share a batch
            big = [x for kv, x in sized[j] if kv >= theta]
            if len(big) > 1:
                m.add(sum(big[1:], 1.0 * big[0]) <= M // theta, "packing-count")
    return m


def area_bound(classes: list[tuple[int, int, int]], M: int, R_max: int | None) -> int:
    """The relaxation's simplest bounds from the start: longest chain, ⌈Σ item KV / M⌉, ⌈items / R_max⌉."""
    R_max = R_max or sum(n for _, _, n in classes)
    return _RemainingBound(classes, M, R_max)(tuple((0,) * n for _, _, n in classes))


def refute_batch_counts(classes: list[tuple[int, int, int]], M: int, R_max: int | None, start: int,
                        solve, time_budget_s: float) -> int:
    """The least Y >= ``start`` not proven impossible for the relaxation: a lower bound on the batch count.

    ``solve(model, time_limit_s)`` is a backend's solve; Y goes up while the backend proves
    :func:`packing_model` infeasible within what is left of the budget, and stops at the first Y it
    finds packable (then Y is the relaxation's least count) or cannot decide.
    """
    deadline = time.perf_counter() + time_budget_s
    Y = start
    if any(I + O - 1 > M for I, O, _ in classes):
        raise ValueError(f"a request needs more than M={M} KV: no batch count is possible")
    while (left := deadline - time.perf_counter()) > 0:
        if solve(packing_model(classes, M, R_max, Y), left).status != "infeasible":
            break
        Y += 1
    return Y
