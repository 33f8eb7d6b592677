"""The registry of bound methods: one :class:`BoundMethod` per name, which :func:`.combine.combine` runs.

A method declares what it bounds (``metrics``: the objectives' events, see
:class:`~infermax.bounds.objectives.ObjectiveSpec`; ``quantiles``, ``tags``: whether it bounds percentiles and
one tag's requests), when it is run (``on_request``: only when named; ``solves``: it runs a solver with a time
budget, so ``check_scheduler``'s cheap default leaves it out), whether it applies to an instance
(``applies(ctx)``: None, or the reason it does not, reported in ``Bound.skipped``) and ``run(ctx)``: the
value and its certificate (value None: no bound here, the certificate's ``not_applicable`` says why). Unless
``margin`` is False (a value certified already), the value is lowered by the relative margin :data:`SAFETY`.

The relaxations register here, in the order they run (``order`` before ``chains``, which starts from it);
the two that solve register from the layers that can run them, into this same registry: ``search`` (the
class-state A*) from :mod:`infermax.csp.bound_methods` when csp is imported, ``milp`` (the exact MILP through
the public ``solve_optimal``, above csp) from :mod:`infermax.bounds.api`. So this module stays below csp
(docs/design.md). ``lower_bound``, ``check_scheduler``, the CLI and the tests read :func:`registered`, so a
method registered here is run, listed and held to the oracle (tests/test_oracle.py) with no other edit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .chains import chain_bound
from .lagrangian import lagrangian_bound
from .lp import lp_bound
from .objectives import BASES, SPEC_OF, SPECS, Objective, ObjectiveSpec
from .order import EventBounds, event_bounds, quantile_of_sorted
from .requests import request_bounds
from .sharing import sharing_bound
from .work import arrival_bound

#: relative safety margin taken off every method's value (LP tolerances are ~1e-9; closed forms err ~1e-15)
SAFETY = 1e-7


def with_safety(result: tuple[float, dict]) -> tuple[float, dict]:
    """(value, certificate) with the value lowered by the relative margin :data:`SAFETY`."""
    value, cert = result
    return value - SAFETY * abs(value), cert


@dataclass(frozen=True, kw_only=True, slots=True)
class BoundContext:
    """What a method is run on: the parsed ``objective``; the whole ``workload`` and the requests it is over
    (``chosen``: a tag's, else all); ``limits`` with KV in tokens (blocks counted in M_b) and
    ``block_limits`` as given (the MILP models the blocks); ``cost`` and its linear ``coefficients``;
    ``upper`` (a known achievable latency, or None); the call's budgets; ``values``: what the methods run
    before it gave (seconds, before the makespan's inversion)."""

    objective: Objective
    workload: Any
    chosen: Any
    limits: Any
    block_limits: Any
    cost: Any
    coefficients: Any
    upper: float | None = None
    milp_max_requests: int = 6
    milp_time_limit_s: float = 30.0
    search_time_limit_s: float = 10.0
    values: dict[str, float] = field(default_factory=dict)
    _events: dict[str, EventBounds] = field(default_factory=dict, repr=False)

    def events(self, metric: str) -> EventBounds:
        """The order statistics of ``metric``'s event times over ``chosen`` (computed once per call)."""
        if metric not in self._events:
            self._events[metric] = event_bounds(self.coefficients, self.chosen, self.limits, metric)
        return self._events[metric]


def _always(ctx: BoundContext) -> str | None:
    return None


@dataclass(frozen=True, kw_only=True, slots=True)
class BoundMethod:
    """One bound method (module docstring): ``name``, what it bounds, when it runs and how."""

    name: str
    run: Callable[[BoundContext], tuple[float | None, dict]]
    metrics: tuple[str, ...]
    quantiles: bool = False
    tags: bool = True
    applies: Callable[[BoundContext], str | None] = _always
    on_request: bool = False
    solves: bool = False
    margin: bool = True
    doc: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name or "," in self.name:
            raise ValueError(f"a bound method's name must be a non-empty string without commas, got {self.name!r}")
        for field_name in ("run", "applies"):
            if not callable(getattr(self, field_name)):
                raise ValueError(f"bound method {self.name!r}: {field_name} must be callable, got "
                                 f"{getattr(self, field_name)!r}")
        known = {s.metric for s in SPECS}
        unknown = sorted(set(self.metrics) - known) if isinstance(self.metrics, tuple) else None
        if unknown is None or unknown or not self.metrics:
            raise ValueError(f"bound method {self.name!r}: metrics {self.metrics!r} name no objective "
                             f"(unknown {unknown}); a tuple of {', '.join(sorted(known))}")

    def bounds(self, spec: ObjectiveSpec) -> bool:
        """Whether it bounds objective ``spec`` (untagged)."""
        return spec.metric in self.metrics and (spec.quantile is None or self.quantiles)

    def bounds_objective(self, objective: Objective) -> bool:
        """Whether it bounds the parsed ``objective`` (its tag included)."""
        return self.bounds(objective.spec) and (objective.tag is None or self.tags)


_REGISTRY: dict[str, BoundMethod] = {}


def register(method: BoundMethod, *, before: str | None = None) -> BoundMethod:
    """Add ``method`` (run after those registered already, or just ``before`` the one named); ValueError for a
    name taken."""
    if not isinstance(method, BoundMethod):
        raise ValueError(f"register takes a BoundMethod, got {method!r}")
    if method.name in _REGISTRY:
        raise ValueError(f"bound method {method.name!r} is registered already")
    if before is not None and before not in _REGISTRY:
        raise ValueError(f"bound method {method.name!r}: no method {before!r} to register it before; registered: "
                         f"{', '.join(_REGISTRY)}")
    items = list(_REGISTRY.items())
    at = len(items) if before is None else [k for k, _ in items].index(before)
    items.insert(at, (method.name, method))
    _REGISTRY.clear()
    _REGISTRY.update(items)
    return method


def unregister(name: str) -> BoundMethod:
    """Remove the method ``name`` (KeyError naming the registered ones if there is none)."""
    if name not in _REGISTRY:
        raise KeyError(f"no bound method {name!r} is registered; registered: {', '.join(_REGISTRY)}")
    return _REGISTRY.pop(name)


def registered() -> tuple[BoundMethod, ...]:
    """Every registered method, in the order they run."""
    return tuple(_REGISTRY.values())


def get_method(name: str) -> BoundMethod | None:
    """The method registered as ``name`` (None: none is)."""
    return _REGISTRY.get(name)


def method_names() -> tuple[str, ...]:
    """The names of the registered methods, in the order they run (:data:`infermax.bounds.METHODS`)."""
    return tuple(_REGISTRY)


def methods_of(objective: str | ObjectiveSpec) -> tuple[str, ...]:
    """The registered methods that bound ``objective`` (a base name, an alias, or a spec; untagged)."""
    spec = objective if isinstance(objective, ObjectiveSpec) else SPEC_OF[objective.partition(":")[0]]
    return tuple(m.name for m in _REGISTRY.values() if m.bounds(spec))


def applicable(objective: Objective) -> tuple[str, ...]:
    """The registered methods that bound the parsed ``objective``, its tag included."""
    return tuple(m.name for m in _REGISTRY.values() if m.bounds_objective(objective))


def registry_list(name: str, module: str = __name__):
    """The registry's lists under their public names (:data:`infermax.bounds.METHODS`, ...), as they stand:
    ``METHODS`` (every name), ``METHODS_OF`` (each objective name and alias -> its methods), ``ON_REQUEST``,
    ``SOLVER_METHODS`` (those that solve), ``OBJECTIVES`` (every objective name); AttributeError otherwise."""
    if name == "OBJECTIVES":
        return BASES
    if name == "METHODS":
        return method_names()
    if name == "METHODS_OF":
        return {base: methods_of(base) for base in BASES}
    if name == "ON_REQUEST":
        return tuple(m.name for m in _REGISTRY.values() if m.on_request)
    if name == "SOLVER_METHODS":
        return tuple(m.name for m in _REGISTRY.values() if m.solves)
    raise AttributeError(f"module {module!r} has no attribute {name!r}")


# --- the relaxations -------------------------------------------------------------------------------------
def _requests(ctx: BoundContext) -> tuple[float, dict]:
    """Each request alone (`requests`): the mean, or the quantile of the sorted per-request bounds."""
    obj, w = ctx.objective, ctx.chosen
    per = request_bounds(ctx.coefficients, w, ctx.limits)[f"{obj.metric}_s"]
    if obj.metric == "tpot":
        per = per[w.output_lens > 1]
    value = float(per.mean()) if obj.quantile is None else quantile_of_sorted(np.sort(per), obj.quantile)
    return value, {"per_request_min_s": float(per.min()), "per_request_max_s": float(per.max()),
                   "num_requests": int(per.size)}


def _order(ctx: BoundContext) -> tuple[float, dict]:
    """Order statistics of the event times (`order`): the mean flow, or the quantile of the flows."""
    obj = ctx.objective
    b = ctx.events(obj.metric)
    value = b.mean_flow_s if obj.quantile is None else quantile_of_sorted(b.flow_s, obj.quantile)
    return value, {"num_requests": int(b.flow_s.size), "first_flow_s": float(b.flow_s[0]),
                   "last_flow_s": float(b.flow_s[-1])}


def _chains(ctx: BoundContext) -> tuple[float | None, dict]:
    """Decode chains (`chains`): the mean end-to-end latency, offline (the `order` value, if run: a bound
    already known, so that splits that cannot beat it stop early)."""
    return chain_bound(ctx.coefficients, ctx.chosen, ctx.limits, ctx.values.get("order", -math.inf))


def _sharing(ctx: BoundContext) -> tuple[float | None, dict]:
    """Shared batches and backlog in windows (`sharing`): the mean end-to-end latency (the completions'
    order statistics, computed once for `order` and this)."""
    return sharing_bound(ctx.coefficients, ctx.chosen, ctx.limits, ctx.events("e2e").absolute_s)


_MAKESPAN = ("latency", "throughput")
for _method in (
    BoundMethod(name="work", metrics=_MAKESPAN, doc="closed-form work bound, with the arrival bound online",
                run=lambda ctx: arrival_bound(ctx.coefficients, ctx.workload, ctx.limits)),
    BoundMethod(name="lp", metrics=_MAKESPAN, doc="LP relaxation of the aggregated class-count formulation",
                run=lambda ctx: lp_bound(ctx.coefficients, ctx.workload, ctx.limits)),
    BoundMethod(name="lagrangian", metrics=_MAKESPAN, doc="Lagrangian relaxation of the per-batch constraints",
                run=lambda ctx: lagrangian_bound(ctx.coefficients, ctx.workload, ctx.limits, upper=ctx.upper)),
    BoundMethod(name="requests", metrics=("ttft", "e2e", "tpot"), quantiles=True, run=_requests,
                doc="what each request takes alone"),
    BoundMethod(name="order", metrics=("ttft", "e2e"), quantiles=True, run=_order,
                doc="order statistics of first-token and completion times"),
    BoundMethod(name="chains", metrics=("e2e",), run=_chains, doc="decode chains, offline"),
    BoundMethod(name="sharing", metrics=("e2e",), run=_sharing, doc="shared batches and backlog in windows"),
):
    register(_method)
