"""Step 4 of ``gpu_validation.py``: run vLLM's, Sarathi's and the solver-optimal schedule on the model.

The workload, its limits and its optimal schedule come from ``benchmarks/data/
gpu_validation_schedule.json``, solved beforehand by ``benchmarks/gpuval_make_schedule.py``
(the GPU machine has no MILP solver); the schedule is optimal under the cost model named in
that file, and here it is re-priced (``infermax.replay``) under the cost model fitted to step 3's
profile, as vLLM's and Sarathi's are simulated under it. If step 3 left no profile the file's
cost model prices all three, and the record says so.

Each schedule runs ``repeats`` times on a random-weight model of step 3's shape and dtype
(``backend="sdpa"``, the forward pass the profiler times); per batch the median (CPU: min) is
compared with the prediction, per batch and end to end. Sarathi's schedule (mixed batches)
also runs once through the paged Triton kernels (``backend="triton"``). Tokens: the
generated tokens of every request against a single-request greedy decode of its prompt
(dense attention, no cache): ``tokens_identical`` counts exact matches; ``tokens_consistent``
checks every generated token against the reference's logits on the same prefix (teacher
forcing): its logit is within ``GAP_TOL[dtype]`` of the best one. In half precision two
correct computations may break a near-tie differently, after which free-running decodes
differ; a wrong token misses the best logit by several units (logits are about N(0, 1)).
"""
from __future__ import annotations

import dataclasses
import json
import time
from typing import Any

import numpy as np
from gpuval_common import Ctx, device_info
from gpuval_profile import _label, model_name, profile_folder

SCHEDULE_FILE = "benchmarks/data/gpu_validation_schedule.json"
GAP_TOL = {"float32": 1e-3, "float16": 0.1, "bfloat16": 0.25}


