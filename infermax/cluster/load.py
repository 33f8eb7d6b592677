"""Offered load relative to a cluster's capacity (PecSched §6.6).

``load = 1.0`` means the FIFO baseline's measured maximum throughput: every request
of the workload arrives at once, FIFO serves them on the cluster, and the capacity
is requests served per second of that run. :func:`at_load` rescales a trace's
inter-arrival times so that its mean arrival rate is ``load`` times that capacity,
keeping the trace's burstiness (the order and the relative gaps of arrivals).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from infermax.types import Workload

from .spec import Cluster


def capacity_rps(workload: Workload, cluster: "Cluster | str", policy: str = "fifo", scheduler: Any = "vllm",
                 **options: Any) -> float:
    """Requests per second the cluster serves under ``policy`` when every request of ``workload`` waits at t = 0."""
    from .engine import simulate_cluster
    offline = Workload(requests=tuple(dataclasses.replace(r, arrival_s=0.0) for r in workload.requests),
                       name=f"{workload.name} (all at t=0)")
    span = simulate_cluster(offline, cluster, policy, scheduler, **options).metrics["latency_s"]
    if not span > 0:
        raise ValueError(f"capacity: the run of {workload.name!r} took {span!r} s")
    return len(workload) / span


def at_load(workload: Workload, load: float, capacity: float) -> Workload:
    """``workload`` with its arrivals rescaled to a mean rate of ``load × capacity`` requests per second."""
    for name, v in (("load", load), ("capacity", capacity)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise ValueError(f"at_load: {name} must be a finite number > 0, got {v!r}")
    t = workload.arrivals_s
    span = float(t.max() - t.min())
    if len(workload) < 2 or span <= 0:
        raise ValueError(f"at_load: workload {workload.name!r} has no arrival process to rescale "
                         f"({len(workload)} requests over {span} s)")
    target = load * capacity                          # requests per second
    factor = (len(workload) - 1) / span / target      # new gap = old gap * factor
    new = (t - t.min()) * factor
    reqs = tuple(dataclasses.replace(r, arrival_s=float(a)) for r, a in zip(workload.requests, new))
    return Workload(requests=reqs, name=f"{workload.name},load={load:g}")


def mean_rate_rps(workload: Workload) -> float:
    """The workload's mean arrival rate (requests per second between its first and last arrival)."""
    t = workload.arrivals_s
    span = float(np.ptp(t))
    return (len(workload) - 1) / span if span > 0 else math.inf
