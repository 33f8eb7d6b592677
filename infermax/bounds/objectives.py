"""The objectives ``lower_bound`` and ``check_scheduler`` know, by name, and their measured values.

A name is ``metric[:tag]``:

- ``latency`` (makespan) and ``throughput`` (tokens per second of makespan; an upper bound);
- ``ttft``, ``e2e`` (``completion`` is the same), ``tpot``: means over the requests (TPOT over
  requests with O > 1), as :func:`infermax.metrics.metrics` computes ``*_mean_s``;
- ``ttft_p50``, ``ttft_p90``, ``ttft_p99``, ``e2e_p50``, ``e2e_p90``, ``e2e_p99``: numpy's
  linear-interpolation percentiles, as ``*_p99_s`` there;
- ``:tag`` (e.g. ``ttft:short``, ``e2e_p99:long``): the same statistic over the requests whose
  ``Request.tag`` is ``tag`` only (not for latency and throughput).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from infermax.types import Workload

WHOLE = ("latency", "throughput")
MEANS = ("ttft", "e2e", "completion", "tpot")
QUANTILES = tuple(f"{m}_p{q}" for m in ("ttft", "e2e") for q in (50, 90, 99))
BASES = WHOLE + MEANS + QUANTILES
#: the rows of ``--objective all``
ALL = ("latency", "ttft", "e2e", "tpot", "ttft_p99", "e2e_p99")
_QUANTILE = re.compile(r"^(ttft|e2e)_p(\d+)$")


@dataclass(frozen=True, kw_only=True, slots=True)
class Objective:
    """A parsed objective: ``metric`` (latency, throughput, ttft, e2e, tpot), ``quantile`` (percent;
    None for a mean or a makespan) and the request ``tag`` it is restricted to (None: all)."""

    name: str
    metric: str
    quantile: float | None = None
    tag: str | None = None

    @property
    def solver_name(self) -> str | None:
        """The name of this objective for ``solve_optimal`` (None: the MILP has no such objective)."""
        if self.tag is not None or self.quantile is not None:
            return None
        return "completion" if self.metric == "e2e" else self.metric


def parse_objective(name: str) -> Objective:
    """Parse ``metric[:tag]``; ValueError naming the value and the known names."""
    if not isinstance(name, str):
        raise ValueError(f"objective must be a string, got {name!r}")
    base, _, tag = name.partition(":")
    if base not in BASES:
        raise ValueError(f"objective {name!r} has no bound; supported: {', '.join(BASES)}, each of "
                         f"{', '.join(b for b in BASES if b not in WHOLE)} optionally as NAME:TAG (a request tag)")
    if ":" in name and not tag:
        raise ValueError(f"objective {name!r} names an empty tag; use e.g. {base}:short")
    if tag and base in WHOLE:
        raise ValueError(f"objective {name!r}: {base} is a property of the whole schedule and has no per-tag "
                         f"bound; per-tag objectives: {', '.join(b for b in BASES if b not in WHOLE)}")
    match = _QUANTILE.match(base)
    if match:
        return Objective(name=name, metric=match[1], quantile=float(match[2]), tag=tag or None)
    return Objective(name=name, metric="e2e" if base == "completion" else base, tag=tag or None)


def members(workload: Workload, tag: str | None) -> np.ndarray:
    """Indices of the requests tagged ``tag`` (all for None); ValueError naming the known tags."""
    if tag is None:
        return np.arange(len(workload))
    tags = [r.tag for r in workload.requests]
    idx = np.flatnonzero([t == tag for t in tags])
    if idx.size == 0:
        known = sorted({t for t in tags if t is not None})
        raise ValueError(f"no request of workload {workload.name!r} has tag {tag!r}; its tags: "
                         f"{', '.join(known) if known else 'none (the requests are untagged)'}")
    return idx


def subset(workload: Workload, idx: np.ndarray) -> Workload:
    """The requests at ``idx`` as a workload of their own."""
    if idx.size == len(workload):
        return workload
    return Workload(requests=tuple(workload.requests[int(i)] for i in idx), name=workload.name)


def value_of(objective: Objective, arrival_s: np.ndarray, first_s: np.ndarray, done_s: np.ndarray,
             output_len: np.ndarray, tags: np.ndarray | None = None) -> float:
    """The objective's value from per-request times, with the formulas of ``infermax.metrics``."""
    if objective.metric in WHOLE:
        latency = float(done_s.max() - arrival_s.min())
        if objective.metric == "latency":
            return latency
        return float(output_len.sum()) / latency if latency > 0 else math.inf      # as infermax.metrics's tps
    sel = np.ones(arrival_s.size, dtype=bool) if objective.tag is None else \
        np.array([t == objective.tag for t in tags], dtype=bool)
    if not sel.any():
        raise ValueError(f"objective {objective.name!r}: no request has tag {objective.tag!r}")
    if objective.metric == "tpot":
        many = sel & (output_len > 1)
        if not many.any():
            raise ValueError(f"objective {objective.name!r} needs a request with output_len > 1")
        return float(((done_s - first_s)[many] / (output_len[many] - 1)).mean())
    values = ((first_s if objective.metric == "ttft" else done_s) - arrival_s)[sel]
    if objective.quantile is None:
        return float(values.mean())
    return float(np.percentile(values, objective.quantile))


def trace_value(objective: Objective, trace) -> float:
    """The objective's value on a replayed :class:`~infermax.trace.Trace`."""
    r = trace.requests
    tags = np.array([t or None for t in r["tag"]], dtype=object)
    return value_of(objective, r["arrival_s"], r["first_token_s"], r["completion_s"], r["output_len"], tags)
