"""Who serves what in a cluster run, decided before it starts, with the checks that refuse an impossible one.

- Requests: a request tagged ``long`` runs on a gang of ``gang_size``..``sp_replicas``
  replicas (sequence parallelism) unless one replica is all it may have; every other
  request must fit one replica (its KV within M, its prompt within C).
- Replicas: with disaggregation the last ``decode_replicas`` replicas only decode
  short requests migrated to them (PecSched §6.2: 4/4/1/1 for its four models,
  else one per node); under the reservation discipline (:mod:`~.disciplines`) the last replicas — the majority,
  in whole gangs, unless ``reserved_replicas`` says how many — serve long requests
  only (Llumnix-style, §6.2–6.3; :func:`~.placement.reservation_split`).
- Each replica's local limits: M from the cluster; C and P at least the longest
  short prompt unless given.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infermax.types import Limits, Workload

from .csps import group_gpus
from .placement import replicas_needed
from .spec import Cluster

# PecSched §6.2: replicas dedicated to short-request decode, per model
DECODE_REPLICAS = {"mistral-7b-v0.3": 4, "phi3-14b": 4, "yi-34b": 1, "llama3.1-70b": 1}


@dataclass(frozen=True, eq=False)
class Roles:
    """Per request (length n) and per replica (length R) masks and sizes of one run."""

    limits: Limits                 # every replica's local limits
    sp_replicas: int               # the most replicas of a gang
    is_long: np.ndarray            # n: tagged long
    on_gang: np.ndarray            # n: runs on a gang of replicas
    gang_size: np.ndarray          # n: least replicas a long request's KV needs (0 for the others)
    prefill_pool: np.ndarray       # R: takes dispatched requests (the rest decode migrated ones)
    eligible_long: np.ndarray      # R: may serve long requests
    eligible_short: np.ndarray     # R: may serve short requests
    gang_max: np.ndarray | None = None   # n: most replicas of a request's elastic gang (LoongServe; else sp_replicas)

    @property
    def decode_pool(self) -> np.ndarray:
        return ~self.prefill_pool

    @property
    def classes(self) -> tuple[np.ndarray, int]:
        """(per replica its eligibility class — bit 1: short requests, bit 0: long ones; -1: neither —,
        the number of classes)."""
        cls = self.eligible_short.astype(np.int64) * 2 + self.eligible_long
        return np.where(cls > 0, cls, -1), 4


def local_limits(cluster: Cluster, workload: Workload, limits: "Limits | str | None", short: np.ndarray) -> Limits:
    """The replicas' limits: M from the cluster; C and P at least the longest short prompt unless given."""
    base = Limits.from_spec(limits) if limits is None or isinstance(limits, str) else limits
    if not isinstance(base, Limits):
        raise ValueError(f"limits must be a Limits or a spec string, got {limits!r}")
    M = cluster.replica_kv_capacity_tokens
    if limits is None and short.any():
        longest = int(workload.input_lens[short].max())
        return base.replace(M=M, C=max(base.C, longest), P=max(base.P, longest))
    return base.replace(M=M)


