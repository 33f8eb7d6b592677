"""Run a Schedule on a real model: exactly its batches, evictions and refills, timed.

Each batch is *plan -> execute -> commit* (nano-vllm's step):

1. plan: drop the KV blocks of the batch's evicted requests; give every request
   of the batch its next ``c`` token ids (prompt and tokens generated so far, so
   a refill after an eviction recomputes them); reserve their blocks;
2. execute: one timed forward pass over the packed batch + greedy choice;
3. commit: ``m += c``; a request whose KV now covers all its tokens gains the
   chosen token; a request with ``O`` tokens frees its blocks.

The schedule is judged by :func:`infermax.replay` first, so an invalid schedule
raises its ``ScheduleError`` before any model is built. Wall time is
``time.perf_counter`` around step 2 only (inputs are prepared outside, as an
engine prepares them before launching the model); with ``repeats > 1`` the whole
schedule runs again on a fresh cache and each batch keeps ``stat`` (median or
min) of its runs. The measured timeline is the replayed clock with measured
durations: batches run back to back, and an online workload's idle gaps (a batch
that may not start before an arrival) are accounted for, not slept.
"""
from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import numpy as np

from infermax.costmodel.base import CostModel
from infermax.replay import replay
from infermax.trace import Trace
from infermax.types import Limits, Schedule, Workload

from .forward import Chunk, FusedLlama, pack, resolve_backend, run
from .model import DEFAULT_MODEL, build_model, check_device, prompt_tokens, torch_threads

STATS = ("median", "min", "mean")


@dataclass(frozen=True, kw_only=True, eq=False)
class ExecutionResult:
    """What running a schedule measured and produced.

    ``batch_times_s`` [num_batches]: wall seconds per batch (``stat`` over
    ``run_times_s`` [repeats, num_batches]). ``cpu_times_s``: the same for the
    thread's CPU time (``time.thread_time``), a diagnostic: wall well above CPU
    time means other processes took the core. ``tokens``: generated ids per
    request id; ``prompts``: the prompt ids. ``blocks_in_use``: KV blocks still
    held after the last batch (0 when every request freed its cache).
    """

    batch_times_s: np.ndarray
    run_times_s: np.ndarray
    cpu_times_s: np.ndarray
    tokens: Mapping[int, tuple[int, ...]]
    prompts: Mapping[int, tuple[int, ...]]
    num_blocks: int
    block_size: int
    blocks_in_use: int
    schedule: Schedule
    workload: Workload
    limits: Limits
    device: str
    backend: str
    num_threads: int | None
    model: Mapping[str, Any] = field(default_factory=dict)

    @property
    def num_batches(self) -> int:
        return int(self.batch_times_s.size)

    @property
    def busy_s(self) -> float:
        """Sum of measured batch times (s)."""
        return float(self.batch_times_s.sum())

    def measured_trace(self) -> Trace:
        """The schedule's Trace with measured batch durations (replayed clock, idle gaps included)."""
        return replay(self.schedule, self.workload, self.limits, _Measured(self.batch_times_s))

    def compare(self, predicted: Trace) -> dict[str, Any]:
        """Predicted (``predicted.duration_s``) vs measured batch times and latencies.

        Errors are fractions: batch-time absolute percentage errors (median, p90,
        mean, max), ``e2e_latency_error`` = |pred - meas| / meas of the makespan
        (last completion - first arrival), its signed version, and the mean APE of
        per-request end-to-end latency.
        """
        from infermax.costmodel.accuracy import error_stats
        from infermax.metrics import metrics

        pred_s = np.asarray(predicted.batches["duration_s"], dtype=np.float64)
        if pred_s.size != self.num_batches:
            raise ValueError(f"predicted trace has {pred_s.size} batches, the execution {self.num_batches}")
        measured = self.measured_trace()
        pm, mm = metrics(predicted), metrics(measured)
        batch = error_stats(pred_s, self.batch_times_s)
        e2e_pred = predicted.requests["completion_s"] - predicted.requests["arrival_s"]
        e2e_meas = measured.requests["completion_s"] - measured.requests["arrival_s"]
        latency_err = (pm["latency_s"] - mm["latency_s"]) / mm["latency_s"]
        return {"num_batches": self.num_batches,
                "batch_time_median_ape": batch["median_ape"], "batch_time_p90_ape": batch["p90_ape"],
                "batch_time_mean_ape": batch["mean_ape"], "batch_time_max_ape": batch["max_ape"],
                "predicted_latency_s": pm["latency_s"], "measured_latency_s": mm["latency_s"],
                "e2e_latency_error": abs(latency_err), "e2e_latency_signed_error": latency_err,
                "request_e2e_mean_ape": float(np.mean(np.abs(e2e_pred - e2e_meas) / e2e_meas)),
                "predicted_busy_s": pm["busy_s"], "measured_busy_s": mm["busy_s"]}


