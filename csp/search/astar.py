"""Exact best-first search over class states: the optimum for interchangeable requests, no MILP.

:func:`exact_search` is A* over :class:`.classstate.ClassStateSpace` (the
states, moves and admissible bound are described there), from "all waiting" to
"all done", dropping states whose f = g + h cannot beat a known schedule; h is
raised by the trajectory LP's Lagrangian tables (:mod:`.trajectorybound`) where
they are built. It is anytime: stopped early, the least f on the open list (or
the LP's root bound, if higher) is still a valid lower bound on every schedule.
It is exponential in the number of requests: on I = O = 16, M = 128 it proves
B = 7 in about a second and B = 8 in under a minute (see benchmarks/milp_bench.py);
:func:`pilot_search` and :func:`beam_search` supply the incumbent.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from infermax.costmodel import CostModel, linear_coefficients
from infermax.types import Limits, Schedule, Workload

from ..milp.aggregate import chunking_bound_holds
from ..milp.policy import Policy
from .batchtable import RemainingBatches
from .classstate import ClassStateSpace, to_schedule
from .trajectorybound import TrajectoryBound


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """schedule: an optimal schedule (None if the search stopped early or found nothing below ``upper_s``);
    value_s: the search's price of it; bound_s: a valid lower bound
    on the latency of every schedule; is_complete: the search ran to the end; effort counters;
    trajectory_lp: what the trajectory LP's tables gave, if built (batch counts, root bound, whether
    column generation converged, build time)."""

    schedule: Schedule | None
    value_s: float | None
    bound_s: float
    is_complete: bool
    num_expanded: int
    num_generated: int
    wall_s: float
    trajectory_lp: dict | None = None


def is_applicable(workload: Workload, limits: Limits, cost: CostModel, policy: Policy) -> tuple[bool, str]:
    """(ok, why not): offline, a linear cost model, refills never cheaper per item than decodes, and —
    with chunked prefill allowed — the chunking bound of :mod:`.aggregate`."""
    if not workload.is_offline:
        return False, "the workload has arrival times (the class state has no clock)"
    if limits.block_size > 1:
        return False, f"Limits.block_size = {limits.block_size} > 1 (the class state counts KV in tokens)"
    try:
        k = linear_coefficients(cost, "the class-state search")
    except ValueError as exc:
        return False, str(exc)
    b_min = min(b for _, b in k.nonattn_lines)
    for L in range(int(workload.input_lens.min()) + 1, int((workload.input_lens + workload.output_lens).max())):
        refill_extra = b_min * (L - 1) + k.prefill_attn_s * (L * L + L) / 2 + k.prefill_token_s * L
        if refill_extra < k.decode_kv_s * L:
            return False, f"a refill of {L} tokens is cheaper than its decode under this cost model"
    if policy.chunked_prefill and not chunking_bound_holds(limits, cost):
        return False, "chunked prefill may pay here (needs M <= C, M <= P and linear time up to M tokens)"
    return True, ""


def exact_search(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, upper_s: float,
                 time_budget_s: float = 30.0, rel_gap: float = 0.0, min_batches: int = 0,
                 rest: "RemainingBatches | None" = None, max_states: int = 5_000_000,
                 cut_successors: bool = True, lp_budget_s: float = 0.0, refine_lp: bool = False) -> SearchResult:
    """A* from the start state to the goal (module docstring); ``limits`` are the policy's effective limits.

    upper_s: the latency of a known schedule (states that cannot beat it by half ``rel_gap`` are dropped);
    min_batches: a known lower bound on the batch count; rest: the relaxation's exact batches left
    (:class:`.batchtable.RemainingBatches`), the strongest part of the bound where it can be built.
    cut_successors: let :meth:`.classstate.ClassStateSpace.successors` drop batches that cannot beat the
    cutoff before enumerating their evictions, and enumerate only batches leaving one batch fewer when
    no other can beat it (same result; off only to measure what it buys).
    lp_budget_s: time for the trajectory LP's Lagrangian tables (:mod:`.trajectorybound`), which raise the
    bound of every state by pricing residency (0: none; needs OR-Tools). refine_lp: spend what the
    trajectory LPs leave of that time on configuration LPs (:mod:`.configlp`; needs HiGHS).
    Long because it is the A* loop itself (set-up, goal, budget, expansion), kept in one piece as the hot
    loop of the exact search.
    """
    ok, why = is_applicable(workload, limits, cost, policy)
    if not ok:
        raise ValueError(f"exact_search does not apply: {why}")
    t0 = time.perf_counter()
    sp = ClassStateSpace(workload, limits, cost, policy, min_batches, rest)
    cutoff = upper_s * (1 - rel_gap / 2)     # finishing without a path proves a gap of rel_gap / 2 < rel_gap
    lp = root = None
    if lp_budget_s > 0:
        tb = sp.trajectories = TrajectoryBound(sp, min_batches, cutoff, lp_budget_s, refine=refine_lp)
        root = tb.root_bound
        lp = {"batch_counts": sorted(tb.tables), "root_bound_s": root, "converged": tb.is_converged,
              "wall_s": round(tb.wall_s, 3),
              "refined": {y: {"bound_s": b, "converged": c} for y, (b, c) in sorted(tb.refined.items())}}
    best = {sp.start: 0.0}
    parent: dict[tuple, tuple] = {}
    heap = [(sp.bound(sp.start, 0), 0.0, 0, sp.start)]
    expanded = generated = 0
    while heap:
        f, g, k, s = heap[0]
        if s == sp.goal:
            moves = []
            while s in parent:
                s, move = parent[s]
                moves.append(move)
            return SearchResult(schedule=to_schedule(sp, moves[::-1], workload), value_s=g, bound_s=g,
                                is_complete=True, num_expanded=expanded, num_generated=generated,
                                wall_s=time.perf_counter() - t0, trajectory_lp=lp)
        if time.perf_counter() - t0 > time_budget_s or len(best) > max_states:
            return SearchResult(schedule=None, value_s=None, bound_s=min(f if root is None else max(f, root), upper_s),
                                is_complete=False, num_expanded=expanded, num_generated=generated,
                                wall_s=time.perf_counter() - t0, trajectory_lp=lp)
        heapq.heappop(heap)
        if g > best[s]:
            continue
        expanded += 1
        for ns, dt, move in sp.successors(s, budget=cutoff - g if cut_successors else math.inf, spent=k + 1):
            ng = g + dt
            if ng < best.get(ns, math.inf):
                fv = ng + sp.bound(ns, k + 1)
                if fv > cutoff:
                    continue
                best[ns] = ng
                parent[ns] = (s, move)
                generated += 1
                heapq.heappush(heap, (fv, ng, k + 1, ns))
    # nothing beats the known schedule by rel_gap / 2: its latency, less that, is a bound
    return SearchResult(schedule=None, value_s=None, bound_s=cutoff, is_complete=True, num_expanded=expanded,
                        num_generated=generated, wall_s=time.perf_counter() - t0, trajectory_lp=lp)


def _width_space(name: str, workload: Workload, limits: Limits, cost: CostModel, policy: Policy, width: int,
                 rest: "RemainingBatches | None") -> ClassStateSpace:
    ok, why = is_applicable(workload, limits, cost, policy)
    if not ok:
        raise ValueError(f"{name} does not apply: {why}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    return ClassStateSpace(workload, limits, cost, policy, 0, rest)


def _full_batches(sp: ClassStateSpace, layer: dict) -> dict:
    """state -> (g, link) one full batch after ``layer`` (state -> (g, link)); link = (move, parent link)."""
    nxt: dict = {}
    for s, (g, link) in layer.items():
        for ns, dt, move in sp.successors(s, greedy=True):
            if ns not in nxt or g + dt < nxt[ns][0]:
                nxt[ns] = (g + dt, (move, link))
    return nxt


def _unwind(link) -> list:
    """The moves of a link chain, first batch first."""
    moves = []
    while link is not None:
        move, link = link
        moves.append(move)
    return moves[::-1]


def beam_search(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, width: int = 64,
                time_budget_s: float = 10.0, rest: "RemainingBatches | None" = None) -> tuple[Schedule, float] | None:
    """A good schedule fast: keep the ``width`` states of least g + h after each batch (not exact).

    Returns (schedule, search value) or None when every state of a layer was dropped or time ran out
    before any reached the goal. Used as the upper bound (and MILP hint) where :func:`exact_search`
    cannot finish.
    """
    t0 = time.perf_counter()
    sp = _width_space("beam_search", workload, limits, cost, policy, width, rest)
    layer = {sp.start: (0.0, None)}         # state -> (g, link); link = (move, parent link)
    k = 0
    while layer and time.perf_counter() - t0 <= time_budget_s:
        if sp.goal in layer:
            g, link = layer[sp.goal]
            return to_schedule(sp, _unwind(link), workload), g
        k += 1
        nxt = _full_batches(sp, layer)
        ranked = heapq.nsmallest(width, nxt.items(), key=lambda kv: kv[1][0] + sp.bound(kv[0], k))
        layer = dict(ranked)
    return None


def rollout(sp: ClassStateSpace, s: tuple, evict_largest: bool, moves: list | None = None) -> float | None:
    """Finish from ``s`` by a fixed rule; its time (None if the rule gets stuck or does not apply).

    Each batch decodes every resident request; if their KV exceeds M (or they exceed R_max),
    residents are evicted one at a time — largest KV first when ``evict_largest``, else smallest —
    until the rest fit; then waiting requests are (re)filled, fewest tokens first, while they fit in
    M, C, P and R_max. The rule never idles a resident, so it needs eviction and hybrid batches.
    The rule is deterministic, so the time from every state it passes is remembered on ``sp``.
    ``moves``: if a list, the batches are appended to it in :func:`.classstate.to_schedule`'s format.
    """
    if not (sp.evict and sp.hybrid):
        return None
    memo = sp.memo.setdefault(("rollout", evict_largest), {})
    path = []
    state = s
    while state != sp.goal and (moves is not None or state not in memo):
        step = _rule_batch(sp, state, evict_largest)
        if step is None:
            memo.update((st, None) for st, _ in path)
            memo[state] = None
            return None
        nxt, dt, move = step
        path.append((state, dt))
        if moves is not None:
            moves.append(move)
        state = nxt
    total = 0.0 if state == sp.goal else memo[state]
    if total is None:
        return None
    for st, dt in reversed(path):
        total += dt
        memo[st] = total
    return total


# complexity: the rollout rule's decisions in order: decodes, evictions while M or R_max overflow, then fills
def _rule_batch(sp: ClassStateSpace, state: tuple, evict_largest: bool):
    """(next state, batch time, move) of :func:`rollout`'s rule from ``state``, or None if nothing can run.

    Its branches are the rule's three steps in order (decode every resident, evict until they fit, fill
    the waiting), inlined because rollouts run it once per batch of every scored state."""
    order = sp.memo.get("rule order")
    if order is None:
        slots = sp.slots
        res = sorted(((q, sl[3]) for q, sl in enumerate(slots) if sl[1] and sl[2] > 0), key=lambda x: x[1])
        waiting = sorted(((q, sl[3]) for q, sl in enumerate(slots) if not sl[1]), key=lambda x: x[1])
        order = sp.memo["rule order"] = (res, res[::-1], waiting)
    res_small, res_large, waiting = order
    M, R_max = sp.M, sp.R_max
    run = {}
    mem = count = 0
    for q, L in res_small:
        n = state[q]
        if n:
            run[q] = n
            mem += n * L
            count += n
    evicted = []
    if mem > M or count > R_max:
        for q, L in (res_large if evict_largest else res_small):
            n = run.get(q, 0)
            if not n:
                continue
            e = min(n, max(-(-(mem - M) // L), count - R_max))   # fewest of this group that make room
            run[q] = n - e
            evicted.append((q, e))
            mem -= e * L
            count -= e
            if mem <= M and count <= R_max:
                break
    dec_n, dec_kv = count, mem
    taken = [(q, n) for q, n in run.items() if n]
    fill_tok = 0
    work = 0.0
    for q, L in waiting:
        n = state[q]
        if not n:
            continue
        n = min(n, (M - mem) // L, (sp.P - fill_tok) // L, (sp.C - dec_n - fill_tok) // L, R_max - count)
        if n > 0:
            taken.append((q, n))
            mem += n * L
            count += n
            fill_tok += n * L
            work += n * sp.slot_fill_work[q]
    if count == 0:
        return None
    dt = sp.batch_time(dec_n + fill_tok, count, dec_n, dec_kv, count - dec_n, fill_tok, work)
    taken, evicted = tuple(taken), tuple(evicted)
    return sp.advance(state, taken, evicted), dt, (taken, evicted, False)


def pilot_search(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, width: int = 4,
                 time_budget_s: float = 10.0) -> tuple[Schedule, float] | None:
    """A good schedule by the pilot method: a beam whose states are ranked by a completed schedule.

    After each batch, every full batch (:meth:`.classstate.ClassStateSpace.successors` with
    ``greedy``) from the ``width`` kept states is scored by its time so far plus the better of two
    :func:`rollout` completions, and the ``width`` best are kept. The best completed schedule seen
    is returned with its search value — it is never worse than the rollouts from the start. Unlike
    :func:`beam_search`, whose ranking trusts the lower bound (blind to refills and prefill biases to
    come), the pilot's ranking prices them. None if the rule does not apply (no eviction or no
    hybrid batches) or gets stuck from the start; the start's rollouts always finish, whatever the
    time budget.
    """
    t0 = time.perf_counter()
    sp = _width_space("pilot_search", workload, limits, cost, policy, width, None)

    def score(s: tuple) -> tuple[float, bool] | None:
        vals = [(v, rule) for rule in (True, False) if (v := rollout(sp, s, rule)) is not None]
        return min(vals) if vals else None

    first = score(sp.start)
    if first is None:
        return None
    best = (first[0], None, sp.start, first[1])            # value, link to s, s, rollout rule
    layer = {sp.start: (0.0, None)}
    while layer and time.perf_counter() - t0 <= time_budget_s:
        nxt = _full_batches(sp, layer)
        ranked = []
        for ns, (g, link) in nxt.items():
            sc = score(ns)
            if sc is not None:
                ranked.append((g + sc[0], ns, sc[1]))
                if g + sc[0] < best[0]:
                    best = (g + sc[0], link, ns, sc[1])
            if time.perf_counter() - t0 > time_budget_s:
                break
        ranked.sort(key=lambda r: r[0])
        layer = {ns: nxt[ns] for _, ns, _ in ranked[:width] if ns != sp.goal}
    value, link, s, rule = best
    moves = _unwind(link)
    rollout(sp, s, rule, moves)
    return to_schedule(sp, moves, workload), value
