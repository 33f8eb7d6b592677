"""The aggregated model: class flows alone, with no per-request variables (a decomposition).

For the latency objective of an offline workload, requests with the same
(I, O) are interchangeable, so a schedule *without chunked prefill* is fully
described by the class flows of :mod:`.flows`: counts of requests decoding,
idling, being evicted or (re)filling whole at each token level in each batch.
Every quantity of the cost model is then linear in the counts — tokens,
decode KV read Σ(I+t), causal prefill work L(L+1)/2 per whole (re)fill of
L = I+t — so the model has no big-M, no product and no symmetry, and any
integer solution decomposes into per-request paths (:func:`to_schedule`).

It is exact for the no-chunked-prefill class, and for the unconstrained
problem too when M <= C, M <= P and the non-attention time is linear up to M
tokens: then moving a partial chunk into the batch that completes its
(re)fill keeps every limit (a batch never processes more tokens than it holds
KV, N <= M), leaves the non-attention time and the causal prefill work (L(L+1)/2
for a fill of L, whatever the chunks) unchanged, and can only drop a batch, a
prefill bias or a request slot — so some optimal schedule fills whole.
"""
from __future__ import annotations

import math
from collections import deque

import numpy as np

from infermax.costmodel import CostModel, linear_coefficients
from infermax.types import Batch, Limits, Schedule, Workload

from .flows import class_flow
from .formulation import Formulation, empty_formulation, num_identical_classes
from .model import LinExpr
from .objectives import MAKESPAN, nonattention_segments
from .policy import Policy
from .strengthening import batch_count_lower_bound
from .trajectory import trajectory


def chunking_bound_holds(limits: Limits, cost: CostModel) -> bool:
    """Whether some optimal schedule fills whole, so whole fills bound every chunked schedule (module doc)."""
    k = linear_coefficients(cost, "the MILP")
    _, segs = nonattention_segments(k.nonattn_lines, limits.C)
    return limits.M <= limits.C and limits.M <= limits.P and segs[0][0] >= limits.M


def is_applicable(workload: Workload, objective: str) -> bool:
    return objective in MAKESPAN and workload.is_offline