class _Measured(CostModel):
    """Plays back measured batch durations, one per ``batch_time`` call, in schedule order."""

    name = "measured"

    def __init__(self, durations_s: np.ndarray) -> None:
        self._durations = iter(np.asarray(durations_s, dtype=np.float64).tolist())

    def batch_time(self, tokens: np.ndarray, kv_before: np.ndarray, is_decode: np.ndarray) -> float:
        return next(self._durations)


class _Progress:
    """Per-request progress: all its tokens (prompt + generated), ``m`` cached, ``inp`` current input."""

    def __init__(self, prompts: Mapping[int, tuple[int, ...]], workload: Workload) -> None:
        self.seq = {rid: list(p) for rid, p in prompts.items()}
        self.m = dict.fromkeys(self.seq, 0)
        self.inp = {rid: len(p) for rid, p in prompts.items()}
        self.num_prompt = dict(self.inp)
        self.output_len = {int(r.id): r.output_len for r in workload.requests}

    def evict(self, rid: int, cache: Any) -> None:
        """Drop the KV: every token so far (generated ones too) becomes input to recompute."""
        cache.free(rid)
        self.m[rid] = 0
        self.inp[rid] = len(self.seq[rid])

    def chunk(self, rid: int, c: int) -> Chunk:
        m = self.m[rid]
        return Chunk(rid, tuple(self.seq[rid][m:m + c]), m, m >= self.inp[rid])

    def commit(self, chunk: Chunk, next_token: int, cache: Any) -> None:
        rid = chunk.request_id
        self.m[rid] += len(chunk.token_ids)
        seq = self.seq[rid]
        if self.m[rid] == len(seq):
            seq.append(next_token)
            if len(seq) - self.num_prompt[rid] == self.output_len[rid]:
                cache.free(rid)

    def generated(self) -> dict[int, tuple[int, ...]]:
        return {rid: tuple(s[self.num_prompt[rid]:]) for rid, s in self.seq.items()}


def _limits_of(schedule: Schedule, limits: "Limits | str | None") -> Limits:
    if isinstance(limits, Limits):
        return limits
    if isinstance(limits, str):
        return Limits.from_spec(limits)
    meta = schedule.meta.get("limits") if isinstance(schedule.meta, Mapping) else None
    return Limits(**meta) if meta else Limits()