# complexity: one refusal per option, request or limit that makes the roles impossible, in order
def plan_roles(workload: Workload, cluster: Cluster, pol: Any, limits: "Limits | str | None",
               long_tag: str, sp_replicas: int | None, decode_replicas: int | None,
               reserved_replicas: int | None = None) -> Roles:
    """The run's :class:`Roles` under ``pol`` (a :class:`~.policies.ClusterPolicy`: its discipline splits the
    replicas); a ``ValueError`` naming the option, request or limit that makes it impossible."""
    R = cluster.num_replicas
    is_long = np.array([r.tag == long_tag for r in workload.requests], dtype=bool)
    peak = workload.input_lens + workload.output_lens - 1
    per_node = max(1, cluster.gpus_per_node // cluster.replica_gpus)
    if sp_replicas is not None and (isinstance(sp_replicas, bool) or not isinstance(sp_replicas, int)
                                    or not 1 <= sp_replicas <= R):
        raise ValueError(f"sp_replicas must be an integer in [1, {R}], got {sp_replicas!r}")
    gang_size = np.zeros(len(workload), dtype=np.int64)
    for i in np.flatnonzero(is_long):
        gang_size[i] = replicas_needed(cluster, int(peak[i]))
        if pol.csps is not None:      # CSPS: one GPU per SPT (csps.py), as many as the gang may have
            spts = -(-group_gpus(int(workload.input_lens[i]), pol.csps) // cluster.replica_gpus)
            gang_size[i] = max(gang_size[i], min(spts, sp_replicas or R))
    if pol.csps is not None and sp_replicas is None:
        sp_replicas = max(per_node, int(gang_size.max(initial=1)))
    sp = sp_replicas or per_node
    if sp < int(gang_size.max(initial=0)):
        raise ValueError(f"sp_replicas = {sp} < {int(gang_size.max())} replicas, what the "
                         f"largest long request's KV needs on {cluster.to_spec()}")
    # long requests run on gangs of gang_size..sp replicas (sequence parallelism), unless one
    # replica is all they may have: then they run there like any other request
    on_gang = is_long & (sp > 1)
    lim = local_limits(cluster, workload, limits, ~on_gang)
    check_one_replica_fits(workload, cluster, lim, peak, on_gang, long_tag)
    prefill_pool = prefill_replicas(cluster, pol, decode_replicas)
    eligible_long, eligible_short = pol.discipline.split(pol, cluster, prefill_pool, is_long, peak,
                                                         sp if on_gang.any() else 1, reserved_replicas, long_tag)
    if on_gang.any() and int(gang_size[is_long].max()) > int(eligible_long.sum()):
        raise ValueError(f"a long request needs a gang of {int(gang_size[is_long].max())} replicas "
                         f"but only {int(eligible_long.sum())} may serve long requests under policy "
                         f"{pol.name!r} on {cluster.to_spec()}")
    return Roles(limits=lim, sp_replicas=sp, is_long=is_long, on_gang=on_gang, gang_size=gang_size,
                 prefill_pool=prefill_pool, eligible_long=eligible_long, eligible_short=eligible_short)


def check_one_replica_fits(workload: Workload, cluster: Cluster, lim: Limits, peak: np.ndarray,
                            on_gang: np.ndarray, long_tag: str) -> None:
    """Every request that runs on one replica fits it: its peak KV within M, its prompt within C."""
    too_big = np.flatnonzero((peak > lim.M) & ~on_gang)
    if too_big.size:
        i = int(too_big[0])
        raise ValueError(f"request {int(workload.ids[i])} (input {int(workload.input_lens[i])}, output "
                         f"{int(workload.output_lens[i])}) needs {int(peak[i])} KV tokens, more than one replica's "
                         f"M = {lim.M} on {cluster.to_spec()}, and is not tagged {long_tag!r} (only "
                         f"long requests run on gangs of replicas; {too_big.size} such requests)")
    too_long = np.flatnonzero((workload.input_lens > lim.C) & ~on_gang)
    if too_long.size:
        i = int(too_long[0])
        raise ValueError(f"request {int(workload.ids[i])} has input {int(workload.input_lens[i])} > C = "
                         f"{lim.C}: a replica could never prefill it in one batch")


def prefill_replicas(cluster: Cluster, pol: Any, decode_replicas: int | None) -> np.ndarray:
    """The replicas that take dispatched requests: all, or all but the decode replicas (disaggregation)."""
    R = cluster.num_replicas
    pool = np.ones(R, dtype=bool)
    if pol.disaggregate:
        d = decode_replicas if decode_replicas is not None else DECODE_REPLICAS.get(cluster.model.name, cluster.nodes)
        if isinstance(d, bool) or not isinstance(d, int) or not 1 <= d < R:
            raise ValueError(f"decode_replicas must be an integer in [1, {R - 1}] on {cluster.to_spec()} "
                             f"({R} replicas), got {d!r}")
        pool[R - d:] = False
    return pool
