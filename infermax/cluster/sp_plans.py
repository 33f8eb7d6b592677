"""CSPS's sequence-parallel plans for one request (CSPS §3.2, §4, App. A): what they move and how long.

A long prompt of L tokens runs on an SP group of N GPUs (g per node, n nodes), each
holding one sequence partition (SPT) of s = L/N tokens. Per layer and GPU (elements;
h query heads, h_kv KV heads of d_h, d = h·d_h):

- **SP-NTP** (Ulysses): all-to-all of the SPT's Q, K, V to the heads' owners,
  (N−1)/N · s·(h + 2h_kv)·d_h, attention, all-to-all of the output back,
  (N−1)/N · s·h·d_h; when the group shards the weights (a TP deployment) it also
  gathers the attention parameters, (N−1)/N · (d·(h + 2h_kv)·d_h + h·d_h·d).
- **SP-TP** (Megatron): all-gather of the embeddings, (N−1)·s·d, and
  reduce-scatter of the output projection, (N−1)·s·d.

With h_kv = h these are App. A's volumes divided by N (App. A sums the group);
we keep the model's GQA shape. The per-request choice (:func:`choose_sp_kind`)
takes the kind that moves less; for an MHA model that is App. A's crossover
L > 2dN/(N−2), never at N = 2 (App. A's text says "N = 2: SP-NTP always
better"; its own inequality says the opposite — we follow the inequality).

**Time of a transfer phase** (:class:`NetworkModel`): latency + bytes / bandwidth
+ contention, calibrated on the shipped Vidur measurements of the cluster's GPU:
the latency is the measured collective's intercept for that group shape (N, g);
NVLink bandwidth is the measured 8-GPU all-reduce bus bandwidth; a network flow
gets the measured inter-node send/recv bandwidth, and the g GPUs of a node that
send off-node at once *share* the node's link (``net_gbps``, at the same
measured efficiency): the contention term. A bandwidth-only model
(``NetworkModel.bandwidth_only``: no latency, spec bandwidths, no sharing) is
kept to show what the calibration changes (Fig. 5).

**Compute** comes from the replica's own cost-model terms (the single-GPU
schedulers' LinearCoefficients): non-attention = the batch line at s tokens
(split into the attention block's projections and the MLP by their FLOPs),
attention = ``prefill_attn_s`` × the causal pairs L(L+1)/2 / N (balanced over
heads or GPUs), both per layer (/ L_layers).

**CSA** (§3.2.4): :func:`~infermax.costmodel.communication.csa_kv_fractions` with
one segment per GPU scales the KV part of SP-NTP's first all-to-all by
``moved`` and all attention by ``attended``; SP-TP's all-gather cannot drop
(§3.2.4), only its attention shrinks.

**Three-phase pipelining** (§3.2.5): the layer's transfer-in, attention and
transfer-out are cut into M micro-partitions; the link carries one transfer at a
time (each micro-partition pays the phase latency again), the GPU one attention
at a time, and a micro-partition's transfer-out follows its attention
(:func:`pipeline_s`). M is chosen in 1..16 per plan (the paper enumerates 4..16).
The result is never below max(link busy time, attention time) nor above the
serial sum with M = 1.

**SP decode** (§4.2, Table 3): the home GPU ships the new token's Q to the N−1
KV holders (h·d_h per layer) and gets back their partial outputs and
log-sum-exps (h·(d_h + 1)); gathering the KV instead moves (N−1)/N of the
context's K and V every layer (:func:`decode_layer_bytes`).

Departures: one SPT length for both kinds (the paper: 64K without TP, 128K at
TP 8); the objective-oriented configuring (§3.2.6's regression models) is
replaced by the fixed CSA setting of the variant and the best M by enumeration;
hierarchical communication for SP-TP is not modelled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from infermax.costmodel.communication import CsaFractions, comm_model, csa_kv_fractions
from infermax.costmodel.specs import ModelSpec

from .spec import Cluster

KINDS = ("ntp", "tp")
MAX_MICRO = 16


# --- volumes ------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class LayerVolumes:
    """Elements one GPU sends per layer: before attention (``comm_in``, its KV part ``kv_in``), after it."""

    comm_in: float
    kv_in: float
    comm_out: float


def layer_volumes(kind: str, seq_len: int, model: ModelSpec, num_gpus: int, weights_sharded: bool,
                  kv_moved: float = 1.0) -> LayerVolumes:
    """Per-GPU elements of one layer of ``kind`` (module docstring), KV scaled by CSA's ``kv_moved``."""
    _check_kind(kind)
    n = num_gpus
    if n <= 1:
        return LayerVolumes(comm_in=0.0, kv_in=0.0, comm_out=0.0)
    s, h, hkv, dh, d = seq_len / n, model.num_heads, model.num_kv_heads, model.head_dim, model.hidden_size
    share = (n - 1) / n
    if kind == "tp":
        return LayerVolumes(comm_in=(n - 1) * s * d, kv_in=0.0, comm_out=(n - 1) * s * d)
    q, kv = share * s * h * dh, share * s * 2 * hkv * dh * kv_moved
    params = share * (d * (h + 2 * hkv) * dh + h * dh * d) if weights_sharded else 0.0
    return LayerVolumes(comm_in=q + kv + params, kv_in=kv, comm_out=share * s * h * dh)


