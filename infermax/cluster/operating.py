"""The operating point of a cluster run: its load against FIFO's capacity and against each class's own.

:func:`~infermax.cluster.load.capacity_rps` (PecSched §6.6) measures what FIFO serves of the whole
mix. With PecSched's mix — 5 % long requests of 100K–500K tokens — the long requests are almost all of
that work, so a load of 1.0 there leaves the short requests a small share of what the cluster could
serve them, and a policy's treatment of short requests is hardly tested. The paper's §3.2 and §6.3
describe a cluster busy with short requests (Reservation's short requests queue and lose throughput,
Priority's long requests starve). So each class gets its own capacity and load:

- **short capacity**: what one replica serves of the short requests in steady state, times the
  replicas. Measured on one replica (its local scheduler and limits, R_max = ``max_num_seqs``):
  the short requests cycled to ``hold_factor`` times what the replica holds at once (R_max, or M over
  their mean peak KV, the smaller), all waiting at t = 0; the throughput between the 10th and the 90th
  percentile completion, the steady state between filling the replica and draining it. (All short
  requests at t = 0 on the whole cluster measure their latency instead: they all fit at once.)
- **long capacity**: the long requests alone, all at t = 0, FIFO on the whole cluster (their gangs):
  requests over the makespan, as §6.6 measures the mix.
- **load of a class**: its mean arrival rate over its capacity — the share of the cluster its
  arrivals need. :func:`at_class_load` rescales a trace to a class's load.

:class:`OperatingPoint` gathers the rates, the capacities, the loads and the short requests' KV
demand (their peak KV, I + O − 1 each, summed) beside the cluster's KV capacity: a finite trace whose
short requests all fit the replicas' KV at once can queue them only for compute, never for memory.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from infermax.engine import simulate
from infermax.types import Limits, Request, Workload

from .load import at_load, capacity_rps
from .spec import Cluster

HOLD_FACTOR = 4        # short-capacity runs: requests per replica, in multiples of what it holds at once


def _tagged(workload: Workload, tag: str) -> np.ndarray:
    mask = np.array([r.tag == tag for r in workload.requests], dtype=bool)
    if not mask.any():
        raise ValueError(f"workload {workload.name!r} has no request tagged {tag!r}")
    return mask


def replica_capacity_rps(workload: Workload, cluster: "Cluster | str", tag: str = "short",
                         scheduler: Any = "sarathi", max_num_seqs: int | None = 256,
                         hold_factor: int = HOLD_FACTOR) -> float:
    """Steady-state requests per second one replica of ``cluster`` serves of ``workload``'s ``tag`` requests
    (module docstring)."""
    cluster = Cluster.from_spec(cluster)
    if isinstance(hold_factor, bool) or not isinstance(hold_factor, int) or hold_factor < 2:
        raise ValueError(f"hold_factor must be an integer >= 2, got {hold_factor!r}")
    mask = _tagged(workload, tag)
    ins, outs = workload.input_lens[mask], workload.output_lens[mask]
    M = cluster.replica_kv_capacity_tokens
    longest = int(ins.max())
    lim = Limits(M=M, C=max(4096, longest), P=max(4096, longest), R_max=max_num_seqs)
    holds = min(lim.max_running, max(1, int(M // float(np.mean(ins + outs - 1)))))
    n = max(int(mask.sum()), hold_factor * holds)
    reqs = tuple(Request(id=k, input_len=int(ins[k % ins.size]), output_len=int(outs[k % ins.size]))
                 for k in range(n))
    run = simulate(Workload(requests=reqs, name=f"{tag} requests of {workload.name}, {n} at t=0"),
                   scheduler, lim, cluster.cost_model_name())
    done = np.sort(run.trace.requests["completion_s"])
    t10, t90 = done[int(0.1 * n)], done[int(0.9 * n)]
    if not t90 > t10:
        raise ValueError(f"replica capacity: the {tag} requests' completions span no time ({t10} .. {t90} s)")
    return (int(0.9 * n) - int(0.1 * n)) / float(t90 - t10)


def class_capacity_rps(workload: Workload, cluster: "Cluster | str", tag: str = "long", scheduler: Any = "sarathi",
                       **options: Any) -> float:
    """Requests per second the cluster serves of the ``tag`` requests alone, all waiting at t = 0, under FIFO."""
    mask = _tagged(workload, tag)
    alone = Workload(requests=tuple(r for r, m in zip(workload.requests, mask) if m),
                     name=f"{tag} requests of {workload.name}")
    return capacity_rps(alone, cluster, "fifo", scheduler, **options)


def class_rate_rps(workload: Workload, tag: str) -> float:
    """The ``tag`` requests' mean arrival rate: their share of the workload's mean rate."""
    mask = _tagged(workload, tag)
    span = float(np.ptp(workload.arrivals_s))
    return (len(workload) - 1) / span * mask.mean() if span > 0 else math.inf


def at_class_load(workload: Workload, load: float, capacity: float, tag: str = "short") -> Workload:
    """``workload`` with its arrivals rescaled so that its ``tag`` requests arrive at ``load × capacity``
    requests per second (the other requests keep their places in the trace)."""
    share = float(_tagged(workload, tag).mean())
    w = at_load(workload, load, capacity / share)
    return Workload(requests=w.requests, name=f"{workload.name},{tag}_load={load:g}")


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    """A workload's load on a cluster, per class (module docstring); rates and capacities in requests/s."""

    rate_rps: float
    short_rate_rps: float
    long_rate_rps: float
    fifo_capacity_rps: float
    short_capacity_rps: float          # every replica serving short requests only
    long_capacity_rps: float
    short_kv_tokens: int               # the short requests' peak KV, summed
    kv_capacity_tokens: int            # every replica's M, summed

    @property
    def load(self) -> float:
        return self.rate_rps / self.fifo_capacity_rps

    @property
    def short_load(self) -> float:
        return self.short_rate_rps / self.short_capacity_rps

    @property
    def long_load(self) -> float:
        return self.long_rate_rps / self.long_capacity_rps

    def as_dict(self) -> dict[str, float]:
        return {**dataclasses.asdict(self), "load": self.load, "short_load": self.short_load,
                "long_load": self.long_load}


