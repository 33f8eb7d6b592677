"""Capacity search: the highest arrival rate at which a scheduler still meets a target (Vidur's capacity
search, here over infermax's simulations).

A *target* is one metric of :func:`infermax.metrics` and a bound, ``"ttft_p99_s<=2.0"`` (a latency
percentile stays within a limit) or ``"slo_attainment>=0.9"`` (a share of requests meets its SLOs;
the workload's requests must carry SLOs, e.g. a ``medha:`` or ``pecsched:`` spec, or
:func:`infermax.workloads.long.with_slos`). The workload is a spec with ``{rate}`` where the
arrival rate (requests per second) goes — ``"fixed:I=512,O=128,B=400,rate={rate}"`` — or a
``fixed:``/``mix:``/``medha:`` spec without a rate, to which ``rate=`` is added. The number of
requests stays what the spec says.

The search assumes the metric only gets worse as the rate grows. It first brackets the
capacity — ``lo_rps`` must meet the target (else it reports that none of the rates tried does);
without ``hi_rps`` it doubles the rate until one fails — and then narrows the bracket
``[passing, failing]`` by parallel bisection: each round runs ``workers`` rates spread evenly
inside the bracket at once on the sweep executor (:func:`infermax.sweep.run_cells`: serial, a local
process pool or Ray), until the bracket is narrower than ``rel_tol`` of its lower end. The answer is
the highest rate that met the target; every rate run is kept, with its metric value.
"""
from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from .sweep import Cell, canonical_limits, run_cells

_TARGET = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(<=|>=)\s*([-+0-9.eE]+)\s*$")
RATE_KINDS = ("fixed", "mix", "medha")


@dataclass(frozen=True, slots=True)
class Target:
    """``metric <= bound`` (a latency, say) or ``metric >= bound`` (an attainment)."""

    metric: str
    op: str
    bound: float

    @classmethod
    def parse(cls, text: str) -> "Target":
        m = _TARGET.match(str(text))
        if not m:
            raise ValueError(f"capacity: target must look like METRIC<=VALUE or METRIC>=VALUE "
                             f"(e.g. ttft_p99_s<=2.0, slo_attainment>=0.9), got {text!r}")
        bound = float(m.group(3))
        if not math.isfinite(bound):
            raise ValueError(f"capacity: the target's bound must be finite, got {m.group(3)!r}")
        return cls(m.group(1), m.group(2), bound)

    def met(self, value: float) -> bool:
        """Whether ``value`` meets the target (NaN never does)."""
        return bool(value == value and (operator.le if self.op == "<=" else operator.ge)(value, self.bound))

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"


@dataclass(frozen=True, slots=True)
class Probe:
    rate_rps: float
    value: float
    met: bool


@dataclass(frozen=True)
class CapacityResult:
    """The highest rate run that met the target (None if none did), the last bracket and every probe."""

    target: Target
    rate_rps: float | None
    failing_rps: float | None          # the lowest rate run that failed (None: none failed)
    probes: tuple[Probe, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"target": str(self.target), "capacity_rps": self.rate_rps, "failing_rps": self.failing_rps,
                "probes": [{"rate_rps": p.rate_rps, self.target.metric: p.value, "met": p.met} for p in self.probes]}


def workload_at(template: str, rate_rps: float) -> str:
    """The workload spec at ``rate_rps`` (``{rate}`` replaced, or ``rate=`` added to a fixed/mix/medha spec)."""
    if "{rate}" in template:
        return template.replace("{rate}", f"{rate_rps:.6g}")
    kind = template.partition(":")[0].strip().lower()
    if kind not in RATE_KINDS:
        raise ValueError(f"capacity: workload {template!r} has no {{rate}} placeholder, and only "
                         f"{', '.join(RATE_KINDS)} specs take a rate= option")
    if re.search(r"(^|[:,])\s*rate\s*=", template):
        raise ValueError(f"capacity: workload {template!r} fixes its rate; put {{rate}} where the rate goes")
    return f"{template},rate={rate_rps:.6g}"