def choose_sp_kind(seq_len: int, model: ModelSpec, num_gpus: int, weights_sharded: bool = True) -> str:
    """The kind that moves fewer elements per layer (ties: SP-TP); App. A's rule for an MHA model."""
    ntp = layer_volumes("ntp", seq_len, model, num_gpus, weights_sharded)
    tp = layer_volumes("tp", seq_len, model, num_gpus, weights_sharded)
    return "ntp" if ntp.comm_in + ntp.comm_out < tp.comm_in + tp.comm_out else "tp"


def decode_layer_bytes(context_tokens: int, model: ModelSpec, num_gpus: int, mode: str) -> float:
    """Bytes one decode step moves per layer on an SP group holding ``context_tokens`` of KV (Table 3):
    ``q`` ships Q to the N−1 holders and their partial outputs back; ``kv`` gathers their KV shards."""
    if mode not in ("q", "kv"):
        raise ValueError(f"decode mode must be 'q' or 'kv', got {mode!r}")
    n, b = num_gpus, model.dtype_bytes
    if n <= 1:
        return 0.0
    if mode == "q":
        return (n - 1) * (model.num_heads * model.head_dim + model.num_heads * (model.head_dim + 1)) * b
    return (n - 1) / n * context_tokens * 2 * model.num_kv_heads * model.head_dim * b


