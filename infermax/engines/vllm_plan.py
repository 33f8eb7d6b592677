"""vLLM executes an infermax plan step for step: a Scheduler subclass plugged in as ``scheduler_cls``.

:class:`PlanScheduler` is a ``vllm.v1.core.sched.scheduler.Scheduler`` whose ``schedule`` builds each
``SchedulerOutput`` from the plan's next batch (:mod:`.plans`) instead of from vLLM's own policy:

1. the batch's evictions are preempted first (vLLM's own preemption: the KV blocks freed, the request
   back in the waiting queue, to be refilled later with its prompt and the tokens it generated —
   infermax's recompute eviction);
2. each request of the batch gets exactly its tokens: a running request the KV blocks of
   ``computed + c`` tokens (``KVCacheManager.allocate_slots``), a waiting or preempted one is taken
   out of the queue, admitted into ``running`` and given the blocks of its chunk;
3. the output lists the new, resumed and running requests the way vLLM's model runner reads them
   (the scheduler's own helpers build the per-request data), and ``_update_after_schedule`` advances
   each request's computed tokens, as after vLLM's own step.

Without a plan (:meth:`PlanScheduler.clear_plan`) it *is* vLLM's scheduler (``super().schedule``),
so one engine runs vLLM's own schedule and infermax's plans in alternation. A step of the plan runs
only when its requests have been submitted (:meth:`PlanScheduler.ready`; :func:`.vllm_engine.drive`
waits for them); a plan the engine cannot follow (a block that cannot be allocated, a chunk longer
than what a request lacks) stops the run with the batch and request named — :func:`.plans.check_plan`
refuses such plans before the engine starts.

Device-neutral, like :mod:`.vllm_engine`. Only what infermax plans need is supported: no speculative
decoding, KV connector, LoRA, encoder inputs or pipeline parallelism (refused at construction).
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreEventType
from vllm.v1.request import RequestStatus

from ..schedule import Schedule
from ..types import Limits, Workload
from . import vllm_engine
from .fidelity import Comparison
from .plans import PlanStep, check_plan, executed_as_planned, missing, ready
from .records import Measurements, schedule_from_records
from .vllm_config import MODEL_SHAPES, engine_limits

log = logging.getLogger(__name__)


class PlanError(RuntimeError):
    """The engine cannot execute a plan's batch as written (the batch and the request named)."""


