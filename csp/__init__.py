"""infermax.csp — optimal schedules from the CSP/MILP of infermax.txt §3.3.

``solve_optimal(workload, limits, cost, objective, backend, time_limit_s)``
builds a solver-neutral model (:mod:`.formulation`, :mod:`.objectives`,
:mod:`.strengthening`), warm-starts it from the best heuristic
(:mod:`.warmstart`), solves it with one of :mod:`.backends` and returns an
:class:`OptimalResult` whose schedule has been replayed.
"""
from .api import OptimalResult, Strengthening, solve_optimal
from .policy import Policy

__all__ = ["OptimalResult", "Policy", "Strengthening", "solve_optimal"]
