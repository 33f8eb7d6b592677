"""Certified lower bounds on the best achievable value of an objective, and the scheduler checker.

``lower_bound(workload, limits, cost, objective)`` combines several methods and
returns the best value, which no valid schedule can beat. For the makespan
(``latency``, and ``throughput`` as tokens over it: an upper bound there):

- ``work``: closed-form work bound (`work`), with the arrival bound online;
- ``lp``: LP relaxation of the aggregated class-count formulation (`lp`, HiGHS; the value is the
  dual at HiGHS's multipliers, `certify`, so the solver's accuracy is not trusted);
- ``lagrangian``: Lagrangian relaxation of the per-batch constraints with
  per-request shortest paths (`lagrangian`);
- ``milp``: the dual bound of the exact MILP (`infermax.solve_optimal`) when the
  instance is small enough;
- ``search`` (on request only: ``methods=(..., "search")``, ``infermax bound --methods``):
  the class-state A* of ``infermax.csp.search`` — the search ``solve_optimal`` runs —
  stopped after ``search_time_limit_s``; the least f = g + h on its frontier is a bound
  (its h is admissible), the optimum when it finishes. Offline workloads under a linear
  cost model only (it says why not otherwise).

For TTFT, end-to-end latency (``e2e``, alias ``completion``) and TPOT — means,
percentiles (``ttft_p99``, ``e2e_p99``, also p50 and p90) and per request tag
(``ttft:short``; see `objectives`):

- ``requests``: what each request takes alone (`requests`);
- ``order``: order statistics of first-token and completion times, the maximum of
  own-time, fluid SRPT (release dates), windowed and batch-count bounds (`order`);
  not for TPOT;
- ``chains``: mean end-to-end latency, offline: the k-th completion also pays for the
  unfinished decode chains of the requests that finish soon after it, and for its own
  batches (`chains`; a convex relaxation closed by weak duality);
- ``sharing``: mean end-to-end latency, online or offline: in windows of time, the requests
  alive at least fill the running batch, whose time carries every member's work, and the
  backlog left by what the windows can complete (`sharing`; an LP closed by weak duality);
- ``milp``: as above, for the untagged means.

A per-tag bound is the bound of the tagged requests alone: dropping the other requests
from every batch leaves a valid schedule whose batches are no slower (`requests`).

KV in blocks (``Limits.block_size`` = b > 1): the relaxations count KV in tokens
within M_b = b·(M // b). Every schedule valid in blocks holds Σ m <= Σ b·ceil(m/b)
<= M_b tokens, so it is valid for the token relaxation too and each bound stays
below its value; ignoring the rounding of each request's KV only loosens them.
The ``milp`` method solves the block model itself.

Every value is lowered by a relative :data:`SAFETY` margin, so that rounding in
its own arithmetic (or an LP solver's tolerances) can never lift it above the
replayed value of a schedule: a bound is valid under floating point, always.

``check_scheduler`` (in `check`) simulates a scheduler, replays its schedule and
states its certified optimality gap.

The objectives are one table (`objectives`: :data:`SPECS`, an ``ObjectiveSpec`` each) and the methods one
registry (`methods`: a ``BoundMethod`` each, :func:`register`): ``lower_bound``, ``check_scheduler``,
the CLI and the tests iterate them, and :data:`METHODS`, :data:`METHODS_OF`, :data:`ON_REQUEST`,
:data:`SOLVER_METHODS` are read from the registry at each use (docs/bounds.md, "Adding a bound method
or an objective").

The layers (docs/design.md, "Boundaries"): the relaxations, the table, the registry and :mod:`.combine`,
which runs the methods, sit below csp (the schedulers read their cost lines, :func:`.requests.cost_lines`;
csp its horizon-free bound, and registers ``search``); ``lower_bound`` (:mod:`.api`), the checker
(:mod:`.check`) and the CLI sit above it. Importing this package loads none of them: every name loads its
module on first use (PEP 562).
"""
from importlib import import_module
from importlib.util import find_spec

#: each public name -> the module of this package that defines it (loaded on first use)
_LAZY = {"lower_bound": "api", "Bound": "combine", "METHODS": "api", "METHODS_OF": "api",
         "OBJECTIVES": "combine", "ON_REQUEST": "api", "SAFETY": "methods", "SOLVER_METHODS": "api",
         "cheap_methods": "combine", "combine": "combine", "CheckResult": "check", "check_scheduler": "check",
         "BoundMethod": "methods", "BoundContext": "methods", "register": "methods", "unregister": "methods",
         "registered": "methods", "methods_of": "methods", "ObjectiveSpec": "objectives", "SPECS": "objectives",
         "spec_of": "objectives",
         "ALL": "objectives", "BASES": "objectives", "Objective": "objectives", "members": "objectives",
         "parse_objective": "objectives", "subset": "objectives", "chain_bound": "chains",
         "coefficients_of": "costs", "lagrangian_bound": "lagrangian", "lp_bound": "lp", "EventBounds": "order",
         "event_bounds": "order", "quantile_of_sorted": "order", "request_bounds": "requests",
         "cost_lines": "requests", "sharing_bound": "sharing", "arrival_bound": "work"}

#: the registry's lists, read from it at each use (loading ``api`` completes it: ``milp`` and ``search``)
_LIVE = ("METHODS", "METHODS_OF", "ON_REQUEST", "SOLVER_METHODS")

__all__ = ["ALL", "Bound", "BoundMethod", "CheckResult", "OBJECTIVES", "SPECS", "check_scheduler", "cheap_methods",
           "lower_bound", "parse_objective", "register", "unregister"]


def __getattr__(name: str):
    """A public name loads its module on first use; a submodule is an attribute as an import makes it."""
    if name in _LAZY:
        value = getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
        if name in _LIVE:
            return value
    elif not name.startswith("_") and find_spec(f"{__name__}.{name}") is not None:
        value = import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
