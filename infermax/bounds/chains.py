"""Decode chains: a bound on mean end-to-end latency (offline) that prices running requests together.

The order bound (`order`) finishes the k-th request after the k least works, as if the others waited
untouched. But a request needs n_i = ⌈I_i / min(C, P)⌉ + O_i - 1 batches, one token per batch: a
schedule that finishes requests one after another pays the per-batch time n_i times for each, and
one that runs them together makes everyone's batches slower. This bound charges both.

**Time of the J-th batch's end.** With the split of `order` (a line (a, b) of the non-attention
model, β the cheapest attention bias, r = ρ(a + β), multipliers μ on the limits), every batch takes
t_b >= r + Σ_{i in b} edge_i(μ), so the end of batch J is X(J) >= r·J + Σ_i done_i(J), where done_i(J)
is i's work in batches 1..J. If i completes in batch J_i, it generates at most J_i - J tokens after
batch J, so by then it has generated at least O_i - (J_i - J) of them and done at least

    D_i(d) = fill_i + Σ of its first O_i - 1 - d later tokens' costs        (d = J_i - J < O_i)

(`order.path_costs`; D_i(0) = w_i, its whole work, and D_i(d) >= 0 for d >= O_i).

**Sum over requests.** Sort by completion batch (J_1 <= J_2 <= ...): request k finishes at
X(J_k) >= r·J_k + Σ_{l <= k} w_l + Σ_{l > k} D_l(J_l - J_k). With g a function below every D_l
(g(d) <= D_l(d) for every d >= 0 and l), convex and falling to 0 — the greatest convex minorant of
min_l D_l from a few of its supporting lines — and Σ_{l <= k} w_l >= S_k (the k least works):

    Σ_k X(J_k) >= Σ_k S_k + min over J_i >= n_i of [ r Σ_i J_i + Σ_{k < l} g(J_l - J_k) ].

**The minimum, relaxed.** g(d) = Σ_j a_j (n_j - d)⁺ with a_j >= 0 (its second differences), and each
tent (n - |J - J'|)⁺ = Σ_t 1[J, J' in [t, t + n)] is the kernel of window counts, so with ν_J the
number of requests finishing in batch J and W_jt = Σ_{J in [t, t + n_j)} ν_J,

    Σ_{k<l} g(J_l - J_k) = ½ Σ_j a_j Σ_t W_jt² - ½ N g(0)

(N requests; a tie pair counts g(0) <= w_l, which the S_k term leaves out). W² >= 2λW - λ² for
every λ, so for ANY multipliers λ_jt (weak duality; no solver accuracy is trusted):

    min [...] >= Σ_i min_{J >= n_i} φ(J) - ½ Σ_jt a_j λ_jt² - ½ N g(0),
    φ(J) = r·J + Σ_j a_j Σ_{t in (J - n_j, J]} λ_jt.

λ = W of a near-optimal ν of the convex relaxation (ν >= 0, Σ ν = N; accelerated projected
gradient), where it is tight. The relaxation's ν lives on a window of batches; only its tightness
depends on the window (the dual above is valid for any ν), so the window is sized to hold the
relaxation's optimum: finishing requests s batches apart costs about r·s·N²/2 in batch times and
N·G/s in pairs (G = Σ_d g(d)), least at s = sqrt(2G / (rN)); the window holds SPREAD_SAFETY times the
N·s batches of that spacing (N when that is more). (A window of N batches, as before 2026-11-27, held
the I = 16, O = 1024 paper cell's bound at 83.7 s instead of 144.2 s: its optimum spaces completions
~5 batches apart.) The mean e2e is the total over N (all requests arrive at T_min). Each line and
split gives a valid bound; the best is kept. Online arrivals: not applicable.
"""
from __future__ import annotations

import math

import numpy as np

from infermax.costmodel import LinearCoefficients
from infermax.types import Limits, Workload

from .order import cost_lines, path_costs, path_works

#: (ρ, which limit carries the rest of the per-batch time: None = none) tried per line (the per-batch time
#: priced on M is what the O = 1024 cells need; on C it never led on the paper grid)
SPLITS = ((1.0, None), (0.75, 0), (0.5, 0))
NUM_LINES = 8          # supporting lines of the minorant g (so at most 2·NUM_LINES tents)
ITERATIONS = 300       # accelerated projected-gradient steps on the relaxation (more: tighter, never invalid)
CHECK_EVERY = 25
NUM_STARTS = 24       # uniform spreads tried as the starting point
TOLERANCE = 1e-4       # relative primal-dual gap at which the relaxation counts as solved
SPREAD_SAFETY = 1.5    # window over the estimated optimal spread of completions (module docstring)


