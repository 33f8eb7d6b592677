"""Executed parallel plans on a replica: TP × SPP × KVP (Medha 3D, Medha §3.3–3.5, Figs. 7, 8, 12).

A replica whose plan has ``spp > 1`` or ``kvp > 1`` keeps its
:class:`~infermax.state.ServingState` for every serving rule (admission, M, C, P,
chunk ≤ what is left, ...) and its local scheduler's batches, but its *timing* is
executed here instead of priced as one batch after another:

- **stages** (p = spp, or pp for the plain-pipeline ablation): every batch passes the p
  stages in order; stage q is busy with it for its stage time s (below), starting when
  the batch left stage q − 1 and stage q finished the batch before. A batch *enters*
  (starts stage 1) when stage 1 is free and its requests allow it: a decode (or the
  token after a prompt's last chunk) only after the request's previous batch left the
  last stage — decoding pays one pipeline pass per token; a prefill chunk, under SPP,
  as soon as the request's previous chunk left stage 1 (which stage 1's order already
  ensures: chunk j + 1 enters stage 1 while chunk j is in stage 2, Fig. 7b), under
  plain PP (``pipeline="pp"``) only after the previous chunk left the last stage.
  The state's clock is stage 1's: the next batch may enter when this one left stage 1;
  a request's tokens appear when its batch leaves the last stage (its first-token and
  completion times are set to that).
- **KVP groups** (:mod:`~infermax.cluster.kvp`): each request's KV is placed on groups;
  the batch's attention time is the slowest group's partial attention (the query is
  replicated; the linear layers and TP all-reduces run whole on every group), plus,
  per layer, the log-sum-exp merge of the queries whose KV spans several groups
  (:func:`~infermax.costmodel.parallel.kvp_merge_s` over as many ranks as the widest
  request spans).

The stage time comes from the same linear terms as the single-GPU schedulers'
(``nonattention_s``, ``decode_s``, ``prefill_s`` of the replica's cost model *without*
KVP: ``@tp=t,pp=p``, whose coefficients already hold TP's all-reduces and the p − 1
stage hops) split as :meth:`~infermax.costmodel.parallel.ParallelCostModel.stage_time`
does: (T − (p − 1)·hop)/p + hop, T the whole batch with the slowest group's attention
and the merge. At spp = kvp = 1 nothing here runs (the replica is the simulator's).

Departures, by design: batches pass the pipeline in the order the local scheduler made
them (no reordering to fill bubbles, and one batch stream: no interleaved micro-batches of
disjoint requests as in plain PP serving, Fig. 7a) — so a batch that carries a decode waits
for that decode's previous token, and a prompt's chunks batched with decodes no longer
overlap across stages (SPP's gain is the prefill-only batches'); a stage frees a finished request's KV when the
batch leaves stage 1 (each stage holds its own layers' KV); the fast-forward of
identical decode batches is off on these replicas (each batch's entry depends on its
requests' exits); the cluster policies that move KV between replicas (gangs,
disaggregation) do not run on executed plans.

Every batch's entry, stage intervals and per-group KV, and every KVP onboarding, is
recorded (:meth:`PlanExecutor.record`) for the judge (:mod:`~infermax.cluster.judge_plans`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from infermax.costmodel.communication import comm_model
from infermax.costmodel.parallel import ParallelCostModel, kvp_merge_s
from infermax.engine import ReplicaRunner, SchedulerStuckError
from infermax.types import Batch

from .kvp import ONBOARDING, KVLayout

PIPELINES = ("spp", "pp")
_NO_IDS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True, kw_only=True, slots=True)
class PlanOptions:
    """How a replica executes its plan. ``kvp_group_tokens``: Medha's per-group token limit of one
    request (None: the longest request's peak KV over the kvp groups, at most a group's capacity —
    the longest request spreads over every group, shorter ones onboard fewer)."""

    pipeline: str = "spp"
    onboarding: str = "dynamic"
    kvp_group_tokens: int | None = None
    max_kvp: int | None = None          # refuse a cluster whose kvp exceeds this (medha-2d: 1)

    def __post_init__(self) -> None:
        if self.pipeline not in PIPELINES:
            raise ValueError(f"PlanOptions.pipeline must be one of {PIPELINES}, got {self.pipeline!r}")
        if self.onboarding not in ONBOARDING:
            raise ValueError(f"PlanOptions.onboarding must be one of {ONBOARDING}, got {self.onboarding!r}")
        v = self.kvp_group_tokens
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1):
            raise ValueError(f"kvp_group_tokens must be an integer >= 1, got {v!r}")


#: the plan presets the cluster policies name (policies.py): Medha 3D, 2D and the ablations
PRESETS = {
    "3d": PlanOptions(),
    "2d": PlanOptions(max_kvp=1),
    "3d-static": PlanOptions(onboarding="static"),
    "3d-pp": PlanOptions(pipeline="pp"),
}


class StageTimer:
    """Stage time of a batch from the replica's cost terms, given each group's attention work."""

    def __init__(self, cluster: Any) -> None:
        from infermax.costmodel import get_cost_model
        plan = dataclasses.replace(cluster.cost_plan, kvp=1)
        base = cluster.cost_model_name().partition("@")[0]
        self.cost = get_cost_model(base if plan.is_single_gpu else f"{base}@{plan.to_text()}")
        # (one GPU per KVP group, tp = pp = 1: the replica's model prices no communication, the merge does)
        self.comm = self.cost.comm if isinstance(self.cost, ParallelCostModel) else comm_model(cluster.gpu.name)
        self.cluster, self.plan_kvp = cluster, cluster.cost_plan
        self.stages = plan.pp
        self.k = self.cost.coefficients
        m = cluster.model
        self._act_bytes = m.hidden_size * m.dtype_bytes
        self._intra = plan.num_gpus <= cluster.gpu.gpus_per_node
        self._merge: dict[tuple[int, int], float] = {}

    def hop_s(self, num_tokens: int) -> float:
        """One stage-to-stage send of the batch's activations (0 without stages)."""
        if self.stages == 1:
            return 0.0
        return float(self.comm.send_recv_s(num_tokens * self._act_bytes, intra_node=self._intra))

    def merge_s(self, num_tokens: int, span: int) -> float:
        """All layers' KVP merge of ``num_tokens`` queries over ``span`` groups."""
        if span <= 1 or num_tokens == 0:
            return 0.0
        key = (num_tokens, span)
        if key not in self._merge:
            c = self.cluster
            par = dataclasses.replace(self.plan_kvp, kvp=span)
            self._merge[key] = c.model.num_layers * kvp_merge_s(num_tokens, par, c.model, c.gpu, self.comm)
        return self._merge[key]

    def stage_s(self, num_tokens: int, num_requests: int, decode_kv: np.ndarray, prefill_work: np.ndarray,
                prefill_tokens: np.ndarray, merge_tokens: int, span: int) -> float:
        """Per group g: ``decode_kv[g]`` KV tokens read by decodes, ``prefill_work[g]`` causal pairs and
        ``prefill_tokens[g]`` query tokens of prefill chunks; ``merge_tokens`` queries merged over ``span``."""
        k = self.k
        attn = np.zeros(decode_kv.size)
        if decode_kv.any():
            attn += np.where(decode_kv > 0, k.decode_s(decode_kv), 0.0)
        if prefill_tokens.any():
            attn += np.where(prefill_tokens > 0, k.prefill_s(prefill_work, prefill_tokens), 0.0)
        whole = (float(k.nonattention_s(num_tokens)) + k.request_s * num_requests + float(attn.max())
                 + self.merge_s(merge_tokens, span))
        p = self.stages
        if p == 1:
            return whole
        hop = self.hop_s(num_tokens)
        return (whole - (p - 1) * hop) / p + hop