# --- time of a transfer phase ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class NetworkModel:
    """latency + bytes / bandwidth + contention (module docstring); bandwidths in bytes/s."""

    nvlink_Bps: float                  # one GPU's NVLink bandwidth, as measured
    flow_Bps: float                    # one inter-node flow, as measured
    node_link_Bps: float               # a node's network link (shared by its GPUs' flows)
    latencies: tuple[tuple[int, int, float], ...]     # measured (N, GPUs per node, latency_s)
    contention: bool = True

    @classmethod
    def calibrated(cls, cluster: Cluster) -> "NetworkModel":
        """Vidur's measurements of the cluster's GPU; the analytic bounds where there are none."""
        comm, g = comm_model(cluster.gpu.name), cluster.gpu
        ar8, flow = comm.fitted.get(("all_reduce", 8, 8)), comm.fitted.get(("send_recv", 2, 1))
        nvlink = 2 * 7 / 8 / ar8.per_byte_s if ar8 is not None else g.nvlink_bandwidth
        flow_Bps = 1 / flow.per_byte_s if flow is not None else g.network_bandwidth
        efficiency = min(1.0, flow_Bps / g.network_bandwidth)
        node = cluster.gpu_bandwidth(False) * cluster.gpus_per_node * efficiency
        lat = tuple((n, p, line.latency_s) for (kind, n, p), line in sorted(comm.fitted.items())
                    if kind == "all_reduce")
        return cls(nvlink_Bps=nvlink, flow_Bps=flow_Bps, node_link_Bps=node, latencies=lat)

    @classmethod
    def bandwidth_only(cls, cluster: Cluster) -> "NetworkModel":
        """Spec bandwidths, no latency, no sharing of a node's link."""
        return cls(nvlink_Bps=cluster.gpu.nvlink_bandwidth, flow_Bps=cluster.gpu_bandwidth(False),
                   node_link_Bps=math.inf, latencies=(), contention=False)

    def latency_s(self, num_gpus: int, per_node: int) -> float:
        """The measured latency of the nearest group shape (same node count first, then size)."""
        if num_gpus <= 1 or not self.latencies:
            return 0.0
        nodes = -(-num_gpus // per_node)
        best = min(self.latencies, key=lambda x: (abs(-(-x[0] // x[1]) - nodes) if nodes > 1 else x[1] != x[0],
                                                  abs(math.log2(x[0]) - math.log2(num_gpus))))
        return best[2]

    def phase_s(self, elements_per_gpu: float, num_gpus: int, per_node: int, dtype_bytes: int) -> float:
        """One all-to-all-like phase: each GPU sends ``elements_per_gpu`` spread evenly over its N−1 peers."""
        if num_gpus <= 1 or elements_per_gpu <= 0:
            return 0.0
        per_node = min(per_node, num_gpus)
        b = elements_per_gpu * dtype_bytes
        intra = b * (per_node - 1) / (num_gpus - 1)
        inter = b - intra
        t = intra / self.nvlink_Bps
        if inter > 0:
            flow = self.flow_Bps
            if self.contention:              # the node's GPUs send off-node at once, over one shared link
                flow = min(flow, self.node_link_Bps / per_node)
            t = max(t, inter / flow)
        return self.latency_s(num_gpus, per_node) + t

    def fan_s(self, total_bytes: float, num_gpus: int, per_node: int) -> float:
        """One GPU sends to (or receives from) the N−1 others ``total_bytes`` in all, spread evenly: the
        off-node part over that GPU's one network flow."""
        if num_gpus <= 1 or total_bytes <= 0:
            return 0.0
        per_node = min(per_node, num_gpus)
        intra = total_bytes * (per_node - 1) / (num_gpus - 1)
        return self.latency_s(num_gpus, per_node) + max(intra / self.nvlink_Bps, (total_bytes - intra) / self.flow_Bps)


# --- three-phase pipelining ------------------------------------------------------------------------------
def pipeline_s(comm_in_s: float, compute_s: float, comm_out_s: float, latency_s: float, micro: int) -> float:
    """Makespan of ``micro`` micro-partitions through transfer-in → compute → transfer-out (§3.2.5, Fig. 9).

    The link runs one transfer at a time (each pays ``latency_s`` plus its share of the bytes' time); a
    transfer-out is ready when its compute ends and goes first when both are ready; compute runs in order.
    ``comm_*_s`` include one ``latency_s`` each (the M = 1 phase)."""
    if isinstance(micro, bool) or not isinstance(micro, (int, np.integer)) or micro < 1:
        raise ValueError(f"micro must be an integer >= 1, got {micro!r}")
    a = (comm_in_s - latency_s) / micro + latency_s if comm_in_s > 0 else 0.0
    c = (comm_out_s - latency_s) / micro + latency_s if comm_out_s > 0 else 0.0
    b = compute_s / micro
    link = gpu = 0.0
    ins_done, outs = 0, []            # outs: ready times of pending transfer-outs
    while ins_done < micro or outs:
        if outs and (ins_done == micro or outs[0] <= link):
            link = max(link, outs.pop(0)) + c
            continue
        link += a                      # the next transfer-in
        gpu = max(gpu, link) + b
        outs.append(gpu)
        ins_done += 1
    return max(link, gpu)


# --- a request's prefill plan ---------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True, slots=True)
class PrefillPlan:
    """One request's SP prefill (all layers): phases and what they moved."""

    kind: str
    num_gpus: int
    per_node: int
    seq_len: int
    csa: CsaFractions
    micro: int
    attention_s: float         # all layers, per GPU
    other_s: float             # non-attention compute, all layers
    comm_in_s: float           # all layers, unpipelined
    comm_out_s: float
    exposed_comm_s: float      # communication not hidden behind attention
    bytes_per_gpu: float       # all layers
    time_s: float              # the prefill's time (TTFT once it starts)

    @property
    def comm_s(self) -> float:
        return self.comm_in_s + self.comm_out_s

    @property
    def comm_share(self) -> float:
        """Communication on the critical path over the prefill time (Fig. 5's ratio)."""
        return self.exposed_comm_s / self.time_s if self.time_s > 0 else 0.0

    @property
    def attention_share(self) -> float:
        return self.attention_s / self.time_s if self.time_s > 0 else 0.0


def _flop_split(m: ModelSpec) -> float:
    """The attention block's projections' share of a layer's linear FLOPs (the rest is the MLP)."""
    proj = m.hidden_size * (m.num_heads + 2 * m.num_kv_heads) * m.head_dim + m.num_heads * m.head_dim * m.hidden_size
    mlp = (3 if m.gated_mlp else 2) * m.hidden_size * m.ffn_size
    return proj / (proj + mlp)


def prefill_plan(cluster: Cluster, seq_len: int, num_gpus: int, per_node: int, kind: str, *,
                 weights_sharded: bool = True, csa: tuple[int, float] | None = None, pipeline: bool = True,
                 network: NetworkModel | None = None) -> PrefillPlan:
    """SP prefill of ``seq_len`` tokens on ``num_gpus`` GPUs (``per_node`` per node); ``csa`` = (levels, p)."""
    for name, value in (("seq_len", seq_len), ("num_gpus", num_gpus), ("per_node", per_node)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"SP plan: {name} must be an integer >= 1, got {value!r}")
    _check_kind(kind)
    m, net = cluster.model, network or NetworkModel.calibrated(cluster)
    L, n = m.num_layers, num_gpus
    fr = (csa_kv_fractions(seq_len, -(-seq_len // n), csa[0], csa[1]) if csa is not None and n > 1
          else CsaFractions(moved=1.0, attended=1.0))
    k = cluster.cost_model().coefficients
    s = seq_len / n
    linear = max(a + b * s for a, b in k.nonattn_lines) + k.prefill_bias_s + k.prefill_token_s * s
    attention = k.prefill_attn_s * seq_len * (seq_len + 1) / 2 / n * fr.attended
    vol = layer_volumes(kind, seq_len, m, n, weights_sharded, fr.moved if kind == "ntp" else 1.0)
    cin = net.phase_s(vol.comm_in, n, per_node, m.dtype_bytes)
    cout = net.phase_s(vol.comm_out, n, per_node, m.dtype_bytes)
    lat = net.latency_s(n, per_node)
    proj = linear * _flop_split(m)                       # inside the pipeline with attention (Fig. 9)
    compute = (attention + proj) / L
    serial = cin + compute + cout
    best, micro = serial, 1
    if pipeline and n > 1:
        for mm in range(2, MAX_MICRO + 1):
            t = pipeline_s(cin, compute, cout, lat, mm)
            if t < best:
                best, micro = t, mm
    layer = best + (linear - proj) / L
    return PrefillPlan(kind=kind, num_gpus=n, per_node=min(per_node, n), seq_len=int(seq_len), csa=fr, micro=micro,
                       attention_s=attention, other_s=linear, comm_in_s=L * cin, comm_out_s=L * cout,
                       exposed_comm_s=L * (best - compute),
                       bytes_per_gpu=L * (vol.comm_in + vol.comm_out) * m.dtype_bytes,
                       time_s=L * layer)


def decode_comm_phases(cluster: Cluster, num_gpus: int, per_node: int, network: NetworkModel | None = None
                       ) -> tuple[float, float]:
    """(before the first layer's attention, after the last member's attention) of one SP decode step that
    ships Q: every layer the home GPU sends Q to the N−1 holders, then gathers their partial outputs and
    log-sum-exps (the merge); layer l's attention waits for its Q, so L−1 Q ships and L merges follow the
    first attention."""
    if num_gpus <= 1:
        return 0.0, 0.0
    m, net = cluster.model, network or NetworkModel.calibrated(cluster)
    b, peers = m.dtype_bytes, num_gpus - 1
    q = net.fan_s(peers * m.num_heads * m.head_dim * b, num_gpus, per_node)
    merge = net.fan_s(peers * m.num_heads * (m.head_dim + 1) * b, num_gpus, per_node)
    return q, (m.num_layers - 1) * q + m.num_layers * merge


def decode_layer_s(cluster: Cluster, context_tokens: int, num_gpus: int, per_node: int, mode: str,
                   network: NetworkModel | None = None) -> float:
    """Table 3: one layer's transfer of a decode step, shipping Q (and merging) or gathering the KV."""
    net = network or NetworkModel.calibrated(cluster)
    if mode == "q":
        return sum(decode_comm_phases(cluster, num_gpus, per_node, net)) / cluster.model.num_layers
    return net.fan_s(decode_layer_bytes(context_tokens, cluster.model, num_gpus, mode), num_gpus, per_node)


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"SP kind must be 'ntp' (SP-NTP) or 'tp' (SP-TP), got {kind!r}")


__all__ = ["KINDS", "LayerVolumes", "NetworkModel", "PrefillPlan", "choose_sp_kind", "decode_comm_phases",
           "decode_layer_bytes", "decode_layer_s", "layer_volumes", "pipeline_s", "prefill_plan"]
