"""Batch time inside the model, and the objectives built on it (§3.3 "Objective").

The batch time is the simulator's own cost model, its coefficients read at build time by
:func:`infermax.costmodel.linear_coefficients` (the one "is this cost model linear?" check)::

    t_j = max_k(a_k + b_k·N_j) + [decode](db + dk·K_j) + [prefill](pb + pa·W_j + pt·P_j)

with N_j = Σ_i c_ij, K_j = Σ_decode k_ij, W_j = Σ_prefill c_ij·(2k_ij - c_ij + 1)/2 (the causal
pairs c·m + c(c + 1)/2 with m = k - c the KV before the chunk) and P_j = Σ_prefill c_ij. Encoded
exactly:

- the max of lines is convex in the integer N_j, so N_j = Σ_seg s_jseg with one
  bounded segment per slope of the integer envelope (minimisation fills them in
  order; ``exact=True`` adds order binaries for objectives that are not
  monotone in batch time);
- [decode]/[prefill] are the batch indicators yd_j >= dp_ij, yp_j >= cz_ij - dp_ij;
- K_j is linear through kvd_ij = dp_ij·k_ij (exact bool×int);
- W_j is quadratic. For the total busy time the per-request sum telescopes
  (Φ = m²/2 potential: c·m + c(c + 1)/2 = ((m + c)² - m²)/2 + c/2) to
  Σ_j W_j = Σ_i [Pk_i²/2 + Σ_j (ev_ij² + c_ij)/2 - Σ_j kvd_ij]
  (a decode's pairs m + 1 = k are its kvd, taken out again), so only the
  evictions' squares remain (qe >= ev², exact at the optimum, no bilinear term).
  Objectives that need each batch's end time use w_ij = c_ij·h_ij per batch,
  h_ij = 2k_ij - c_ij + 1, so W_j = Σ_prefill w_ij / 2.

Objectives (all in seconds, minimised): ``latency`` (makespan), ``completion``
(mean end-to-end time), ``ttft`` (mean time to first token), ``tpot`` (mean time
per output token over requests with O > 1), ``throughput`` (tokens/s; solved as
latency). ``completion``, ``ttft`` and ``tpot`` may name a request tag, ``ttft:short``: the mean over
the requests of that tag only (the others must still be served; a class-weighted objective with
weight 1 on the tag and 0 elsewhere). Online arrivals (§3.3 "Online Setting") use accumulated batch ends
end_j >= start_j + t_j, start_j >= end_j-1, start_j >= T_i·cz_ij.
"""
from __future__ import annotations

import math

import numpy as np

from infermax.bounds.objectives import SPEC_OF_MILP, members, parse_objective, trace_value
from infermax.costmodel import linear_coefficients
from infermax.types import Workload

from .formulation import Formulation
from .model import LinExpr

#: the objectives the model builds (each a row of the bounds' objective table, ``ObjectiveSpec.milp``), in the
#: order they are listed (``infermax solve --help``); their builders are :data:`BUILDERS`, below
OBJECTIVES = ("latency", "completion", "ttft", "tpot", "throughput")
#: objectives whose value only grows with every batch time (slack in t_j never pays)
MONOTONE = tuple(n for n in OBJECTIVES if SPEC_OF_MILP[n].monotone)
#: objectives that may be restricted to the requests of one tag (``ttft:short``)
TAGGABLE = tuple(n for n in OBJECTIVES if SPEC_OF_MILP[n].taggable)
#: the metric (``infermax.metrics``) each objective is (untagged)
METRIC_OF = {n: SPEC_OF_MILP[n].metric_key for n in OBJECTIVES}
#: the objectives of the whole schedule: the makespan, and throughput, solved as it
MAKESPAN = tuple(n for n in OBJECTIVES if SPEC_OF_MILP[n].horizon == "makespan")
#: the maximised ones (throughput: the model minimises the makespan; a value or bound is tokens over it)
MAXIMISED = tuple(n for n in OBJECTIVES if SPEC_OF_MILP[n].sense == "max")