# complexity: the model's row families side by side, one branch per arc kind, as the docstring lists
def build_aggregate(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, horizon: int,
                    min_batches: int = 0, exact_batches: bool = False,
                    deadline: float = math.inf) -> Formulation:
    """The class-flow model (whole fills; see the module docstring for when that bounds chunked schedules).

    min_batches: a known lower bound on the number of batches (e.g. from :func:`probe_batch_count`);
    exact_batches: every batch of the horizon is non-empty. Building stops with
    :class:`.budget.BudgetExhausted` once ``deadline`` (``time.perf_counter()``) passes.
    Long because it writes the whole model in the order of the module docstring (variables, conservation,
    per-batch rows, objective), each family commented, like :mod:`.formulation` but in one place.
    """
    fm = empty_formulation(workload, limits, cost, policy, horizon, "latency")
    fm.model.deadline = deadline
    m, J, lim = fm.model, horizon, fm.limits
    k = linear_coefficients(cost, "the MILP")
    v = fm.v
    v.classes = num_identical_classes(workload)
    v.flows = []
    f0, segs = nonattention_segments(k.nonattn_lines, lim.C)
    v.y = [m.bool_var(f"y[{j}]") for j in range(J)]
    v.yd = [m.bool_var(f"yd[{j}]") for j in range(J)]
    v.yp = [m.bool_var(f"yp[{j}]") for j in range(J)]
    v.seg = [[m.int_var(0, L, f"seg[{j},{q}]") for q, (L, _) in enumerate(segs)] for j in range(J)]
    lb_y = horizon if exact_batches else max(batch_count_lower_bound(workload, lim), min_batches)
    fm.info["batch_count_lb"] = lb_y
    objective = LinExpr()
    batch = [dict(tokens=LinExpr(), prefill=LinExpr(), mem=LinExpr(), holders=LinExpr(), dec=LinExpr(),
                  pre=LinExpr(), items=[]) for _ in range(J)]
    I_min = int(workload.input_lens.min())
    for cls in v.classes:
        r = workload.requests[cls[0]]
        n, I, O = len(cls), r.input_len, r.output_len
        F = class_flow(fm, cls, n, I, O, policy.allow_eviction)
        v.flows.append(F)
        for j in range(J):
            b = batch[j]
            for t in range(O):
                fill = F.XP[t][j] + F.EC[t][j]                 # whole (re)fills of I + t tokens
                L = I + t
                b["tokens"] = b["tokens"] + F.XD[t][j] + L * fill
                b["prefill"] = b["prefill"] + L * fill
                b["mem"] = b["mem"] + L * (F.XD[t][j] + fill) + ((L - 1) * F.H[t][j] if t else 0)
                b["holders"] = b["holders"] + F.XD[t][j] + fill + (F.H[t][j] if t else 0)
                b["dec"] = b["dec"] + F.XD[t][j]
                b["pre"] = b["pre"] + fill
                b["items"] += [(L, F.XD[t][j] + fill)] + ([(L - 1, 1.0 * F.H[t][j])] if t else [])
                work = (L * L + L) / 2                        # causal pairs of a whole fill of L
                objective = objective + k.decode_kv_s * L * F.XD[t][j] + k.prefill_attn_s * work * fill
                objective = objective + getattr(k, "prefill_token_s", 0.0) * L * fill
    num_dec = max(1, lim.M // (I_min + 1))
    num_gen = max(1, lim.M // I_min)
    for j in range(J):
        b, y = batch[j], v.y[j]
        m.add(b["mem"] <= lim.M * y, "agg-memory")
        for theta in sorted({w for w, _ in b["items"]}):
            cap = lim.M // theta              # at most ⌊M/θ⌋ requests holding >= θ KV fit in a batch
            if cap < len(workload):
                m.add(sum((x for w, x in b["items"] if w >= theta), LinExpr()) <= cap * y, "agg-count")
        m.add(b["tokens"] <= lim.C * y, "agg-tokens")
        m.add(b["prefill"] <= lim.P, "agg-prefill")
        if lim.R_max is not None:
            m.add(b["holders"] <= lim.R_max, "agg-running")
        m.add(y <= b["dec"] + b["pre"], "agg-batch")
        m.add(b["dec"] <= min(num_dec, len(workload)) * v.yd[j], "agg-bias")
        m.add(b["pre"] <= min(num_gen, len(workload)) * v.yp[j], "agg-bias")
        m.add(v.yd[j] + v.yp[j] >= y, "agg-bias")
        m.add(v.yd[j] <= y, "agg-bias")
        m.add(v.yp[j] <= y, "agg-bias")
        if not policy.hybrid:
            m.add(v.yd[j] + v.yp[j] <= 1, "policy")
        m.add(sum(v.seg[j][1:], 1.0 * v.seg[j][0]) == b["tokens"], "agg-tokens")
        for q, (L, slope) in enumerate(segs):
            m.add(v.seg[j][q] <= L * y, "agg-segment")
            objective = objective + slope * v.seg[j][q]
        objective = objective + f0 * y + k.decode_bias_s * v.yd[j] + k.prefill_bias_s * v.yp[j]
        # request_s · R: merging a chunk never adds a request to a batch, so the relaxation stays a bound
        objective = objective + k.request_s * (b["dec"] + b["pre"])
        if j + 1 < J:
            m.add(y >= v.y[j + 1], "batch-order")
        if j < lb_y:
            m.lb[y.index] = 1.0
    m.add(sum(v.y[1:], 1.0 * v.y[0]) >= lb_y, "cut-batches")
    m.minimize(objective)
    fm.info["objective_expr"] = objective
    return fm


def probe_batch_count(workload: Workload, limits: Limits, cost: CostModel, policy: Policy, start: int,
                      stop: int, solve, time_limit_s: float) -> int:
    """The smallest Y in [start, stop] for which a schedule with exactly Y batches is not ruled out.

    Each probe asks the backend for *any* aggregated schedule with exactly Y non-empty batches.
    When the class flows bound the problem (no chunking, or the chunking bound of the module
    docstring), a proven-infeasible probe means no schedule at all has <= Y batches (merging
    chunks never adds a batch), so the answer is a valid lower bound on the batch count.
    """
    for Y in range(start, stop + 1):
        fm = build_aggregate(workload, limits, cost, policy, Y, exact_batches=True)
        fm.model.minimize(LinExpr())
        if solve(fm.model, time_limit_s).status != "infeasible":
            return Y
    return stop + 1


# complexity: one loop per class, batch and arc kind (XD, XP, EW, EC) a class path takes
def to_schedule(fm: Formulation, values: np.ndarray, meta: dict) -> Schedule:
    """Decompose the class flows of a solution into per-request paths (any order within a class).

    Its branches are the arc kinds of a batch (decode, refill, fill, evict, hold), each moving requests
    between queues; they read top to bottom."""
    ids = fm.workload.ids
    J = fm.horizon
    val = lambda var: int(round(values[var.index]))
    per_batch: list[dict[int, tuple[int, bool]]] = [dict() for _ in range(J)]   # index -> (tokens, evicted)
    for F in fm.v.flows:
        resident = [deque() for _ in range(F.O + 1)]
        waiting = [deque() for _ in range(F.O)]
        waiting[0].extend(F.cls)
        for j in range(J):
            moves = []
            for t in range(F.O):
                L = F.I + t
                for arc, src, dst, tokens, evicted in (("XD", resident, resident, 1, False),
                                                       ("EC", resident, resident, L, True),
                                                       ("EW", resident, waiting, 0, True),
                                                       ("XP", waiting, resident, L, False)):
                    for _ in range(val(getattr(F, arc)[t][j])):
                        i = src[t].popleft()
                        if tokens or evicted:
                            per_batch[j][i] = (tokens, evicted)
                        moves.append((dst, t + 1 if tokens else t, i))
            for dst, level, i in moves:
                dst[level].append(i)
    batches = []
    for j in range(J):
        act = per_batch[j]
        run = sorted(i for i, (c, _) in act.items() if c > 0)
        if not run:
            continue
        ev = sorted(i for i, (_, e) in act.items() if e)
        batches.append(Batch(ids=ids[run], tokens=np.array([act[i][0] for i in run]), evict=ids[ev]))
    return Schedule(tuple(batches), meta)


def assign_aggregate(fm: Formulation, schedule: Schedule) -> np.ndarray:
    """Values of every aggregated variable for a schedule without chunked prefill."""
    from .flows import assign_flows

    w, v, J = fm.workload, fm.v, fm.horizon
    tr = trajectory(schedule, w, fm.limits, fm.cost)
    n = tr.c.shape[1]
    if n > J:
        raise ValueError(f"schedule has {n} batches > horizon {J}")
    pad = J - n
    P = lambda a: np.pad(a, ((0, 0), (0, pad)), mode="edge")
    Z = lambda a: np.pad(a, ((0, 0), (0, pad)))
    m, inp, gen = P(tr.m), P(tr.inp), P(tr.gen)
    c, e = Z(tr.c), Z(tr.e)
    fin = (gen == w.output_lens[:, None]).astype(np.int64)
    D = ((m >= inp) & (m > 0) & (fin == 0)).astype(np.int64)
    g = gen[:, 1:] - gen[:, :-1]
    x = np.full(fm.model.num_vars, np.nan)
    assign_flows(fm, x, gen, D, fin, e, g)
    dec = Z(tr.decode.astype(np.int64)) * (1 - e) * (c > 0)
    segs = [fm.model.ub[s.index] for s in v.seg[0]]
    for j in range(J):
        x[v.y[j].index] = float((c[:, j] > 0).any())
        x[v.yd[j].index] = float(dec[:, j].any())
        x[v.yp[j].index] = float(((c[:, j] > 0) & (dec[:, j] == 0)).any())
        left = int(c[:, j].sum())
        for q, L in enumerate(segs):
            x[v.seg[j][q].index] = min(L, left)
            left -= min(L, left)
    missing = np.flatnonzero(np.isnan(x))
    if missing.size:
        raise RuntimeError(f"assign_aggregate left {missing.size} variables unset")
    return x
