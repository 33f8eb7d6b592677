"""LoongServe: elastic sequence parallelism over instances, with a disaggregated decode pool.

Medha §2.2–2.3 (after Wu et al., SOSP 2024): each instance is one replica (the
paper's LoongServe runs TP 2 instances, 8 of them on 16 A100s); a request's prefill
runs with ring attention (context parallelism) over an *elastic* group of
instances sized to its prompt, and its decode runs elsewhere, after its KV moved.

- **Scale-up (prefill).** A request of I prompt tokens wants
  ``k_target = ceil(I / min_shard_tokens)`` instances (ring attention only pays
  when each instance holds enough tokens to hide the KV rotation behind its
  attention: Medha §2.2 quotes 24.5K tokens on A100 with InfiniBand), capped
  by the prefill pool (or ``sp_replicas``). It starts on at least
  ``ceil(k_target / 2)`` free instances and takes up to ``k_target`` of them, filling the nodes with the most
  free instances first (:func:`choose_elastic`). A request with ``k_target = 1`` (every short
  request) is prefilled whole (no chunking) by one instance's local scheduler,
  batched with the other prompts there. The global queue is first come, first
  served and a prefill is never preempted: a long request waiting for instances
  blocks the queue (the head-of-line blocking of Medha §2.3, Fig. 1).
  A gang's prefill is priced by ring attention over its instances, striped as
  LoongServe's kernels stripe it so every instance does the same causal work
  (:func:`~infermax.cluster.fastsp.fast_sp_prefill` with ``ring_only`` and
  ``striped``; the KV rotation exposed where attention cannot hide it).
- **Scale-down (decode).** LoongServe keeps a request's KV on a subset of the
  prefill instances, written there while the prefill runs (proactive migration),
  and decodes it on that subset; Medha describes the result as separate pools for
  prefills and decodes (§2.3, Fig. 4). Here the pools are static: the last
  ``decode_replicas`` instances (default one per node) only decode. After its
  first token a request's KV goes to one decode instance — a short one by the
  disaggregation of :mod:`~infermax.cluster.migration`, a gang's one by
  :class:`ScaleDown`: the decode instance with the most free KV, which reserves the
  request's peak KV (a ``hold``) from that decision to the KV's arrival. The
  transfer is the whole KV from the gang member nearest the destination
  (``Cluster.transfer_s``; a receiving instance's links are the bottleneck, as
  many as a sending one's), sent layer by layer during the prefill so only the
  last layer is exposed. When no decode instance has room the gang keeps the KV
  and asks again every ``retry_s`` (its instances stay busy meanwhile).

``loongserve-reserve`` (Medha §5.4, Fig. 23: "reserving two of eight CP
instances for short requests"): the first prefill instance of each node in turn,
``SHORT_RESERVE`` of them, serve only requests that need no gang, the rest only
gangs; each pool queues first come, first served, without blocking the other.

Not modelled: LoongServe's per-iteration re-planning (moving decode KV to free
instances for a big prefill, scaling a decode up when it outgrows its instances),
and its multi-master decoding of one request over several instances: every
request here must fit one instance (its peak KV within M).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from infermax.types import Limits, Workload

from .gang import Gang
from .replicas import GANG, MIGRATE
from .roles import Roles, check_one_replica_fits, local_limits, prefill_replicas
from .spec import Cluster

MIN_SHARD_TOKENS = 24_500     # prompt tokens per instance below which ring attention stops paying (medha §2.2)
SHORT_RESERVE = 2             # loongserve-reserve: prefill instances kept for requests that need no gang (§5.4)
RETRY_S = 0.25                # a gang whose KV finds no decode instance asks again after this long


def gang_targets(input_lens: np.ndarray, cap: int, min_shard_tokens: int = MIN_SHARD_TOKENS) -> np.ndarray:
    """Per request the instances its prefill wants: ``ceil(I / min_shard_tokens)``, between 1 and ``cap``."""
    if isinstance(min_shard_tokens, bool) or not isinstance(min_shard_tokens, (int, np.integer)) \
            or min_shard_tokens < 1:
        raise ValueError(f"min_shard_tokens must be an integer >= 1, got {min_shard_tokens!r}")
    if isinstance(cap, bool) or not isinstance(cap, (int, np.integer)) or cap < 1:
        raise ValueError(f"the gang cap must be an integer >= 1, got {cap!r}")
    want = -(-np.asarray(input_lens, dtype=np.int64) // int(min_shard_tokens))
    return np.clip(want, 1, int(cap))


def elastic_roles(workload: Workload, cluster: Cluster, pol: Any, limits: "Limits | str | None",
                  sp_replicas: int | None, decode_replicas: int | None) -> Roles:
    """Who serves what under LoongServe: gangs for prompts that want two or more instances, one instance
    for the others; every request's peak KV within one (decode) instance's M."""
    prefill_pool = prefill_replicas(cluster, pol, decode_replicas)
    eligible_long, eligible_short = pol.discipline.split_elastic(pol, cluster, prefill_pool)
    num_prefill = int(eligible_long.sum())
    if sp_replicas is not None and (isinstance(sp_replicas, bool) or not isinstance(sp_replicas, int)
                                    or not 1 <= sp_replicas <= num_prefill):
        raise ValueError(f"sp_replicas must be an integer in [1, {num_prefill}] (the instances that prefill gangs on "
                         f"{cluster.to_spec()} under {pol.name}), got {sp_replicas!r}")
    cap = sp_replicas or num_prefill
    peak = workload.input_lens + workload.output_lens - 1
    M = cluster.replica_kv_capacity_tokens
    too_big = np.flatnonzero(peak > M)
    if too_big.size:
        i = int(too_big[0])
        raise ValueError(f"{pol.name}: request {int(workload.ids[i])} (input {int(workload.input_lens[i])}, output "
                         f"{int(workload.output_lens[i])}) needs {int(peak[i])} KV tokens at its peak, more than one "
                         f"decode instance's M = {M} on {cluster.to_spec()} (a request decodes on one instance)")
    target = gang_targets(workload.input_lens, cap)
    on_gang = (target >= 2) & (cap >= 2)
    lim = local_limits(cluster, workload, limits, ~on_gang)
    check_one_replica_fits(workload, cluster, lim, peak, on_gang, "long")
    k_min = np.where(on_gang, -(-target // 2), 0)          # (the KV fits one instance: checked above)
    return Roles(limits=lim, sp_replicas=cap, is_long=on_gang.copy(), on_gang=on_gang, gang_size=k_min,
                 prefill_pool=prefill_pool, eligible_long=eligible_long, eligible_short=eligible_short,
                 gang_max=np.where(on_gang, target, 0))


def short_reserve(pol: Any, cluster: Cluster, prefill_pool: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``loongserve-reserve``'s role plan (the reservation discipline's, elastic): the first prefill instance of
    each node in turn, ``SHORT_RESERVE`` of them, serve only requests that need no gang, the rest only gangs;
    (may serve long requests, may serve short ones) per instance."""
    eligible_short, eligible_long = prefill_pool.copy(), prefill_pool.copy()
    pool = np.flatnonzero(prefill_pool)
    if pool.size <= SHORT_RESERVE:
        raise ValueError(f"{pol.name}: reserving {SHORT_RESERVE} instances for short requests leaves none of the "
                         f"{pool.size} prefill instances of {cluster.to_spec()} for long ones")
    nodes = cluster.replica_nodes[pool]
    by_turn = pool[np.lexsort((pool, nodes, _rank_in_group(nodes)))]
    eligible_long[by_turn[:SHORT_RESERVE]] = False
    eligible_short &= ~eligible_long
    return eligible_long, eligible_short


