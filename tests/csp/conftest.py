"""Factories for the MILP tests: tiny instances, their heuristic schedules, a solver guard."""
from __future__ import annotations

import pytest

from infermax import Limits, Workload, simulate
from infermax.costmodel import get_cost_model
from infermax.engine import SchedulerStuckError
from infermax.state import ScheduleError

#: a spread of heuristics (prefill/decode priority, hybrid or not, chunked or not, eviction-free)
SOME_SCHEDULERS = ("vllm", "vllm-ef", "sarathi", "sarathi-nohy", "sarathi-pc", "rank-i")


@pytest.fixture(scope="session")
def cost():
    return get_cost_model(None)


def section45(I: int) -> tuple[str, str]:
    """The §4.5 instance: B = O = 4, M = max(2I, I + O - 1), C = 4096."""
    return f"fixed:I={I},O=4,B=4", f"M={max(2 * I, I + 3)},C=4096"


def heuristic_schedules(workload: Workload, limits: Limits, cost, names=SOME_SCHEDULERS):
    """(name, SimResult) for every scheduler in ``names`` that completes the instance."""
    out = []
    for name in names:
        try:
            out.append((name, simulate(workload, name, limits, cost)))
        except (SchedulerStuckError, ScheduleError):
            continue
    return out
