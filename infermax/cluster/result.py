"""A cluster run's result: per-replica schedules, the merged trace and its metrics, and what the engine did.

The merged trace has every replica's batches and every gang step (one batch row per
member) in start order, and one row per request: its times from the replica that
served it (a migrated decode's completion from its decode replica; a long request's
from its gang), its evictions and suspensions summed over replicas. A one-replica
run without gangs is the simulator's own trace, unchanged (docs/design.md invariant 5).
Metrics add the p99 dispatch decision time and, per class, the p99 of decision time
over JCT (PecSched §6.6).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from infermax.engine import SchedulerStuckError
from infermax.metrics import metrics as compute_metrics
from infermax.metrics import metrics_by_tag
from infermax.trace import Trace, request_arrays
from infermax.types import Schedule

from .gang import Gang
from .spec import Cluster


@dataclass(frozen=True, eq=False)
class ClusterResult:
    """A cluster run: per-replica schedules, the merged trace, metrics, per-tag metrics, dispatches."""

    cluster: Cluster
    policy: str
    schedules: tuple[Schedule, ...]
    trace: Trace
    metrics: dict[str, Any]
    by_tag: dict[str, dict[str, float]]
    replica_of: np.ndarray          # request index -> replica it was dispatched to (a gang: its first member)
    dispatch_s: np.ndarray          # request index -> dispatch time
    replica_busy_s: np.ndarray      # per replica: seconds of batches and gang steps
    decision_s: np.ndarray = field(default_factory=lambda: np.zeros(0))   # per dispatch decision: CPU time
    decode_replica_of: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    gangs: tuple[Gang, ...] = ()
    migrations: tuple[dict, ...] = ()
    events: tuple[tuple[tuple, ...], ...] = ()      # per replica: (before_batch, time, kind, request, ...)
    options: dict = field(default_factory=dict)     # the engine's options (sp_replicas, decode_replicas, ...)
    plans: tuple[dict, ...] = ()                    # per replica: its executed plan's record (cluster/plans.py)

    @property
    def num_preemptions(self) -> int:
        """Suspension episodes of the long requests' gangs: a prefill paused at a kernel boundary or (/CoL) a
        decode step yielded; one episode lasts until the members have no short work left."""
        return int(sum(g.num_suspensions for g in self.gangs))

    @property
    def num_overtakes(self) -> int:
        """Preemptions the long requests experienced, counted per preempting request (PecSched Table 6):
        short requests sent to a gang's member while its prefill was unfinished (running, suspended or not
        yet started) or, without colocation (/CoL), during its decode. An episode holds one or more."""
        return int(sum(g.num_overtaken for g in self.gangs))

    @property
    def utilization(self) -> np.ndarray:
        """Busy share of each replica over the makespan."""
        span = self.metrics["latency_s"]
        return self.replica_busy_s / span if span > 0 else np.zeros_like(self.replica_busy_s)

    def cluster_schedule(self):
        """The run as a :class:`~infermax.cluster.schedule.ClusterSchedule` (JSON, replayable)."""
        from .schedule import ClusterSchedule
        return ClusterSchedule.from_result(self)


def assemble(engine: Any) -> ClusterResult:
    """The :class:`ClusterResult` of a finished :class:`~infermax.cluster.engine.ClusterEngine` run."""
    reps, gangs, disp = engine.replicas, engine.gangs, engine.dispatcher
    R = len(reps)
    built = sorted(reps.built)
    one = R == 1 and not gangs.gangs
    if one:
        merged = reps.runner(0).recorder.finish(reps.state(0))
        batches_of = {0: merged.batches}
    else:
        batches_of = {r: reps.runner(r).recorder.finish_batches() for r in built}
        merged = _merged_trace(engine, built, batches_of)
    busy = np.array([float(batches_of[r]["duration_s"].sum()) if r in batches_of else 0.0 for r in range(R)])
    busy += gangs.busy_s
    schedules = tuple(Schedule(tuple(reps.runner(r).out.batches) if reps.is_built(r) else (),
                               {"scheduler": reps.describe_scheduler(r), "replica": r, "workload": engine.workload.name,
                                "limits": engine.limits.to_dict(), "cost": engine.cost.describe()})
                      for r in range(R))
    out = compute_metrics(merged)
    out["scheduling_decision_p99_s"] = float(np.percentile(disp.decisions, 99)) if disp.decisions else 0.0
    if not one:
        out.update(_cluster_metrics(engine, merged))
    return ClusterResult(cluster=engine.cluster, policy=engine.policy, schedules=schedules, trace=merged,
                         metrics=out, by_tag=metrics_by_tag(merged), replica_of=disp.replica_of.copy(),
                         dispatch_s=disp.dispatch_s.copy(), replica_busy_s=busy,
                         decision_s=np.array(disp.decisions), decode_replica_of=engine.migrations.decode_of.copy(),
                         gangs=tuple(gangs.gangs), migrations=tuple(engine.migrations.records),
                         events=tuple(tuple(e) for e in reps.events), options=engine.options,
                         plans=engine.plans.records(R) if engine.plans is not None else ())


# complexity: one branch per source merged (replica batches, gang steps, requests) and per missing record
def _merged_trace(engine: Any, built: list[int], batches_of: dict[int, dict[str, np.ndarray]]) -> Trace:
    """Every replica's batches and gang steps in start order, and one row per request."""
    reps, replica_of, decode_of = engine.replicas, engine.dispatcher.replica_of, engine.migrations.decode_of
    mine_only = ~engine.roles.on_gang        # a long request one replica serves (sp_replicas = 1) is its own
    s0 = reps.state(0)
    times = {k: getattr(s0, k).copy() for k in ("first_scheduled_s", "first_token_s", "completion_s")}
    counts = {k: sum(getattr(reps.state(r), k) for r in built)
              for k in ("num_evictions", "refill_tokens", "num_suspensions")}
    for r in built:              # (a replica never built served no request)
        st = reps.state(r)
        mine = (replica_of == r) & mine_only
        for key, arr in times.items():
            arr[mine] = getattr(st, key)[mine]
        dec = decode_of == r
        times["completion_s"][dec] = st.completion_s[dec]
    for g in engine.gangs.gangs:
        i = g.request
        times["first_scheduled_s"][i] = g.first_scheduled_s
        times["first_token_s"][i] = g.first_token_s
        if not np.isnan(g.completion_s):       # (a gang that scaled down: its decode replica's)
            times["completion_s"][i] = g.completion_s
        counts["num_suspensions"][i] = g.num_suspensions
    unfinished = np.flatnonzero(~np.isfinite(times["completion_s"]))
    if (replica_of < 0).any() or unfinished.size:
        raise SchedulerStuckError(f"cluster: {unfinished.size} requests never finished (an engine bug)")
    requests = request_arrays(engine.workload, times["first_scheduled_s"], times["first_token_s"],
                              times["completion_s"], counts["num_evictions"], counts["refill_tokens"],
                              counts["num_suspensions"])
    parts = [batches_of[r] for r in built]
    parts += [rec.finish_batches() for _, rec in sorted(engine.gangs.recorders.items())]
    parts = [p for p in parts if p["start_s"].size] or parts[:1]
    order = np.argsort(np.concatenate([p["start_s"] for p in parts]), kind="stable")
    batches = {k: np.concatenate([p[k] for p in parts])[order] for k in parts[0]}
    return Trace(batches=batches, requests=requests, M=engine.limits.M * len(reps), cost_name=engine.cost.name)