class _StageCost:
    """The replica state's cost model: the executor's stage time for the batch being applied. Otherwise —
    a scheduler's prediction (Medha's chunk sizing and slack) — the latency a batched decode pays, one
    whole pass through the stages, priced by the replica's own cost model (KV spread evenly over the
    KVP groups, the merge always paid: ``predict``)."""

    def __init__(self, timer: StageTimer, name: str, predict: Any) -> None:
        self.timer, self.name, self.pending, self.predict = timer, name, None, predict
        self.is_linear = False

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        if self.pending is not None:
            out, self.pending = self.pending, None
            return out
        return float(self.predict.batch_time(tokens, kv_before, is_decode))

    def decode_run_times(self, kv_before: np.ndarray, num_steps: int) -> np.ndarray:
        raise SchedulerStuckError("an executed plan never fast-forwards decode runs")

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "kind": "executed-plan", "stages": self.timer.stages,
                "group_cost": self.timer.cost.describe()}


class PlanExecutor:
    """One replica's pipeline stages and KVP groups: the dependencies, the timing and the records."""

    def __init__(self, cluster: Any, options: PlanOptions, timer: StageTimer, group_tokens: int,
                 num_requests: int) -> None:
        self.options, self.timer = options, timer
        self.p = timer.stages
        kvp = cluster.plan.kvp
        self.capacity = cluster.replica_kv_capacity_tokens // kvp
        self.layout = KVLayout(kvp, self.capacity, group_tokens, options.onboarding)
        self.cost = _StageCost(timer, f"plan:{cluster.cost_model_name()}", cluster.cost_model())
        self.free_s = np.zeros(self.p)                 # when each stage finishes its last batch
        self.exit_s = np.zeros(num_requests)           # when each request's last batch left the last stage
        self.entries: list[float] = []
        self.stage_starts: list[list[float]] = []
        self.stage_lens: list[float] = []
        self.group_kv: list[list[int]] = []
        self.onboards: list[tuple[int, int, int, int]] = []    # (batch, request index, group, position)

    def ready_s(self, idx: np.ndarray, is_decode: np.ndarray) -> float:
        """The earliest entry its requests allow (decodes, and chunks under plain PP, wait for their exits)."""
        wait = idx if self.options.pipeline == "pp" else idx[is_decode]
        return float(self.exit_s[wait].max()) if wait.size else 0.0

    def prepare(self, idx: np.ndarray, tokens: np.ndarray, m0: np.ndarray, is_decode: np.ndarray,
                evict: np.ndarray, batch: int) -> float:
        """Free the evicted requests' KV, place the batch's new tokens, and return its stage time."""
        lay = self.layout
        for i in evict.tolist():
            lay.free(i)
        k = lay.k
        dkv, work, ptok = np.zeros(k), np.zeros(k), np.zeros(k)
        merge_tokens, span = 0, 1
        before = len(lay.onboarded)
        for i, c, dec in zip(idx.tolist(), tokens.tolist(), is_decode.tolist()):
            read, pairs = lay.place(i, c, dec)
            if dec:
                dkv += read
            else:
                work += pairs
                ptok += np.where(pairs > 0, c, 0)
            s = lay.span(i)
            if s > 1:
                merge_tokens, span = merge_tokens + c, max(span, s)
        self.onboards += [(batch, i, g, pos) for i, g, pos in lay.onboarded[before:]]
        stage = self.timer.stage_s(int(tokens.sum()), int(idx.size), dkv, work, ptok, merge_tokens, span)
        self.cost.pending = stage
        return stage

    def commit(self, state: Any, idx: np.ndarray, start: float, stage: float, gen0: np.ndarray) -> float:
        """The batch entered at ``start``: run it through the stages; set its requests' token times to its exit."""
        starts, t = [], start
        for q in range(self.p):
            t = max(t, self.free_s[q]) if q else t
            starts.append(t)
            t += stage
            self.free_s[q] = t
        exit_s = t
        self.entries.append(start)
        self.stage_starts.append(starts)
        self.stage_lens.append(stage)
        self.exit_s[idx] = exit_s
        emitted = idx[state.gen[idx] > gen0]
        first = emitted[state.gen[emitted] == 1]
        state.first_token_s[first] = exit_s
        done = emitted[state.gen[emitted] == state.output_lens[emitted]]
        if done.size:
            state.completion_s[done] = exit_s
            for i in done.tolist():
                self.layout.free(i)
        self.group_kv.append(self.layout.kv.tolist())
        return exit_s

    def record(self, ids: np.ndarray) -> dict[str, Any]:
        """What the judge reads (the cluster schedule's ``plans`` entry of this replica)."""
        o = self.options
        return {"pipeline": o.pipeline, "onboarding": o.onboarding, "stages": self.p, "groups": self.layout.k,
                "group_tokens": self.layout.group_tokens, "group_capacity": self.capacity,
                "entry_s": list(self.entries), "stage_s": list(self.stage_lens),
                "stage_start_s": [list(s) for s in self.stage_starts], "group_kv": [list(g) for g in self.group_kv],
                "onboard": [[b, int(ids[i]), g, pos] for b, i, g, pos in self.onboards]}


