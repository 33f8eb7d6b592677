"""Warm starts: the best heuristic schedule, the horizon it implies, and its hint.

A heuristic schedule (any registered scheduler's, simulated outside csp by
:mod:`infermax.heuristics` and replayed here) is an upper bound UB.
It becomes a complete assignment of every model variable (``assign``), so the
solver starts from a feasible point — and, as a test, the model must accept it
with an objective equal to the replayed one. Before that the schedule is
cleaned (:func:`.trajectory.strip_wasted_work`) and relabelled into the
symmetry-breaking order (:func:`.trajectory.canonical_labels`).

The horizon J must hold an optimal schedule. For latency each non-empty batch
costs at least β = f(0) + min(decode, prefill bias) on top of the work w every
schedule does (Σ Pk tokens at the cheapest slope, Σ I(I+1)/2 causal prefill work), so
an optimal schedule has at most ⌊(UB - w) / β⌋ batches. For mean TTFT only the
batches up to the last first token are priced (:func:`horizon_for_events`); a
tail that finishes every request after them is counted on top.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from infermax.costmodel import CostModel, linear_coefficients
from infermax.metrics import metrics as compute_metrics
from infermax.replay import replay
from infermax.state import ScheduleError
from infermax.types import Limits, Schedule, Workload

from .milp.flows import assign_flows
from .milp.formulation import Formulation
from .milp.objectives import MAXIMISED, nonattention_segments, trace_objective
from .milp.policy import Policy
from .milp.trajectory import canonical_labels, respects_policy, sequential_schedule, strip_wasted_work, trajectory

log = logging.getLogger(__name__)

__all__ = ["WarmStart", "assign", "canonical_labels", "find_warm_start", "horizon_for_events", "horizon_for_latency"]



@dataclass(frozen=True)
class WarmStart:
    """The schedule the solver starts from, who produced it, and its replayed value (minimised)."""

    name: str
    schedule: Schedule
    value: float
    latency_s: float


def find_warm_start(workload: Workload, limits: Limits, cost: CostModel, objective: str, policy: Policy,
                    candidates: Sequence[tuple[str, Schedule]], clean: bool) -> WarmStart | None:
    """The best valid starting schedule in ``policy``'s class among ``candidates`` (name, schedule) and
    the sequential schedule (always tried: the horizon needs some schedule)."""
    best: WarmStart | None = None
    for name, sched in [*candidates, ("sequential", sequential_schedule(workload, limits))]:
        # the replay below judges validity; the policy class needs its own look only when it restricts
        if not policy.is_unconstrained and not respects_policy(sched, workload, limits, cost, policy):
            continue
        if clean and any(b.evict.size for b in sched.batches):     # only evictions leave wasted work
            sched = strip_wasted_work(sched, workload, policy.effective_limits(limits), cost)
        try:
            trace = replay(sched, workload, policy.effective_limits(limits), cost)
        except ScheduleError as exc:
            log.info("warm start: %s's schedule is invalid here (%s)", name, exc)
            continue
        met = compute_metrics(trace)
        # minimised: throughput is solved as latency
        value = float(met["latency_s"]) if objective in MAXIMISED else trace_objective(trace, met, objective)
        if best is None or value < best.value - 1e-15:
            best = WarmStart(name, sched, value, float(met["latency_s"]))
    return best


def horizon_for_latency(upper_s: float, workload: Workload, cost: CostModel) -> int | None:
    """Batches an optimal latency schedule can have: ⌊(UB - work lower bound) / β⌋ (valid, see module doc);
    None when the cost model gives batches no fixed cost (β = 0: no count is proven)."""
    k = linear_coefficients(cost, "the horizon proof")
    f0, segs = nonattention_segments(k.nonattn_lines, 1)
    slope = segs[0][1]
    beta = f0 + min(k.decode_bias_s, k.prefill_bias_s)
    I = workload.input_lens.astype(np.float64)
    Pk = I + workload.output_lens - 1
    work = slope * Pk.sum() + k.prefill_attn_s * float((I * (I + 1) / 2).sum())
    if beta <= 0:
        return None
    return max(1, int(math.floor((upper_s - work) / beta * (1 + 1e-9))))


def horizon_for_events(upper_s: float, workload: Workload, limits: Limits, cost: CostModel,
                       policy: Policy, which: np.ndarray | None = None, event: str = "first") -> int | None:
    """Batches some schedule optimal for the mean TTFT (``event`` "first") or the mean end-to-end
    time (``event`` "done") of the requests ``which`` (None: all) fits in; None where no such
    count is proven.

    ``upper_s`` bounds the busy time up to the last such event of an optimal schedule (their
    count × the warm start's mean plus the spread of arrivals). Those batches each cost at least β
    on top of the work the events need (the prompts of ``which`` for first tokens, all their
    tokens for completions, at the cheapest slope, plus the causal attention of their prompts), so
    there are at most K = ⌊(upper - work) / β⌋ of them. After the last event the schedule may end
    any valid way without changing the objective; one that always exists:

    - with eviction and chunked prefill (or every refill fitting min(C, P) whole): evict every
      running request, then finish the requests one at a time — a refill of at most I + O - 1
      tokens in chunks of min(C, P), then its decodes: ⌈(I + O - 1) / min(C, P)⌉ + O - 2 batches
      for a request that has its first token, one more for one that may not;
    - without eviction: the optimal schedule's own continuation, every batch of which serves at
      least one token: at most the tokens left, Σ (O - 1) over the requests with a first token and
      Σ (I + O - 1) over the others.

    Any other policy class gets None (the tail is not bounded here).
    """
    I, O = workload.input_lens, workload.output_lens
    chosen = np.zeros(len(workload), dtype=bool)
    chosen[np.arange(len(workload)) if which is None else np.asarray(which, dtype=np.int64)] = True
    k = linear_coefficients(cost, "the horizon proof")
    f0, segs = nonattention_segments(k.nonattn_lines, 1)
    beta = f0 + min(k.decode_bias_s, k.prefill_bias_s)
    if beta <= 0:
        return None
    If = I[chosen].astype(np.float64)
    tokens = If if event == "first" else If + O[chosen] - 1
    work = segs[0][1] * tokens.sum() + k.prefill_attn_s * float((If * (If + 1) / 2).sum())
    prefix = max(1, int(math.floor((upper_s - work) / beta * (1 + 1e-9))))
    cap = min(limits.C, limits.P)
    started = chosen & (O > 1) if event == "first" else np.zeros_like(chosen)    # has its first token
    rest = ~chosen                                                               # may have nothing yet
    if not policy.allow_eviction:
        tail = int((O - 1)[started].sum() + (I + O - 1)[rest].sum())
    elif policy.chunked_prefill or int((I + O - 1).max()) <= cap:
        refill = -(-(I + O - 1) // cap)
        tail = int((refill + O - 2)[started].sum() + (refill + O - 1)[rest].sum())
    else:
        return None
    return prefix + tail


# complexity: one loop per variable family of the model, each filled from the schedule, in model order
def assign(fm: Formulation, schedule: Schedule) -> np.ndarray:
    """Every model variable's value for ``schedule`` (which must fit in the horizon).

    Long because it sets every variable family of :class:`.milp.formulation.Variables` in the order the
    formulation declares them, each from the schedule's trajectory.
    """
    w, v, J, model = fm.workload, fm.v, fm.horizon, fm.model
    tr = trajectory(schedule, w, fm.limits, fm.cost)
    n = tr.c.shape[1]
    if n > J:
        raise ValueError(f"schedule has {n} batches > horizon {J}")
    B = len(w)
    pad = J - n
    P = lambda a: np.pad(a, ((0, 0), (0, pad)), mode="edge")          # states stay after the last batch
    Z = lambda a: np.pad(a, ((0, 0), (0, pad)))                        # batches are empty
    m, inp, gen = P(tr.m), P(tr.inp), P(tr.gen)
    c, e, dec = Z(tr.c), Z(tr.e), Z(tr.decode.astype(np.int64))
    O = w.output_lens[:, None]
    fin = (gen == O).astype(np.int64)
    D = ((m >= inp) & (m > 0) & (fin == 0)).astype(np.int64)
    ev = e * m[:, :-1]
    k = m[:, :-1] - ev + c
    g = gen[:, 1:] - gen[:, :-1]
    dp = dec * (1 - e) * (c > 0)
    x = np.full(model.num_vars, np.nan)

    def put(grid, values):
        for i in range(B):
            for s, var in enumerate(grid[i]):
                x[var.index] = values[i, s]

    for name, val in (("m", m), ("inp", inp), ("G", gen), ("D", D), ("F", fin), ("mz", (m > 0) * 1),
                      ("c", c), ("k", k), ("ev", ev), ("e", e), ("g", g), ("cz", (c > 0) * 1),
                      ("kz", (k > 0) * 1), ("dp", dp), ("f", fin[:, 1:] - fin[:, :-1]), ("kvd", dp * k)):
        put(getattr(v, name), val)
    for i, rows in enumerate(v.gam or []):
        for s in range(J + 1):
            for t, var in enumerate(rows[s]):
                x[var.index] = float(gen[i, s] >= t + 1)
    for i, row in (v.started or {}).items():       # {request: row}
        for s, var in enumerate(row):
            x[var.index] = float(gen[i, s] >= 1)
    busy = (c > 0).any(axis=0)
    for j in range(J):
        x[v.y[j].index] = float(busy[j])
        x[v.yd[j].index] = float(dp[:, j].any())
        x[v.yp[j].index] = float(((c[:, j] > 0) & (dp[:, j] == 0)).any())
        left = int(c[:, j].sum())
        for q, (length, _) in enumerate(v.segs):
            x[v.seg[j][q].index] = min(length, left)
            left -= min(length, left)
    for i, row in enumerate(v.qe or []):
        for j, var in enumerate(row):
            x[var.index] = ev[i, j] ** 2
    for i, row in enumerate(v.w or []):
        for j, var in enumerate(row):
            if var is not None:
                h = 2 * k[i, j] - c[i, j] + 1               # c·h/2 = the causal pairs c·m + c(c + 1)/2
                x[v.h[i][j].index] = h
                x[var.index] = c[i, j] * h
                x[v.pw[i][j].index] = c[i, j] * h / 2 * (1 - dp[i, j])
    _assign_times(fm, x, tr, fin, gen, pad)
    assign_flows(fm, x, gen, D, fin, e, g)
    for var, fn in fm.derived:
        x[var.index] = fn(x)
    missing = np.flatnonzero(np.isnan(x))
    if missing.size:
        raise RuntimeError(f"assign left {missing.size} variables unset, e.g. {model.names[int(missing[0])]}")
    return x


def _assign_times(fm: Formulation, x: np.ndarray, tr, fin: np.ndarray, gen: np.ndarray,
                  pad: int) -> None:
    v = fm.v
    if not v.end:
        return
    n = tr.start_s.size
    last = tr.start_s[-1] + tr.duration_s[-1] if n else 0.0
    starts = np.concatenate([tr.start_s, np.full(pad, last)])
    ends = np.concatenate([tr.start_s + tr.duration_s, np.full(pad, last)])
    for j, var in enumerate(v.end):
        x[var.index] = ends[j]
        if v.start:
            x[v.start[j].index] = starts[j]
    for name, happened in (("completion", fin), ("first", (gen >= 1).astype(np.int64))):
        for i, var in (getattr(v, name, None) or {}).items():       # {request: event time}
            x[var.index] = ends[int(np.argmax(np.diff(happened[i]) > 0))]
    for i, row in (v.ft or {}).items():
        for j, var in enumerate(row):
            x[var.index] = float(gen[i, j + 1] >= 1 and gen[i, j] == 0)
