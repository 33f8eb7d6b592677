"""infermax.csp — optimal schedules from the CSP/MILP of InferMax §3.3.

``solve_optimal(workload, limits, cost, objective, backend, time_limit_s)`` is the conductor
(:mod:`.api`): it runs stages, each handed its time by one :class:`~.budget.Budget` and each
returning a typed result that a :class:`~.progress.Tracker` combines. It takes Schedules (a warm
start), values (better-than) and a :class:`Policy`, and names no scheduler: ``infermax.solve_optimal``
(:mod:`infermax.optimal`, the layer above csp and the schedulers) reads "best", "vllm" and "like=vllm"
into those. Two packages do the work:

- :mod:`.milp` — the solver-neutral per-request model of the paper and the aggregated class-flow
  model (model, formulation, objectives, strengthening, flows, linearisation, read-back);
- :mod:`.search` — exact A* and anytime searches over class states for interchangeable requests,
  with the chain-packing relaxation and the trajectory/configuration LP bounds.

The conductor's own modules, in the order a call uses them:

- :mod:`.budget` — the one clock of a call and the named shares each stage gets;
- :mod:`.warmstart` — the best heuristic schedule, the proven horizon, the hint for the model;
- :mod:`.backends` — one module per solver (CP-SAT by default); the only place solvers are imported;
- :mod:`.result` — :class:`OptimalResult`: extract, replay, compare, bound, gap;
- :mod:`.progress` — the best schedule and bound so far, and who is told;
- :mod:`.bound_methods` — the class-state search as a bound method of :mod:`infermax.bounds`;
- :mod:`.cli` — ``infermax solve``.
"""
from .api import OptimalResult, solve_optimal
from .milp.build import Strengthening
from .milp.policy import Policy
from .result import InvalidBoundError

__all__ = ["InvalidBoundError", "OptimalResult", "Policy", "Strengthening", "solve_optimal"]