def load_schedule(ctx: Ctx) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(workload, limits, optimal schedule, the file's data) from SCHEDULE_FILE."""
    from infermax.types import Limits, Schedule, Workload

    data = json.loads((ctx.repo / SCHEDULE_FILE).read_text())["instances"]["tiny" if ctx.tiny else "full"]
    return Workload.from_dict(data["workload"]), Limits.from_spec(data["limits"]), \
        Schedule.from_dict(data["schedule"]), data


def _cost_model(ctx: Ctx, data: dict[str, Any]) -> tuple[Any, str]:
    from infermax.costmodel import get_cost_model
    from infermax.execute.validation import fit_cost_model

    folder = profile_folder(ctx)
    if (folder / "mlp.csv").exists() and (folder / "attention.csv").exists():
        return fit_cost_model(folder, model_name(ctx), "median" if ctx.cuda else "min"), f"fitted to {folder}"
    return get_cost_model(data["cost_model"]), f"FALLBACK: no profile from step 3; {data['cost_model']}"


def run(ctx: Ctx) -> dict[str, Any]:
    import infermax
    from infermax.execute import build_model, prompt_tokens, reference_tokens

    ctx.record("device", **device_info(ctx.device))
    workload, limits, optimal, data = load_schedule(ctx)
    cost, source = _cost_model(ctx, data)
    ctx.record("inputs", workload=data["workload_spec"], limits=limits.to_dict(), cost=cost.describe(),
               cost_source=source, solver=data["solver"], solved_under=data["cost_model"])
    best = "optimal" if data["solver"]["status"] == "optimal" else f"solver-{data['solver']['status']}"
    schedules = {"vllm": infermax.simulate(workload, "vllm", limits, cost).schedule,
                 "sarathi": infermax.simulate(workload, "sarathi", limits, cost).schedule, best: optimal}
    predicted = {name: infermax.replay(s, workload, limits, cost) for name, s in schedules.items()}
    start = time.perf_counter()
    model = build_model(model_name(ctx), ctx.device, seed=0, dtype=ctx.dtype)
    prompts = prompt_tokens(workload, model.cfg.vocab_size, 0)
    threads = 1 if ctx.device == "cpu" else None
    reference = reference_tokens(model, prompts, workload, threads)
    ctx.record("reference", model=_label(model_name(ctx)), dtype=ctx.dtype,
               seconds=round(time.perf_counter() - start, 2))
    checks: dict = {}
    results = []
    runs = [(name, "sdpa") for name in schedules] + [("sarathi", "triton")]
    for name, backend in runs:
        if ctx.time_left() < 0:
            ctx.record("skipped", scheduler=name, backend=backend, reason="step budget spent")
            continue
        results.append(_run_one(ctx, name, backend, schedules[name], predicted[name], workload, limits, model,
                                prompts, reference, checks))
    try:
        _plot(ctx, [r for r in results if r[1] == "sdpa"])
    except Exception as exc:              # noqa: BLE001 - the numbers are recorded already
        ctx.record("plot_error", error=repr(exc))
    rows = [r[0] for r in results]
    return {"runs": len(rows), "tokens_identical": all(r["tokens_identical"] for r in rows) and bool(rows),
            "tokens_consistent": all(r["tokens_consistent"] for r in rows) and bool(rows),
            "worst_e2e_latency_error": max((r["e2e_latency_error"] for r in rows), default=None),
            "cost_source": source}


def _run_one(ctx, name, backend, schedule, predicted, workload, limits, model, prompts, reference, checks):
    from infermax.execute import execute

    repeats = (1 if ctx.tiny else 5) if backend == "sdpa" else 1
    start = time.perf_counter()
    run = execute(schedule, workload, model, ctx.device, 0, limits=limits, backend=backend, repeats=repeats,
                  stat="median" if ctx.cuda else "min", num_threads=1 if ctx.device == "cpu" else None,
                  warmup=ctx.cuda or backend != "triton")          # the interpreter has nothing to warm up
    row = {"scheduler": name, "backend": backend, "repeats": repeats, **run.compare(predicted),
           **_token_check(ctx, model, prompts, dict(run.tokens), reference, checks),
           "blocks_in_use": run.blocks_in_use, "seconds": round(time.perf_counter() - start, 2),
           "predicted_batch_s": predicted.batches["duration_s"].tolist(),
           "measured_batch_s": run.batch_times_s.tolist()}
    ctx.record("schedule", **row)
    return row, backend, run, predicted


def _token_check(ctx: Ctx, model, prompts, tokens, reference, cache: dict) -> dict[str, Any]:
    """Exact matches with the reference decode, and the teacher-forced logit gap of every generated token."""
    import torch

    gaps = []
    with torch.inference_mode():
        for rid, generated in tokens.items():
            key = (rid, generated)
            if key not in cache:
                prompt = list(prompts[rid])
                seq = torch.tensor(prompt + list(generated[:-1]), dtype=torch.long, device=ctx.device)
                logits = model.forward_dense(seq)[len(prompt) - 1:].float()
                chosen = logits.gather(1, torch.tensor(generated, device=ctx.device)[:, None]).squeeze(1)
                cache[key] = float((logits.max(dim=1).values - chosen).max())
            gaps.append(cache[key])
    same = sum(tokens[rid] == reference[rid] for rid in tokens)
    return {"requests": len(tokens), "tokens_identical_requests": int(same), "tokens_identical": same == len(tokens),
            "max_logit_gap": max(gaps), "gap_tol": GAP_TOL[ctx.dtype],
            "tokens_consistent": max(gaps) <= GAP_TOL[ctx.dtype]}


def _plot(ctx: Ctx, results: list) -> None:
    """execute.png: predicted vs measured batch times and timelines (infermax.execute.validation's plot)."""
    from infermax.execute.validation import SchedulerValidation, ValidationReport, plot_validation

    if not results:
        return
    items = []
    for row, _, run, predicted in results:
        b = predicted.batches
        items.append(SchedulerValidation(
            scheduler=row["scheduler"], tokens_identical=row["tokens_identical"], blocks_in_use=run.blocks_in_use,
            num_evictions=int(predicted.requests["num_evictions"].sum()), comparison=_comparison(run, predicted),
            predicted_s=np.asarray(b["duration_s"]), measured_s=run.batch_times_s,
            predicted_start_s=np.asarray(b["start_s"]), measured_start_s=run.measured_trace().batches["start_s"],
            cpu_s=run.cpu_times_s))
    report = ValidationReport(workload=results[0][2].workload.name, limits=results[0][2].limits.to_dict(),
                              device=ctx.device, model=_label(model_name(ctx)), profile=str(profile_folder(ctx)),
                              stat="median" if ctx.cuda else "min", repeats=results[0][0]["repeats"], cost={},
                              results=tuple(items))
    plot_validation(report, ctx.out / "execute.png")


def _comparison(run: Any, predicted: Any) -> dict[str, Any]:
    """``run.compare(predicted)`` plus the same errors against the batches' CPU time (the plot's summary reads them)."""
    out = run.compare(predicted)
    cpu = dataclasses.replace(run, batch_times_s=run.cpu_times_s).compare(predicted)
    out.update({f"cpu_time_{key}": cpu[key] for key in ("e2e_latency_error", "e2e_latency_signed_error",
                                                         "batch_time_median_ape", "batch_time_p90_ape")})
    return out


def format_records(records: list[dict]) -> list[str]:
    lines = []
    for r in records:
        if r["kind"] == "inputs":
            lines += [f"workload {r['workload']}, limits {r['limits']}; optimal schedule solved under "
                      f"{r['solved_under']} ({r['solver']['status']}, {r['solver']['backend']}); predictions: "
                      f"{r['cost_source']}",
                      f"{'scheduler':<10}{'backend':<8}{'batches':>8}{'pred_e2e_s':>11}{'meas_e2e_s':>11}"
                      f"{'e2e_err':>9}{'batch_med':>10}{'batch_p90':>10}  tokens identical / consistent (max gap)"]
        elif r["kind"] == "schedule":
            lines.append(f"{r['scheduler']:<10}{r['backend']:<8}{r['num_batches']:>8}{r['predicted_latency_s']:>11.4f}"
                         f"{r['measured_latency_s']:>11.4f}{r['e2e_latency_signed_error']:>+9.1%}"
                         f"{r['batch_time_median_ape']:>10.1%}{r['batch_time_p90_ape']:>10.1%}  "
                         f"{r['tokens_identical_requests']}/{r['requests']} / "
                         f"{'yes' if r['tokens_consistent'] else 'NO'} ({r['max_logit_gap']:.3g} <= {r['gap_tol']})")
        elif r["kind"] == "skipped":
            lines.append(f"{r['scheduler']:<10}{r['backend']:<8}skipped: {r['reason']}")
    return lines
