"""Where a request goes: PecSched §6.2's "Scheduling" rules, as plain functions.

- A replica's local queue length is the number of tokens queued on it (Splitwise's
  measure); a request that one replica can serve goes to the eligible replica with
  the shortest local queue (ties: lowest index).
- A request that needs k replicas (its KV, I + O − 1 tokens, over k replicas' M)
  takes k replicas of one node when a node has k eligible ones, else the fewest
  nodes; among the valid combinations the one with the smallest total local queue.
- Reservation (Llumnix-style, §6.2): the majority of the replicas, in whole gangs, is set
  apart for long requests (§6.3: short requests get fewer GPUs than long ones); the rest
  serve short ones only.
"""
from __future__ import annotations

import math

import numpy as np

from .spec import Cluster


def replicas_needed(cluster: Cluster, peak_kv_tokens: int) -> int:
    """Least k with k · M ≥ ``peak_kv_tokens`` (the KV is sharded evenly over the gang)."""
    if isinstance(peak_kv_tokens, bool) or not isinstance(peak_kv_tokens, (int, np.integer)) or peak_kv_tokens < 1:
        raise ValueError(f"peak_kv_tokens must be an integer >= 1, got {peak_kv_tokens!r}")
    k = math.ceil(int(peak_kv_tokens) / cluster.replica_kv_capacity_tokens)
    if k > cluster.num_replicas:
        raise ValueError(f"a request holding {peak_kv_tokens} KV tokens needs {k} replicas of M = "
                         f"{cluster.replica_kv_capacity_tokens}, but the cluster {cluster.to_spec()} has "
                         f"{cluster.num_replicas}")
    return k


def shortest_queue(queue_tokens: np.ndarray, eligible: np.ndarray) -> int | None:
    """Index of the eligible replica with the fewest queued tokens (lowest index on ties); None if none."""
    idx = np.flatnonzero(eligible)
    if idx.size == 0:
        return None
    return int(idx[np.argmin(queue_tokens[idx])])     # argmin keeps the first of equal minima


def choose_gang(cluster: Cluster, k: int, queue_tokens: np.ndarray, eligible: np.ndarray) -> tuple[int, ...] | None:
    """k eligible replicas: one node if possible, else the fewest nodes; least total queue among those.

    On one node the choice is exact: the node whose k shortest queues sum least.
    Across nodes the count of nodes is the least possible (nodes with the most
    eligible replicas are taken first) and, among nodes of equal size, those with
    less queued work first; that total is not always the least over every
    combination on that many nodes (a greedy, as placement must be fast at
    thousands of replicas). Ties go to the lower index.
    """
    if k < 1:
        raise ValueError(f"gang size k must be >= 1, got {k}")
    by_node: dict[int, list[int]] = {}
    for r in np.flatnonzero(eligible):
        by_node.setdefault(cluster.replicas[int(r)].node, []).append(int(r))
    if sum(len(v) for v in by_node.values()) < k:
        return None
    for reps in by_node.values():
        reps.sort(key=lambda r: (queue_tokens[r], r))
    single = [(sum(queue_tokens[r] for r in reps[:k]), node) for node, reps in by_node.items() if len(reps) >= k]
    if single:
        _, node = min(single)
        return tuple(sorted(by_node[node][:k]))
    # fewest nodes: take the nodes with the most eligible replicas first, then the least queue
    order = sorted(by_node, key=lambda n: (-len(by_node[n]), sum(queue_tokens[r] for r in by_node[n]), n))
    chosen: list[int] = []
    for node in order:
        chosen.extend(by_node[node][:k - len(chosen)])
        if len(chosen) == k:
            return tuple(sorted(chosen))
    return None      # unreachable: enough eligible replicas were counted above


def choose_elastic_gang(cluster: Cluster, k_min: int, k_max: int, queue_tokens: np.ndarray,
                        eligible: np.ndarray) -> tuple[int, ...] | None:
    """Between ``k_min`` (what the KV needs) and ``k_max`` eligible replicas of one node — as many as
    the node offers, the node offering most first, then the least total queue — else ``k_min``
    replicas over the fewest nodes (:func:`choose_gang`).

    On one node the replicas taken are its eligible ones with the shortest queues (ties: lower
    index); the whole choice is a handful of array operations over the eligible replicas, as it
    runs inside a dispatch decision on clusters of thousands of replicas."""
    if not 1 <= k_min <= k_max:
        raise ValueError(f"gang sizes need 1 <= k_min <= k_max, got {k_min}, {k_max}")
    idx = np.flatnonzero(eligible)
    if idx.size < k_min:
        return None
    q = np.asarray(queue_tokens)[idx].astype(np.int64)
    node = cluster.replica_nodes[idx]
    order = np.lexsort((idx, q, node))             # by node, then queue, then index
    idx, q, node = idx[order], q[order], node[order]
    first = np.flatnonzero(np.r_[True, node[1:] != node[:-1]])     # each node's first position
    count = np.diff(np.r_[first, idx.size])
    ok = count >= k_min
    if not ok.any():
        return choose_gang(cluster, k_min, queue_tokens, eligible)
    take = np.minimum(count, k_max)
    csum = np.r_[0, np.cumsum(q)]
    total = csum[first + take] - csum[first]       # each node's k shortest queues
    rank = np.lexsort((node[first], total, -take))     # most replicas, then least total queue, then node
    best = rank[ok[rank]][0]
    return tuple(sorted(idx[first[best]:first[best] + take[best]].tolist()))


def reservation_split(cluster: Cluster, longest_peak_kv: int, gang: int = 1,
                      reserved: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(long-only, short-only) replica masks: the last ``k`` replicas serve long requests only.

    ``k`` = ``reserved`` if given, else as PecSched §6.3 describes its Reservation baseline ("fewer
    GPUs are reserved for short requests than for long ones"; §3.2: "substantial resources must be
    reserved for rare long requests"): the fewest whole gangs of ``gang`` replicas that leave short
    requests fewer replicas than long ones — the fewest replicas that do when whole gangs would leave
    none. Either way at least what the longest long request's KV (``longest_peak_kv`` tokens) needs, and
    at least one replica left for short requests."""
    R = cluster.num_replicas
    need = max(replicas_needed(cluster, longest_peak_kv), gang)
    if need >= R:
        raise ValueError(f"reservation for {longest_peak_kv}-token long requests on gangs of {gang} needs {need} "
                         f"replicas, leaving none of the {R} on {cluster.to_spec()} for short requests")
    if reserved is not None:
        if isinstance(reserved, bool) or not isinstance(reserved, (int, np.integer)) or not need <= reserved < R:
            raise ValueError(f"reserved_replicas must be an integer in [{need}, {R - 1}] on {cluster.to_spec()} "
                             f"(at least the {need} replicas a {longest_peak_kv}-token long request's gang needs, "
                             f"leaving one for short requests), got {reserved!r}")
        k = int(reserved)
    else:
        majority = R // 2 + 1
        k = max(need, -(-majority // gang) * gang)
        if k >= R:
            k = max(need, min(majority, R - 1))
    long_only = np.zeros(R, dtype=bool)
    long_only[R - k:] = True
    return long_only, ~long_only