class PlanRunner(ReplicaRunner):
    """A replica runner whose batches' timing is executed by a :class:`PlanExecutor` (module docstring)."""

    def __init__(self, state: Any, sched: Any, out: Any, recorder: Any, ids: np.ndarray,
                 executor: PlanExecutor) -> None:
        super().__init__(state, sched, out, recorder, ids, fast_forward=False)
        self.executor = executor

    def step(self, extra: Any = None) -> bool:
        if extra is not None:
            raise ValueError("a replica with an executed plan (spp or kvp > 1) takes no colocated gang work")
        state, ids, ex = self.state, self.ids, self.executor
        plan = self.sched.next_batch(state)
        if plan.idx.size == 0:
            if plan.evict.size:
                raise SchedulerStuckError(f"scheduler {self.sched.name!r} evicted requests but scheduled none "
                                          f"(batch {state.num_batches})")
            return False
        idx, tokens, evict = plan.idx, plan.tokens, plan.evict
        m0, inp0 = state.m[idx].copy(), state.inp[idx].copy()
        if evict.size:
            gone = np.isin(idx, evict)
            m0[gone] = 0
        is_decode = m0 >= inp0
        ready = ex.ready_s(idx, is_decode)
        not_before = max(self.not_before, ready) if ready > state.clock_s else self.not_before
        gen0 = state.gen[idx].copy()
        stage = ex.prepare(idx, tokens, m0, is_decode, evict, state.num_batches)
        start, duration, record = state.apply(idx, tokens, evict, not_before)
        ex.commit(state, idx, start, stage, gen0)
        self.out.add(Batch.trusted(ids[idx], tokens, ids[evict] if evict.size else _NO_IDS, not_before))
        self.recorder.add(start, duration, record)
        self.not_before = 0.0
        return True