def _rank_in_group(groups: np.ndarray) -> np.ndarray:
    """Per element its position among the equal values before it (0, 1, ... within each group)."""
    out = np.zeros(groups.size, dtype=np.int64)
    seen: dict[int, int] = {}
    for k, g in enumerate(groups.tolist()):
        out[k] = seen.get(g, 0)
        seen[g] = out[k] + 1
    return out


def choose_elastic(cluster: Cluster, k_min: int, k_max: int, queue_tokens: np.ndarray,
                   eligible: np.ndarray) -> tuple[int, ...] | None:
    """Up to ``k_max`` (at least ``k_min``) eligible instances, from the nodes with the most eligible ones
    first (fewest nodes: the ring's hops stay on NVLink where they can), then the shortest queues, then the
    lowest index; None if fewer than ``k_min`` are eligible."""
    if not 1 <= k_min <= k_max:
        raise ValueError(f"gang sizes need 1 <= k_min <= k_max, got {k_min}, {k_max}")
    idx = np.flatnonzero(eligible)
    if idx.size < k_min:
        return None
    node = cluster.replica_nodes[idx]
    per_node = np.bincount(node)
    order = np.lexsort((idx, np.asarray(queue_tokens)[idx], node, -per_node[node]))
    return tuple(sorted(idx[order[:min(k_max, idx.size)]].tolist()))