def _cluster_metrics(engine: Any, merged: Trace) -> dict[str, Any]:
    """Preemptions, migrations, bytes over NVLink and the network, and the decision time / JCT per class."""
    gangs, mig, disp = engine.gangs.gangs, engine.migrations, engine.dispatcher
    sp_bytes = [_gang_bytes(engine, g) for g in gangs]
    out: dict[str, Any] = {"num_preemptions": int(sum(g.num_suspensions for g in gangs)),
                           "num_overtakes": int(sum(g.num_overtaken for g in gangs)),
                           "num_migrations": len(mig.records),
                           "nvlink_bytes": mig.link_bytes["nvlink"] + sum(b[0] for b in sp_bytes),
                           "network_bytes": mig.link_bytes["network"] + sum(b[1] for b in sp_bytes)}
    req = merged.requests
    jct = req["completion_s"] - req["arrival_s"]
    share = disp.decision_of / np.where(jct > 0, jct, np.inf)
    is_long = engine.roles.is_long
    for tag, sel in (("short", ~is_long), ("long", is_long)):
        if sel.any():
            out[f"decision_share_p99_{tag}"] = float(np.percentile(share[sel], 99))
    return out


def _gang_bytes(engine: Any, g: Gang) -> tuple[float, float]:
    from .fastsp import fast_sp_prefill
    if g.plan is not None:          # CSPS: its SP plan's bytes, the off-node share of each GPU's peers
        p = g.plan
        total = p.bytes_per_gpu * p.num_gpus
        off = (p.num_gpus - p.per_node) / (p.num_gpus - 1) if p.num_gpus > 1 else 0.0
        return total * (1 - off), total * off
    p = fast_sp_prefill(engine.cluster, g.input_len, g.members, ring_only=not engine.pol.fast_sp,
                        striped=engine.pol.striped)
    return p.nvlink_bytes, p.network_bytes
