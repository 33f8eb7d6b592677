"""One prepared GPU validation run: kernels correct, kernels fast, profile -> fit, execute.

    pip install --no-deps --no-build-isolation -e . && python benchmarks/gpu_validation.py --out $OUT
    python benchmarks/gpu_validation.py --device cpu --tiny --out /tmp/gv    # the CPU dry run (same code)

Four steps, each in its own forked process under its own time budget (seconds, scaled by
``--budget-scale``): the step checks a soft deadline (85 % of its budget) between sub-cases and
records every finished sub-case at once; at its budget it is killed, and what it recorded is
kept. A failing or killed step does not stop the next one.

1. ``kernels_correct``: every Triton kernel of infermax.kernels against its PyTorch reference
   at Llama-3-8B attention shapes, contexts 1K-128K, batches 1-64 (gpuval_kernels.py).
2. ``kernels_fast``: the same kernels timed beside SDPA (flash backend) and the physical limit.
3. ``profile_fit``: the profiler on a random-weight Llama-3-8B, the linear fit, held-out error,
   beside the same table for Vidur's A100 profile (gpuval_profile.py).
4. ``execute``: vLLM, Sarathi and the solver-optimal schedule of a small workload run on that
   model: predicted vs measured batch and end-to-end time, tokens vs a reference decode
   (gpuval_execute.py; the optimal schedule was solved beforehand: benchmarks/data/).

Writes ``<out>/gpu_validation.json`` (everything, per step: status, records, summary, log tail),
``<out>/summary.txt`` (the table printed at the end) and a few PNGs, at most 8 files in all.
``--tiny`` shrinks every shape (and the model to llama-tiny) so that the whole run takes
seconds on a CPU with ``TRITON_INTERPRET=1`` (set here); it is the same code. Nothing on the
GPU machine may be missing: the packages it has are checked first, and a missing one stops the
run before any step, with its name. Exit status: 0 all steps ok, 1 some step not ok, 2 no start.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import io
import json
import multiprocessing
import os
import resource
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

#: (module, what needs it): all on the GPU machine; nothing else may be imported (no solvers there)
NEEDED = (("numpy", "every step"), ("pandas", "infermax traces"), ("scipy", "the cost-model fit"),
          ("matplotlib", "the PNGs"), ("torch", "every step"), ("triton", "the kernels"),
          ("infermax", "every step: pip install --no-deps --no-build-isolation -e ."))
BUDGETS_S = {"kernels_correct": 100.0, "kernels_fast": 70.0, "profile_fit": 130.0, "execute": 120.0}
SOFT_DEADLINE = 0.85


def missing_packages() -> list[str]:
    """'name (needed for ...)' for every package of NEEDED that is not installed (found, not imported)."""
    missing = []
    for name, why in NEEDED:
        try:
            found = importlib.util.find_spec(name) is not None
        except ImportError as exc:               # a finder that refuses the name
            found, why = False, f"{why}; {exc}"
        if not found:
            missing.append(f"{name} (needed for {why})")
    return missing


#: imported once before the steps fork, so that no step pays for them (torch's attention bias imports dynamo)
PRELOAD = ("torch.nn.attention.bias", "infermax.kernels.csa", "infermax.kernels.decode_attention",
           "infermax.kernels.llama", "infermax.costmodel.accuracy", "infermax.costmodel.cli",
           "infermax.costmodel.profiler", "infermax.execute.validation", "matplotlib.pyplot")


def _preload() -> None:
    """Import PRELOAD and draw one figure (fonts, backend), so that the forked steps inherit all of it."""
    import matplotlib

    matplotlib.use("Agg")
    for name in PRELOAD:
        importlib.import_module(name)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.loglog([1, 10], [1, 10], ".", label="warm-up")
    ax.set(xlabel="x", ylabel="y", title="t")
    ax.legend()
    fig.tight_layout()
    fig.savefig(io.BytesIO(), format="png")
    plt.close(fig)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="folder for gpu_validation.json, summary.txt and the PNGs")
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the dry run, with --tiny)")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes and llama-tiny: a CPU dry run of every step")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    ap.add_argument("--steps", default=",".join(BUDGETS_S), help=f"comma list of {', '.join(BUDGETS_S)}")
    ap.add_argument("--budget-scale", type=float, default=1.0, help="multiply every step's time budget")
    args = ap.parse_args(argv)
    steps = [s.strip() for s in args.steps.split(",") if s.strip()]
    unknown = [s for s in steps if s not in BUDGETS_S]
    if unknown or not steps:
        ap.error(f"--steps: unknown step(s) {unknown or args.steps!r}; choose from {', '.join(BUDGETS_S)}")
    if not (args.device == "cpu" or args.device.startswith("cuda")):
        ap.error(f"--device must be cpu or cuda[:i], got {args.device!r}")
    if args.budget_scale <= 0:
        ap.error(f"--budget-scale must be > 0, got {args.budget_scale}")
    args.steps = steps
    return args


def _step_functions() -> dict:
    import gpuval_execute
    import gpuval_kernels
    import gpuval_profile

    return {"kernels_correct": (gpuval_kernels.correctness, gpuval_kernels.format_correctness),
            "kernels_fast": (gpuval_kernels.speed, gpuval_kernels.format_speed),
            "profile_fit": (gpuval_profile.run, gpuval_profile.format_records),
            "execute": (gpuval_execute.run, gpuval_execute.format_records)}


def _child(fn, ctx) -> None:
    """In the forked process: output to the step's log, run, record the summary or the traceback."""
    log = open(ctx.work / f"{ctx.records.stem}.log", "w")
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    code = 0
    try:
        torch = sys.modules.get("torch")      # preloaded by main (a bare run_step call may not have it)
        if torch is not None and ctx.device == "cpu":
            torch.set_num_threads(1)          # tiny shapes gain nothing from threads on a shared CPU
        ctx.record("summary", **fn(ctx))
    except BaseException:                     # noqa: BLE001 - everything a step raises is its result
        ctx.record("error", traceback=traceback.format_exc()[-6000:])
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_step(name: str, fn, budget_s: float, ctx_args: dict) -> dict:
    """Run one step in a forked process, killed at ``budget_s``; returns its status and records."""
    from gpuval_common import Ctx

    start, cpu_start = time.monotonic(), _children_cpu_s()
    ctx = Ctx(**ctx_args, deadline=start + SOFT_DEADLINE * budget_s, records=ctx_args["work"] / f"{name}.jsonl")
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(fn, ctx), name=name)
    proc.start()
    proc.join(budget_s)
    killed = proc.is_alive()
    if killed:
        proc.terminate()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
    records = [json.loads(line) for line in ctx.records.read_text().splitlines()] if ctx.records.exists() else []
    log = ctx.work / f"{name}.log"
    kinds = {r["kind"] for r in records}
    status = "timeout" if killed else "ok" if proc.exitcode == 0 and "summary" in kinds else \
        "error" if "error" in kinds else f"crashed (exit {proc.exitcode})"
    return {"status": status, "wall_s": round(time.monotonic() - start, 2), "budget_s": budget_s,
            "cpu_s": round(_children_cpu_s() - cpu_start, 2),
            "exitcode": proc.exitcode, "records": records,
            "summary": next((r for r in records if r["kind"] == "summary"), None),
            "log_tail": log.read_text()[-3000:] if log.exists() else ""}


