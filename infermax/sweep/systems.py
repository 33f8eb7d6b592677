"""Sweep cells that run a whole serving *system* on a cluster (:mod:`infermax.cluster`).

A system is a cluster spec, a cluster policy and the scheduler every replica runs
(plus, optionally, the engine's options, limits and a cost model). In a sweep
config each ``systems`` item is one such block; the cells are workloads × systems
(the grid of :mod:`infermax.sweep.config` runs beside them)::

    systems:
      - name: loongserve                               # the label in the policy column
        cluster: "a100:nodes=2,model=llama3-8b,tp=2"
        policy: loongserve                             # a cluster policy (default fifo)
        scheduler: sarathi-pc                          # every replica's scheduler
        options: {decode_replicas: 2}                  # ClusterEngine options (optional)
        window_s: 3600                                 # measure over the first hour only (optional)
      - {name: sarathi, cluster: "a100:nodes=2,model=llama3-8b,tp=8,pp=2", scheduler: sarathi}

Limits: M is the cluster's (each replica's KV capacity); ``limits`` (optional, without
M) sets the rest, else C and P cover the longest prompt one replica serves. The row
holds the run's metrics, the same metrics per request tag with the tag as suffix
(``ttft_p50_s_long``, ``tpot_p50_s_short``, ...), and ``system``, ``cluster``,
``cluster_policy``, ``num_replicas``, ``cpu_s`` (the cell's CPU time). With ``window_s`` the run stops at that time and
the metrics are the window's (:mod:`infermax.cluster.window`: TTFT percentiles with
requests not served by then as +∞, TPOT over those completed, ``served_fraction``).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

SYSTEM_KEYS = ("name", "cluster", "policy", "scheduler", "options", "limits", "cost", "window_s")
ENGINE_OPTIONS = ("sp_replicas", "decode_replicas", "colocate_tokens", "long_tag", "fast_forward",
                  "reserved_replicas")


# complexity: one check per key of a system block, each naming the key and value
def canonical_system(block: Any) -> dict[str, Any]:
    """A system block checked (a ``ValueError`` naming the key and value) and completed with its defaults."""
    from infermax.cluster import Cluster, get_policy
    from infermax.schedulers import get_scheduler

    if not isinstance(block, Mapping):
        raise ValueError(f"sweep config: each systems item must be a mapping with cluster and scheduler, "
                         f"got {block!r}")
    unknown = sorted(set(block) - set(SYSTEM_KEYS))
    if unknown:
        raise ValueError(f"sweep config: system {block.get('name', '?')!r} has unknown key(s) {unknown}; "
                         f"known: {', '.join(SYSTEM_KEYS)}")
    for key in ("cluster", "scheduler"):
        if not isinstance(block.get(key), str) or not block[key].strip():
            raise ValueError(f"sweep config: system {block.get('name', '?')!r} needs {key} (a spec string), "
                             f"got {block.get(key)!r}")
    cluster = Cluster.from_spec(block["cluster"])
    policy = get_policy(block.get("policy", "fifo")).name
    get_scheduler(block["scheduler"])
    options = block.get("options") or {}
    if not isinstance(options, Mapping) or set(options) - set(ENGINE_OPTIONS):
        raise ValueError(f"sweep config: system {block.get('name', '?')!r}: options must be a mapping of "
                         f"{', '.join(ENGINE_OPTIONS)}, got {options!r}")
    limits = block.get("limits")
    if limits is not None:
        from ..types import Limits
        if not isinstance(limits, str) or any(p.split("=")[0].strip() == "M" for p in limits.split(",")):
            raise ValueError(f"sweep config: system {block.get('name', '?')!r}: limits must be a spec string "
                             f"without M (M is the cluster's), got {limits!r}")
        Limits.from_spec(limits)
    window = block.get("window_s")
    if window is not None and (isinstance(window, bool) or not isinstance(window, (int, float))
                               or not 0 < window < float("inf")):
        raise ValueError(f"sweep config: system {block.get('name', '?')!r}: window_s must be a finite number > 0 "
                         f"(seconds), got {window!r}")
    name = block.get("name") or f"{policy}/{block['scheduler']}"
    out = {"name": str(name), "cluster": cluster.to_spec(), "policy": policy, "scheduler": block["scheduler"],
           "options": dict(options), "limits": limits, "cost": block.get("cost")}
    return out | ({"window_s": float(window)} if window is not None else {})


def system_columns(system_json: str) -> dict[str, Any]:
    """The config columns of a system cell."""
    s = json.loads(system_json)
    return {"system": s["name"], "cluster": s["cluster"], "cluster_policy": s["policy"]}


def run_system(workload: str, system_json: str) -> dict[str, Any]:
    """Simulate ``workload`` on the system; its metrics, per-tag metrics (suffixed by the tag) and size."""
    import time

    from infermax.cluster import Cluster, ClusterEngine
    from infermax.types import Workload

    cpu0 = time.process_time()
    s = json.loads(system_json)
    cluster = Cluster.from_spec(s["cluster"])
    engine = ClusterEngine(Workload.from_spec(workload), cluster, s["policy"], s["scheduler"], s["limits"], s["cost"],
                           **s["options"])
    res = engine.run(until_s=s.get("window_s", float("inf")))
    row = dict(res.metrics)
    for tag, values in sorted(res.by_tag.items()):
        row |= {f"{k}_{tag}": v for k, v in values.items()}
    row["num_replicas"] = cluster.num_replicas
    row["cpu_s"] = time.process_time() - cpu0          # (this cell's CPU time, whichever process ran it)
    return row
