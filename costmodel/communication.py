"""Collective-communication times and the volumes of each parallel strategy.

Times: a collective moving S bytes among N GPUs takes ``latency_s +
per_byte_s · S`` — a line fitted per (collective, N, GPUs per node) to Vidur's
NCCL measurements where they exist, otherwise the ring-algorithm bound from the
GPU's link bandwidth (NVLink inside a node, the network across nodes):
all-reduce 2(N−1)/N · S / bw; all-gather, reduce-scatter and all-to-all
(N−1)/N · S / bw; send/recv S / bw. Collectives without a measurement of their
own reuse the all-reduce's bus bandwidth (a ring all-reduce *is* a
reduce-scatter then an all-gather).

Volumes (elements, per layer, whole parallel group) follow the papers:
PecSched §5.3 for Megatron-SP and Ulysses-SP inside a node, CSPS App. A
for SP-NTP (Ulysses with parameter gathering) vs SP-TP (Megatron), and ring
attention's KV rotation. CSA's token dropping (CSPS §3.2.4) scales the KV
moved and attended: :func:`csa_kv_fractions` gives those fractions of dense
causal attention, from the same keep rule the CSA kernel applies.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from .lsq import relative_lsq
from .profiles import ProfileFormatError, load_network_profile
from .specs import GPUS, GpuSpec, get_gpu_spec

DEFAULT_LATENCY_S = 10e-6


@dataclass(frozen=True, kw_only=True, slots=True)
class CollectiveLine:
    """time = latency_s + per_byte_s · bytes."""

    latency_s: float
    per_byte_s: float

    def time_s(self, num_bytes: float | np.ndarray) -> float | np.ndarray:
        return self.latency_s + self.per_byte_s * num_bytes


def fit_collective(size_bytes: np.ndarray, time_s: np.ndarray) -> CollectiveLine:
    """Fit one collective's line by relative least squares (scipy)."""
    latency, per_byte = relative_lsq(np.c_[np.ones(len(size_bytes)), size_bytes.astype(np.float64)], time_s)
    return CollectiveLine(latency_s=float(latency), per_byte_s=float(per_byte))


