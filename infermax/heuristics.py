"""The registered heuristics as the solver sees them: their Schedules on an instance, and their classes.

The MILP never runs a scheduler (docs/design.md: a warm start arrives as a Schedule, and
``infermax.csp`` does not import ``infermax.schedulers``). Running them is the
simulator's job, done here: :func:`heuristic_schedules` simulates the heuristics a
warm-start source names and hands back their Schedules (:mod:`infermax.optimal` reads the name), which
:func:`infermax.csp.warmstart.find_warm_start` then judges. (The optimum's policy class
of a scheduler comes from :func:`infermax.optimal.policy_of`.)
"""
from __future__ import annotations

import logging
import math
import time

from .costmodel import CostModel
from .engine import SchedulerStuckError, simulate
from .schedulers import available
from .state import ScheduleError
from .types import Limits, Schedule, Workload

log = logging.getLogger(__name__)


def heuristic_schedules(workload: Workload, limits: Limits, cost: CostModel, source: str,
                        deadline: float = math.inf) -> list[tuple[str, Schedule]]:
    """(name, simulated schedule) of each heuristic ``source`` names, in name order.

    source: "best" for every registered scheduler, else one scheduler's name (options allowed,
    ``"vllm:R_max=4"``). With "best", a scheduler that fails or refuses the instance is left out
    and the runs stop once ``deadline`` (``time.perf_counter()``) has passed; the one scheduler
    asked for by name must finish (ValueError naming it otherwise).
    """
    names = available() if source == "best" else [source]
    out: list[tuple[str, Schedule]] = []
    for name in names:
        if time.perf_counter() > deadline:
            log.info("warm start: time is up after %d of %d schedulers", len(out), len(names))
            break
        try:
            out.append((name, simulate(workload, name, limits, cost).schedule))
        except (SchedulerStuckError, ScheduleError, ValueError) as exc:
            if source != "best":      # the one scheduler asked for: an unknown name or a refusal is an error
                raise ValueError(f"warm start {source!r}: {exc}") from exc
            log.info("warm start: scheduler %s failed on this instance (%s)", name, exc)
    return out

