"""A cluster run measured over a fixed window, as a capacity experiment measures it (Medha §5.2).

Medha profiles each load for 60 minutes; a system that falls behind leaves requests
without a first token by the end ("truncated CDFs", Fig. 15). ``ClusterEngine.run(
until_s=T)`` stops the event loop at T and returns a :class:`WindowResult`: per
request, its first token and completion if they happened by T, else *censored*
(not yet). That also spares simulating the hours an overloaded system needs to
drain its backlog.

Statistics over censored values, as a truncated CDF reads: a request without a
first token by T counts as +∞, so a TTFT percentile is the value where the CDF over
*all* requests arrived by T reaches it (``inf`` if it never does; a request that
arrived just before T and would have been served soon counts as +∞ too, so late
arrivals bias it up, as they do the paper's curves); ``served_fraction`` is where
the CDF ends. ``ttft_p50_lb_s`` replaces each censored TTFT by its bound T − arrival:
the median of those is a lower bound of the true median, finite where ``ttft_p50_s``
is not. TPOT (decode latency, Fig. 16) is over the requests completed by T with more
than one output token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

_HUGE = 1e300          # stands for +inf in percentiles (np.percentile interpolates inf into nan)


@dataclass(frozen=True, eq=False)
class WindowResult:
    """A run stopped at ``until_s``: per-request times (NaN: not by then) and window metrics."""

    until_s: float
    arrival_s: np.ndarray
    first_token_s: np.ndarray
    completion_s: np.ndarray
    output_lens: np.ndarray
    tags: np.ndarray
    metrics: dict[str, float]
    by_tag: dict[str, dict[str, float]]


def _pct(values: np.ndarray, qs: tuple[int, ...]) -> list[float]:
    if values.size == 0:
        return [math.nan] * len(qs)
    out = np.percentile(np.where(np.isinf(values), _HUGE, values), qs)
    return [math.inf if v >= _HUGE / 10 else float(v) for v in out]


def window_metrics(arrival: np.ndarray, first: np.ndarray, done: np.ndarray, out_len: np.ndarray,
                   until_s: float) -> dict[str, float]:
    """TTFT percentiles over the requests arrived by ``until_s`` (+∞ for those without a first token
    by then), TPOT percentiles over those completed by then, and the counts."""
    came = arrival <= until_s
    got = came & (first <= until_s)
    ttft = np.where(got, first - arrival, math.inf)[came]
    fin = came & (done <= until_s) & (out_len > 1)
    tpot = ((done - first) / np.maximum(out_len - 1, 1))[fin]
    out = {"num_arrived": int(came.sum()), "num_first_token": int(got.sum()),
           "num_completed": int((came & (done <= until_s)).sum()),
           "served_fraction": float(got.sum() / came.sum()) if came.any() else math.nan}
    for name, v in (("ttft", ttft), ("tpot", tpot)):
        p50, p90, p99 = _pct(v, (50, 90, 99))
        out |= {f"{name}_p50_s": p50, f"{name}_p90_s": p90, f"{name}_p99_s": p99}
    # a censored TTFT is at least until_s - arrival: with those bounds, the median is a lower bound of the true one
    out["ttft_p50_lb_s"] = _pct(np.where(got, first - arrival, until_s - arrival)[came], (50,))[0]
    return out


def windowed(engine: Any, until_s: float) -> WindowResult:
    """The :class:`WindowResult` of ``engine`` (a ClusterEngine) whose loop stopped at ``until_s``."""
    engine.migrations.advance_all(until_s)            # decode replicas run on demand: up to the end
    w, reps, disp = engine.workload, engine.replicas, engine.dispatcher
    n = len(w)
    first = np.full(n, math.nan)
    done = np.full(n, math.nan)
    on_gang = engine.roles.on_gang
    decode_of = engine.migrations.decode_of
    for r in reps.built:
        st = reps.state(r)
        mine = (disp.replica_of == r) & ~on_gang
        first[mine] = st.first_token_s[mine]
        done[mine] = st.completion_s[mine]
    for r in reps.built:              # a migrated decode completes on its decode replica (or not yet)
        dec = decode_of == r
        done[dec] = reps.state(r).completion_s[dec]
    for g in engine.gangs.gangs:
        first[g.request] = g.first_token_s
        if not math.isnan(g.completion_s):
            done[g.request] = g.completion_s
    first = np.where(first <= until_s, first, math.nan)
    done = np.where(done <= until_s, done, math.nan)
    tags = np.array([r.tag or "" for r in w.requests], dtype=object)
    out_len = w.output_lens
    metrics = window_metrics(w.arrivals_s, first, done, out_len, until_s)
    by_tag = {str(t): window_metrics(w.arrivals_s[tags == t], first[tags == t], done[tags == t],
                                     out_len[tags == t], until_s) for t in sorted(set(tags.tolist())) if t}
    return WindowResult(until_s=until_s, arrival_s=w.arrivals_s.copy(), first_token_s=first, completion_s=done,
                        output_lens=out_len.copy(), tags=tags, metrics=metrics, by_tag=by_tag)
