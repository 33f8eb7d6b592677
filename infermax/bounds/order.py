"""Order-statistic bounds on first-token and completion times: a fluid machine, SRPT and windows.

**Work per request.** Split each batch's fixed time a_k + β (a line (a_k, b_k) of the
non-attention model, β the cheapest attention bias) into r = ρ(a_k + β) and multipliers
μ = (1 - ρ)(a_k + β)·θ / caps on the batch limits caps = (M, C, P, R_max), θ >= 0, Σθ = 1
(ρ in [0, 1]). A batch's tokens (<= C), prefill tokens (<= P), KV after its tokens (<= M)
and requests (<= R_max) then pay at most (1 - ρ)(a_k + β), so

    t_j >= r + Σ_{i in j} edge_i(μ)

where edge_i is what request i's part of the batch costs on its own (b_k and the
per-token, attention and per-request terms of the model, plus μ times its use of each
limit). A request's *work* w_i(μ) is its cheapest path of edges: a fill of I (first
token; ⌈I / min(C, P)⌉ chunks at least) then, per later token at context ℓ, a decode or a
refill of ℓ — the shortest path of `lagrangian`, here with the per-request chunk cap kept.

**Fluid machine (ρ = 0).** Spread every batch's edges over its duration: that is a
preemptive schedule of one unit-speed machine in which request i's work w_i runs after its
arrival T_i and is done when its event (first token, completion) happens. Preemptive SRPT
with release dates completes, at every instant, at least as many jobs as any schedule of that
machine (Schrage 1968), so the k-th smallest SRPT completion is <= the k-th smallest event
time of every valid schedule.

**Offline with batch counts (ρ > 0).** The k-th event needs J >= (the k-th smallest own batch
count n_i: ⌈I / min(C, P)⌉ for the first token, plus O - 1 for completion) batches before it,
each paying r, and the works of k requests: X_(k) >= T_min + r·n_(k) + (sum of the k least w_i).

**Windows (flows, online).** A request of a window of arrivals [τ_lo, τ_hi] with flow
(event - arrival) <= y has its work done within [τ_lo, τ_hi + y], so at most
#{j : w-prefix_j - (τ_hi - τ_lo) <= y} of the window's requests (least works first) make it;
summed over a partition of the arrivals, the k-th smallest of those keys bounds the k-th
smallest flow from below. With one window (offline) this is the fluid order statistic.

**Own time.** Each request's event is at least its arrival plus its own fastest path
(`requests`); the k-th smallest of those bounds the k-th smallest event (and flow).

Every order statistic is the maximum of these valid bounds; a mean is the mean of the order
statistics (minus the mean arrival for absolute times), a quantile the same linear
interpolation numpy's ``percentile`` applies, with non-negative weights. Values are exact
float64 sums; ``lower_bound`` lowers them by its relative safety margin.
"""
from __future__ import annotations

import heapq
import math
from typing import NamedTuple

import numpy as np

from infermax.costmodel import LinearCoefficients
from infermax.types import Limits, Workload

from .costs import chunk_end_sum
from .requests import cost_lines, request_bounds

EVENTS = ("ttft", "e2e")
#: share ρ of the per-batch time kept per batch (offline) instead of spread over the limits
BATCH_SHARES = (0.0, 0.25, 0.5, 0.75, 0.9)
#: mixtures θ of two limits tried besides each limit alone
MIXTURES = (0.25, 0.5, 0.75)
NUM_WINDOW_SIZES = 14


class Works(NamedTuple):
    """Per request, seconds: the work up to its first token and up to its completion."""

    first_s: np.ndarray
    total_s: np.ndarray


