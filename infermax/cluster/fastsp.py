"""PecSched's fast sequence parallelism for a long prefill on a gang of replicas (PecSched §5.3).

Across nodes the sequence is split ring-attention style (each node's KV shard
visits the other nodes, overlapped with attention); inside a node the attention
stage and the MLP stage each use Megatron-SP or Ulysses-SP, whichever of the four
combinations is fastest for this sequence length, with the §5.3 volumes
(:mod:`infermax.costmodel.communication`; Ulysses moves the replica's parameters
when TP > 1) and its per-GPU computation:

- attention, Megatron: ``2sd(N_h+N_kv)d_h/T + 4(sT)²d/T + 2sd²``; Ulysses:
  ``2sd(N_h+N_kv)d_h + 4(sG)²d/G + 2sd²`` (s = tokens per GPU, G = GPUs of the
  gang in one node, T = TP); MLP ``16sd²`` either way;
- attention itself is causal and balanced over all the gang's GPUs (the §5.3
  terms count one node's share; across nodes the ring supplies the rest);
- FLOPs become seconds through the replica's own cost model: the one-shot
  prefill time on one replica times the ratio of per-GPU FLOPs, so a gang of one
  replica costs exactly what the replica costs.

``ring_only`` prices ring attention across every replica of the gang, each
replica keeping its TP (the SP of §6.2's baselines and of the ``pecsched-fsp``
ablation). Plain ring attention over a causal mask is unbalanced: with the
sequence cut into h contiguous shards, the last shard's queries attend to all h
KV shards, so the ring's slowest member does (2h − 1)/h times the balanced share
of attention; fast SP's hybrid inside a node balances it (the Megatron/Ulysses
all-to-all redistributes heads, not sequence positions). ``striped`` ring attention
(LoongServe's: token t goes to replica t mod h) gives every member the balanced share.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from infermax.costmodel.communication import (
    DEFAULT_LATENCY_S,
    megatron_sp_attention_volume,
    megatron_sp_mlp_volume,
    ulysses_sp_attention_volume,
    ulysses_sp_mlp_volume,
)

from .spec import Cluster


@dataclass(frozen=True, slots=True)
class SpPlan:
    """How a prefill of ``num_tokens`` runs on ``gang`` and what it costs."""

    num_tokens: int
    gang: tuple[int, ...]
    nodes: int
    gpus_per_node: int
    attention: str          # "megatron", "ulysses", "ring" (ring_only) or "ring-striped"
    mlp: str
    compute_s: float
    intra_comm_s: float
    ring_exposed_s: float   # inter-node KV rotation not hidden behind attention
    nvlink_bytes: float
    network_bytes: float

    @property
    def time_s(self) -> float:
        return self.compute_s + self.intra_comm_s + self.ring_exposed_s


def _layer_flops(attn: str, num_tokens: float, gpus: int, m, tp: int, g: int, imbalance: float = 1.0) -> float:
    """FLOPs per GPU per layer: §5.3's projections, causal attention over the gang's GPUs (balanced,
    or ``imbalance`` times the balanced share on the busiest GPU)."""
    d, qkv, s = m.hidden_size, (m.num_heads + m.num_kv_heads) * m.head_dim, num_tokens / gpus
    proj = 2 * s * d * qkv / tp if attn == "megatron" else 2 * s * d * qkv
    return proj + imbalance * 2 * num_tokens * num_tokens * d / gpus + 2 * s * d * d + 16 * s * d * d


def _intra_volume(attn: str, mlp: str, s: float, m, tp: int, g: int) -> float:
    d = m.hidden_size
    vol = (megatron_sp_attention_volume(s, d, tp, g) if attn == "megatron" else
           ulysses_sp_attention_volume(s, d, m.num_heads, m.num_kv_heads, m.head_dim, tp, g))
    return vol + (megatron_sp_mlp_volume(s, d, tp, g) if mlp == "megatron" else ulysses_sp_mlp_volume(d, tp, g))


# complexity: input checks, then one branch per plan shape (ring or Megatron, attention and MLP splits), compared
def fast_sp_prefill(cluster: Cluster, num_tokens: int, gang: Sequence[int], ring_only: bool = False,
                    striped: bool = False) -> SpPlan:
    """The fastest §5.3 plan for a prefill of ``num_tokens`` on the replicas ``gang``.

    Computation is the replica's own modelled one-shot prefill time scaled by the
    ratio of per-GPU FLOPs (gang vs one replica), so one replica costs exactly what
    its cost model says; communication beyond the replica's own TP collectives
    (already in its cost model) is added per layer; the inter-node ring is hidden
    behind attention where it can be.
    """
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, (int, np.integer)) or num_tokens < 1:
        raise ValueError(f"fast SP: num_tokens must be an integer >= 1, got {num_tokens!r}")
    gang = tuple(int(r) for r in gang)
    if not gang or len(set(gang)) != len(gang) or not all(0 <= r < cluster.num_replicas for r in gang):
        raise ValueError(f"fast SP: gang must be distinct replica indices in [0, {cluster.num_replicas}), "
                         f"got {gang!r}")
    m, tp, L, b = cluster.model, cluster.plan.tp, cluster.model.num_layers, cluster.model.dtype_bytes
    n = float(num_tokens)
    by_node: dict[int, int] = {}
    for r in gang:
        by_node[cluster.replicas[r].node] = by_node.get(cluster.replicas[r].node, 0) + cluster.replica_gpus
    nodes, g = len(by_node), max(by_node.values())
    total_gpus = len(gang) * cluster.replica_gpus
    one_replica_s = cluster.cost_model().batch_time(np.array([num_tokens]), np.array([0]), np.array([False]))
    ref_flops = _layer_flops("megatron", n, tp, m, tp, tp)
    ref_comm = _intra_volume("megatron", "megatron", n / tp, m, tp, tp)
    # the ring: across nodes (fast SP) or across every replica (ring_only); one K,V shard per hop and layer
    hops = len(gang) if ring_only else nodes
    ring_bytes = (hops - 1) * (n / hops) * 2 * m.num_kv_heads * m.head_dim * b if hops > 1 else 0.0
    ring_bw = (cluster.gpu_bandwidth(False) * (g if not ring_only else cluster.replica_gpus) if nodes > 1
               else cluster.gpu.nvlink_bandwidth * cluster.replica_gpus)
    ring_s = L * (ring_bytes / ring_bw + DEFAULT_LATENCY_S) if hops > 1 else 0.0
    combos = [("ring-striped" if striped else "ring", "megatron")] if ring_only else \
        [(a, f) for a in ("megatron", "ulysses") for f in ("megatron", "ulysses")]
    plans = []
    for attn, mlp in combos:
        if ring_only:     # every replica keeps its TP (Megatron inside the replica)
            imbalance = 1.0 if striped else (2 * len(gang) - 1) / len(gang)
            flops = _layer_flops("megatron", n, total_gpus, m, tp, tp, imbalance)
            volume, links = _intra_volume("megatron", "megatron", n / total_gpus, m, tp, tp), tp
        else:
            flops = _layer_flops(attn, n, total_gpus, m, tp, g)
            volume, links = _intra_volume(attn, mlp, n / total_gpus, m, tp, g), g
        compute = one_replica_s * flops / ref_flops
        extra = max(0.0, volume / links - ref_comm / tp) * b
        intra = L * (extra / cluster.gpu.nvlink_bandwidth + (DEFAULT_LATENCY_S if extra else 0.0))
        attention_s = one_replica_s * (2 * n * n * m.hidden_size / total_gpus) / ref_flops
        plans.append(SpPlan(num_tokens=int(num_tokens), gang=gang, nodes=nodes, gpus_per_node=g, attention=attn,
                            mlp=mlp, compute_s=compute, intra_comm_s=intra,
                            ring_exposed_s=max(0.0, ring_s - attention_s),
                            nvlink_bytes=L * volume * b * (len(gang) if ring_only else nodes),
                            network_bytes=L * ring_bytes * hops if nodes > 1 else 0.0))
    return min(plans, key=lambda p: p.time_s)