def split_objective(name: str, workload: Workload | None = None) -> tuple[str, str | None]:
    """``"ttft:short"`` -> ("ttft", "short"); ``e2e`` is ``completion``. ValueError naming the value (parsed
    by :func:`infermax.bounds.parse_objective`; given ``workload``, naming its tags when none has the tag)."""
    obj = parse_objective(name)
    base = obj.spec.milp
    if base not in BUILDERS:
        raise ValueError(f"solve_optimal has no objective {name!r} (quantiles are bounds only); use one of "
                         f"{', '.join(OBJECTIVES)}, or {'/'.join(TAGGABLE)}:TAG")
    if obj.tag is not None and workload is not None:
        members(workload, obj.tag)            # ValueError naming the workload's tags
    return base, obj.tag


def is_monotone(name: str) -> bool:
    """Whether the objective only grows with every batch time (so slack never pays)."""
    return split_objective(name)[0] in MONOTONE


def trace_objective(trace, metrics: dict, name: str) -> float:
    """The objective's value on a replayed trace (``metrics`` = ``infermax.metrics.metrics(trace)``)."""
    base, tag = split_objective(name)
    if tag is None:
        return float(metrics[METRIC_OF[base]])
    return trace_value(parse_objective(name), trace)


def nonattention_segments(lines, max_tokens: int) -> tuple[float, list[tuple[int, float]]]:
    """f(0) and the (length, slope) runs of f(N) = max_k(a_k + b_k·N) on integers 0..max_tokens.

    Slopes are non-decreasing (f is convex), so Σ_seg slope·s_seg with the
    segments filled in order equals f(N) - f(0) at every integer N.
    """
    n = np.arange(max_tokens + 1, dtype=np.float64)
    f = np.max([a + b * n for a, b in lines], axis=0)
    slopes = np.diff(f)
    segs: list[tuple[int, float]] = []
    for d in slopes:
        if segs and math.isclose(segs[-1][1], float(d), rel_tol=1e-9, abs_tol=1e-15):
            segs[-1] = (segs[-1][0] + 1, segs[-1][1])
        else:
            segs.append((1, float(d)))
    # one slope per run: the mean keeps f exact at the run's ends despite rounding noise
    out, pos = [], 0
    for length, _ in segs:
        out.append((length, float((f[pos + length] - f[pos]) / length)))
        pos += length
    return float(f[0]), out


def add_batch_time_terms(fm: Formulation, exact: bool) -> None:
    """yd, yp, kvd and the segment variables of every batch (see the module docstring)."""
    m, v, J, lim = fm.model, fm.v, fm.horizon, fm.limits
    B = fm.num_requests
    k = linear_coefficients(fm.cost, "the MILP")
    f0, segs = nonattention_segments(k.nonattn_lines, lim.C)
    v.f0, v.segs = f0, segs
    v.yd = [m.bool_var(f"yd[{j}]") for j in range(J)]
    v.yp = [m.bool_var(f"yp[{j}]") for j in range(J)]
    v.kvd = [[m.int_var(0, v.Pk[i], f"kvd[{i},{j}]") for j in range(J)] for i in range(B)]
    v.seg = [[m.int_var(0, length, f"seg[{j},{q}]") for q, (length, _) in enumerate(segs)] for j in range(J)]
    for j in range(J):
        for i in range(B):
            dp, kk, kvd = v.dp[i][j], v.k[i][j], v.kvd[i][j]
            m.add(v.yd[j] >= dp, "time")
            m.add(v.yp[j] >= v.cz[i][j] - dp, "time")
            m.add(kvd <= v.Pk[i] * dp, "time")
            m.add(kvd <= kk, "time")
            m.add(kvd >= kk - v.Pk[i] * (1 - dp), "time")
        m.add(v.yd[j] <= v.y[j], "time")
        m.add(v.yp[j] <= v.y[j], "time")
        m.add(sum(v.seg[j][1:], 1.0 * v.seg[j][0]) == sum((v.c[i][j] for i in range(B)), LinExpr()), "time")
        if not fm.policy.hybrid:
            m.add(v.yd[j] + v.yp[j] <= 1, "policy")
        if exact:
            m.add(v.yd[j] <= sum((v.dp[i][j] for i in range(B)), LinExpr()), "time-exact")
            m.add(v.yp[j] <= sum((v.cz[i][j] - v.dp[i][j] for i in range(B)), LinExpr()), "time-exact")
            for q in range(len(segs) - 1):
                w = m.bool_var(f"segfull[{j},{q}]")
                fm.derive(w, lambda x, a=v.seg[j][q].index, L=segs[q][0]: float(x[a] >= L))
                m.add(v.seg[j][q] >= segs[q][0] * w, "time-exact")
                m.add(v.seg[j][q + 1] <= segs[q + 1][0] * w, "time-exact")