class PlanScheduler(Scheduler):
    """vLLM's scheduler made to run a given plan (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        unsupported = {"speculative decoding": self.num_spec_tokens > 0, "a KV connector": self.connector is not None,
                       "an encoder-cache connector": self.ec_connector is not None,
                       "LoRA": bool(self.lora_config), "pipeline parallelism": self.use_pp,
                       "async scheduling": bool(self.scheduler_config.async_scheduling)}
        refused = [k for k, v in unsupported.items() if v]
        if refused:
            raise ValueError(f"PlanScheduler executes infermax plans without {', '.join(refused)}: turn them off")
        self._plan: list[PlanStep] | None = None
        self._next = 0
        self._engine_id: dict[int, str] = {}

    # --- the plan -------------------------------------------------------------------------------------
    def load_plan(self, steps: Sequence[PlanStep]) -> None:
        """Run ``steps`` from the next call of ``schedule`` on (the engine must be idle)."""
        if self.running or len(self.waiting):
            raise PlanError("load_plan: the engine still has requests; load a plan only when it is idle")
        self._plan, self._next, self._engine_id = list(steps), 0, {}

    def clear_plan(self) -> None:
        """Back to vLLM's own scheduling."""
        self._plan, self._next, self._engine_id = None, 0, {}

    def submitted(self, request_id: int, engine_id: str) -> None:
        """Request ``request_id`` (infermax id) was submitted as ``engine_id``."""
        self._engine_id[int(request_id)] = engine_id

    @property
    def steps_done(self) -> int:
        return self._next

    def ready(self) -> bool:
        """Whether the next ``schedule`` call can run a step (vLLM's own policy always can)."""
        if self._plan is None:
            return True
        return self._next < len(self._plan) and ready(self._plan[self._next], self._engine_id)

    def waiting_for(self) -> str:
        if self._plan is None:
            return "nothing (vLLM's own scheduling)"
        if self._next >= len(self._plan):
            return f"nothing: all {len(self._plan)} batches of the plan ran, yet requests are unfinished"
        return f"plan batch {self._next} needs requests {missing(self._plan[self._next], self._engine_id)}"

    # --- vLLM's hook ----------------------------------------------------------------------------------
    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        if self._plan is None:
            return super().schedule(throttle_prefills)
        self.current_step += 1
        self.kv_cache_manager.new_step_starts()
        if not self.ready():                      # an empty step: the plan's batch waits
            return self._output([], [], [], {}, {})
        j, step = self._next, self._plan[self._next]
        now = time.monotonic()
        for i in step.evict:
            request = self._request(j, i)
            if request.status != RequestStatus.RUNNING:
                raise PlanError(f"plan batch {j}: evicts request {i}, which does not hold KV ({request.status.name})")
            self.running.remove(request)
            self._preempt_request(request, now)
        new, resumed, running, blocks, tokens = [], [], [], {}, {}
        for i, c in step.tokens.items():
            request = self._request(j, i)
            lacks = request.num_tokens_with_spec - request.num_computed_tokens
            if not 0 < c <= lacks:
                raise PlanError(f"plan batch {j}: request {i} gets {c} tokens but lacks {lacks}")
            rid = request.request_id
            if request.status == RequestStatus.RUNNING:
                got = self.kv_cache_manager.allocate_slots(request, c, num_lookahead_tokens=self.num_lookahead_tokens)
                running.append(request)
            elif request.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED):
                got = self.kv_cache_manager.allocate_slots(request, c, new_computed_blocks=
                                                           self.kv_cache_manager.empty_kv_cache_blocks,
                                                           num_lookahead_tokens=self.num_lookahead_tokens,
                                                           has_scheduled_reqs=bool(self.running))
                if got is not None:
                    self.waiting.remove_request(request)
                    self.running.append(request)
                    (new if request.status == RequestStatus.WAITING else resumed).append(request)
                    request.status = RequestStatus.RUNNING
                    if self.log_stats:
                        request.record_event(EngineCoreEventType.SCHEDULED, now)
                    got = self.kv_cache_manager.get_blocks(rid)
            else:
                raise PlanError(f"plan batch {j}: request {i} cannot be scheduled ({request.status.name})")
            if got is None:
                raise PlanError(f"plan batch {j}: vLLM cannot allocate the KV blocks of request {i} ({c} tokens "
                                f"after {request.num_computed_tokens}); "
                                f"{self.kv_cache_manager.block_pool.get_num_free_blocks()} blocks free")
            blocks[rid], tokens[rid] = got, c
        if len(self.running) > self.max_num_running_reqs:
            raise PlanError(f"plan batch {j}: {len(self.running)} running requests > max_num_seqs = "
                            f"{self.max_num_running_reqs} (R_max)")
        self._next += 1
        return self._output(new, resumed, running, blocks, tokens)

    def _request(self, j: int, i: int) -> Any:
        try:
            return self.requests[self._engine_id[i]]
        except KeyError:
            raise PlanError(f"plan batch {j}: request {i} is not in the engine "
                            "(never submitted, or finished)") from None

    def _output(self, new: list, resumed: list, running: list, blocks: dict, tokens: dict) -> SchedulerOutput:
        """The step's SchedulerOutput, built as vLLM's model runner reads it, then the scheduler's bookkeeping."""
        if self.use_v2_model_runner:
            new, resumed = new + resumed, []
            new_data = [NewRequestData.from_request(r, blocks[r.request_id].get_block_ids(), r._all_token_ids,
                                                    uses_mrope=self.model_uses_mrope) for r in new]
        else:
            new_data = [NewRequestData.from_request(r, blocks[r.request_id].get_block_ids(),
                                                    uses_mrope=self.model_uses_mrope) for r in new]
        cached = self._make_cached_request_data(running, resumed, tokens, {}, blocks)
        if not self.use_v2_model_runner:
            self.prev_step_scheduled_req_ids.clear()
            self.prev_step_scheduled_req_ids.update(tokens)
        copies, _ = self.kv_cache_manager.take_kv_cache_block_copies()
        if copies:
            raise PlanError("KV block copies are pending (prefix caching must be off to execute a plan)")
        total = int(sum(tokens.values()))
        out = SchedulerOutput(scheduled_new_reqs=new_data, scheduled_cached_reqs=cached, num_scheduled_tokens=tokens,
                              total_num_scheduled_tokens=total, scheduled_spec_decode_tokens={},
                              scheduled_encoder_inputs={}, preempted_req_ids=self.reset_preempted_req_ids,
                              finished_req_ids=self.finished_req_ids,
                              free_encoder_mm_hashes=self.encoder_cache_manager.get_freed_mm_hashes(),
                              new_block_ids_to_zero=self._get_new_block_ids_to_zero(),
                              num_spec_tokens_to_schedule=self.num_spec_tokens,
                              ec_manager_metadata=self.encoder_cache_manager.get_manager_metadata())
        if self.defer_block_free and total > 0:
            self.sched_step_seq += 1
        self._update_after_schedule(out)
        return out


