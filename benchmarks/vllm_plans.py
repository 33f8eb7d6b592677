"""infermax's plans executed by vLLM: predicted vs measured ratios (issue 37 item 4).

For each comparison of :data:`infermax.engines.validation.COMPARISONS` (the §4.5 eviction finding scaled to a
CPU, a bound-guided schedule against vLLM's own on a Splitwise slice): the plans are made (the solver's, a
policy's; kept in ``DIR/plans`` and reused; the committed ones of notebooks/data/vllm/plans unless
``--fresh-plans``), each schedule's makespan, mean TTFT and mean e2e predicted under
the linear cost model fitted to vLLM's CPU step times, then every schedule run on vLLM (one engine per
comparison, a warm-up run first, then ``--reps`` rounds alternating the schedules) and measured on the CPU
clock (primary: the engine's own work) and the wall clock. Prints per run and per pair the predicted ratio
beside the measured one (median, min–max over the rounds); writes ``DIR/runs.csv``, ``DIR/ratios.csv`` and
each run directory (``DIR/<comparison>/<label>/rep<k>``).

    python benchmarks/vllm_plans.py --dir DIR [--reps 3] [--comparisons a,b] [--cost FIT.json] [--solve-time 40]
    python benchmarks/vllm_plans.py --dir DIR --analyse      # the tables again from DIR (runs.csv, the run
                                                             # directories and plans), no vLLM
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from pathlib import Path

from infermax.engines.plans import check_plan, executed_as_planned
from infermax.engines.records import num_preemptions, write_engine_run
from infermax.engines.validation import COMPARISONS, OWN, by_name, make_plan, measured_values, predicted_values, ratios
from infermax.rundir import cost_from_description
from infermax.schedule import Schedule

DATA = Path(__file__).resolve().parents[1] / "notebooks" / "data" / "vllm"
FIT = DATA / "cost_cpu_fit.json"


def plans_for(comparison, cost, root: Path, solve_time: float, fresh: bool = False) -> dict:
    """label -> (schedule, info): the plans, made once and kept under ``root/plans`` (copied from the committed
    ones in notebooks/data/vllm/plans unless ``fresh``: the solver's plans depend on its time limit)."""
    w, lim = comparison.build()
    out = {}
    for label in comparison.schedules:
        path = root / "plans" / f"{comparison.name}.{label}.json"
        committed = DATA / "plans" / path.name
        if not path.is_file() and committed.is_file() and not fresh:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(committed.read_text())
        if path.is_file():
            saved = json.loads(path.read_text())
            out[label] = (Schedule.from_dict(saved["schedule"]), saved["info"])
            continue
        schedule, info = make_plan(label, w, lim, cost, solve_time)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"info": info, "schedule": schedule.to_dict()}))
        out[label] = (schedule, info)
        print(f"{comparison.name}: made {label} ({len(schedule)} batches; {info})", file=sys.stderr, flush=True)
    return out


def as_predicted(executed: Schedule, plan: Schedule) -> bool:
    """The executed batches are the plan's (for vLLM's own: the vllm-v1 prediction's), order within a batch aside."""
    c = executed_as_planned(executed, plan)
    return c.first_divergence is None and c.identical == len(plan)


def recheck(rows: list[dict], root: Path) -> list[dict]:
    """``as_predicted`` of each row recomputed from its run directory and plan file (where both are kept)."""
    for r in rows:
        run = root / r["comparison"] / r["label"] / f"rep{int(r['rep'])}" / "schedule.json"
        plan = root / "plans" / f"{r['comparison']}.{r['label']}.json"
        if run.is_file() and plan.is_file():
            r["as_predicted"] = as_predicted(Schedule.from_json(run),
                                             Schedule.from_dict(json.loads(plan.read_text())["schedule"]))
    return rows