def _fixed_terms(fm: Formulation, j: int) -> LinExpr:
    """The part of t_j that is linear in the model's variables (all but attention work)."""
    v = fm.v
    k = linear_coefficients(fm.cost, "the MILP")
    B = fm.num_requests
    e = v.f0 * v.y[j] + k.decode_bias_s * v.yd[j] + k.prefill_bias_s * v.yp[j]
    for q, (_, slope) in enumerate(v.segs):
        e = e + slope * v.seg[j][q]
    pt = getattr(k, "prefill_token_s", 0.0)
    rs = k.request_s
    for i in range(B):
        if pt:
            e = e + pt * (v.c[i][j] - v.dp[i][j])
        if rs:
            e = e + rs * v.cz[i][j]          # request_s · R: one per request with a chunk in the batch
    return e


def busy_time(fm: Formulation) -> LinExpr:
    """Σ_j t_j, with the prefill work in its telescoped form (linear but for the evictions' squares)."""
    m, v, J = fm.model, fm.v, fm.horizon
    k = linear_coefficients(fm.cost, "the MILP")
    B = fm.num_requests
    total = LinExpr()
    for j in range(J):
        total = total + _fixed_terms(fm, j)
    pa, dk = k.prefill_attn_s, k.decode_kv_s
    v.qe = []
    for i in range(B):
        total = total + (dk - pa) * sum((v.kvd[i][j] for j in range(J)), LinExpr())
        if pa:
            total = total + pa * 0.5 * v.Pk[i] ** 2 + (pa * 0.5) * sum((v.c[i][j] for j in range(J)), LinExpr())
            qei = []
            for j in range(J):
                qe = m.int_var(0, (v.Pk[i] - 1) ** 2, f"qe[{i},{j}]")
                m.add_product(qe, v.ev[i][j], v.ev[i][j], "ev^2", sense="ge")
                total = total + (pa * 0.5) * qe
                qei.append(qe)
            v.qe.append(qei)
    return total


def batch_times(fm: Formulation, exact: bool) -> list[LinExpr]:
    """t_j for every batch, with per-batch causal prefill work pw_ij = (1 - dp_ij)·c_ij·h_ij/2, where
    h_ij = 2k_ij - c_ij + 1 (= 2m + c + 1) and w_ij = c_ij·h_ij is an integer product (exact, or >= for
    objectives monotone in batch time). A decode row's c·h/2 = k <= Pk is switched off by Pk·dp_ij."""
    m, v, J = fm.model, fm.v, fm.horizon
    k = linear_coefficients(fm.cost, "the MILP")
    B = fm.num_requests
    out = []
    v.h = [[None] * J for _ in range(B)]
    v.w, v.pw = [[None] * J for _ in range(B)], [[None] * J for _ in range(B)]
    for j in range(J):
        t = _fixed_terms(fm, j)
        for i in range(B):
            t = t + k.decode_kv_s * v.kvd[i][j]
            if k.prefill_attn_s:
                Pk, cmax = v.Pk[i], v.cmax[i]
                big = cmax * Pk                      # c·m + c(c + 1)/2 <= c·Pk when m + c <= Pk
                h = m.int_var(1, 2 * Pk + 1, f"h[{i},{j}]")
                m.add(h == 2 * v.k[i][j] - v.c[i][j] + 1, "time")
                w = m.int_var(0, 2 * big, f"w[{i},{j}]")
                m.add_product(w, v.c[i][j], h, "c*h", sense="eq" if exact else "ge")
                pw = m.int_var(0, big, f"pw[{i},{j}]")       # w = c(2m + c + 1) is even: pw is an integer
                m.add(2 * pw >= w - 2 * Pk * v.dp[i][j], "time")
                if exact:
                    m.add(2 * pw <= w, "time-exact")
                    m.add(pw <= big * (1 - v.dp[i][j]), "time-exact")
                v.h[i][j], v.w[i][j], v.pw[i][j] = h, w, pw
                t = t + k.prefill_attn_s * pw
        out.append(t)
    return out