@dataclass(frozen=True)
class CommModel:
    """Collective times for one GPU type; ``fitted`` maps (collective, N, GPUs per node) to a line."""

    gpu: GpuSpec
    fitted: dict[tuple[str, int, int], CollectiveLine] = field(default_factory=dict)
    #: a network collective's ring step over one send/recv of the same bytes (1: the bare transfer)
    network_step_factor: float = 1.0

    def _link_bw(self, intra_node: bool) -> float:
        return self.gpu.nvlink_bandwidth if intra_node else self.gpu.network_bandwidth

    def _per_node(self, num_workers: int, intra_node: bool) -> int:
        return num_workers if intra_node else max(1, num_workers // 2)

    def all_reduce_s(self, num_bytes: float, num_workers: int, intra_node: bool = True) -> float:
        if num_workers <= 1:
            return 0.0
        line = self.fitted.get(("all_reduce", num_workers, self._per_node(num_workers, intra_node)))
        if line is not None:
            return float(line.time_s(num_bytes))
        return DEFAULT_LATENCY_S + 2 * (num_workers - 1) / num_workers * num_bytes / self._link_bw(intra_node)

    def gather_like_s(self, num_bytes: float, num_workers: int, intra_node: bool = True) -> float:
        """All-gather, reduce-scatter or all-to-all of ``num_bytes`` per GPU: (N−1)/N · S at bus bandwidth."""
        if num_workers <= 1:
            return 0.0
        line = self.fitted.get(("all_reduce", num_workers, self._per_node(num_workers, intra_node)))
        if line is not None:   # half an all-reduce: same latency, half the bytes moved
            return float(line.latency_s + line.per_byte_s * num_bytes / 2)
        return DEFAULT_LATENCY_S + (num_workers - 1) / num_workers * num_bytes / self._link_bw(intra_node)

    def send_recv_s(self, num_bytes: float, intra_node: bool = True) -> float:
        line = self.fitted.get(("send_recv", 2, 2 if intra_node else 1))
        if line is not None:
            return float(line.time_s(num_bytes))
        return DEFAULT_LATENCY_S + num_bytes / self._link_bw(intra_node)

    def placed_collective_s(self, collective: str, num_bytes: float, num_workers: int,
                            workers_per_node: int) -> float:
        """``all_reduce`` of ``num_bytes`` per GPU, or ``all_gather`` of ``num_bytes`` in total, among
        ``num_workers`` GPUs placed ``workers_per_node`` to a node (e.g. one per node: KVP's merge).

        A measured line of that exact shape is used as is (an all-gather as half an all-reduce).
        Otherwise, when the group leaves its node, the ring algorithm over the network: 2(N−1) steps
        for an all-reduce, N−1 for an all-gather, each step the *measured* inter-node send/recv of
        S/N bytes (Vidur's ``send_recv`` at one GPU per node: ≈ 19 µs latency on H100, 28 µs on
        A100) times :attr:`network_step_factor`, what a collective's step costs beyond the bare
        transfer (NCCL's synchronisation and reduction), read off the one multi-node collective
        measured with one GPU per node (:func:`measured_network_step_factor`).
        Inside a node without a measurement: :meth:`all_reduce_s` / :meth:`gather_like_s`.
        """
        if collective not in ("all_reduce", "all_gather"):
            raise ValueError(f"collective must be 'all_reduce' or 'all_gather', got {collective!r}")
        if num_workers <= 1:
            return 0.0
        per_node = max(1, min(workers_per_node, num_workers))
        line = self.fitted.get(("all_reduce", num_workers, per_node))
        if line is not None:
            share = 1.0 if collective == "all_reduce" else 0.5
            return float(line.latency_s + line.per_byte_s * num_bytes * share)
        if per_node >= num_workers:
            if collective == "all_reduce":
                return self.all_reduce_s(num_bytes, num_workers, intra_node=True)
            return self.gather_like_s(num_bytes, num_workers, intra_node=True)
        steps = (num_workers - 1) * (2 if collective == "all_reduce" else 1)
        return steps * self.network_step_factor * self.send_recv_s(num_bytes / num_workers, intra_node=False)


def _fit_node(node: "str | Path") -> dict[tuple[str, int, int], CollectiveLine]:
    fitted: dict[tuple[str, int, int], CollectiveLine] = {}
    for collective in ("all_reduce", "send_recv"):
        try:
            profile = load_network_profile(node, collective)
        except ProfileFormatError:
            continue
        for workers, per_node in profile.configurations():
            size, time_s = profile.select(workers, per_node)
            fitted[(collective, workers, per_node)] = fit_collective(size, time_s)
    return fitted


def _step_factor(fitted: dict[tuple[str, int, int], CollectiveLine]) -> float | None:
    """Measured 2-node all-reduce (one GPU per node: two ring steps of S/2 bytes) over two
    send/recvs of S/2 on the same network, compared by latency (the regime of small collectives)."""
    ar, sr = fitted.get(("all_reduce", 2, 1)), fitted.get(("send_recv", 2, 1))
    if ar is None or sr is None or sr.latency_s <= 0:
        return None
    return max(1.0, ar.latency_s / (2 * sr.latency_s))


@lru_cache(maxsize=1)
def measured_network_step_factor() -> float:
    """:attr:`CommModel.network_step_factor` of a node whose profile lacks a multi-node collective:
    the first packaged profile that has one (Vidur's A100 DGX: 72.5 µs / (2 · 27.9 µs) ≈ 1.30), else 1."""
    for name in GPUS:
        factor = _step_factor(_fit_node(name))
        if factor is not None:
            return factor
    return 1.0


def fit_comm_model(gpu: "str | GpuSpec", node: "str | Path | None" = None) -> CommModel:
    """Fit every measured collective of ``node`` (default: the packaged ``<gpu>_dgx`` profile)."""
    g = get_gpu_spec(gpu)
    fitted = _fit_node(node if node is not None else g.name)
    factor = _step_factor(fitted) if fitted else 1.0
    return CommModel(g, fitted, factor if factor is not None else measured_network_step_factor())


@lru_cache(maxsize=8)
def comm_model(gpu: str) -> CommModel:
    """The (cached) communication model of a GPU type: fitted if profiled, analytic otherwise."""
    return fit_comm_model(gpu)


# --- volumes (elements per layer, whole group) -------------------------------------------

def megatron_sp_attention_volume(seg: float, hidden: int, tp: int, gpus: int) -> float:
    """pecsched §5.3, Megatron SP attention stage: all-gather + reduce-scatter, 2·s·d·(T−1)·G."""
    return 2 * seg * hidden * (tp - 1) * gpus


def ulysses_sp_attention_volume(seg: float, hidden: int, heads: int, kv_heads: int, head_dim: int,
                                tp: int, gpus: int) -> float:
    """pecsched §5.3, Ulysses SP attention stage: two A2A plus parameter transfer,
    2·s·(N_h + N_h^KV)·d_h·(G−1) + (d·(N_h + N_h^KV)·d_h + d²)·G·(T−1)/T."""
    qkv = (heads + kv_heads) * head_dim
    return 2 * seg * qkv * (gpus - 1) + (hidden * qkv + hidden**2) * gpus * (tp - 1) / tp


def megatron_sp_mlp_volume(seg: float, hidden: int, tp: int, gpus: int) -> float:
    """pecsched §5.3, MLP stage with Megatron SP: 2·s·d·(T−1)·G (computation 16·s·d² per GPU)."""
    return 2 * seg * hidden * (tp - 1) * gpus


def ulysses_sp_mlp_volume(hidden: int, tp: int, gpus: int) -> float:
    """pecsched §5.3, MLP stage with Ulysses SP: parameters only, 8·d²·(T−1)·G/T."""
    return 8 * hidden**2 * (tp - 1) * gpus / tp


def sp_ntp_volume(seq_len: float, hidden: int, num_gpus: int) -> float:
    """csps App. A, SP-NTP under TP: parameters plus two A2A, (4d² + 4·L_in·d/N)·(N−1)."""
    return (4 * hidden**2 + 4 * seq_len * hidden / num_gpus) * (num_gpus - 1)


def sp_tp_volume(seq_len: float, hidden: int, num_gpus: int) -> float:
    """csps App. A, SP-TP: one all-gather and one reduce-scatter, 2·L_in·d·(N−1)."""
    return 2 * seq_len * hidden * (num_gpus - 1)


def sp_ntp_crossover_length(hidden: int, num_gpus: int) -> float:
    """csps App. A: SP-NTP moves less than SP-TP iff L_in > 2·d·N/(N−2).

    At N <= 2 the volumes above never favour SP-NTP ((4d² + 2·L·d) > 2·L·d), so
    this returns inf. (The appendix's text says N = 2 "always" favours SP-NTP;
    its own inequality d/L < (1 − 2/N)/2 cannot hold there — we follow the volumes.)
    """
    return math.inf if num_gpus <= 2 else 2 * hidden * num_gpus / (num_gpus - 2)


def ring_attention_volume(seq_len: float, kv_heads: int, head_dim: int, num_gpus: int) -> float:
    """Ring attention: each of N shards of K and V (L_in/N tokens) visits the N−1 other GPUs,
    (N−1) · L_in · 2 · h_kv · d_h."""
    return (num_gpus - 1) * seq_len * 2 * kv_heads * head_dim


# --- CSA token dropping (CSPS §3.2.4): fractions of the dense KV moved and attended --------

@dataclass(frozen=True, kw_only=True, slots=True)
class CsaFractions:
    """CSA's share of dense causal attention over one sequence, per head (both in [0, 1]).

    moved: KV of earlier segments delivered to a segment's queries (level >= 2 rings),
        CSA / dense. Level 1 (the segment's own keys) never moves.
    attended: (query, key) pairs scored, CSA / dense causal. Scales attention FLOPs.
    A plan prices CSA by scaling its KV traffic by ``moved`` and its attention
    work by ``attended``. A segment's rings are disjoint, so no key is counted
    twice for one destination.
    """

    moved: float
    attended: float


def csa_keep_ratios(drop_ratio: float, num_levels: int) -> list[float]:
    """Kept fraction of a ring's keys at levels 1..num_levels: 1, 1 − p, (1 − p)/2, (1 − p)/4, …

    CSPS §3.2.4 with p the level-2 drop ratio; the halving per level is the
    prose's reading (see ``kernels/csa.py`` for why not the formula's literal one).
    """
    if not 0.0 <= drop_ratio <= 1.0:
        raise ValueError(f"drop_ratio must be in [0, 1], got {drop_ratio}")
    if num_levels < 1:
        raise ValueError(f"num_levels must be >= 1, got {num_levels}")
    return [1.0] + [(1.0 - drop_ratio) / 2 ** n for n in range(num_levels - 1)]


def csa_num_kept(ring_tokens: int, keep_ratio: float) -> int:
    """Keys a ring of ``ring_tokens`` keeps: round(keep_ratio · ring_tokens), halves up."""
    return int(keep_ratio * ring_tokens + 0.5)


def csa_rings(segment_start: int, segment_tokens: int, num_levels: int) -> list[tuple[int, int, int]]:
    """(level, first key, end key) of the earlier-key rings seen by the segment starting at ``segment_start``.

    A level-v segment spans segment_tokens · 2^(v−1) tokens (the top level: all),
    and the level-v ring is the part of it before the level-(v−1) segment; so the
    rings tile [0, segment_start) from near to far. Empty rings are left out.
    """
    rings, end = [], segment_start
    for level in range(2, num_levels + 1):
        width = segment_tokens * 2 ** (level - 1)
        start = 0 if level == num_levels else segment_start // width * width
        if start < end:
            rings.append((level, start, end))
        end = start
    return rings


def csa_kv_fractions(seq_len: int, segment_tokens: int, num_levels: int, drop_ratio: float,
                     block_tokens: int = 1) -> CsaFractions:
    """Fractions of the dense KV moved and attended under CSA for one ``seq_len``-token prefill.

    Segment s (its queries q_s, its start a_s) attends its own keys causally and
    keeps k_(s,v) = round(keep_v · |ring_v|) keys of each earlier ring. With B(x)
    = x rounded up to whole blocks of ``block_tokens`` (kept keys packed per ring):

        moved    = Σ_s Σ_v B(k_(s,v)) / Σ_s Σ_v B(|ring_(s,v)|)
        attended = Σ_s [q_s(q_s+1)/2 + q_s Σ_v B(k_(s,v))] / Σ_s [q_s(q_s+1)/2 + q_s Σ_v B(|ring_(s,v)|)]

    With ``block_tokens = 1`` ``attended`` is exactly the kept share of the causal
    mask the CSA kernel applies. A sequence of one segment (or one level) moves
    nothing either way: moved = 1.
    """
    for name, value in (("seq_len", seq_len), ("segment_tokens", segment_tokens), ("block_tokens", block_tokens)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    ratios = csa_keep_ratios(drop_ratio, num_levels)
    if num_levels == 1:  # level 1 is the top level: one segment, nothing dropped or moved
        segment_tokens = seq_len
    blocks = lambda x: -(-x // block_tokens) * block_tokens
    moved = moved_dense = attended = attended_dense = 0
    for start in range(0, seq_len, segment_tokens):
        queries = min(segment_tokens, seq_len - start)
        rings = csa_rings(start, segment_tokens, num_levels)
        kept = sum(blocks(csa_num_kept(hi - lo, ratios[lv - 1])) for lv, lo, hi in rings)
        dense = sum(blocks(hi - lo) for _, lo, hi in rings)
        moved, moved_dense = moved + kept, moved_dense + dense
        own = queries * (queries + 1) // 2
        attended, attended_dense = attended + own + queries * kept, attended_dense + own + queries * dense
    return CsaFractions(moved=moved / moved_dense if moved_dense else 1.0, attended=attended / attended_dense)

