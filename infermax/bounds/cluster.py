"""Certified bounds for a cluster: R replicas are no faster than one fluid machine of speed R.

``cluster_lower_bound(workload, cluster, objective)`` bounds ``latency`` (makespan),
``throughput`` (from above), the means ``ttft`` and ``e2e`` and their percentiles, overall or
per request tag, for **every** cluster policy — whatever it dispatches, gangs, suspends, migrates
or colocates — under the replicas' linear cost model.

**Work per request.** Take one line (a, b) of the non-attention model (b >= 0, a >= 0): every
batch any replica runs takes at least b·N plus its attention and per-request terms
(:mod:`infermax.costmodel.linear`; the biases are dropped). Charge each request what its own
tokens add: a fill of e tokens at least (b + prefill_token_s)·e + prefill_attn_s·e(e + 1)/2 +
request_s (causal pairs add up to e(e + 1)/2 over any chunking, and a request is in at least one
batch), each later token a decode over its context or a refill — the cheapest path of
:func:`~infermax.bounds.order.request_works` with no multipliers and no chunk cap.
A request spread over k replicas (sequence-parallel prefill: ring, Megatron-SP, Ulysses; KV- or
pipeline-parallel plans) pays per member the parallel model's slopes / k on the whole sequence
plus communication (:mod:`infermax.costmodel.parallel`), so its replica-seconds are at least the
same work: dividing compute k ways never removes any of it.

**Pipelines.** A replica of p stages (``spp``, executed, or ``pp``, priced) holds up to p batches at
once, each stage busy with a batch for its stage time, compute / p plus one hop: p stage-times are
at least the batch's latency in the replica's model (compute plus p − 1 hops), so such a replica
counts as p machines. KVP groups run one batch together, its attention the slowest group's (at
least the model's even split).

**Fluid machine.** Spread every batch's per-request charges over its duration: the cluster is
then a preemptive schedule on R unit-speed machines (R = replicas × stages) in which request i's work
w_i runs after its arrival and is done by its event (first token or completion); a request may
even run on several machines at once. One machine of speed R can follow any such schedule, and
on it preemptive SRPT with release dates completes at every instant at least as many jobs as any
schedule (Schrage 1968): the k-th smallest SRPT completion bounds the k-th smallest event time
from below. Flows (event − arrival), for percentiles: in a window of arrivals [lo, hi] the
requests with flow <= y have their work done within [lo, hi + y], at most R·(hi + y − lo) of it,
so the window's least works bound how many make it (:func:`~infermax.bounds.order.window_keys`).
A tag: the tagged requests alone (the others only take capacity).

**Sparse attention.** CSPS's CSA computes only the kept pairs of a prefill's causal mask; for policies
that drop tokens the attention term is scaled by the least kept share (:func:`attention_kept`), which
``infermax bound --cluster`` does when it compares such a policy.

What it leaves out — each batch's fixed time (a, the attention biases), the sequential decode
steps of a request, communication — only makes real schedules slower, so the bound is loose
where those dominate (decode-heavy work: the gap reported is then mostly the bound's). Values
are lowered by :data:`~infermax.bounds.SAFETY` like every other bound.
"""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np

from infermax.clock import on_relative_clock
from infermax.costmodel import get_cost_model, linear_coefficients

from .objectives import members, parse_objective, subset, trace_value
from .order import partitions, quantile_of_sorted, request_works, srpt_completions, window_keys
from .requests import cost_lines

#: a chunk cap no request reaches: the fill of a prompt counts as one batch (a gang's prefill is one)
_NO_CAP = SimpleNamespace(C=2 ** 62, P=2 ** 62)
_RING_SIZES = 4096        # ring sizes scanned exactly for CSA's least kept share
_METRICS = ("latency", "throughput", "ttft", "e2e", "completion")