def run_comparison(comparison, cost, root: Path, reps: int, solve_time: float, model: str,
                   fresh: bool = False) -> list[dict]:
    from infermax.engines.vllm_plan import execute_plans

    w, lim = comparison.build()
    plans = plans_for(comparison, cost, root, solve_time, fresh)
    for plan, _ in plans.values():
        check_plan(plan, w, lim)
    order = [(label, None if label == OWN else plans[label][0], w) for label in comparison.schedules]
    items = [("warm-up", None, w)] + [(f"{label}#{k}", plan, w) for k in range(reps) for label, plan, w in order]
    runs = execute_plans(items, lim, model, cache_dir=root / "models")[1:]
    rows = []
    for run in runs:
        label, rep = run.label.split("#")
        plan, info = plans[label]
        write_engine_run(root / comparison.name / label / f"rep{rep}", run.schedule, w, lim, run.measurements, cost)
        same = as_predicted(run.schedule, plan)
        row = {"comparison": comparison.name, "label": label, "rep": int(rep), "batches": len(run.schedule),
               "preemptions": num_preemptions(run.measurements.records), "as_predicted": same,
               "plan_status": info.get("status", ""), "plan_bound_s": info.get("bound_s", "")}
        row.update({f"pred_{k}": v for k, v in predicted_values(plan, w, lim, cost).items()})
        row.update(measured_values(run.schedule, w, run.measurements))
        rows.append(row)
        print(f"ran {comparison.name} {label} rep {rep}: {row['batches']} batches, cpu {row['cpu_makespan']:.2f} s, "
              f"wall {row['wall_makespan']:.2f} s", file=sys.stderr, flush=True)
    return rows


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_runs(path: Path) -> list[dict]:
    def cast(k, v):
        if k in ("comparison", "label", "plan_status"):
            return v
        if k == "as_predicted":
            return v == "True"
        return float(v) if v not in ("", None) else float("nan")
    with open(path) as f:
        return [{k: cast(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


def print_tables(rows: list[dict], pairs: list[dict]) -> None:
    print("\nruns: predicted under the CPU fit; measured on the CPU clock (cpu) and the engine clock (wall), seconds")
    print(f"{'comparison':<15}{'schedule':<13}{'rep':>4}{'batches':>8}{'preempt':>8}{'as pred':>8}"
          f"{'pred mk':>9}{'cpu mk':>8}{'wall mk':>8}{'pred e2e':>9}{'cpu e2e':>8}{'wall e2e':>9}{'pred ttft':>10}"
          f"{'cpu ttft':>9}")
    for r in rows:
        print(f"{r['comparison']:<15}{r['label']:<13}{int(r['rep']):>4}{int(r['batches']):>8}{int(r['preemptions']):>8}"
              f"{str(r['as_predicted']):>8}{r['pred_makespan']:>9.2f}{r['cpu_makespan']:>8.2f}{r['wall_makespan']:>8.2f}"
              f"{r['pred_e2e']:>9.2f}{r['cpu_e2e']:>8.2f}{r['wall_e2e']:>9.2f}{r['pred_ttft']:>10.2f}{r['cpu_ttft']:>9.2f}")
    print("\nratios baseline / candidate (> 1: the candidate is faster); measured: median [min - max] over the rounds")
    print(f"{'comparison':<15}{'baseline / candidate':<26}{'metric':<10}{'predicted':>10}{'cpu measured':>26}"
          f"{'wall measured':>26}")
    for p in pairs:
        mark = " *" if p["claimed"] else ""
        print(f"{p['comparison']:<15}{p['baseline'] + ' / ' + p['candidate']:<26}{p['metric'] + mark:<10}"
              f"{p['predicted']:>10.3f}"
              f"{p['cpu_median']:>10.3f} [{p['cpu_min']:.3f} - {p['cpu_max']:.3f}]"
              f"{p['wall_median']:>10.3f} [{p['wall_min']:.3f} - {p['wall_max']:.3f}]")
    print("(* the metric the comparison's claim is about)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--comparisons", help="comma separated (default: all)")
    ap.add_argument("--reps", type=int, default=3, help="alternated rounds per comparison (default 3)")
    ap.add_argument("--cost", type=Path, default=FIT, help="the fitted cost model (default: the committed CPU fit)")
    ap.add_argument("--solve-time", type=float, default=40.0, help="seconds per solver plan (default 40)")
    ap.add_argument("--model", default="llama-tiny")
    ap.add_argument("--fresh-plans", action="store_true", help="solve the plans again instead of using the committed "
                    "ones (notebooks/data/vllm/plans)")
    ap.add_argument("--analyse", action="store_true", help="print the tables of DIR/runs.csv (no vLLM)")
    args = ap.parse_args(argv)
    comparisons = [by_name(n) for n in args.comparisons.split(",")] if args.comparisons else list(COMPARISONS)
    cost = cost_from_description(json.loads(args.cost.read_text()), str(args.cost))
    if args.analyse:
        rows = recheck(read_runs(args.dir / "runs.csv"), args.dir)
        write_csv(args.dir / "runs.csv", rows)
    else:
        args.dir.mkdir(parents=True, exist_ok=True)
        rows = [r for c in comparisons
                for r in run_comparison(c, cost, args.dir, args.reps, args.solve_time, args.model, args.fresh_plans)]
        write_csv(args.dir / "runs.csv", rows)
    pairs = [p for c in comparisons for p in ratios(rows, c)]
    write_csv(args.dir / "ratios.csv", pairs)
    print(f"vLLM plans, {datetime.date.today()}: cost {cost.name}")
    print_tables(rows, pairs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
