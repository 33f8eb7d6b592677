"""The complete §3.3 model of one instance: core, objective, strengthening, an optional better-than row.

:class:`Strengthening` names the model options (each measured in ``benchmarks/milp_bench.py``);
:func:`build` puts :mod:`.formulation`, :mod:`.objectives`, :mod:`.strengthening` and :mod:`.flows`
together in that order; :func:`backend_kwargs` passes the options a backend reads itself.
The conductor (:mod:`infermax.csp.api`) decides when to build and with what horizon.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from infermax.costmodel import CostModel
from infermax.types import Limits, Workload

from .flows import add_class_flows
from .formulation import Formulation, build_core, empty_formulation
from .objectives import add_objective, is_monotone, max_batch_time_s
from .policy import Policy
from .strengthening import (SYMMETRY_MODES, add_dff_cuts, add_dominance, add_symmetry_breaking,
                            add_valid_inequalities)


@dataclass(frozen=True, kw_only=True, slots=True)
class Strengthening:
    """Model options (all on by default, except dff; the benchmark switches them one at a time).

    symmetry: "completion" | "lex" | "none" (completion order measured fastest).
    cuts: valid inequalities. flows: aggregated class flows with their
    bin-packing rows (:mod:`.flows`). dff: the same bin-packing cuts on
    per-request indicators (useful without flows). dominance: evict
    decode-phase requests only (used for monotone objectives). indicators:
    "native" (backend decides) or "big-m" (rows of eq. (6) for every backend).
    big_m: "tight" (from variable bounds) or "loose" (one global M). products:
    "exact" or "mccormick" (under-approximation for MIP backends, gap reported).
    """

    symmetry: str = "completion"
    cuts: bool = True
    flows: bool = True
    dff: bool = False
    dominance: bool = True
    indicators: str = "native"
    big_m: str = "tight"
    products: str = "exact"

    def __post_init__(self) -> None:
        if self.symmetry not in SYMMETRY_MODES:
            raise ValueError(f"Strengthening.symmetry must be one of {SYMMETRY_MODES}, got {self.symmetry!r}")
        if self.indicators not in ("native", "big-m"):
            raise ValueError(f"Strengthening.indicators must be 'native' or 'big-m', got {self.indicators!r}")
        if self.big_m not in ("tight", "loose"):
            raise ValueError(f"Strengthening.big_m must be 'tight' or 'loose', got {self.big_m!r}")
        if self.products not in ("exact", "mccormick"):
            raise ValueError(f"Strengthening.products must be 'exact' or 'mccormick', got {self.products!r}")
        if (self.dff or self.flows) and not self.cuts:
            raise ValueError("Strengthening.dff and .flows need cuts=True (they extend the cut set)")


def build(workload: Workload, limits: Limits, cost: CostModel, objective: str, policy: Policy, horizon: int,
          strengthening: Strengthening, target: float | None = None, deadline: float = math.inf) -> Formulation:
    """The complete model (core, objective, strengthening, optional better-than row).

    Building stops with :class:`.budget.BudgetExhausted` once ``deadline`` (``time.perf_counter()``) passes.
    """
    fm = empty_formulation(workload, limits, cost, policy, horizon, objective)
    fm.model.deadline = deadline
    build_core(fm)
    T = workload.arrivals_s
    upper_s = float(T.max()) + horizon * max_batch_time_s(fm)
    expr = add_objective(fm, "latency" if objective == "throughput" else objective, upper_s)
    dominance = is_monotone(objective) and strengthening.dominance
    if dominance:
        add_dominance(fm)
    if strengthening.cuts:
        add_valid_inequalities(fm, dominance=dominance)
        if strengthening.flows:
            add_class_flows(fm, dominance=dominance)
        if strengthening.dff:
            add_dff_cuts(fm)
    add_symmetry_breaking(fm, strengthening.symmetry)
    if target is not None:
        fm.model.add(expr <= target, "better-than")
    fm.info["objective_expr"] = expr
    return fm


def backend_kwargs(be, strengthening: Strengthening, solver_params: dict | None) -> dict[str, Any]:
    """What the backend ``be`` reads of the options: CP-SAT its parameters, the others how to linearise."""
    if be.NAME == "cpsat":
        return {"params": solver_params}
    return {"products": strengthening.products, "big_m": strengthening.big_m}
