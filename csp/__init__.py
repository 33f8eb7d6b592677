"""infermax.csp — optimal schedules from the CSP/MILP of infermax.txt §3.3.

``solve_optimal(workload, limits, cost, objective, backend, time_limit_s)``
builds a solver-neutral model (:mod:`.model`): the per-request model of the
paper (:mod:`.formulation`, :mod:`.objectives`) made strong by
:mod:`.strengthening` and the class flows of :mod:`.flows`, or the aggregated
class-flow model of :mod:`.aggregate` for interchangeable requests. It is
warm-started from the best heuristic (:mod:`.warmstart`, :mod:`.trajectory`),
solved by one of :mod:`.backends` (CP-SAT by default), read back
(:mod:`.extract`) and returned as an :class:`OptimalResult` whose schedule has
been replayed. ``infermax solve`` is :mod:`.cli`.
"""
from .api import OptimalResult, Strengthening, solve_optimal
from .policy import Policy

__all__ = ["OptimalResult", "Policy", "Strengthening", "solve_optimal"]