def own_batch_time(fm: Formulation, i: int) -> LinExpr:
    """A lower bound on Σ_j t_j over request i's batches from its own variables: per batch f(0) and
    its decode or prefill bias (yd_j >= dp_ij, yp_j >= cz_ij - dp_ij), its tokens at the first (least)
    segment slope, and its own decode-KV and prefill-work terms of :func:`batch_times`."""
    v, J = fm.v, fm.horizon
    k = linear_coefficients(fm.cost, "the MILP")
    slope = v.segs[0][1]
    e = LinExpr()
    for j in range(J):
        e = e + (v.f0 + k.prefill_bias_s) * v.cz[i][j] + slope * v.c[i][j] \
            + (k.decode_bias_s - k.prefill_bias_s) * v.dp[i][j] + k.decode_kv_s * v.kvd[i][j]
        if v.pw and v.pw[i][j] is not None:
            e = e + k.prefill_attn_s * v.pw[i][j]
    return e


def max_batch_time_s(fm: Formulation) -> float:
    """An upper bound on any single batch's time under the limits (for time big-Ms)."""
    k = linear_coefficients(fm.cost, "the MILP")
    lim = fm.limits
    return (max(a + b * lim.C for a, b in k.nonattn_lines) + k.decode_bias_s + k.decode_kv_s * lim.M
            + k.prefill_bias_s + k.prefill_attn_s * lim.C * lim.M + getattr(k, "prefill_token_s", 0.0) * lim.P
            + k.request_s * fm.num_requests)


def add_timeline(fm: Formulation, times: list[LinExpr], exact: bool, upper_s: float) -> None:
    """Accumulated batch ends (§3.3 "Online Setting"): end_j = start_j + t_j.

    Offline, start_j = end_j-1. Online, start_j >= end_j-1 and start_j >= T_i·cz_ij
    (a batch waits for its requests); a later start is an explicit idle period that
    the extracted schedule keeps as ``not_before_s``.
    """
    m, v, J = fm.model, fm.v, fm.horizon
    T = fm.workload.arrivals_s
    online = not fm.workload.is_offline
    v.start, v.end = [], []
    prev = None
    for j in range(J):
        end = m.num_var(0.0, upper_s, f"end[{j}]")
        if online:
            start = m.num_var(0.0, upper_s, f"start[{j}]")
            if prev is not None:
                m.add(start >= prev, "timeline")
            for i in range(fm.num_requests):
                if T[i] > 0:
                    m.add(start >= float(T[i]) * v.cz[i][j], "timeline")
            m.add(end == start + times[j], "timeline")
            v.start.append(start)
        else:
            m.add(end == (prev if prev is not None else 0.0) + times[j], "timeline")
        v.end.append(end)
        prev = end


def _event_times(fm: Formulation, name: str, happens, exact: bool, upper_s: float, which) -> dict:
    """One time variable per request of ``which``: the end of the batch where ``happens[i][j]``
    (>=, or == if exact); {request: variable}."""
    m, v, J = fm.model, fm.v, fm.horizon
    out = {}
    for i in which:
        i = int(i)
        t = m.num_var(0.0, upper_s, f"{name}[{i}]")
        for j in range(J):
            lit = happens[i][j]
            m.add(t >= v.end[j], f"event-{name}", enforce=[(lit, 1)])
            if exact:
                m.add(t <= v.end[j], f"event-{name}", enforce=[(lit, 1)])
        out[i] = t
    return out


