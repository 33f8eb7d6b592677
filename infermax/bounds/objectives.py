"""The objectives ``lower_bound`` and ``check_scheduler`` know, by name, and their measured values.

A name is ``metric[:tag]``:

- ``latency`` (makespan) and ``throughput`` (tokens per second of makespan; an upper bound);
- ``ttft``, ``e2e`` (``completion`` is the same), ``tpot``: means over the requests (TPOT over
  requests with O > 1), as :func:`infermax.metrics.metrics` computes ``*_mean_s``;
- ``ttft_p50``, ``ttft_p90``, ``ttft_p99``, ``e2e_p50``, ``e2e_p90``, ``e2e_p99``: numpy's
  linear-interpolation percentiles, as ``*_p99_s`` there;
- ``:tag`` (e.g. ``ttft:short``, ``e2e_p99:long``): the same statistic over the requests whose
  ``Request.tag`` is ``tag`` only (not for latency and throughput).

Each is one row of :data:`SPECS` (:class:`ObjectiveSpec`): its aliases, its key in ``infermax.metrics``,
its sense, whether it is monotone, taggable or a quantile, its MILP objective and horizon rule. Every
list of names (:data:`BASES`, :data:`ALL`, csp's ``OBJECTIVES``) and :func:`parse_objective` derive from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from infermax.types import Workload


@dataclass(frozen=True, kw_only=True, slots=True)
class ObjectiveSpec:
    """One objective, by its base name: the one row every layer reads (bounds, checker, CLI, MILP, tests).

    ``metric``: the per-request event it is a statistic of (latency, throughput, ttft, e2e, tpot: the
    formulas of :func:`value_of`); ``metric_key``: its key in :func:`infermax.metrics.metrics` (and in a
    scheduler's ``reported_metrics()``); ``aliases``: other names of it (``completion`` is ``e2e``);
    ``sense``: "min", or "max" (throughput: its bound is a ceiling); ``unit``: of its value;
    ``quantile``: the percentile (None: a mean or a property of the whole schedule); ``taggable``: may be
    restricted to one tag's requests (``ttft:short``); ``monotone``: the value only grows with every
    batch time (the MILP needs no exact batch-time encoding, slack never pays); ``via_makespan``: its
    bound is the workload's tokens over the makespan's (the methods bound the latency); ``in_all``: a row
    of ``--objective all``; ``milp``: the name of its MILP objective (a builder in
    :data:`infermax.csp.milp.objectives.BUILDERS`; None: the MILP has none, quantiles are bounded only);
    ``horizon``: how csp proves the model's horizon holds an optimum ("makespan": the latency's rule;
    "completion": B x the mean, untagged; "first" / "done": the batches up to the last first token /
    completion; None: no proof). Which bound methods apply is declared by each method
    (:class:`infermax.bounds.methods.BoundMethod`), so :func:`methods_of` reads the registry.
    """

    name: str
    metric: str
    metric_key: str
    aliases: tuple[str, ...] = ()
    sense: str = "min"
    unit: str = "s"
    quantile: float | None = None
    taggable: bool = True
    monotone: bool = True
    via_makespan: bool = False
    in_all: bool = False
    milp: str | None = None
    horizon: str | None = None

    def __post_init__(self) -> None:
        if self.sense not in ("min", "max"):
            raise ValueError(f"objective {self.name!r}: sense must be 'min' or 'max', got {self.sense!r}")
        if self.horizon not in (None, "makespan", "completion", "first", "done"):
            raise ValueError(f"objective {self.name!r}: unknown horizon rule {self.horizon!r}")


def _quantile(metric: str, q: int, in_all: bool = False) -> ObjectiveSpec:
    return ObjectiveSpec(name=f"{metric}_p{q}", metric=metric, metric_key=f"{metric}_p{q}_s", quantile=float(q),
                         in_all=in_all)


#: every objective, in the order the names are listed (``--help``, errors, :data:`BASES`)
SPECS: tuple[ObjectiveSpec, ...] = (
    ObjectiveSpec(name="latency", metric="latency", metric_key="latency_s", taggable=False, in_all=True,
                  milp="latency", horizon="makespan"),
    ObjectiveSpec(name="throughput", metric="throughput", metric_key="tps", sense="max", unit="tokens/s",
                  taggable=False, via_makespan=True, milp="throughput", horizon="makespan"),
    ObjectiveSpec(name="ttft", metric="ttft", metric_key="ttft_mean_s", in_all=True, milp="ttft", horizon="first"),
    ObjectiveSpec(name="e2e", metric="e2e", metric_key="e2e_mean_s", aliases=("completion",), in_all=True,
                  milp="completion", horizon="completion"),
    ObjectiveSpec(name="tpot", metric="tpot", metric_key="tpot_mean_s", monotone=False, in_all=True, milp="tpot"),
    *(_quantile(m, q, in_all=q == 99) for m in ("ttft", "e2e") for q in (50, 90, 99)),
)
#: each name and alias -> its spec
SPEC_OF: dict[str, ObjectiveSpec] = {n: s for s in SPECS for n in (s.name, *s.aliases)}
#: each MILP objective name -> its spec
SPEC_OF_MILP: dict[str, ObjectiveSpec] = {s.milp: s for s in SPECS if s.milp is not None}
_BY_STATISTIC = {(s.metric, s.quantile): s for s in SPECS}

WHOLE = tuple(n for n in SPEC_OF if not SPEC_OF[n].taggable)
MEANS = tuple(n for n in SPEC_OF if SPEC_OF[n].taggable and SPEC_OF[n].quantile is None)
QUANTILES = tuple(n for n in SPEC_OF if SPEC_OF[n].quantile is not None)
#: every name (aliases beside their objective)
BASES = tuple(SPEC_OF)
#: the rows of ``--objective all``
ALL = tuple(s.name for s in SPECS if s.in_all)


def spec_of(name: str) -> ObjectiveSpec:
    """The spec of ``name`` (``metric[:tag]``; an alias: its objective's); ValueError as :func:`parse_objective`."""
    return parse_objective(name).spec


@dataclass(frozen=True, kw_only=True, slots=True)
class Objective:
    """A parsed objective: ``metric`` (latency, throughput, ttft, e2e, tpot), ``quantile`` (percent;
    None for a mean or a makespan) and the request ``tag`` it is restricted to (None: all)."""

    name: str
    metric: str
    quantile: float | None = None
    tag: str | None = None

    @property
    def spec(self) -> ObjectiveSpec:
        """Its row of :data:`SPECS`."""
        return _BY_STATISTIC[(self.metric, self.quantile)]

    @property
    def solver_name(self) -> str | None:
        """The name of this objective for ``solve_optimal`` (None: the MILP has no such objective)."""
        if self.tag is not None:
            return None
        return self.spec.milp


def parse_objective(name: str) -> Objective:
    """Parse ``metric[:tag]``; ValueError naming the value and the known names."""
    if not isinstance(name, str):
        raise ValueError(f"objective must be a string, got {name!r}")
    base, _, tag = name.partition(":")
    if base not in SPEC_OF:
        raise ValueError(f"objective {name!r} has no bound; supported: {', '.join(BASES)}, each of "
                         f"{', '.join(b for b in BASES if b not in WHOLE)} optionally as NAME:TAG (a request tag)")
    if ":" in name and not tag:
        raise ValueError(f"objective {name!r} names an empty tag; use e.g. {base}:short")
    spec = SPEC_OF[base]
    if tag and not spec.taggable:
        raise ValueError(f"objective {name!r}: {base} is a property of the whole schedule and has no per-tag "
                         f"bound; per-tag objectives: {', '.join(b for b in BASES if b not in WHOLE)}")
    return Objective(name=name, metric=spec.metric, quantile=spec.quantile, tag=tag or None)


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
    if not objective.spec.taggable:               # a property of the whole schedule: the makespan, or over it
        latency = float(done_s.max() - arrival_s.min())
        if not objective.spec.via_makespan:
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