def _check_rates(lo_rps: float, hi_rps: float | None, rel_tol: float, workers: int, max_rounds: int) -> None:
    for name, v in (("lo_rps", lo_rps), ("rel_tol", rel_tol)) + ((("hi_rps", hi_rps),) if hi_rps is not None else ()):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"capacity: {name} must be a finite number > 0, got {v!r}")
    if hi_rps is not None and hi_rps <= lo_rps:
        raise ValueError(f"capacity: hi_rps = {hi_rps!r} must exceed lo_rps = {lo_rps!r}")
    for name, v in (("workers", workers), ("max_rounds", max_rounds)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"capacity: {name} must be an integer >= 1, got {v!r}")


def find_capacity(workload: str, scheduler: str = "vllm", limits: str | None = None, cost: str = "default",
                  target: "str | Target" = "ttft_p99_s<=1.0", lo_rps: float = 0.5, hi_rps: float | None = None,
                  rel_tol: float = 0.05, executor: str = "local", workers: int = 2, max_rounds: int = 12,
                  progress: Callable[[CapacityResult], None] | None = None) -> CapacityResult:
    """The highest arrival rate (requests/s) at which ``scheduler`` meets ``target``; see the module."""
    tgt = target if isinstance(target, Target) else Target.parse(target)
    _check_rates(lo_rps, hi_rps, rel_tol, workers, max_rounds)
    lim = canonical_limits(limits or "")
    workload_at(workload, lo_rps)                      # a bad template is refused before any run
    probes: dict[float, Probe] = {}

    def run(rates: list[float]) -> None:
        cells = {r: Cell(workload_at(workload, r), scheduler, lim, cost) for r in rates if r not in probes}
        if not cells:
            return
        table = run_cells(list(cells.values()), executor=executor, workers=min(workers, len(cells)))
        for rate, row in zip(cells, table.to_dict("records")):
            if isinstance(row.get("error"), str):
                raise ValueError(f"capacity: the run at {rate:g} requests/s failed: {row['error']}")
            if tgt.metric not in row:
                raise ValueError(f"capacity: metric {tgt.metric!r} is not among the run's metrics "
                                 f"({', '.join(sorted(k for k in row if isinstance(row[k], float)))})")
            value = float(row[tgt.metric])
            probes[rate] = Probe(rate, value, tgt.met(value))
        if progress is not None:
            progress(_result(tgt, probes))

    # bracket: lo must pass; then double (workers rates per round) until one fails
    run([lo_rps] if hi_rps is None else [lo_rps, hi_rps])
    rounds = 0
    while hi_rps is None and _result(tgt, probes).failing_rps is None and probes[lo_rps].met and rounds < max_rounds:
        top = max(probes)
        run([top * 2 ** (k + 1) for k in range(workers)])
        rounds += 1
    # narrow the bracket [passing, failing]: workers rates spread evenly inside it per round
    res = _result(tgt, probes)
    while res.rate_rps is not None and res.failing_rps is not None and rounds < max_rounds \
            and res.failing_rps - res.rate_rps > rel_tol * res.rate_rps:
        a, b = res.rate_rps, res.failing_rps
        run([a + (b - a) * (k + 1) / (workers + 1) for k in range(workers)])
        res = _result(tgt, probes)
        rounds += 1
    return res


def _result(tgt: Target, probes: dict[float, Probe]) -> CapacityResult:
    """The bracket the probes give: the highest passing rate below the lowest failing one."""
    failing = min((p.rate_rps for p in probes.values() if not p.met), default=None)
    passing = [p.rate_rps for p in probes.values() if p.met and (failing is None or p.rate_rps < failing)]
    return CapacityResult(tgt, max(passing) if passing else None, failing,
                          tuple(probes[r] for r in sorted(probes)))
