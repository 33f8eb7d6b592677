"""Exact best-first search over class states: the optimum for interchangeable requests, no MILP.

:func:`exact_search` is A* over :class:`.classstate.ClassStateSpace` (the
states, moves and admissible bound are described there), from "all waiting" to
"all done", dropping states whose f = g + h cannot beat a known schedule. It
is anytime: stopped early, the least f on the open list is still a valid lower
bound on every schedule. It is exponential in the number of requests: on
I = O = 16, M = 128 it proves B = 7 in seconds and stops short from B = 8 (see
benchmarks/milp_bench.py); :func:`beam_search` then supplies the incumbent.
"""
from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass

from infermax.costmodel import CostModel
from infermax.types import Limits, Schedule, Workload

from .aggregate import chunking_bound_holds
from .batchcount import RemainingBatches
from .classstate import ClassStateSpace, to_schedule
from .objectives import linear_coefficients
from .policy import Policy


@dataclass(frozen=True, kw_only=True, slots=True)
class SearchResult:
    """schedule: an optimal schedule (None if the search stopped early or found nothing below ``upper_s``);
    value_s: the search's price of it (a lower bound when fills are relaxed); bound_s: a valid lower bound
    on the latency of every schedule; is_complete: the search ran to the end; effort counters."""

    schedule: Schedule | None
    value_s: float | None
    bound_s: float
    is_complete: bool
    num_expanded: int
    num_generated: int
    wall_s: float


def is_applicable(workload: Workload, limits: Limits, cost: CostModel, policy: Policy) -> tuple[bool, str]:
    """(ok, why not): offline, a linear cost model, refills never cheaper per item than decodes, and —
    with chunked prefill allowed — the chunking bound of :mod:`.aggregate`."""
    if not workload.is_offline:
        return False, "the workload has arrival times (the class state has no clock)"
    try:
        k = linear_coefficients(cost)
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
                 rest: "RemainingBatches | None" = None, max_states: int = 5_000_000) -> SearchResult:
    """A* from the start state to the goal (module docstring); ``limits`` are the policy's effective limits.

    upper_s: the latency of a known schedule (states that cannot beat it by half ``rel_gap`` are dropped);
    min_batches: a known lower bound on the batch count; rest: the relaxation's exact batches left
    (:class:`.batchcount.RemainingBatches`), the strongest part of the bound where it can be built.
    """
    ok, why = is_applicable(workload, limits, cost, policy)
    if not ok:
        raise ValueError(f"exact_search does not apply: {why}")
    t0 = time.perf_counter()
    sp = ClassStateSpace(workload, limits, cost, policy, min_batches, rest)
    cutoff = upper_s * (1 - rel_gap / 2)     # finishing without a path proves a gap of rel_gap / 2 < rel_gap
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
                                wall_s=time.perf_counter() - t0)
        if time.perf_counter() - t0 > time_budget_s or len(best) > max_states:
            return SearchResult(schedule=None, value_s=None, bound_s=min(f, upper_s), is_complete=False,
                                num_expanded=expanded, num_generated=generated, wall_s=time.perf_counter() - t0)
        heapq.heappop(heap)
        if g > best[s]:
            continue
        expanded += 1
        for ns, dt, move in sp.successors(s):
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
                        num_generated=generated, wall_s=time.perf_counter() - t0)


def beam_search(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, width: int = 64,
                time_budget_s: float = 10.0, rest: "RemainingBatches | None" = None) -> tuple[Schedule, float] | None:
    """A good schedule fast: keep the ``width`` states of least g + h after each batch (not exact).

    Returns (schedule, search value) or None when every state of a layer was dropped or time ran out
    before any reached the goal. Used as the upper bound (and MILP hint) where :func:`exact_search`
    cannot finish.
    """
    ok, why = is_applicable(workload, limits, cost, policy)
    if not ok:
        raise ValueError(f"beam_search does not apply: {why}")
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    t0 = time.perf_counter()
    sp = ClassStateSpace(workload, limits, cost, policy, 0, rest)
    layer = {sp.start: (0.0, None)}         # state -> (g, link); link = (move, parent link)
    k = 0
    while layer and time.perf_counter() - t0 <= time_budget_s:
        if sp.goal in layer:
            g, link = layer[sp.goal]
            moves = []
            while link is not None:
                move, link = link
                moves.append(move)
            return to_schedule(sp, moves[::-1], workload), g
        k += 1
        nxt: dict = {}
        for s, (g, link) in layer.items():
            for ns, dt, move in sp.successors(s, greedy=True):
                ng = g + dt
                if ns not in nxt or ng < nxt[ns][0]:
                    nxt[ns] = (ng, (move, link))
        ranked = heapq.nsmallest(width, nxt.items(), key=lambda kv: kv[1][0] + sp.bound(kv[0], k))
        layer = dict(ranked)
    return None
