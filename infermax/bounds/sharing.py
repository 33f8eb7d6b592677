"""Shared batches under load: a bound on mean end-to-end latency, online, from a window LP.

The order bound (`order`) lets a request finish in its own work once the machine serves it first. But
a request needs n_i = ⌈I_i / min(C, P)⌉ + O_i - 1 batches, and under load every one of them carries
the other requests' work: on the Splitwise conversation trace ~74 requests run together in ~58 ms
batches. This bound charges that, and the backlog, on one time line.

**Alive requests.** N(t), the number of requests arrived and not finished, integrates to
Σ_i (C_i - a_i). Cut [t_0, T] into windows w of length Δ_w (any T: the time after it is only
dropped). In a window, N(t) >= |b(t)|, the requests of the batch running at t, and
N(t) = A(t) - D(t) >= A(t) - min(D_w, D_order(t)), with A the arrivals, D_w the completions by the
window's end and D_order(t) the number of `order`'s completion order statistics at or before t (the
k-th completion is no earlier than the k-th of them):

    ∫_w N  >=  max( Σ_b f_b |b| d_b ,  ∫_w A - g_w(D_w) ),    g_w(D) = ∫_w min(D, D_order(t)) dt

(f_b the share of batch b's duration d_b inside w). g_w is concave and piecewise linear in D (its
slope at D is the time in w during which D_order(t) > D), so the second term is the maximum of one
linear function per piece.

**Batch sharing.** For a line (a, b) of the non-attention model and β the cheapest attention bias,
d_b >= r + Σ_{j in b} e_j with r = a + β and e_j what request j's part costs on its own (its tokens
at b, its KV reads, prefill attention and per-request time). With s_b = |b| and W_b = Σ e_j,
√(s_b W_b) >= Σ_{j in b} √e_j (Cauchy-Schwarz), and again over the batches weighted by f_b:

    Σ_b f_b s_b d_b  >=  r·x_w + q_w² / h_w,    x_w = Σ f_b s_b, q_w = Σ_b f_b Σ_{j in b} √e_j, h_w = Σ f_b.

q²/h >= 2σq - σ²h for every σ (tangents of a convex function), so the right side is an LP cut (σ on
a geometric grid; only the tightness depends on which).

**Capacity.** Per window and line: r·h_w + b·τ_w + ω_w <= Δ_w (the batches' times; τ tokens,
ω the rest of the e_j); K_w <= M·h_w (each batch holds at most M KV tokens, K the KV after each part);
τ_w <= C·h_w; x_w <= R_max·h_w.

**Completions.** Each request needs at least (x, τ, ω, K, q_line...) = v_i: its fewest parts, its
tokens, and, per later token, the cheaper of a decode and a refill. Count only what each request
needs (every part scaled by v_i over what the request does in all: then no window holds more than
it did, and a finished request has done exactly v_i). The cumulative useful amounts S_w by a
window's end then cover Σ v_i of the finished requests, and never exceed Σ v_i of the arrived
ones. For prices φ >= 0, D_w is at most the most requests, among those that can be done by then
(arrival plus own time, `requests`), whose φ·v_i sum to at most φ·S_w: a concave piecewise-linear
count, above each of its extended segments (a few of them are constraints).

Every schedule maps to a feasible point of this LP whose objective is at most Σ_i (C_i - a_i); every
variable is boxed by what a schedule can do (with r the largest per-batch time: h <= Δ/r, x <= n·h,
τ <= C·h, ω <= Δ, K <= M·h, q <= sqrt(n/r)·Δ as √(s_b W_b) <= sqrt(n·d_b) <= d_b/sqrt(r); D <= n,
z <= n·Δ; the cumulative amounts <= what has arrived). The LP, each resource in units of a request's
mean need, is solved by HiGHS, but the value reported is its Lagrangian dual at HiGHS's multipliers
y >= 0 over the box,
-y·b + Σ_j u_j min(0, (c + Aᵀy)_j), minus a bound on its own rounding: valid for ANY y, so the
solver's accuracy is never trusted. The mean is that total over n.

Three refinements keep every schedule's point feasible, so the proof above stands (2026-11-27: 7.374 →
7.488 s on the conversation trace):

1. *Windows.* The proof holds for any partition of [t_0, T] into windows (nothing in it uses equal
   lengths). ``WINDOW_SHARE`` of the windows cut [t_0, t_0 + the makespan bound (`work`'s arrival
   bound)] evenly, the rest the time from there to the horizon: the completions are decided before
   the makespan bound, and after it only the last requests remain.
2. *Segments of the count functions.* Each count row is one extended segment of a concave function,
   above it everywhere; any subset is valid. Half of them are spread evenly over k = 0..E-1 as before,
   half at k = E - (geometric from 1 to E): near the top, where a window's D lies (all but the
   last few tens of the eligible requests are done by a window's end).
3. *Boxes of the cumulative amounts.* Request i's (scaled) amounts by a window's end t = edges[w + 1]
   come from its parts in batches, each batch b weighted by f_b, its share of time in windows up to w,
   and only batches after a_i carry i's parts. Every batch lasts at least r_max = max over lines of
   (a + β) (d_b >= the largest line's value + the cheapest bias), and the batches holding i's parts
   are disjoint in time, so Σ f_b over them <= (t - a_i)/r_max: i's parts (x) by t are at most
   (t - a_i)/r_max; its tokens at most C times that, its KV at most M times that (a part holds <= C
   tokens and <= M KV); its ω at most t - a_i (e_j <= d_b and Σ f_b d_b <= t - a_i); and each √e_j
   <= sqrt(d_b) <= d_b / sqrt(r_max), so its q at most (t - a_i)/sqrt(r_max). Scaling only lowers
   them, and they never exceed its need v_i, so the cumulative amounts by window w are boxed by
   Σ_{a_i < t} min(v_i, those caps) — at most the arrived need of the LP before.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

from infermax.costmodel import LinearCoefficients
from infermax.types import Limits, Workload

from .certify import certified_dual
from .costs import cheapest_fill, chunk_end_sum, context_lengths
from .order import event_bounds
from .requests import cost_lines, request_bounds
from .work import arrival_bound

NUM_WINDOWS = 140         # windows over [first arrival, horizon] (fewer for few requests: 16 + 2n)
HORIZON = 1.2             # horizon: this many times the larger of the makespan bound and the latest own finish
WINDOW_SHARE = 0.9        # share of the windows over [first arrival, first arrival + the makespan bound]
NUM_BREAKS = 24           # extended segments of each count function kept as constraints (half near its top)
NUM_TANGENTS = 32         # σ of the q²/h cuts, geometric over the per-batch range of q/h
#: prices φ per line: the per-batch time r spread over M and C with these shares (plain work at (0, 0))
SHARES = ((1.0, 0.0), (0.5, 0.5))


def needs(co: LinearCoefficients, workload: Workload, limits: Limits,
          lines: list[tuple[float, float]]) -> np.ndarray:
    """Per request (rows), the least of each resource (columns x, τ, ω, K, then q per line)."""
    I, O = workload.input_lens.astype(np.int64), workload.output_lens.astype(np.int64)
    n, cp = I.size, float(min(limits.C, limits.P))
    If = I.astype(np.float64)
    k = np.ceil(If / cp)
    ell, owner = context_lengths(I, O)
    L = ell.astype(np.float64)
    fill_rest = cheapest_fill(If, co.prefill_token_s, co.prefill_attn_s, co.request_s * k)
    refill_rest = cheapest_fill(L, co.prefill_token_s, co.prefill_attn_s, co.request_s)
    per = lambda v: np.bincount(owner, weights=v, minlength=n)
    x = k + (O - 1)
    tau = If + (O - 1)
    omega = fill_rest + per(np.minimum(co.request_s + co.decode_kv_s * L, refill_rest))
    K = chunk_end_sum(If, cp) + per(L)                   # the fill's chunk ends, then ℓ per later token
    cols = [x, tau, omega, K]
    for _, b in lines:
        cols.append(np.sqrt(b * If + fill_rest)
                    + per(np.sqrt(np.minimum(b + co.request_s + co.decode_kv_s * L, b * L + refill_rest))))
    return np.stack(cols, axis=1)


class WindowLP(NamedTuple):
    """min c·v s.t. A v <= b, 0 <= v <= upper; v holds, per window w (edges[w], edges[w + 1]), at
    ``w * width + offset``: h (offset 0), the resources of :func:`needs` (1..R), D (R + 1), z (R + 2),
    and the cumulative resources (R + 3..2R + 2); resources in units of
    ``scale`` (a request's mean need), so that the LP's numbers are of one size."""

    c: np.ndarray
    A: Any
    b: np.ndarray
    upper: np.ndarray
    edges: np.ndarray
    width: int
    num_resources: int
    lines: list
    scale: np.ndarray


def sharing_bound(co: LinearCoefficients, workload: Workload, limits: Limits,
                  done_by: np.ndarray | None = None) -> tuple[float | None, dict]:
    """Σ_i (C_i - a_i) / n >= the LP's certified dual value (module docstring). ``done_by``: `order`'s
    completion order statistics of this workload, when the caller has them."""
    from scipy.optimize import linprog

    lp = window_lp(co, workload, limits, done_by)
    if lp is None:
        return None, {"not_applicable": "no line of the cost model has a positive per-batch time"}
    n = len(workload)
    res = linprog(lp.c, A_ub=lp.A, b_ub=lp.b, bounds=list(zip(np.zeros(lp.c.size), lp.upper)), method="highs")
    if res.status != 0 or getattr(res, "ineqlin", None) is None:
        raise RuntimeError(f"sharing bound: HiGHS failed ({res.message})")
    y = np.maximum(-np.asarray(res.ineqlin.marginals, dtype=np.float64), 0.0)
    total, err = certified_dual(lp.c, lp.A, lp.b, np.zeros(lp.c.size), lp.upper, y)
    value = float(total - err) / n
    return value, {"lp_value_s": float(res.fun) / n, "rounding_allowance_s": float(err) / n,
                   "num_windows": int(lp.edges.size - 1), "horizon_s": float(lp.edges[-1] - lp.edges[0]),
                   "num_constraints": int(lp.b.size), "num_variables": int(lp.c.size)}


# complexity: the LP's row families built side by side, one branch per family, as the docstring lists
def window_lp(co: LinearCoefficients, workload: Workload, limits: Limits,
              done_by: np.ndarray | None = None) -> WindowLP | None:
    """The LP of the module docstring (None when no line has a positive per-batch time); ``done_by`` as in
    :func:`sharing_bound`."""
    from scipy.sparse import csr_matrix

    lines = cost_lines(co, limits.C)
    beta = min(co.decode_bias_s, co.prefill_bias_s)
    r_line = [a + beta for a, _ in lines]
    r_max = max(r_line)
    if r_max <= 0:
        return None
    a_s = workload.arrivals_s.astype(np.float64)
    n, nl = a_s.size, len(lines)
    t0 = float(a_s.min())
    own = request_bounds(co, workload, limits)["e2e_s"]
    if done_by is None:                                  # the k-th completion is >= done_by[k - 1]
        done_by = event_bounds(co, workload, limits, "e2e").absolute_s
    makespan = arrival_bound(co, workload, limits)[0]
    span = max(float((a_s + own).max()) - t0, makespan)
    num_windows = min(NUM_WINDOWS, 16 + 2 * n)
    edges = t0 + window_edges(num_windows, min(makespan, HORIZON * span), HORIZON * span)
    delta = np.diff(edges)
    v = needs(co, workload, limits, lines)
    R = v.shape[1]                                       # resources: x, τ, ω, K, q per line
    scale = v.mean(axis=0)
    scale = np.where(scale > 0, scale, 1.0)              # the LP holds resources in these units (one request's mean)
    # variables per window: h, resources (R), D, z, cumulative resources (R)
    V = 3 + 2 * R
    H, RES, DD, Z, CUM = 0, 1, 1 + R, 2 + R, 3 + R
    nv = V * num_windows
    col = lambda w, j: w * V + j
    rows, cols_, vals, rhs = [], [], [], []

    def le(terms, bound: float) -> None:
        for c, a in terms:
            rows.append(len(rhs)), cols_.append(c), vals.append(a)
        rhs.append(bound)

    upper = np.empty(nv)
    # σ of the cuts: from the least mean √e per part of a request to a full batch of the largest; a batch
    # holds at most n requests, R_max, or about M over a typical part's KV (only tightness depends on it)
    per_part = v[:, 4:] / np.maximum(v[:, :1], 1.0)
    members = min(n, limits.R_max or n, max(1.0, limits.M / float(np.median(v[:, 3] / np.maximum(v[:, 0], 1.0)))))
    lo_s = max(float(per_part.min()), 1e-9)
    sigmas = np.geomspace(lo_s, max(2 * members * float(per_part.max()), 4 * lo_s), NUM_TANGENTS)
    prices = [np.eye(R)[0]] + [np.eye(R)[4 + j] for j in range(nl)]
    for (_a, b), r in zip(lines, r_line):
        for sM, sC in ((0.0, 0.0),) + SHARES:
            prices.append(np.array([0.0, b + sC * r / limits.C, 1.0, sM * r / limits.M] + [0.0] * nl))
    for w in range(num_windows):
        lo, hi, dw = edges[w], edges[w + 1], delta[w]
        h_max = dw / r_max
        upper[col(w, H)] = h_max
        upper[col(w, RES):col(w, RES) + R] = np.array([n * h_max, limits.C * h_max, dw, limits.M * h_max] +
                                                       [math.sqrt(n / r_max) * dw] * nl) / scale
        upper[col(w, DD)], upper[col(w, Z)] = n, n * dw
        upper[col(w, CUM):col(w, CUM) + R] = done_by_cap(v, a_s, hi, r_max, limits, nl) / scale   # change 3
        for (_a, b), r in zip(lines, r_line):                            # time
            le([(col(w, H), r), (col(w, RES + 1), b * scale[1]), (col(w, RES + 2), scale[2])], dw)
        le([(col(w, RES + 3), scale[3]), (col(w, H), -float(limits.M))], 0.0)   # KV
        le([(col(w, RES + 1), scale[1]), (col(w, H), -float(limits.C))], 0.0)   # tokens
        if limits.R_max:
            le([(col(w, RES), scale[0]), (col(w, H), -float(limits.R_max))], 0.0)
        arrivals_area = float(np.clip(hi - np.maximum(a_s, lo), 0.0, None).sum())
        # z >= ∫A - g(D), g(D) = ∫_w min(D_order(t), D) dt: concave piecewise linear, so one row per piece
        d0, d1 = int(np.searchsorted(done_by, lo, side="right")), int(np.searchsorted(done_by, hi, side="right"))
        le([(col(w, Z), -1.0), (col(w, DD), -dw)], -arrivals_area)        # the piece D <= d0 (slope Δ)
        g = dw * d0
        for m in range(d0, d1):
            slope = hi - done_by[m]
            le([(col(w, Z), -1.0), (col(w, DD), -slope)], -arrivals_area + g - slope * m)
            g += slope
        le([(col(w, Z), -1.0)], -arrivals_area + g)                       # the piece D >= d1
        for j, r in enumerate(r_line):                                    # z >= r x + q²/h
            for s in sigmas:
                le([(col(w, Z), -1.0), (col(w, RES), r * scale[0]), (col(w, RES + 4 + j), 2 * s * scale[4 + j]),
                    (col(w, H), -s * s)], 0.0)
        if w:
            le([(col(w - 1, DD), 1.0), (col(w, DD), -1.0)], 0.0)
        for j in range(R):                                                # cumulative = previous + window
            terms = [(col(w, CUM + j), 1.0), (col(w, RES + j), -1.0)] + ([(col(w - 1, CUM + j), -1.0)] if w else [])
            le(terms, 0.0)
            le([(c, -a) for c, a in terms], 0.0)
        eligible = (a_s + own) <= hi
        E = int(eligible.sum())
        upper[col(w, DD)] = min(n, E, d1)
        if E == 0:
            continue
        breaks = count_breaks(E)                                      # change 2: any subset of segments
        for phi in prices:
            cost = np.sort(v[eligible] @ phi)
            prefix = np.concatenate(([0.0], np.cumsum(cost)))
            for k in breaks:
                if cost[k] <= 0:
                    continue
                # D <= k + (φ·S - prefix_k) / cost_k
                le([(col(w, DD), 1.0)] + [(col(w, CUM + j), -phi[j] * scale[j] / cost[k]) for j in range(R) if phi[j]],
                   k - prefix[k] / cost[k])
    A = csr_matrix((vals, (rows, cols_)), shape=(len(rhs), nv))
    c = np.zeros(nv)
    c[Z::V] = 1.0
    return WindowLP(c, A, np.array(rhs), upper, edges, V, R, lines, scale)


def window_edges(num_windows: int, makespan: float, horizon: float) -> np.ndarray:
    """Edges (from 0) of ``num_windows`` windows: ``WINDOW_SHARE`` of them evenly over [0, ``makespan``],
    the rest evenly over [``makespan``, ``horizon``] (change 1: any partition of [0, horizon] is valid)."""
    if not 0.0 < makespan < horizon or num_windows < 2:
        return np.linspace(0.0, horizon, num_windows + 1)
    first = min(num_windows - 1, max(1, int(round(WINDOW_SHARE * num_windows))))
    return np.concatenate([np.linspace(0.0, makespan, first + 1),
                           np.linspace(makespan, horizon, num_windows - first + 1)[1:]])


def count_breaks(E: int) -> np.ndarray:
    """Indices k of the kept extended segments of a count function over E eligible requests (change 2):
    half evenly over 0..E-1, half at E - (geometric from 1 to E)."""
    half = NUM_BREAKS // 2
    even = np.linspace(0, E - 1, NUM_BREAKS - half).astype(np.int64)
    top = E - np.unique(np.geomspace(1, max(E, 1), half).astype(np.int64))
    return np.unique(np.clip(np.concatenate([even, top]), 0, E - 1))


def done_by_cap(v: np.ndarray, a_s: np.ndarray, t: float, r_max: float, limits: Limits, nl: int) -> np.ndarray:
    """Σ over the requests arrived before ``t`` of min(need, what it can have done since arrival) per
    resource (change 3): parts (t - a)/r_max, tokens C and KV M times that, ω t - a, q (t - a)/sqrt(r_max)."""
    arrived = a_s < t
    el = t - a_s[arrived]
    cap = np.stack([el / r_max, limits.C * el / r_max, el, limits.M * el / r_max]
                   + [el / math.sqrt(r_max)] * nl, axis=1)
    return np.minimum(v[arrived], cap).sum(axis=0)