def chain_bound(co: LinearCoefficients, workload: Workload, limits: Limits,
                floor: float = -math.inf) -> tuple[float | None, dict]:
    """Lower bound on the mean end-to-end latency of ``workload`` (offline), with its certificate.

    ``floor`` (a bound known already, e.g. `order`'s): a split whose relaxation provably cannot beat
    it, or the best split so far, is left early — time only; every value returned is valid."""
    T = workload.arrivals_s
    if not np.all(T == T[0]):
        return None, {"not_applicable": "online arrivals (the chain bound needs every request at one time)"}
    I, O = workload.input_lens, workload.output_lens
    n = -(-I // min(limits.C, limits.P)) + O - 1          # batches each request needs
    N, beta = int(I.size), min(co.decode_bias_s, co.prefill_bias_s)
    best, cert = -math.inf, {}
    for a, b in cost_lines(co, limits.C):
        for share, limit in SPLITS:
            mu = np.zeros(4)
            caps = (limits.M, limits.C, limits.P, limits.R_max or 0)
            if limit is not None:
                if not caps[limit]:
                    continue
                mu[limit] = (1 - share) * (a + beta) / caps[limit]
            works, g_min = _done_profiles(co, limits, b, mu, I, O)
            base = float(np.cumsum(np.sort(works)).sum())
            tents = _tents(g_min)
            spread = _spread_bound(n, share * (a + beta), tents, max(floor, best) * N - base)
            value = (base + spread) / N
            if value > best:
                best, cert = value, {"line": (a, b), "batch_share": share, "limit_priced": limit,
                                     "num_tents": len(tents), "num_requests": N}
    return best, cert


def _done_profiles(co: LinearCoefficients, limits: Limits, per_token_s: float, mu: np.ndarray,
                   I: np.ndarray, O: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(w_i per request, min_l D_l(d) for d = 0..max O): the works and the least work done with d
    batches left, over the distinct (I, O) of the workload."""
    fill, token = path_costs(co, limits, per_token_s, mu, int((I + O - 1).max()))
    works, cum = path_works(fill, token, I, O)
    least = np.full(int(O.max()) + 1, np.inf)
    for i, o in {(int(i), int(o)) for i, o in zip(I, O)}:
        after = fill[i] + (cum[i + np.arange(o)] - cum[i])       # done after g = 1..o tokens
        d_profile = np.concatenate((after[::-1], np.zeros(least.size - o)))
        least = np.minimum(least, d_profile)
    return works.total_s, least


def _tents(D: np.ndarray) -> list[tuple[float, int]]:
    """(a_j, n_j), a_j >= 0, with Σ_j a_j (n_j - d)⁺ <= D[d] for every integer d >= 0 (D falls to 0 at
    its end): the maximum of NUM_LINES supporting lines of D's lower convex hull (and 0), read at the
    integers — a convex sequence, whose second differences are the a_j."""
    hull: list[int] = []
    for x in range(D.size):
        while len(hull) >= 2 and \
                (D[hull[-1]] - D[hull[-2]]) * (x - hull[-2]) >= (D[x] - D[hull[-2]]) * (hull[-1] - hull[-2]):
            hull.pop()
        hull.append(x)
    segments = list(zip(hull[:-1], hull[1:]))
    if not segments:
        return []
    d = np.arange(D.size, dtype=np.float64)
    g = np.zeros(D.size)
    margin = 1e-9 * float(D[0])       # lines a little below the hull, so that rounding stays under D
    for s in sorted(set(np.linspace(0, len(segments) - 1, min(NUM_LINES, len(segments))).round().astype(int))):
        x0, x1 = segments[s]
        g = np.maximum(g, D[x0] - margin + (D[x1] - D[x0]) / (x1 - x0) * (d - x0))
    slopes = np.diff(np.concatenate((g, [0.0, 0.0])))           # on [d, d + 1], the last ones 0
    second = np.diff(slopes)
    # the kinks (and rounding noise, dropped: a tent left out only lowers the sum)
    tents = [(float(c), k + 1) for k, c in enumerate(second) if c > 1e-9 * second.max()]
    # rounding: scale the tents under D wherever their sum came out above it (exactness, not tightness)
    total = _tent_values(tents, D.size)
    over = total > D
    if np.any(over):
        scale = float(np.min(np.where(over, D / np.where(total > 0, total, 1.0), 1.0))) * (1 - 1e-12)
        tents = [(c * scale, k) for c, k in tents] if scale > 0 else []
    return [(c, k) for c, k in tents if c > 0]


def _tent_values(tents: list[tuple[float, int]], size: int) -> np.ndarray:
    d = np.arange(size, dtype=np.float64)
    return sum((c * np.maximum(k - d, 0.0) for c, k in tents), np.zeros(size))


def _window_sums(cs: np.ndarray, n: int) -> np.ndarray:
    """W_t = Σ_{J in [t, t + n)} ν_J for t = -(n - 1) .. size - 1, from ``cs`` = [0, cumsum(ν)]."""
    # t + n runs over 1 .. size + n - 1 (capped at size), t over -(n - 1) .. size - 1 (floored at 0)
    return (np.concatenate((cs[1:], np.full(n - 1, cs[-1]))) - np.concatenate((np.zeros(n - 1), cs[:-1])))


def _kernel(nu: np.ndarray, tents: list[tuple[float, int]]) -> tuple[np.ndarray, list[np.ndarray]]:
    """(K·ν = Σ_j a_j Σ_{t in (J - n_j, J]} W_jt per J — the gradient of ½νᵀKν, and φ's λ-term with
    λ = W — and the window sums W_jt of ``nu``)."""
    out, windows = np.zeros(nu.size), []
    cs = np.concatenate(([0.0], np.cumsum(nu)))
    for c, k in tents:
        W = _window_sums(cs, k)
        windows.append(W)
        cw = np.concatenate(([0.0], np.cumsum(W)))
        out += c * (cw[k:k + nu.size] - cw[:nu.size])
    return out, windows


def _project(v: np.ndarray, total: float) -> np.ndarray:
    """Euclidean projection of ``v`` on {x >= 0, Σ x = total}."""
    u = np.sort(v)[::-1]
    css = np.cumsum(u) - total
    k = np.arange(1, v.size + 1)
    last = np.flatnonzero(u - css / k > 0)[-1]
    return np.maximum(v - css[last] / (last + 1), 0.0)


def _spread_bound(n: np.ndarray, r: float, tents: list[tuple[float, int]], stop_below: float = -math.inf) -> float:
    """A lower bound on min over J_i >= n_i of r Σ J_i + Σ_{k<l} g(J_l - J_k) (module docstring).

    Stops when the relaxation is solved (primal and dual within :data:`TOLERANCE`) or its primal
    value, which no dual bound can exceed, is at most ``stop_below``."""
    N, n_min = int(n.size), int(n.min())
    if not tents:
        return r * float(n.sum())
    spread = N                                       # batches the relaxation may spread completions over
    if r > 0:
        pairs = sum(c * k * (k + 1) / 2 for c, k in tents)   # G = Σ_d g(d)
        spread = max(spread, math.ceil(SPREAD_SAFETY * math.sqrt(2 * pairs * N / r)))
    span = spread + int(n.max()) - n_min
    size = n_min + span + max(k for _, k in tents) + 1   # past it, φ(J) = r·J only grows
    J = np.arange(size, dtype=np.float64)
    free = slice(n_min, n_min + span)
    g0 = sum(c * k for c, k in tents)
    best, x, least = -math.inf, None, math.inf
    for length in np.unique(np.geomspace(1, span, NUM_STARTS).astype(int)):   # uniform spreads: a start
        start = np.zeros(size)
        start[n_min:n_min + length] = N / length
        dual, primal = _values(start, n, r, tents, J, g0)
        best = max(best, dual)
        if primal < least:
            x, least = start, primal
    if least <= stop_below or least - best <= TOLERANCE * abs(least):
        return best
    y, step, t = x.copy(), 1.0 / sum(c * k * k for c, k in tents), 1.0   # 1 / (a bound on K's top eigenvalue)
    for it in range(ITERATIONS):
        grad = _kernel(y, tents)[0] + r * J
        z = np.zeros(size)
        z[free] = _project(y[free] - step * grad[free], N)
        t_next = (1 + math.sqrt(1 + 4 * t * t)) / 2
        y, x, t = z + (t - 1) / t_next * (z - x), z, t_next
        if (it + 1) % CHECK_EVERY == 0:
            dual, primal = _values(x, n, r, tents, J, g0)
            best = max(best, dual)
            if primal - best <= TOLERANCE * abs(primal) or primal <= stop_below:
                break
    return best


def _values(nu: np.ndarray, n: np.ndarray, r: float, tents: list[tuple[float, int]], J: np.ndarray,
            g0: float) -> tuple[float, float]:
    """(the weak-duality bound with λ = the window sums of ``nu``, valid for any ``nu``; the
    relaxation's objective at ``nu``, J >= min n_i for all)."""
    spread, windows = _kernel(nu, tents)
    phi = r * J + spread
    suffix_min = np.minimum.accumulate(phi[::-1])[::-1]        # min over J' >= J (φ grows past the array)
    # einsum, not BLAS: OpenBLAS's threads spin after each call and burn a loaded machine's CPU (measured:
    # 22.5 against 2.9 CPU s for the I = 1024, O = 1024 cell's bound)
    quad = sum(c * float(np.einsum('i,i->', W, W)) for (c, _), W in zip(tents, windows))
    dual = float(suffix_min[n].sum()) - 0.5 * quad - 0.5 * n.size * g0
    primal = float(r * np.einsum('i,i->', J, nu)) + 0.5 * quad - 0.5 * n.size * g0
    return dual, primal