def _children_cpu_s() -> float:
    """CPU seconds (user + system) of the reaped child processes so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def summary_text(meta: dict, steps: dict, formatters: dict) -> str:
    dev = meta.get("device_info") or {}
    lines = [f"GPU validation {meta['started']}: device {meta['device']} ({dev.get('name', '?')}; limits from "
             f"{dev.get('spec')}: peak {_num(dev.get('peak_flops'))} FLOP/s, HBM {_num(dev.get('hbm_bytes_per_s'))} "
             f"B/s), dtype {meta['dtype']}{', tiny' if meta['tiny'] else ''}, {meta['wall_s']:.1f} s in all",
             f"parent (imports, report): {meta['parent_cpu_s']:.1f} CPU s",
             f"{'step':<18}{'status':<22}{'wall_s':>8}{'cpu_s':>8}{'budget_s':>10}"]
    lines += [f"{name:<18}{s['status']:<22}{s['wall_s']:>8.1f}{s['cpu_s']:>8.1f}{s['budget_s']:>10.0f}"
              for name, s in steps.items()]
    for i, (name, s) in enumerate(steps.items(), 1):
        lines += ["", f"[{i}] {name}: {s['status']}"]
        try:
            lines += formatters[name](s["records"])
        except Exception as exc:              # noqa: BLE001 - a report that cannot format still prints the rest
            lines.append(f"(could not format the records: {exc!r})")
        error = next((r for r in s["records"] if r["kind"] == "error"), None)
        if error:
            lines.append("error: " + error["traceback"].strip().splitlines()[-1])
    return "\n".join(lines)


def _num(x) -> str:
    return "?" if x is None else f"{x:.4g}"


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    if args.device == "cpu":
        os.environ.setdefault("TRITON_INTERPRET", "1")       # before triton is imported (the kernels run on CPU)
    missing = missing_packages()
    if missing:
        print("gpu_validation: cannot start, missing package(s):\n  " + "\n  ".join(missing), file=sys.stderr)
        return 2
    _preload()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpuval_common import finite, repo_root

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="gpu_validation-"))     # logs, profile CSVs: not in out (8 files at most)
    started, t0 = datetime.now(timezone.utc).isoformat(timespec="seconds"), time.monotonic()
    ctx_args = {"device": args.device, "tiny": args.tiny, "dtype": args.dtype, "out": out, "work": work,
                "repo": repo_root()}
    functions = _step_functions()
    steps = {}
    for name in args.steps:
        print(f"[gpu_validation] {name} (budget {BUDGETS_S[name] * args.budget_scale:.0f} s) ...", flush=True)
        steps[name] = run_step(name, functions[name][0], BUDGETS_S[name] * args.budget_scale, ctx_args)
        print(f"[gpu_validation] {name}: {steps[name]['status']} in {steps[name]['wall_s']:.1f} s", flush=True)
    device_info = next((r for s in steps.values() for r in s["records"] if r["kind"] == "device"), None)
    meta = {"started": started, "wall_s": round(time.monotonic() - t0, 2), "command": sys.argv, "device": args.device,
            "tiny": args.tiny, "dtype": args.dtype, "device_info": device_info, "work_dir": str(work),
            "python": sys.version.split()[0], "budget_scale": args.budget_scale,
            "soft_deadline_fraction": SOFT_DEADLINE, "parent_cpu_s": round(time.process_time(), 2),
            "steps_cpu_s": round(sum(s["cpu_s"] for s in steps.values()), 2)}
    text = summary_text(meta, steps, {name: fn[1] for name, fn in functions.items()})
    (out / "gpu_validation.json").write_text(json.dumps(finite({"meta": meta, "steps": steps}), indent=1,
                                                        allow_nan=False))
    (out / "summary.txt").write_text(text + "\n")
    _plot_kernels(steps, out)
    print(text)
    return 0 if all(s["status"] == "ok" for s in steps.values()) else 1


def _plot_kernels(steps: dict, out: Path) -> None:
    """kernels.png: error / tolerance per case (step 1) and time / limit per case (step 2)."""
    import gpuval_kernels

    try:
        gpuval_kernels.plot(steps.get("kernels_correct"), steps.get("kernels_fast"), out / "kernels.png")
    except Exception:                         # noqa: BLE001 - the JSON and table are written already
        traceback.print_exc()


if __name__ == "__main__":
    sys.exit(main())