def path_costs(co: LinearCoefficients, limits: Limits, per_token_s: float, mu: np.ndarray,
               max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """(fill, token) over contexts ℓ = 0..max_len with multipliers ``mu`` = (μ_M, μ_C, μ_P, μ_R) >= 0:
    ``fill[ℓ]`` the least cost of a fill of ℓ tokens from an empty cache, ``token[ℓ]`` the least cost
    of the token at context ℓ (a decode reading ℓ KV, or a refill of ℓ, whichever is cheaper).

    A fill of e tokens from an empty cache in k >= ⌈e / cp⌉ chunks (cp = min(C, P)) costs at least
    lin·e + attn·e(e + 1)/2 (causal work, any chunking) + k·(μ_R + request) + μ_M·Σ chunk ends,
    and the ends are least with full chunks last: Σ >= k·e - cp·k(k - 1)/2."""
    mu_M, mu_C, mu_P, mu_R = (float(x) for x in mu)
    ell = np.arange(max_len + 1, dtype=np.float64)
    cp = float(min(limits.C, limits.P))
    k = np.ceil(ell / cp)
    fill = ((per_token_s + co.prefill_token_s + mu_C + mu_P) * ell + co.prefill_attn_s * ell * (ell + 1) / 2
            + k * (mu_R + co.request_s) + mu_M * chunk_end_sum(ell, cp))
    decode = per_token_s + co.request_s + co.decode_kv_s * ell + mu_C + mu_M * ell + mu_R
    return fill, np.minimum(decode, fill)


def request_works(co: LinearCoefficients, workload: Workload, limits: Limits, per_token_s: float,
                  mu: np.ndarray) -> Works:
    """Each request's cheapest path cost with multipliers ``mu`` (:func:`path_costs`): its fill, then
    each later token at its context."""
    I, O = workload.input_lens, workload.output_lens
    return path_works(*path_costs(co, limits, per_token_s, mu, int((I + O - 1).max())), I, O)[0]


def path_works(fill: np.ndarray, token: np.ndarray, I: np.ndarray, O: np.ndarray) -> tuple[Works, np.ndarray]:
    """The works of requests (``I``, ``O``) on the path costs of :func:`path_costs`, and the prefix sums
    ``cum`` of the token costs (the tokens at contexts a..b-1 cost ``cum[b] - cum[a]``)."""
    cum = np.concatenate(([0.0], np.cumsum(token[1:])))
    first = fill[I]
    return Works(first, first + (cum[I + O - 1] - cum[I])), cum


def multipliers(per_batch_s: float, limits: Limits) -> list[np.ndarray]:
    """μ with μ·caps = ``per_batch_s``: each usable limit alone and pairwise mixtures."""
    caps = np.array([limits.M, limits.C, limits.P, limits.R_max or 0], dtype=np.float64)
    usable = [r for r in range(4) if caps[r] > 0]
    shares = [np.eye(4)[r] for r in usable]
    for x, y in ((x, y) for n, x in enumerate(usable) for y in usable[n + 1:]):
        shares += [t * np.eye(4)[x] + (1 - t) * np.eye(4)[y] for t in MIXTURES]
    return [np.where(caps > 0, per_batch_s * s / np.where(caps > 0, caps, 1.0), 0.0) for s in shares]


def srpt_completions(release_s: np.ndarray, work_s: np.ndarray) -> np.ndarray:
    """Completion times, sorted, of preemptive SRPT on one unit-speed machine."""
    order = np.argsort(release_s, kind="stable")
    rel, work = release_s[order], work_s[order]
    done, heap, clock, n, k = [], [], -math.inf, rel.size, 0
    while k < n or heap:
        if not heap:
            clock = max(clock, float(rel[k]))
        while k < n and rel[k] <= clock:
            heapq.heappush(heap, float(work[k]))
            k += 1
        left = heapq.heappop(heap)
        nxt = float(rel[k]) if k < n else math.inf
        if clock + left <= nxt:
            clock += left
            done.append(clock)
        else:                              # preempted (or not) at the next release
            heapq.heappush(heap, left - (nxt - clock))
            clock = nxt
    return np.asarray(done)


class Windows(NamedTuple):
    """A partition of the requests into windows of arrivals: its window number per request, and
    per request the span τ_hi - τ_lo of its window."""

    win: np.ndarray
    span_s: np.ndarray


def partitions(release_s: np.ndarray) -> list[Windows]:
    """Distinct partitions of the arrivals into windows [t0 + offset + q·size, t0 + offset + (q + 1)·size):
    sizes span / 2^s (s < NUM_WINDOW_SIZES), offsets 0 and size / 2."""
    t0, span = float(release_s.min()), float(release_s.max() - release_s.min())
    seen, out = set(), []
    for size in (span * 2.0 ** -q for q in range(NUM_WINDOW_SIZES)):
        for offset in (0.0, 0.5 * size):
            win = np.floor((release_s - t0 + offset) / size)
            key = win.tobytes()
            if key in seen:
                continue
            seen.add(key)
            _, inverse = np.unique(win, return_inverse=True)
            hi = np.full(inverse.max() + 1, -np.inf)
            lo = np.full(inverse.max() + 1, np.inf)
            np.maximum.at(hi, inverse, release_s)
            np.minimum.at(lo, inverse, release_s)
            out.append(Windows(win, (hi - lo)[inverse]))
    return out


def window_keys(work_s: np.ndarray, windows: Windows) -> np.ndarray:
    """Sorted keys w-prefix - (τ_hi - τ_lo) of every request over ``windows`` (module docstring)."""
    order = np.lexsort((work_s, windows.win))
    w, x = windows.win[order], work_s[order]
    csum = np.cumsum(x)
    new = np.empty(w.size, dtype=bool)
    new[0], new[1:] = True, w[1:] != w[:-1]
    base = np.maximum.accumulate(np.where(new, csum - x, -np.inf))   # Σ before the window's first request
    return np.sort(csum - base - windows.span_s[order])


class EventBounds(NamedTuple):
    """Lower bounds on the k-th smallest event time (``absolute_s``) and flow (``flow_s``), k = 1..n."""

    absolute_s: np.ndarray
    flow_s: np.ndarray
    mean_flow_s: float


def event_bounds(co: LinearCoefficients, workload: Workload, limits: Limits, event: str) -> EventBounds:
    """Order-statistic bounds for ``event`` ("ttft": first token, "e2e": completion) of ``workload``."""
    if event not in EVENTS:
        raise ValueError(f"event must be one of {EVENTS}, got {event!r}")
    T = workload.arrivals_s.astype(np.float64)
    I, O = workload.input_lens, workload.output_lens
    own = request_bounds(co, workload, limits)["ttft_s" if event == "ttft" else "e2e_s"]
    absolute = np.sort(T + own)
    flow = np.sort(own)
    cp = min(limits.C, limits.P)
    count = np.sort(-(-I // cp) + (0 if event == "ttft" else O - 1)).astype(np.float64)
    t_min, offline = float(T.min()), bool(np.all(T == T[0]))
    wins = [] if offline else partitions(T)
    beta = min(co.decode_bias_s, co.prefill_bias_s)
    for a, b in cost_lines(co, limits.C):
        per_batch = a + beta
        for rho in BATCH_SHARES:
            for mu in multipliers((1 - rho) * per_batch, limits):
                works = request_works(co, workload, limits, b, mu)
                w = works.first_s if event == "ttft" else works.total_s
                stacked = t_min + rho * per_batch * count + np.cumsum(np.sort(w))
                absolute = np.maximum(absolute, stacked)
                if offline:
                    flow = np.maximum(flow, stacked - t_min)
                    continue
                if rho > 0:
                    continue
                absolute = np.maximum(absolute, srpt_completions(T, w))
                for win in wins:
                    flow = np.maximum(flow, window_keys(w, win))
    mean_flow = max(float(absolute.mean() - T.mean()), float(flow.mean()))
    return EventBounds(absolute, flow, mean_flow)


def quantile_of_sorted(lower: np.ndarray, q: float) -> float:
    """numpy's linear-interpolation ``percentile`` (q in [0, 100]) of the values bounded below by
    the sorted order-statistic bounds ``lower``: monotone in each, so a lower bound too."""
    h = (lower.size - 1) * q / 100.0
    lo = int(math.floor(h))
    hi = min(lo + 1, lower.size - 1)
    frac = h - lo
    return float((1.0 - frac) * lower[lo] + frac * lower[hi])