SCHEDULER_CLS = f"{PlanScheduler.__module__}.{PlanScheduler.__qualname__}"


@dataclass
class ExecutedRun(vllm_engine.VllmRun):
    """A run of a plan (``plan``; None: vLLM's own scheduling) and how the recorded schedule compares with it."""

    plan: Schedule | None = None
    comparison: Comparison | None = None
    label: str = ""

    @property
    def as_planned(self) -> bool:
        c = self.comparison
        return c is not None and c.first_divergence is None and c.identical == len(self.plan)


def execute_plans(items: Sequence[tuple[str, Schedule | None, Workload]], limits: Limits, model: str = "llama-tiny",
                  *, cache_dir: "str | Path" = ".", seed: int = 0, online: bool | None = None,
                  **engine_options: Any) -> list[ExecutedRun]:
    """Run each ``(label, plan, workload)`` in turn on one vLLM engine under ``limits`` (``plan`` None: vLLM's own
    scheduler). Every plan is checked (:func:`.plans.check_plan`) before the engine starts."""
    if model not in MODEL_SHAPES and not Path(model).is_dir() and not model.startswith("llama:"):
        raise ValueError(f"--model {model!r} is neither a model directory nor a shape "
                         f"({', '.join(MODEL_SHAPES)}, llama:...)")
    steps = []
    for _label, plan, w in items:
        engine_limits(limits, w)
        steps.append(None if plan is None else check_plan(plan, w, limits))
    model_dir = vllm_engine.resolve_model(model, cache_dir)
    engine_options.setdefault("max_model_len", max(int((w.input_lens + w.output_lens).max()) for _, _, w in items))
    t0 = time.perf_counter()
    engine, config = vllm_engine.make_engine(limits, items[0][2], model_dir, seed=seed, scheduler_cls=SCHEDULER_CLS,
                                             **engine_options)
    startup = time.perf_counter() - t0
    sched = vllm_engine.engine_scheduler(engine)
    runs = []
    for (label, plan, w), plan_steps in zip(items, steps):
        sched.clear_plan() if plan_steps is None else sched.load_plan(plan_steps)
        recorder = vllm_engine.Recorder(engine)
        try:
            id_of, timings, wall = vllm_engine.drive(engine, w, recorder, online=online,
                                                     gate=None if plan is None else sched)
        finally:
            recorder.close()
        meta = {"producer": "vllm" if plan is None else f"vllm executing {plan.meta.get('producer', 'a plan')}",
                "label": label, "limits": limits.to_dict(), "model": model, "workload": w.name}
        recorded = schedule_from_records(recorder.records, id_of, meta)
        comparison = None if plan is None else executed_as_planned(recorded, plan)
        runs.append(ExecutedRun(recorded, Measurements(config, recorder.records, timings, wall, startup), w, limits,
                                plan, comparison, label))
        log.info("vllm: %s: %d steps, %.1f s%s", label, len(recorded), wall,
                 "" if comparison is None else f", {comparison.identical}/{len(plan)} batches as planned")
    sched.clear_plan()
    del engine
    return runs