class ScaleDown:
    """After a gang's prefill: its KV to a decode instance, where the request decodes (the engine's
    ``GangRunner.scale_down`` hook)."""

    def __init__(self, engine: Any, retry_s: float = RETRY_S) -> None:
        self.workload, self.cluster = engine.workload, engine.cluster
        self.replicas, self.loads, self.migrations, self.gangs = (engine.replicas, engine.loads, engine.migrations,
                                                                 engine.gangs)
        self.retry_s = retry_s
        self.parked: set[int] = set()              # gangs whose KV waits for a decode instance with room

    def waiting(self, g: Gang) -> bool:
        return g.gid in self.parked

    def start(self, g: Gang, t: float) -> None:
        """Gang g's prefill ended at ``t`` with the first token: send its KV, or wait for room."""
        if not self._send(g, t, g.first_scheduled_s):
            self.parked.add(g.gid)
            self._retry_at(g, t + self.retry_s)

    def retry(self, g: Gang, t: float) -> None:
        if self._send(g, t, t):
            self.parked.discard(g.gid)
        else:
            self._retry_at(g, t + self.retry_s)

    def _retry_at(self, g: Gang, t: float) -> None:
        g.step_seq += 1
        self.replicas.push(t, GANG, (g.gid, g.step_seq))

    def _send(self, g: Gang, t: float, began: float) -> bool:
        """Migrate g's KV at ``t`` (written out layer by layer since ``began``) if a decode instance has room."""
        mig, reps, cluster = self.migrations, self.replicas, self.cluster
        mig.advance_all(t)
        i, I = g.request, g.input_len
        peak = I + g.output_len - 1
        M = cluster.replica_kv_capacity_tokens
        room = [(M - reps.state(d).kv_used - reps.state(d).external_kv, -d) for d in mig.decode_replicas]
        free, neg = max(room)
        if free < peak:
            return False
        dst = -neg
        # the room is dst's as of its clock, which may have run past t by the batch that freed it: the KV is
        # sent from then (and, not streamed during the prefill any more, as a whole)
        at = max(t, reps.clock_s(dst))
        began = began if at == t else at
        kv = cluster.kv_bytes(I)
        src = min(g.members, key=lambda m: (cluster.transfer_s(kv, m, dst), m))
        arrive = max(at + cluster.transfer_s(kv / cluster.model.num_layers, src, dst),
                     began + cluster.transfer_s(kv, src, dst))
        self._hold(dst, peak, at)
        mig.on_arrive[i] = lambda at, d=dst, p=peak: self._hold(d, -p, at)
        mig.link_bytes["nvlink" if cluster.same_node(src, dst) else "network"] += kv
        self.loads.inflight[dst] += g.output_len - 1
        self.loads.touch(dst)
        mig.decode_of[i] = dst
        mig.records.append({"request": int(i), "src": int(src), "dst": int(dst), "sent_s": at, "arrive_s": arrive,
                            "bytes": kv})
        reps.push(arrive, MIGRATE, (int(i), int(dst)))
        for r in g.members:
            reps.wait_until(r, at)        # (its members were the gang's until now)
        self.gangs.release(g, at, complete=False)
        return True

    def _hold(self, d: int, tokens: int, t: float) -> None:
        """Decode instance d reserves (or frees) ``tokens`` of KV for a request on its way."""
        st = self.replicas.state(d)
        st.external_kv += tokens
        self.replicas.scheduler(d).set_kv_budget(st, st.external_kv)
        self.replicas.event(d, t, "hold", -1, int(st.external_kv))
        self.replicas.touched(d)


__all__ = ["MIN_SHARD_TOKENS", "ScaleDown", "choose_elastic", "elastic_roles", "gang_targets", "short_reserve"]
