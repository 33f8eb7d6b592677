"""A long request served by a gang of replicas: sequence-parallel prefill, then a sharded decode.

The gang's prefill runs layer by layer over the whole sequence (sequence
parallelism), so its progress is a count of kernel boundaries passed: each of the
model's L layers has ``KERNELS_PER_LAYER`` of them (QKV projection, attention,
output projection, MLP), and the prefill's time (fast SP or plain ring attention,
:mod:`infermax.cluster.fastsp`) is spread evenly over the ``L · KERNELS_PER_LAYER``
units. A suspension (PecSched §5.1) stops at the next kernel boundary and
keeps one layer's intermediate activations (the token embeddings of the gang's
shard, ``saved_bytes``); resuming reads them back (``switch_s``) and continues
from the unit where it stopped.

The KV, I + O − 1 tokens at its peak, is sharded evenly over the members
(``share_tokens`` each, held from the gang's formation to its completion). A
decode step ships the new token's Q to every member, each attends over its shard
(timed by the replica's own cost model as a one-token decode over ``share``
cached tokens, alone or inside that member's colocated batch), and the partial
outputs are merged at the first member (log-sum-exp merge: one all-reduce of
the hidden vector). Under a CSPS policy the prefill is priced by its SP plan
(:func:`~infermax.cluster.csps.csps_prefill`, kept as ``plan``) and a decode step
ships Q every layer (:func:`~infermax.cluster.csps.decode_phases`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .csps import csps_prefill
from .fastsp import fast_sp_prefill
from .spec import Cluster

KERNELS_PER_LAYER = 4

WAIT, PREFILL, DECODE, DONE = "wait", "prefill", "decode", "done"


@dataclass
class Gang:
    """One long request on ``members``; the engine moves it through WAIT → PREFILL ⇄ WAIT → DECODE → DONE."""

    gid: int
    request: int                  # request index in the workload
    members: tuple[int, ...]
    input_len: int
    output_len: int
    share_tokens: int             # KV held on each member (peak, reserved at formation)
    prefill_s: float              # uninterrupted prefill time of the whole prompt on this gang
    units: int                    # kernel boundaries of the prefill (layers × KERNELS_PER_LAYER)
    saved_bytes: float            # one layer's activations per member, kept while suspended
    switch_s: float               # time to save and restore them (HBM write + read)
    sp_plan: str                  # "megatron/megatron", ..., or "ring/megatron"
    phase: str = WAIT
    units_done: int = 0
    gen: int = 0                  # tokens generated
    step_start: float = 0.0
    step_end: float = 0.0
    step_seq: int = 0             # invalidates a step's end event when the step is cut
    switch_applied: float = 0.0   # the current step began by restoring a suspension's saved state
    suspended: bool = False       # a started prefill (or decode) is paused
    num_suspensions: int = 0
    num_overtaken: int = 0        # short requests its members served ahead of it (PecSched Table 6)
    first_scheduled_s: float = math.nan
    first_token_s: float = math.nan
    completion_s: float = math.nan
    steps: list[dict] = field(default_factory=list)    # the cluster schedule's record of this gang
    plan: Any = None              # CSPS: its sp_plans.PrefillPlan

    @property
    def unit_s(self) -> float:
        return self.prefill_s / self.units

    def decode_shares(self) -> np.ndarray:
        """KV tokens each member attends over in the next decode step (the cache sharded evenly)."""
        k = len(self.members)
        cached = self.input_len + self.gen - 1
        base, extra = divmod(cached, k)
        return np.array([base + (1 if j < extra else 0) for j in range(k)], dtype=np.int64)


def make_gang(cluster: Cluster, gid: int, request: int, members: tuple[int, ...], input_len: int,
              output_len: int, fast_sp: bool, csps: Any = None, striped: bool = False) -> Gang:
    """A gang for one long request, with its prefill priced by fast SP (or plain ring attention; ``striped``:
    load-balanced ring attention), or by the CSPS variant ``csps``."""
    if csps is not None:
        plan = csps_prefill(cluster, int(input_len), tuple(members), csps)
        label = f"csps:{plan.kind}/M{plan.micro}/" + ("csa" if plan.csa.attended < 1 else "dense")
    else:
        plan = fast_sp_prefill(cluster, int(input_len), members, ring_only=not fast_sp, striped=striped)
        label = f"{plan.attention}/{plan.mlp}"
    m = cluster.model
    k = len(members)
    peak = int(input_len) + int(output_len) - 1
    units = m.num_layers * KERNELS_PER_LAYER
    saved = math.ceil(input_len / k) * m.hidden_size * m.dtype_bytes     # one layer's embeddings per member
    switch = 2 * saved / (cluster.gpu.hbm_bandwidth * cluster.replica_gpus)
    return Gang(gid=gid, request=int(request), members=tuple(members), input_len=int(input_len),
                output_len=int(output_len), share_tokens=math.ceil(peak / k), prefill_s=float(plan.time_s),
                units=units, saved_bytes=float(saved), switch_s=float(switch), sp_plan=label,
                plan=plan if csps is not None else None)


def decode_comm_s(cluster: Cluster, members: tuple[int, ...]) -> float:
    """Per decode step: the token's Q to every member and the partial outputs back (in parallel)."""
    m = cluster.model
    home = members[0]
    q_bytes = m.num_heads * m.head_dim * m.dtype_bytes
    out_bytes = (m.hidden_size + m.num_heads) * m.dtype_bytes       # partial output + its log-sum-exp
    if len(members) == 1:
        return 0.0
    return max(cluster.transfer_s(q_bytes, home, r) + cluster.transfer_s(out_bytes, r, home) for r in members[1:])