def operating_point(workload: Workload, cluster: "Cluster | str", scheduler: Any = "sarathi",
                    fifo_capacity: float | None = None, short_per_replica: float | None = None,
                    long_capacity: float | None = None, max_num_seqs: int | None = 256,
                    **options: Any) -> OperatingPoint:
    """The :class:`OperatingPoint` of ``workload`` on ``cluster``; capacities already measured may be given
    (``fifo_capacity``, ``short_per_replica`` — one replica's —, ``long_capacity``), the others are measured
    with :func:`capacity_rps`, :func:`replica_capacity_rps` and :func:`class_capacity_rps`."""
    cluster = Cluster.from_spec(cluster)
    short = _tagged(workload, "short")
    opts = {**options, "max_num_seqs": max_num_seqs}
    fifo = fifo_capacity if fifo_capacity is not None else capacity_rps(workload, cluster, "fifo", scheduler, **opts)
    per = (short_per_replica if short_per_replica is not None
           else replica_capacity_rps(workload, cluster, "short", scheduler, max_num_seqs))
    lcap = long_capacity if long_capacity is not None else class_capacity_rps(workload, cluster, "long", scheduler,
                                                                               **opts)
    peak = workload.input_lens + workload.output_lens - 1
    span = float(np.ptp(workload.arrivals_s))
    return OperatingPoint(rate_rps=(len(workload) - 1) / span if span > 0 else math.inf,
                          short_rate_rps=class_rate_rps(workload, "short"),
                          long_rate_rps=class_rate_rps(workload, "long"), fifo_capacity_rps=fifo,
                          short_capacity_rps=per * cluster.num_replicas, long_capacity_rps=lcap,
                          short_kv_tokens=int(peak[short].sum()),
                          kv_capacity_tokens=int(cluster.replica_kv_capacity_tokens * cluster.num_replicas))