@contextmanager
def _gc_paused():
    """No garbage-collector pauses inside the timed batches (as ``timeit`` does)."""
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def execute(schedule: Schedule, workload: "Workload | str", model: Any = None, device: str = "cpu",
            seed: int = 0, *, limits: "Limits | str | None" = None, backend: str = "auto",
            block_size: int = 16, num_blocks: int | None = None, num_threads: int | None = 1,
            repeats: int = 1, stat: str = "median", warmup: bool = True) -> ExecutionResult:
    """Run every batch of ``schedule`` on ``model`` and time it; see the module docstring.

    model: a LlamaModel (already on ``device``), a model-spec name (``"llama-tiny"``)
    or None (the default spec, weights from ``seed``). ``seed`` also seeds the
    prompts. limits: for validating the schedule (default: the schedule's meta,
    else ``Limits()``). backend: "auto" | "sdpa" | "triton" | "torch"
    (:mod:`.forward`). num_blocks: KV blocks of ``block_size`` tokens (default:
    enough for min(M, Σ(I+O)) tokens plus one partial block per request).
    num_threads: torch CPU threads while running (None: leave as is).
    """
    if isinstance(workload, str):
        workload = Workload.from_spec(workload)
    if stat not in STATS:
        raise ValueError(f"stat must be one of {STATS}, got {stat!r}")
    for name, value in (("repeats", repeats), ("block_size", block_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value!r}")
    limits = _limits_of(schedule, limits)
    replay(schedule, workload, limits)          # the judge rejects an invalid schedule before any model runs
    check_device(device)
    backend = resolve_backend(backend, device)
    import torch

    if model is None or isinstance(model, str):
        model = build_model(model or DEFAULT_MODEL, device, seed)
    prompts = prompt_tokens(workload, model.cfg.vocab_size, seed)
    if num_blocks is None:
        tokens_needed = min(limits.M, int((workload.input_lens + workload.output_lens).sum()))
        num_blocks = math.ceil(tokens_needed / block_size) + len(workload)
    max_positions = int((workload.input_lens + workload.output_lens).max())
    with torch_threads(num_threads if device == "cpu" else None), torch.inference_mode():
        fused = FusedLlama(model, max_positions) if backend == "sdpa" else None
        step = lambda cache, packed: run(model, cache, packed, backend, fused).tolist()
        if warmup:
            _warm_up(step, model, prompts[int(workload.ids[0])], block_size, device)
        wall, cpu, tokens, in_use = _run_repeats(repeats, schedule, workload, prompts, step,
                                                 lambda: model.new_kv_cache(num_blocks=num_blocks,
                                                                            block_size=block_size), device)
    summarise = getattr(np, stat)
    return ExecutionResult(batch_times_s=summarise(wall, axis=0), run_times_s=wall,
                           cpu_times_s=summarise(cpu, axis=0), tokens=tokens, prompts=prompts,
                           num_blocks=num_blocks, block_size=block_size, blocks_in_use=in_use, schedule=schedule,
                           workload=workload, limits=limits, device=device, backend=backend,
                           num_threads=num_threads, model=_describe(model))


def _describe(model: Any) -> dict[str, Any]:
    cfg = model.cfg
    return {"layers": cfg.num_layers, "hidden": cfg.hidden_size, "q_heads": cfg.num_q_heads,
            "kv_heads": cfg.num_kv_heads, "ffn": cfg.intermediate_size, "vocab": cfg.vocab_size,
            "seed": cfg.seed, "dtype": str(model.embed.weight.dtype).removeprefix("torch.")}


def _run_repeats(repeats: int, schedule: Schedule, workload: Workload, prompts: Mapping[int, tuple[int, ...]],
                 step: Callable[[Any, Any], list[int]], new_cache: Callable[[], Any], device: str
                 ) -> tuple[np.ndarray, np.ndarray, dict[int, tuple[int, ...]], int]:
    """Run the schedule ``repeats`` times, each on a fresh cache.

    Returns wall and CPU seconds [repeats, num_batches], the generated tokens
    (identical in every run, or RuntimeError) and the blocks still held after the last run.
    """
    wall, cpu, tokens, in_use = [], [], None, 0
    for _ in range(repeats):
        cache = new_cache()
        with _gc_paused():
            times, cpu_times, generated = _run_schedule(schedule, workload, prompts, step, cache, device)
        if tokens is not None and generated != tokens:
            raise RuntimeError("two runs of the same schedule generated different tokens")
        wall.append(times)
        cpu.append(cpu_times)
        tokens, in_use = generated, cache.k.shape[1] - cache.num_free_blocks   # k: [layers, blocks, ...]
    shape = (repeats, len(schedule))
    as_array = lambda runs: np.asarray(runs, dtype=np.float64).reshape(shape)
    return as_array(wall), as_array(cpu), tokens, in_use


def _run_schedule(schedule: Schedule, workload: Workload, prompts: Mapping[int, tuple[int, ...]],
                  step: Callable[[Any, Any], list[int]], cache: Any, device: str
                  ) -> tuple[list[float], list[float], dict[int, tuple[int, ...]]]:
    """One pass over the schedule on an empty cache: (wall and CPU seconds per batch, generated tokens).

    ``step(cache, packed)`` runs the forward pass and returns the next token ids
    as a list (so a CUDA step has finished when it returns).
    """
    progress = _Progress(prompts, workload)
    times, cpu_times = [], []
    for batch in schedule.batches:
        for rid in batch.evict.tolist():
            progress.evict(rid, cache)
        chunks = [progress.chunk(rid, c) for rid, c in zip(batch.ids.tolist(), batch.tokens.tolist())]
        packed = pack(chunks, cache, device)
        _synchronize(device)
        start, cpu_start = time.perf_counter(), time.thread_time()
        next_tokens = step(cache, packed)
        times.append(time.perf_counter() - start)
        cpu_times.append(time.thread_time() - cpu_start)
        for chunk, token in zip(chunks, next_tokens):
            progress.commit(chunk, token, cache)
    return times, cpu_times, progress.generated()


def _warm_up(step: Callable[[Any, Any], list[int]], model: Any, prompt: tuple[int, ...], block_size: int,
             device: str) -> None:
    """Untimed: one prefill and one decode step of a prompt on a scratch cache."""
    cache = model.new_kv_cache(num_blocks=math.ceil((len(prompt) + 1) / block_size), block_size=block_size)
    first = step(cache, pack([Chunk(-1, prompt, 0, False)], cache, device))[0]
    step(cache, pack([Chunk(-1, (first,), len(prompt), True)], cache, device))