def attention_kept(policies: Any) -> float:
    """The least share of the causal attention pairs any of ``policies`` (names) computes in a prefill:
    1 for exact attention; CSA's token dropping (CSPS, CSPS §3.2.4) keeps at least the least kept
    share of any of its rings (:func:`~infermax.costmodel.communication.csa_num_kept`, halves up, so a
    ring of 3 keys at a keep ratio of 0.75 keeps 2: the least share is taken over every ring size)."""
    from infermax.cluster.policies import get_policy
    from infermax.costmodel.communication import csa_keep_ratios, csa_num_kept

    least, sizes = 1.0, np.arange(1, _RING_SIZES + 1)
    for name in [policies] if isinstance(policies, str) else policies:
        variant = getattr(get_policy(name), "csps", None)
        if variant is None or variant.csa is None:
            continue
        levels, drop = variant.csa
        for keep in csa_keep_ratios(drop, levels):
            kept = np.array([csa_num_kept(int(n), keep) for n in sizes]) / sizes
            least = min(least, float(kept.min()), keep - 0.5 / _RING_SIZES)   # beyond: > keep - 0.5 / n
    return max(0.0, least)


# complexity: input checks, then one branch per objective and per window of the bound, as the docstring reads
def cluster_lower_bound(workload: Any, cluster: Any, objective: str = "ttft", cost: Any = None,
                        attention: float = 1.0):
    """A :class:`~infermax.bounds.Bound` on ``objective`` for ``workload`` on ``cluster`` (a
    :class:`~infermax.cluster.Cluster` or its spec), valid for every cluster policy that computes at least
    the share ``attention`` of the causal attention pairs of a prefill (module docstring): 1, the default,
    for exact attention; :func:`attention_kept` of the policies compared when one of them drops tokens (CSA).

    ``cost``: the replicas' batch-time model (default: the cluster's, ``Cluster.cost_model_name``);
    it must be linear. TPOT has no cluster bound (its per-step times are what this bound drops)."""
    from infermax.cluster import Cluster
    from infermax.types import Workload

    from . import SAFETY, Bound

    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    workload = on_relative_clock(workload)
    cluster = Cluster.from_spec(cluster)
    obj = parse_objective(objective)
    if obj.metric not in _METRICS:
        raise ValueError(f"objective {objective!r} has no cluster bound; use latency, throughput, ttft, e2e "
                         f"or their percentiles (optionally :TAG)")
    co = linear_coefficients(get_cost_model(cost if cost is not None else cluster.cost_model_name()),
                             "the cluster bound")
    if isinstance(attention, bool) or not isinstance(attention, (int, float)) or not 0 <= attention <= 1:
        raise ValueError(f"attention must be a share in [0, 1], got {attention!r}")
    if attention < 1:
        co = dataclasses.replace(co, prefill_attn_s=co.prefill_attn_s * attention)
    chosen = subset(workload, members(workload, obj.tag))
    stages = max(cluster.spp, cluster.plan.pp)
    R = float(cluster.num_replicas * stages)       # machines: a pipelined replica runs a batch per stage
    T = chosen.arrivals_s.astype(np.float64)
    event = "ttft" if obj.metric == "ttft" else "e2e"
    absolute = np.full(len(chosen), -np.inf)
    flow = np.zeros(len(chosen))
    offline = not np.ptp(T) > 0
    wins = [] if offline else partitions(T)
    for _, b in cost_lines(co, 2 ** 20):
        works = request_works(co, chosen, _NO_CAP, b, np.zeros(4))
        w = (works.first_s if event == "ttft" else works.total_s) / R      # on the machine of speed R
        absolute = np.maximum(absolute, srpt_completions(T, w))
        if offline:                                  # one window: all the work after the common arrival
            flow = np.maximum(flow, np.cumsum(np.sort(w)))
        for win in wins:
            flow = np.maximum(flow, window_keys(w, win))
    flow = np.maximum(flow, absolute - T.max())       # the k-th event, less the latest arrival
    if not obj.spec.taggable:                         # the whole schedule's: the makespan (throughput over it)
        value = float(absolute[-1] - T.min())
    elif obj.quantile is None:
        value = max(float(absolute.mean() - T.mean()), float(flow.mean()))
    else:
        value = quantile_of_sorted(np.sort(flow), obj.quantile)
    value -= SAFETY * abs(value)
    cert = {"replicas": cluster.num_replicas, "stages": stages, "num_requests": len(chosen),
            "attention": float(attention)}
    if obj.spec.via_makespan:
        value = float(chosen.output_lens.sum()) / value if value > 0 else float("inf")
    return Bound(value=value, method="cluster-fluid", objective=objective, certificate=cert,
                 values={"cluster-fluid": value})


def measured_value(objective: str, result: Any) -> float:
    """The value of ``objective`` in a :class:`~infermax.cluster.ClusterResult` (its merged trace)."""
    return trace_value(parse_objective(objective), result.trace)
