"""What makes the direct encoding of §3.3 solvable: valid inequalities, symmetry, dominance.

None of these change the set of optimal values; each is measured in
``benchmarks/milp_bench.py``.

- Bin-packing bounds. In the batch that generates token t of request i the
  request holds exactly I_i + t - 1 KV tokens, and a batch holds at most M, so
  the "token items" w_it = I_i + t - 1 are packed into batches. A dual-feasible
  function f (Fekete & Schepers: u_k(x) = x if (k+1)x is integral, else
  floor((k+1)x)/k) turns Σ w <= M into Σ f(w/M) <= 1, which yields both a
  constant lower bound on the number of batches and per-batch cuts
  Σ_i f(k_ij/M) <= y_j whose left side is bounded below through the state
  (generating with G_is >= τ, or holding decode KV without being evicted).
  Split by phase the same cut bounds the decode and prefill indicators.
- Valid inequalities: Σ_j c_ij = Pk_i + Σ_j ev_ij (every KV entry is computed
  once more than it is discarded), Σ_j cz_ij >= O_i, memory-time
  Σ_j k_ij >= Σ_t w_it, yd_j + yp_j >= y_j, evicted KV >= I_i + t - 1 when
  G >= t, decode KV read and phase KV in tight big-M form, prefill tokens <=
  min(P, M)·yp_j, segment s_jq <= L_q·y_j, and perspective tangents of the
  evictions' squares, qe >= 2a·ev - a²·e (ev = 0 unless e = 1), which charge a
  fractional eviction as if it were whole. Online, the last batch ends no earlier than T_i
  plus what request i alone puts into the times of its batches (f(0), its
  tokens at the first slope, its decode or prefill bias, its decode KV and
  prefill work): those batches start after its arrival, one after another.
- Symmetry: interchangeable requests (same I, O, arrival) are ordered
  lexicographically by their progress vectors (G_i1, …, G_iJ), or by completion.
- Dominance (objectives monotone in batch time only): never evict a request in
  prefill phase — its partial KV could simply not have been computed.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import numpy as np

from infermax.types import Limits, Workload

from .formulation import Formulation, num_identical_classes
from .model import LinExpr
from .objectives import own_batch_time

SYMMETRY_MODES = ("none", "completion", "lex")


# --- dual-feasible functions ------------------------------------------------------------
def dff_value(k: int, w: int, M: int) -> Fraction:
    """u_k(w/M): the Fekete–Schepers dual-feasible function (k >= 1)."""
    x = Fraction(w, M)
    if ((k + 1) * x).denominator == 1:
        return x
    return Fraction(math.floor((k + 1) * x), k)


def dff_levels(k: int, M: int, max_w: int) -> list[tuple[int, Fraction]]:
    """(threshold, increment) pairs: u_k(w/M) = Σ_{threshold <= w} increment for 1 <= w <= max_w."""
    out, prev = [], Fraction(0)
    for w in range(1, max_w + 1):
        val = dff_value(k, w, M)
        if val != prev:
            out.append((w, val - prev))
            prev = val
    return out


def token_items(workload: Workload) -> list[int]:
    """KV held by each request in the batch generating each of its tokens: I + t - 1."""
    return [int(I) + t for I, O in zip(workload.input_lens, workload.output_lens) for t in range(int(O))]


def best_dff(workload: Workload, M: int, max_k: int = 12) -> tuple[int, Fraction]:
    """The k whose u_k gives the largest Σ over token items (the best batch-count bound).

    Exact, in integers: Σ u_k(w/M) = (Σ of the w with (k+1)w/M integral) / M + (Σ of the others'
    ⌊(k+1)w/M⌋) / k — the sum of :func:`dff_value` over the items, without a Fraction per item."""
    w, mult = _item_counts(workload)
    best = (1, Fraction(-1))
    for k in range(1, max_k + 1):
        scaled = (k + 1) * w
        whole = scaled % M == 0
        total = Fraction(int((w * mult)[whole].sum()), M) + Fraction(int(((scaled // M) * mult)[~whole].sum()), k)
        if total > best[1]:
            best = (k, total)
    return best


def _item_counts(workload: Workload) -> tuple[np.ndarray, np.ndarray]:
    """The distinct token items of :func:`token_items` (ascending, int64) and how often each occurs: request
    i holds I_i, ..., I_i + O_i - 1, built from the requests' ranges, not item by item."""
    I = workload.input_lens.astype(np.int64)
    O = workload.output_lens.astype(np.int64)
    top = int((I + O).max()) + 1
    diff = np.zeros(top + 1, dtype=np.int64)
    np.add.at(diff, I, 1)
    np.add.at(diff, I + O, -1)
    counts = np.cumsum(diff)[:top]
    w = np.flatnonzero(counts)
    return w.astype(np.int64), counts[w]