# complexity: one branch per objective name and the time terms it adds, as the objectives' table lists
def add_objective(fm: Formulation, name: str, upper_s: float) -> LinExpr:
    """Build the batch-time terms and the objective ``name``; returns the objective expression (s).

    ``upper_s`` bounds every time variable (a valid horizon end for this instance). A tagged
    ``name`` (``ttft:short``) averages over the requests of the tag only. The objective's builder is
    :data:`BUILDERS`'s, one short function each.
    """
    name, tag = split_objective(name, fm.workload)
    sel = [int(i) for i in members(fm.workload, tag)]
    exact = name not in MONOTONE
    add_batch_time_terms(fm, exact)
    expr = BUILDERS[name](fm, sel, tag, exact, upper_s)
    fm.model.minimize(expr)
    return expr


def _timeline(fm: Formulation, exact: bool, upper_s: float) -> None:
    add_timeline(fm, batch_times(fm, exact), exact, upper_s)


def _makespan(fm: Formulation, sel: list[int], tag: str | None, exact: bool, upper_s: float) -> LinExpr:
    """latency (and throughput, solved as it): the busy time offline, the last batch's end online."""
    if fm.workload.is_offline:
        return busy_time(fm)
    _timeline(fm, exact, upper_s)
    return fm.v.end[fm.horizon - 1] - float(fm.workload.arrivals_s.min())


def _completion(fm: Formulation, sel: list[int], tag: str | None, exact: bool, upper_s: float) -> LinExpr:
    """The mean end-to-end time over ``sel``."""
    _timeline(fm, exact, upper_s)
    T = fm.workload.arrivals_s
    fm.v.completion = _event_times(fm, "completion", fm.v.f, exact, upper_s, sel)
    return sum((c - float(T[i]) for i, c in fm.v.completion.items()), LinExpr()) * (1.0 / len(sel))


def _first_tokens(fm: Formulation, sel: list[int]) -> None:
    """started_is = [G_is >= 1]; the first token comes in batch j iff started flips there (ft_ij)."""
    m, v, J = fm.model, fm.v, fm.horizon
    v.started = {i: [m.const(0, f"started[{i},0]")] + [m.bool_var(f"started[{i},{s}]") for s in range(1, J + 1)]
                 for i in sel}
    v.ft = {i: [m.bool_var(f"ft[{i},{j}]") for j in range(J)] for i in sel}
    for i in sel:
        for s in range(1, J + 1):
            m.add(v.G[i][s] >= v.started[i][s], "event-first")
            m.add(v.G[i][s] <= int(fm.workload.output_lens[i]) * v.started[i][s], "event-first")
        for j in range(J):
            m.add(v.ft[i][j] == v.started[i][j + 1] - v.started[i][j], "event-first")


def _ttft(fm: Formulation, sel: list[int], tag: str | None, exact: bool, upper_s: float) -> LinExpr:
    """The mean time to first token over ``sel``."""
    _timeline(fm, exact, upper_s)
    _first_tokens(fm, sel)
    T = fm.workload.arrivals_s
    fm.v.first = _event_times(fm, "first", fm.v.ft, exact, upper_s, sel)
    return sum((f - float(T[i]) for i, f in fm.v.first.items()), LinExpr()) * (1.0 / len(sel))


def _tpot(fm: Formulation, sel: list[int], tag: str | None, exact: bool, upper_s: float) -> LinExpr:
    """The mean time per output token over the requests of ``sel`` with O > 1."""
    _timeline(fm, exact, upper_s)
    _first_tokens(fm, sel)
    v, O = fm.v, fm.workload.output_lens
    many = [i for i in sel if O[i] > 1]
    if not many:
        raise ValueError(f"objective tpot{':' + tag if tag else ''} needs a request with output_len > 1")
    v.first = _event_times(fm, "first", v.ft, exact, upper_s, many)
    v.completion = _event_times(fm, "completion", v.f, exact, upper_s, many)
    return sum(((v.completion[i] - v.first[i]) * (1.0 / (int(O[i]) - 1)) for i in many), LinExpr()) * (1.0 / len(many))


#: each objective of the model -> its builder: (formulation, the requests it is over, tag, exact, upper_s) -> the
#: expression to minimise (s). Each key is the ``milp`` of one row of the objective table (tests hold both ways).
BUILDERS = {"latency": _makespan, "completion": _completion, "ttft": _ttft, "tpot": _tpot, "throughput": _makespan}
