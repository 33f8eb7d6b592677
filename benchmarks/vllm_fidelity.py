"""vLLM's real schedules on the catalogue: judged by replay, reproduced by the vllm-v1 preset (issue 37).

For each case of :data:`vllm_catalogue.CATALOGUE`: vLLM (the ``vllm`` extra) runs the
workload on a random-weight Llama (``llama-tiny``) and its scheduler's steps are recorded
(``DIR/<case>/``: schedule.json, workload.json, limits.json, cost.json, measurements.json). The table
prints, per case: steps, preemptions, the judge's verdict on vLLM's schedule under the mapped limits,
the steps the preset makes identically (in lockstep: each request arrives at the first step vLLM
could schedule it), and the first divergence.

    python benchmarks/vllm_fidelity.py --dir DIR [--record] [--cases a,b] [--repeat K] [--preset vllm-v1]

Without ``--record``, the cases already recorded under DIR are analysed (no vLLM needed); with it,
they are (re)recorded first (one engine per limits group). ``--repeat K`` records K runs of each
case (``DIR/<case>/rep<k>``, the first in ``DIR/<case>``) for the spread of measured times.
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from vllm_catalogue import Case, groups, select

from infermax.costmodel import get_cost_model
from infermax.engines.fidelity import compare_preset, judge
from infermax.engines.records import load_engine_run, num_preemptions, write_engine_run


def case_dir(root: Path, case: Case, rep: int) -> Path:
    return root / case.name if rep == 0 else root / case.name / f"rep{rep}"


def record(root: Path, cases: list[Case], repeat: int, model: str) -> None:
    from infermax.engines.vllm_engine import run_many

    cost = get_cost_model(None)
    for members in groups(cases).values():
        built = [c.build() for c in members]
        limits = built[0][1]
        workloads = [w for w, _ in built] * repeat
        runs = run_many(workloads, limits, model, cache_dir=root / "models")
        for k, run in enumerate(runs):
            case, rep = members[k % len(members)], k // len(members)
            write_engine_run(case_dir(root, case, rep), run.schedule, run.workload, limits, run.measurements, cost)
            print(f"recorded {case.name} (rep {rep}): {len(run.schedule)} steps, {run.measurements.wall_s:.1f} s",
                  file=sys.stderr, flush=True)


def analyse(root: Path, cases: list[Case], preset: str) -> list[dict]:
    rows = []
    for case in cases:
        d = case_dir(root, case, 0)
        if not (d / "schedule.json").is_file():
            print(f"{case.name}: not recorded under {root} (run with --record)", file=sys.stderr)
            continue
        schedule, workload, limits, m = load_engine_run(d)
        comparison, _ = compare_preset(schedule, workload, limits, m.requests, m.records, preset)
        rows.append({"case": case.name, "requests": len(workload), "steps": len(schedule),
                     "preemptions": num_preemptions(m.records), "judge": judge(schedule, workload, limits),
                     "identical_%": comparison.identical_pct, "first_divergence": comparison.divergence_text(),
                     "wall_s": m.wall_s})
    return rows


def print_rows(rows: list[dict], preset: str) -> None:
    print(f"vLLM fidelity, {datetime.date.today()}: preset {preset}, lockstep arrivals")
    print(f"{'case':<22}{'reqs':>5}{'steps':>7}{'preempt':>8}  {'judge':<8}{'identical':>10}{'wall s':>8}"
          "  first divergence")
    for r in rows:
        print(f"{r['case']:<22}{r['requests']:>5}{r['steps']:>7}{r['preemptions']:>8}  {r['judge'][:60]:<8}"
              f"{r['identical_%']:>9.1f}%{r['wall_s']:>8.1f}  {r['first_divergence']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, type=Path, help="where the recorded runs are (or go)")
    ap.add_argument("--record", action="store_true", help="run vLLM on the cases first (the vllm extra)")
    ap.add_argument("--cases", help="comma-separated case names (default: the whole catalogue)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per case when recording (default 1)")
    ap.add_argument("--model", default="llama-tiny", help="model directory or random-weight shape")
    ap.add_argument("--preset", default="vllm-v1", help="the infermax scheduler compared (default vllm-v1)")
    args = ap.parse_args(argv)
    cases = select(args.cases)
    if args.record:
        record(args.dir, cases, args.repeat, args.model)
    print_rows(analyse(args.dir, cases, args.preset), args.preset)
    return 0


if __name__ == "__main__":
    sys.exit(main())