def batch_count_lower_bound(workload: Workload, limits: Limits) -> int:
    """A lower bound on the number of non-empty batches of any schedule (valid for all objectives).

    max of: max_i O_i (one token per request per batch), ⌈Σ O_i / R_max⌉,
    ⌈Σ Pk_i / C⌉ (every KV entry is computed at least once), and the best
    dual-feasible-function bound over token items (memory M).
    """
    O = workload.output_lens
    Pk = workload.input_lens + O - 1
    bounds = [int(O.max()), math.ceil(int(Pk.sum()) / limits.C), best_dff_bound(workload, limits.M)]
    if limits.R_max is not None:
        bounds.append(math.ceil(int(O.sum()) / limits.R_max))
    return max(bounds)


def best_dff_bound(workload: Workload, M: int) -> int:
    """The best of: ⌈Σ w / M⌉, the best u_k's ⌈Σ u_k(w/M)⌉, and for each item size eps <= M/2 the
    Martello–Toth count (items > M - eps count 1, items in [eps, M - eps] count w/M) — exact in
    integers over the sorted distinct items and their prefix sums (O(n log n), not O(n²) Fractions)."""
    w, mult = _item_counts(workload)
    weight = w * mult
    best = -(-int(weight.sum()) // M)
    best = max(best, math.ceil(best_dff(workload, M)[1]))
    # suffix sums over the ascending items: count and weight of the items >= a threshold
    n_ge = np.concatenate([np.cumsum(mult[::-1])[::-1], [0]])
    w_ge = np.concatenate([np.cumsum(weight[::-1])[::-1], [0]])
    eps = w[2 * w <= M]
    lo = np.searchsorted(w, eps, side="left")              # first item >= eps
    hi = np.searchsorted(w, M - eps, side="right")         # first item > M - eps
    big = n_ge[hi]                                          # items > M - eps: one batch each
    small = w_ge[lo] - w_ge[hi]                             # Σ w over eps <= w <= M - eps
    if eps.size:
        best = max(best, int((big + -(-small // M)).max()))
    return best


# --- valid inequalities ------------------------------------------------------------------
def add_valid_inequalities(fm: Formulation, dominance: bool) -> None:
    """Work identity, per-request counts, memory-time, bias and KV links (see module docstring)."""
    m, v, J = fm.model, fm.v, fm.horizon
    lb_y = batch_count_lower_bound(fm.workload, fm.limits)
    fm.info["batch_count_lb"] = lb_y
    if lb_y > J:
        raise ValueError(f"horizon J = {J} is below the batch-count lower bound {lb_y}")
    for j in range(min(lb_y, J)):
        m.lb[v.y[j].index] = 1.0
    m.add(sum(v.y[1:], 1.0 * v.y[0]) >= lb_y, "cut-batches")
    cap = min(fm.limits.P, fm.limits.M)
    for j in range(J):
        m.add(v.yd[j] + v.yp[j] >= v.y[j], "cut-bias")
        prefill_tokens = sum((v.c[i][j] - v.dp[i][j] for i in range(fm.num_requests)), LinExpr())
        m.add(prefill_tokens <= cap * v.yp[j], "cut-bias")
        for q, (length, _) in enumerate(v.segs):
            m.add(v.seg[j][q] <= length * v.y[j], "cut-segment")
    for i in range(fm.num_requests):
        I, O, Pk = v.I[i], v.O[i], v.Pk[i]
        m.add(sum(v.c[i][1:], 1.0 * v.c[i][0]) == Pk + sum(v.ev[i][1:], 1.0 * v.ev[i][0]), "cut-work")
        m.add(sum(v.cz[i][1:], 1.0 * v.cz[i][0]) >= O, "cut-count")
        m.add(sum(v.k[i][1:], 1.0 * v.k[i][0]) >= O * I + O * (O - 1) // 2, "cut-memory-time")
        if v.end and fm.workload.arrivals_s[i] > 0:
            m.add(v.end[J - 1] >= float(fm.workload.arrivals_s[i]) + own_batch_time(fm, i), "cut-arrival")
        for j in range(J):
            s = j
            if fm.policy.allow_eviction:
                ed = v.e[i][j] if dominance else v.e[i][j] + v.D[i][s] - 1
                m.add(v.ev[i][j] >= (I + O - 1) * ed + v.G[i][s] - O, "cut-evicted-kv")
            m.add(v.kvd[i][j] >= (I + O) * v.dp[i][j] + v.G[i][s] - O, "cut-decode-kv")
            m.add(v.m[i][s] >= (I + O) * v.D[i][s] + v.G[i][s] - O - 1, "cut-phase-kv")
            m.add(v.m[i][s] <= I - 1 + v.G[i][s], "cut-phase-kv")
            if v.qe:                # ev² of the busy time's telescoped prefill work
                sq, x, on = v.qe[i][j], v.ev[i][j], v.e[i][j]
                m.add(sq >= x, "cut-square")
                for a in _tangent_points(int(m.ub[x.index])):     # perspective: x = 0 unless on = 1
                    m.add(sq >= 2 * a * x - a * a * on, "cut-square")


def _tangent_points(ub: int, num: int = 12) -> list[int]:
    """Where to place tangents of x² on [0, ub]: powers of two and an even grid."""
    pts = {2 ** b for b in range(1, max(1, ub).bit_length())}
    pts |= {round(ub * q / num) for q in range(1, num)}
    return sorted(a for a in pts if 1 < a < ub)


def add_thermometer(fm: Formulation) -> None:
    """gam_ist = [G_is >= t] (t = 1..O_i): G_is = Σ_t gam_ist, gam_ist >= gam_i,s-1,t,
    gam_ist <= gam_i,s-1,t-1 (one token per batch), gam_ist <= gam_is,t-1."""
    m, v, J = fm.model, fm.v, fm.horizon
    v.gam = []
    for i in range(fm.num_requests):
        O = v.O[i]
        rows = [[m.const(0, f"gam[{i},0,{t}]") for t in range(1, O + 1)]]
        for s in range(1, J + 1):
            gam = [m.int_var(1 if O - t >= J - s else 0, 1 if t <= s else 0, f"gam[{i},{s},{t}]")
                   for t in range(1, O + 1)]
            m.add(v.G[i][s] == sum(gam[1:], gam[0] * 1.0), "thermometer")
            for t in range(O):
                m.add(gam[t] >= rows[s - 1][t], "thermometer")
                if t > 0:
                    m.add(gam[t] <= rows[s - 1][t - 1], "thermometer")
                    m.add(gam[t] <= gam[t - 1], "thermometer")
            rows.append(gam)
        v.gam.append(rows)


# complexity: one loop per dual-feasible function and row family (all, decode, prefill)
def add_dff_cuts(fm: Formulation) -> None:
    """Σ_i u_k(k_ij/M) <= y_j (and the same over decode rows <= yd_j, prefill completions <= yp_j).

    u_k(k/M) = Σ_l Δ_l·[k >= θ_l]; each indicator z_ijl is only bounded below:
    z >= g_ij + [G_is >= θ_l - I_i] - 1 (the generated token's KV reaches θ_l) and
    z >= D_is - e_ij + [G_is >= θ_l - I_i + 1] - 1 (held decode KV reaches θ_l).
    Its branches are the three row families and which thresholds apply to a request.
    """
    m, v, J, M = fm.model, fm.v, fm.horizon, fm.limits.M
    if v.gam is None:
        add_thermometer(fm)
    kk, _ = best_dff(fm.workload, M)
    levels = dff_levels(kk, M, max(v.Pk))
    fm.info["dff_k"] = kk
    den = math.lcm(*(d.denominator for _, d in levels)) if levels else 1
    for j in range(J):
        s = j
        rows = {"all": LinExpr(), "decode": LinExpr(), "prefill": LinExpr()}
        for i in range(fm.num_requests):
            I, O, gam = v.I[i], v.O[i], v.gam[i][s]
            for theta, inc in levels:
                if theta > v.Pk[i]:
                    continue
                weight = int(inc * den)
                tau = theta - I                       # tokens generated before, for the new token's KV
                gen = {"all": v.g[i][j], "decode": v.dp[i][j], "prefill": v.g[i][j] - v.dp[i][j]}
                for kind, row_lit in gen.items():
                    z = m.bool_var(f"dff-{kind}[{i},{j},{theta}]")
                    lows = [row_lit if tau <= 0 else row_lit + gam[tau - 1] - 1]
                    if kind == "all" and tau + 1 <= O - 1:
                        hold = v.D[i][s] - v.e[i][j]
                        lows.append(hold if tau + 1 <= 1 else hold + gam[tau] - 1)
                    for low in lows:
                        m.add(z >= low, "cut-dff")
                    fm.derive(z, _max_of(lows))
                    rows[kind] = rows[kind] + weight * z
        for kind, ind in (("all", v.y[j]), ("decode", v.yd[j]), ("prefill", v.yp[j])):
            if rows[kind].terms:
                m.add(rows[kind] <= den * ind, "cut-dff")


def _max_of(exprs: list) -> "Callable[[np.ndarray], float]":
    lows = [LinExpr.of(e) for e in exprs]

    def value(x: np.ndarray) -> float:
        return float(max([0.0] + [lo.constant + sum(c * x[k] for k, c in lo.terms.items()) for lo in lows]))

    return value


def add_dominance(fm: Formulation) -> None:
    """e_ij <= D_is: only decode-phase requests are evicted (valid for monotone objectives)."""
    m, v = fm.model, fm.v
    for i in range(fm.num_requests):
        for j in range(fm.horizon):
            m.add(v.e[i][j] <= v.D[i][j], "dominance")


def add_symmetry_breaking(fm: Formulation, mode: str) -> None:
    """Order interchangeable requests: lexicographically by (G_i1..G_iJ), or by completion."""
    if mode not in SYMMETRY_MODES:
        raise ValueError(f"symmetry must be one of {', '.join(SYMMETRY_MODES)}, got {mode!r}")
    if mode == "none":
        return
    m, v, J = fm.model, fm.v, fm.horizon
    for group in num_identical_classes(fm.workload):
        for a, b in zip(group, group[1:]):
            if mode == "completion":
                for s in range(1, J + 1):
                    m.add(v.F[a][s] >= v.F[b][s], "symmetry")
                continue
            O = v.O[a]
            prev = None                                  # eq_s: G_a = G_b up to s
            for s in range(1, J + 1):
                diff = v.G[a][s] - v.G[b][s]
                if prev is None:
                    m.add(diff >= 0, "symmetry")
                else:
                    m.add(diff >= -O * (1 - prev), "symmetry")
                eq = m.bool_var(f"lexeq[{a},{s}]")
                fm.derive(eq, lambda x, p=prev, ga=v.G[a][s].index, gb=v.G[b][s].index:
                          float((1.0 if p is None else x[p.index]) * (x[ga] == x[gb])))
                if prev is not None:
                    m.add(eq <= prev, "symmetry")
                    m.add(eq >= (O + 1) * prev - diff - O, "symmetry")
                else:
                    m.add(eq >= 1 - diff, "symmetry")
                m.add(diff <= O * (1 - eq), "symmetry")
                prev = eq
