"""CSPS on the cluster engine (CSPS): its variants, how big a request's SP group is, its prices, its workloads.

A request whose prompt exceeds one SPT (``spt_tokens``, 64K: §3.2.3's SP-NTP
partition) is served by a gang of N = ⌈I / SPT⌉ single-GPU replicas (at least what
its KV needs, at most ``sp_replicas``), exactly that many, on one node if one has
them free, else on the fewest nodes (§3.2.2: "the servers with the most available
GPUs are chosen first"). Its prefill is the :mod:`~infermax.cluster.sp_plans` plan
of the variant — SP-NTP or SP-TP per request by volume (App. A), CSA, three-phase
pipelining — and runs alone on the gang. Its decode keeps the KV where the prefill
left it (sharded over the gang) and ships Q every layer (§4.2): the step's first Q
transfer precedes the members' attention, the remaining Q transfers and the merges
follow it (``decode_comm_phases``); a member's attention runs inside its own next
batch with at most ``colocate_tokens`` prefill tokens of shorter requests (their
decodes colocated, Fig. 12). Shorter requests run on one replica under the local
scheduler. Nothing preempts a gang's prefill; the global queue is first come,
first served, a request that finds no replica or gang yet letting later ones pass.

Departures from the paper: the SP group shards the weights in every variant
(the TP deployment, where App. A's choice exists), so SP-NTP gathers the
attention parameters; the decode does not migrate the long request's KV to
other GPUs (§4.2 does) — it stays on the prefill's GPUs, which take other
requests' work beside it; the hyper-parameters are fixed per variant, not
regressed (§3.2.6), so there is no "Oracle".

Variants (the policies ``csps``, ``csps-nocsa``, ``csps-nopipe``, ``csps-ntp``,
``csps-tp``, ``csps-plain``, ``csps-kvdecode``: the decode gathers the KV at the
first member every layer instead of shipping Q), registered in
:mod:`~infermax.cluster.policies`.

Workloads: :func:`csps_workload` draws inputs and outputs log-normally to Table 2's
median and p99 of NeedleBench and BookCorpus (inputs clipped to [1K, 1M], the
paper's range) with Poisson arrivals (§5.2: 1 request/s).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from infermax.types import Request, Workload

from .sp_plans import (
    KINDS,
    NetworkModel,
    PrefillPlan,
    choose_sp_kind,
    decode_comm_phases,
    decode_layer_bytes,
    prefill_plan,
)
from .spec import Cluster

SPT_TOKENS = 65_536


@dataclass(frozen=True, kw_only=True, slots=True)
class CspsVariant:
    """What a CSPS policy does: the SP kind (``auto``: per request, App. A), CSA (levels, level-2 drop ratio
    p; None: off), three-phase pipelining, the SPT length, and the decode: ship Q to the KV holders (``q``,
    §4.2) or gather their KV at the first member every step (``kv``, what O4 / Table 3 compare it with)."""

    kind: str = "auto"
    csa: tuple[int, float] | None = (2, 0.25)
    pipeline: bool = True
    spt_tokens: int = SPT_TOKENS
    decode: str = "q"

    def __post_init__(self) -> None:
        if self.kind not in ("auto", *KINDS):
            raise ValueError(f"CspsVariant.kind must be 'auto', 'ntp' or 'tp', got {self.kind!r}")
        if self.csa is not None:
            levels, p = self.csa
            if isinstance(levels, bool) or not isinstance(levels, int) or levels < 1 or not 0 <= p <= 1:
                raise ValueError(f"CspsVariant.csa must be (levels >= 1, drop ratio in [0, 1]), got {self.csa!r}")
        if self.decode not in ("q", "kv"):
            raise ValueError(f"CspsVariant.decode must be 'q' or 'kv', got {self.decode!r}")
        if isinstance(self.spt_tokens, bool) or not isinstance(self.spt_tokens, int) or self.spt_tokens < 1:
            raise ValueError(f"CspsVariant.spt_tokens must be an integer >= 1, got {self.spt_tokens!r}")

    @property
    def label(self) -> str:
        csa = "csa" if self.csa is not None else "dense"
        return f"{self.kind}/{csa}/{'pipelined' if self.pipeline else 'serial'}"


VARIANTS = {
    "csps": CspsVariant(),
    "csps-nocsa": CspsVariant(csa=None),
    "csps-nopipe": CspsVariant(pipeline=False),
    "csps-ntp": CspsVariant(kind="ntp"),
    "csps-tp": CspsVariant(kind="tp"),
    "csps-plain": CspsVariant(csa=None, pipeline=False),
    "csps-kvdecode": CspsVariant(decode="kv"),
}


def group_gpus(input_len: int, variant: CspsVariant) -> int:
    """GPUs of a request's SP group: one per SPT."""
    return max(1, -(-int(input_len) // variant.spt_tokens))


def gang_layout(cluster: Cluster, members: tuple[int, ...]) -> tuple[int, int]:
    """(GPUs, most GPUs on one node) of a gang of replicas."""
    by_node: dict[int, int] = {}
    for r in members:
        node = cluster.replicas[r].node
        by_node[node] = by_node.get(node, 0) + cluster.replica_gpus
    return sum(by_node.values()), max(by_node.values())


def csps_prefill(cluster: Cluster, input_len: int, members: tuple[int, ...], variant: CspsVariant) -> PrefillPlan:
    """The variant's plan for a prefill of ``input_len`` tokens on the gang ``members``."""
    if not isinstance(variant, CspsVariant):
        raise ValueError(f"variant must be a CspsVariant, got {type(variant).__name__}")
    n, per_node = gang_layout(cluster, members)
    kind = variant.kind if variant.kind != "auto" else choose_sp_kind(int(input_len), cluster.model, n)
    return prefill_plan(cluster, int(input_len), n, per_node, kind, csa=variant.csa, pipeline=variant.pipeline,
                        network=network(cluster))


def decode_phases(cluster: Cluster, members: tuple[int, ...]) -> tuple[float, float]:
    """(Q shipped before attention, transfers after it) of one decode step of a gang (§4.2)."""
    n, per_node = gang_layout(cluster, members)
    return decode_comm_phases(cluster, n, per_node, network(cluster))


def kv_gather_phases(cluster: Cluster, members: tuple[int, ...], context_tokens: int) -> tuple[float, float]:
    """(before the first member's attention, after it) of a decode step that gathers the KV instead: every
    layer the first member receives the other members' shards of that layer's K and V, then attends alone."""
    n, per_node = gang_layout(cluster, members)
    m = cluster.model
    layer = network(cluster).fan_s(decode_layer_bytes(int(context_tokens), m, n, "kv"), n, per_node)
    return layer, (m.num_layers - 1) * layer


_NETWORKS: dict[str, NetworkModel] = {}


def network(cluster: Cluster) -> NetworkModel:
    """The calibrated network model of ``cluster`` (cached per spec)."""
    key = cluster.to_spec()
    if key not in _NETWORKS:
        _NETWORKS[key] = NetworkModel.calibrated(cluster)
    return _NETWORKS[key]


# --- workloads (Table 2) ----------------------------------------------------------------------------------
DATASETS = {  # (input median, input p99, output median, output p99), CSPS Table 2
    "needlebench": (113_000, 995_000, 348, 572),
    "bookcorpus": (97_000, 406_000, 375, 631),
}
Z99 = 2.3263


def csps_workload(dataset: str = "needlebench", n: int = 100, rate_per_s: float = 1.0, seed: int = 0,
                  spt_tokens: int = SPT_TOKENS, lo: int = 1_000, hi: int = 1_000_000) -> Workload:
    """Requests with Table 2's medians and p99s (log-normal), Poisson arrivals; tag ``long`` above one SPT."""
    if dataset not in DATASETS:
        raise ValueError(f"dataset must be one of {', '.join(DATASETS)}, got {dataset!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (isinstance(rate_per_s, (int, float)) and math.isfinite(rate_per_s) and rate_per_s > 0):
        raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s!r}")
    med_i, p99_i, med_o, p99_o = DATASETS[dataset]
    rng = np.random.default_rng(seed)
    ins = np.clip(np.round(med_i * np.exp(rng.normal(0, math.log(p99_i / med_i) / Z99, n))), lo, hi).astype(int)
    outs = np.clip(np.round(med_o * np.exp(rng.normal(0, math.log(p99_o / med_o) / Z99, n))), 1, None).astype(int)
    t = np.cumsum(rng.exponential(1 / rate_per_s, n))
    reqs = tuple(Request(id=i, input_len=int(ins[i]), output_len=int(outs[i]), arrival_s=float(t[i]),
                         tag="long" if ins[i] > spt_tokens else "short") for i in range(n))
    return Workload(requests=reqs, name=f"csps:{dataset},n={n},rate={rate_per_s:g},seed={seed}")
