"""The three inputs every entry point takes — a workload, limits, a cost model — from objects or spec strings.

A leaf: the simulator (:mod:`.engine`), the judge (:mod:`.replay`), the MILP (:mod:`infermax.csp`) and the
bounds (:mod:`infermax.bounds`) all read their inputs here, so none of them imports another for it.
"""
from __future__ import annotations

from .clock import on_relative_clock
from .costmodel import CostModel, get_cost_model
from .types import Limits, Workload


def resolve_inputs(workload: "Workload | str", limits: "Limits | str | None",
                   cost: "CostModel | str | None") -> tuple[Workload, Limits, CostModel]:
    """Accept objects or spec strings for the three inputs every entry point takes; the workload comes back
    on its relative clock (:mod:`infermax.clock`: its first arrival at 0, docs/design.md invariant 7)."""
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    if not isinstance(workload, Workload):
        raise ValueError(f"workload must be a Workload or a spec string, got {workload!r}")
    workload = on_relative_clock(workload)
    if limits is None or isinstance(limits, str):
        limits = Limits.from_spec(limits)
    if not isinstance(limits, Limits):
        raise ValueError(f"limits must be a Limits or a spec string, got {limits!r}")
    return workload, limits, get_cost_model(cost)
