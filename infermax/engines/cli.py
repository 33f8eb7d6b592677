"""Command-line layer of infermax.engines: ``infermax vllm run`` and ``infermax vllm execute``.

    infermax vllm run --workload SPEC --limits M=640,C=256,R_max=16,block=32 [--model DIR|SHAPE]
                      --out DIR [--cost NAME] [--seed N] [--watermark F] [--json]
    infermax vllm execute --schedule DIR/schedule.json [--workload SPEC] [--limits SPEC] [--model DIR|SHAPE]
                          --out DIR [--json]

``execute`` makes vLLM run a given schedule (a plan: ``simulate --out``, ``solve --out``, ``vllm run``) step
for step (:mod:`.vllm_plan`); its workload and limits are those stored beside the schedule unless given. A
plan the engine cannot run is refused before the engine starts, naming the limit. It writes the same run
directory as ``run`` (the schedule vLLM executed, as recorded) and prints whether every batch ran as planned
(exit status 1 if not).

Runs the workload on vLLM (the ``vllm`` extra: ``pip install -e ".[vllm]"``), records its
scheduler's decisions and writes a run directory: schedule.json, workload.json, limits.json and
cost.json (so that ``infermax replay DIR/schedule.json`` and ``infermax bound --schedule
DIR/schedule.json`` judge it as any schedule) and measurements.json (step times, per-request
timings, the engine configuration). vLLM is imported only when the command runs.
"""
from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

__all__ = ["add_subcommands"]


def cmd_vllm_run(args: argparse.Namespace) -> int:
    from infermax.costmodel import get_cost_model
    from infermax.output import dumps_json, format_table
    from infermax.rundir import out_dir
    from infermax.types import Limits, Workload

    from .records import num_preemptions, write_engine_run

    workload = Workload.from_spec(args.workload)
    limits = Limits.from_spec(args.limits)
    cost = get_cost_model(args.cost)
    out = out_dir(args.out)
    run = _engine_module("vllm_engine").run_vllm(workload, limits, args.model, cache_dir=Path(args.model_cache or out),
                                                 seed=args.seed, watermark=args.watermark)
    write_engine_run(out, run.schedule, workload, limits, run.measurements, cost)
    m = run.measurements
    row = {"steps": len(run.schedule), "preemptions": num_preemptions(m.records), "wall_s": m.wall_s,
           "startup_s": m.startup_s, "out": str(out)}
    if args.json:
        print(dumps_json({**row, "engine": m.engine}))
    else:
        print(f"vLLM {m.engine.get('vllm_version')} on {args.model}: {len(workload)} requests, limits "
              f"{json.dumps(limits.to_dict())}")
        print(format_table([row], list(row)))
        print(f"judge it: infermax replay {out / 'schedule.json'}")
    return 0


def _engine_module(name: str):
    try:
        return importlib.import_module(f"infermax.engines.{name}")
    except ImportError as exc:
        raise ImportError(f"infermax vllm needs the vllm extra (pip install -e \".[vllm]\"): {exc}") from None


def cmd_vllm_execute(args: argparse.Namespace) -> int:
    from infermax.output import dumps_json, format_table
    from infermax.rundir import load_schedule, out_dir, schedule_inputs

    from .plans import check_plan
    from .records import num_preemptions, write_engine_run

    plan = load_schedule(args.schedule)
    workload, limits, cost, judged, notes = schedule_inputs(args.schedule, plan, args.workload, args.limits, None)
    check_plan(plan, workload, limits)           # refused here, before vLLM is imported
    out = out_dir(args.out)
    run, = _engine_module("vllm_plan").execute_plans([("plan", plan, workload)], limits, args.model,
                                                     cache_dir=Path(args.model_cache or out), seed=args.seed)
    write_engine_run(out, run.schedule, workload, limits, run.measurements, cost)
    plan.to_json(out / "plan.json")
    c, m = run.comparison, run.measurements
    row = {"plan_batches": len(plan), "executed_batches": len(run.schedule), "identical": c.identical,
           "as_planned": run.as_planned, "preemptions": num_preemptions(m.records), "wall_s": m.wall_s,
           "cpu_s": sum(r.cpu_s for r in m.records), "out": str(out)}
    if args.json:
        print(dumps_json({**row, "first_divergence": c.divergence_text(), "notes": notes}))
    else:
        for note in notes:
            print(f"note: {note}")
        print(f"vLLM {m.engine.get('vllm_version')} executed {args.schedule} on {args.model}: "
              f"{len(workload)} requests, limits {json.dumps(limits.to_dict())}")
        print(format_table([row], list(row)))
        print("every batch ran as planned" if run.as_planned else f"NOT as planned: {c.divergence_text()}")
    return 0 if run.as_planned else 1


def add_subcommands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vllm", help="run a workload on the real vLLM engine and record its schedule")
    vsub = p.add_subparsers(dest="vllm_command", required=True)
    r = vsub.add_parser("run", help="run a workload on vLLM; write schedule, workload, limits and measurements")
    r.add_argument("--workload", required=True, help="workload spec or workload.json")
    r.add_argument("--limits", required=True, help="e.g. M=640,C=256,R_max=16,block=32 (P = C: vLLM has one "
                   "token budget; block: the KV block size, a multiple of 32 on the CPU build)")
    r.add_argument("--model", default="llama-tiny", help="a model directory, or a random-weight shape built "
                   "locally: llama-tiny, llama-small, llama:hidden=H,layers=L,heads=A,kv_heads=K,ff=F,vocab=V "
                   "(default llama-tiny)")
    r.add_argument("--model-cache", help="where random-weight models are built (default: --out)")
    r.add_argument("--out", required=True, help="the run directory to write")
    r.add_argument("--cost", default=None, help="cost model stored with the schedule for replay (default: the "
                   "default model; measured times are in measurements.json)")
    r.add_argument("--seed", type=int, default=0, help="engine seed (default 0)")
    r.add_argument("--watermark", type=float, default=0.0, help="vLLM's admission watermark (default 0, vLLM's)")
    r.add_argument("--json", action="store_true")
    r.set_defaults(func=cmd_vllm_run)
    x = vsub.add_parser("execute", help="make vLLM execute a schedule step for step; record what it ran")
    x.add_argument("--schedule", required=True, help="the plan: a schedule.json (its workload.json and limits.json "
                   "beside it are used unless --workload / --limits are given)")
    x.add_argument("--workload", help="workload spec or workload.json (default: stored with the schedule)")
    x.add_argument("--limits", help="e.g. M=640,C=256,R_max=16,block=32 (default: stored with the schedule); P = C "
                   "and block > 1, as for run")
    x.add_argument("--model", default="llama-tiny", help="a model directory or a random-weight shape (default "
                   "llama-tiny)")
    x.add_argument("--model-cache", help="where random-weight models are built (default: --out)")
    x.add_argument("--out", required=True, help="the run directory to write (plan.json beside what vLLM ran)")
    x.add_argument("--seed", type=int, default=0, help="engine seed (default 0)")
    x.add_argument("--json", action="store_true")
    x.set_defaults(func=cmd_vllm_execute)
