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

from ..budget import ModelTooLarge
from .flows import add_class_flows
from .formulation import Formulation, build_core, empty_formulation, num_identical_classes
from .objectives import add_objective, is_monotone, max_batch_time_s
from .policy import Policy
from .strengthening import SYMMETRY_MODES, add_dff_cuts, add_dominance, add_symmetry_breaking, add_valid_inequalities


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


#: rows of the core model and its cuts per request and batch (measured: 65-67 with the default strengthening)
CORE_ROWS_PER_CELL = 70
#: rows of the class flows per node (t tokens, state s) of a class: two conservation rows each for R and W
FLOW_ROWS_PER_NODE = 4
#: class flows are added only up to this many nodes (Σ over classes of O × (J + 1)): each node brings
#: eight variables and four rows, and on long outputs they dominate the model (O = 1024 over J = 1401
#: batches is 1.4 million nodes per class, where the whole per-request core of 8 requests has 0.8 million rows)
FLOW_NODES_MAX = 100_000
#: the largest model :func:`build` starts on (estimated rows; ~0.7 KB of Python objects per row with its
#: variables, measured, before a backend copies it): beyond it, :class:`~.budget.ModelTooLarge`
MAX_MODEL_ROWS = 1_000_000


def flow_nodes(workload: Workload, horizon: int) -> int:
    """Nodes of the class flows of :mod:`.flows` over ``horizon`` batches: Σ over classes of O × (J + 1)."""
    O = workload.output_lens
    return sum(int(O[cls[0]]) for cls in num_identical_classes(workload)) * (horizon + 1)


def estimated_rows(workload: Workload, horizon: int, strengthening: "Strengthening") -> int:
    """About how many rows :func:`build` writes (to refuse a model too large before building it)."""
    rows = CORE_ROWS_PER_CELL * len(workload) * horizon
    if strengthening.cuts and strengthening.flows and flow_nodes(workload, horizon) <= FLOW_NODES_MAX:
        rows += FLOW_ROWS_PER_NODE * flow_nodes(workload, horizon)
    return rows


def check_size(workload: Workload, horizon: int, strengthening: "Strengthening", what: str) -> int:
    """The estimated rows of the model; :class:`~.budget.ModelTooLarge` (naming its size) above MAX_MODEL_ROWS."""
    rows = estimated_rows(workload, horizon, strengthening)
    if rows > MAX_MODEL_ROWS:
        raise ModelTooLarge(f"{what} is too large to build: about {rows:,} rows (J = {horizon} batches x "
                            f"{len(workload)} requests) > {MAX_MODEL_ROWS:,}")
    return rows


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
    expr = add_objective(fm, objective, upper_s)             # throughput: its builder is the makespan's
    dominance = is_monotone(objective) and strengthening.dominance
    if dominance:
        add_dominance(fm)
    if strengthening.cuts:
        add_valid_inequalities(fm, dominance=dominance)
        if strengthening.flows and flow_nodes(workload, horizon) <= FLOW_NODES_MAX:
            add_class_flows(fm, dominance=dominance)
        elif strengthening.flows:     # optional: they never change the optimum, only the LP bound
            fm.info["flows_skipped"] = (f"{flow_nodes(workload, horizon):,} class-flow nodes > "
                                        f"{FLOW_NODES_MAX:,}")
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