def check_plan_holds(workload: Any, cluster: Any) -> None:
    """Every request's peak KV fits one replica of the plan (its KVP groups together); else a ValueError
    naming the request and the plan's degrees to raise."""
    peak = workload.input_lens + workload.output_lens - 1
    M = cluster.replica_kv_capacity_tokens
    if int(peak.max()) > M:
        i = int(np.argmax(peak))
        p = cluster.plan
        raise ValueError(f"request {int(workload.ids[i])} (input {int(workload.input_lens[i])}, output "
                         f"{int(workload.output_lens[i])}) needs {int(peak[i])} KV tokens, but a replica of the plan "
                         f"tp={p.tp}, spp={cluster.spp}, pp={p.pp}, kvp={p.kvp} on {cluster.gpu.name} holds M = {M} "
                         f"({M // p.kvp} per KVP group): raise spp or kvp (cluster {cluster.to_spec()})")


def plan_options(preset: str, kvp_group_tokens: int | None) -> PlanOptions:
    if preset not in PRESETS:
        raise ValueError(f"unknown plan preset {preset!r}; known: {', '.join(PRESETS)}")
    return dataclasses.replace(PRESETS[preset], kvp_group_tokens=kvp_group_tokens)


class Plans:
    """The executed plans of a cluster run: one :class:`PlanExecutor` per replica, built with it."""

    def __init__(self, cluster: Any, workload: Any, options: PlanOptions, roles: Any, policy: Any) -> None:
        kvp = cluster.plan.kvp
        if options.max_kvp is not None and kvp > options.max_kvp:
            raise ValueError(f"policy {policy.name!r} runs plans with kvp <= {options.max_kvp}, but the cluster "
                             f"{cluster.to_spec()} has kvp = {kvp}")
        if roles.on_gang.any() or policy.disaggregate:
            raise ValueError(f"policy {policy.name!r} moves KV between replicas (gangs or disaggregation); "
                             f"an executed plan (spp = {cluster.spp}, kvp = {kvp}) keeps every request on one "
                             f"replica: use fifo, priority or a medha-* policy")
        capacity = cluster.replica_kv_capacity_tokens // kvp
        peak = workload.input_lens + workload.output_lens - 1
        longest = int(peak.max()) if len(workload) else 1
        limit = options.kvp_group_tokens or min(capacity, -(-longest // kvp))
        if options.onboarding == "dynamic" and limit * kvp < longest and kvp > 1:
            i = int(np.argmax(peak))
            raise ValueError(f"request {int(workload.ids[i])} needs {longest} KV tokens but kvp_group_tokens = "
                             f"{limit} on each of kvp = {kvp} groups holds at most {limit * kvp}")
        self.cluster, self.workload, self.options, self.group_tokens = cluster, workload, options, limit
        self.timer = StageTimer(cluster)
        self.executors: dict[int, PlanExecutor] = {}

    def executor(self, r: int) -> PlanExecutor:
        ex = self.executors.get(r)
        if ex is None:
            ex = self.executors[r] = PlanExecutor(self.cluster, self.options, self.timer, self.group_tokens,
                                                  len(self.workload))
        return ex

    def runner(self, r: int, state: Any, sched: Any, out: Any, recorder: Any, ids: np.ndarray) -> PlanRunner:
        return PlanRunner(state, sched, out, recorder, ids, self.executor(r))

    def records(self, num_replicas: int) -> tuple[dict, ...]:
        ids = self.workload.ids
        return tuple(self.executors[r].record(ids) if r in self.executors else {} for r in range(num_replicas))
