"""The one clock every computation runs on: the workload's own, whose zero is its first arrival.

docs/design.md invariant 7: shifting every arrival by a constant changes no duration. A float64 holds
53 bits, so an absolute clock loses resolution with its size: at a Unix timestamp (~1.7e9 s) one
unit in the last place is 2.4e-7 s, at 1e12 s it is 1.2e-4 s — a 9 ms batch time added to such a
clock and read back as ``first token − arrival`` comes out wrong in its sixth or second digit, and
a certified bound (exact, from durations) ends up above the replayed value it bounds.

So every entry point (``simulate``, ``replay``, ``lower_bound``, ``check_scheduler``,
``solve_optimal``, the cluster engine, its judge and its bound: through
:func:`infermax.engine.resolve_inputs` or :func:`on_relative_clock` directly) rebases the workload
once: each arrival ``a_i`` becomes ``a_i − t0``, ``t0`` the least arrival, rounded once. For a
shifted workload whose shifted arrivals ``a_i + c`` are exact floats, ``(a_i + c) − (a_0 + c)`` is
the real number ``a_i − a_0``, so the rebased arrivals — and everything computed from them: the
simulator's and the judge's clocks, every bound, every solver model — are the same to the last bit
for every ``c``. For timestamps (every arrival within a factor 2 of the first, Sterbenz) the
subtraction is exact, and nothing is lost at all.

Every time a result reports — a Trace's ``start_s``, ``first_token_s``, ``completion_s`` and its
requests' ``arrival_s``, a Batch's ``not_before_s``, a cluster schedule's event times, a capacity
window's ``until_s`` — is on this clock: seconds since the workload's first arrival. A workload
whose first arrival is 0 (every generated workload, every shipped trace loader's) is unchanged.
To read a time on the original clock, add :func:`first_arrival_s` of the original workload.
"""
from __future__ import annotations

import dataclasses

from .types import Workload


def first_arrival_s(workload: Workload) -> float:
    """The least arrival time of ``workload`` (s, on its own clock): the zero of its relative clock."""
    return float(workload.arrivals_s.min())


def on_relative_clock(workload: Workload) -> Workload:
    """``workload`` with every arrival less its first (the same object when the first is already 0).

    The request order, ids, lengths, SLOs, tags and the name are kept; each new arrival is the
    correctly rounded difference (NumPy's float64 subtraction, as Python's)."""
    t0 = first_arrival_s(workload)
    if t0 == 0.0:
        return workload
    relative = (workload.arrivals_s - t0).tolist()
    requests = tuple(dataclasses.replace(r, arrival_s=t) for r, t in zip(workload.requests, relative))
    return Workload(requests=requests, name=workload.name)
