"""Timing on the real engine and how far vLLM is from optimal (issue 37 items 5 and 6).

Reads the runs ``benchmarks/vllm_fidelity.py --record`` wrote under DIR (``DIR/<case>``, repetitions in
``DIR/<case>/rep<k>``). Item 5: the linear cost model is fitted to vLLM's measured step times
(:mod:`infermax.engines.timing`) leaving each case out in turn; its held-out per-step error, and per case
the mean TTFT and e2e predicted from vLLM's schedule (replayed under the model fitted without that case)
beside the measured ones, with the spread of the repeated runs. Item 6: under the model fitted to every
case, the certified gaps of vLLM's real schedules (makespan, mean TTFT, mean e2e: the replayed value
against ``lower_bound``'s certified bound, through ``check_scheduler``).

    python benchmarks/vllm_timing.py --dir DIR [--cases a,b] [--no-gaps]
"""
from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

from infermax.bounds.check import check_scheduler
from infermax.costmodel.accuracy import error_stats
from infermax.engines.catalogue import select
from infermax.engines.records import load_engine_run, step_times
from infermax.engines.timing import (batch_features, fit_step_model, measured_means, predicted_steps,
                                     predicted_vs_measured, run_features)


def load(root: Path, names: str | None) -> dict[str, list]:
    """Per case, its recorded runs (the first, then the repetitions)."""
    out = {}
    for case in select(names):
        d = root / case.name
        if not (d / "schedule.json").is_file():
            continue
        dirs = [d] + sorted(p for p in d.glob("rep*") if (p / "schedule.json").is_file())
        out[case.name] = [load_engine_run(p) for p in dirs]
    return out


def timing_table(runs: dict[str, list]) -> list[dict]:
    rows = []
    for name, mine in runs.items():
        others = [(s, w, m) for other, rs in runs.items() if other != name for s, w, _, m in rs]
        model = fit_step_model(*run_features(others), name=f"fit-without-{name}")
        s, w, lim, m = mine[0]
        step_err = error_stats(predicted_steps(model, batch_features(s, w)), step_times(m.records)[1])
        row = {"case": name, **predicted_vs_measured(s, w, lim, m, model), "step_median_ape": step_err["median_ape"]}
        reps = [measured_means(w2, m2) for _, w2, _, m2 in mine]
        row["runs"] = len(reps)
        row["e2e_spread"] = (max(r[1] for r in reps) / min(r[1] for r in reps) - 1) if len(reps) > 1 else float("nan")
        rows.append(row)
    return rows


def gap_table(runs: dict[str, list]) -> list[dict]:
    model = fit_step_model(*run_features([(s, w, m) for rs in runs.values() for s, w, _, m in rs]), name="vllm-cpu-fit")
    rows = []
    for name, mine in runs.items():
        s, w, lim, _ = mine[0]
        row = {"case": name}
        for objective in ("latency", "ttft", "e2e"):
            r = check_scheduler("vllm", w, lim, model, objective=objective, schedule=s, optimum=False)
            row[objective] = (r.value_s, r.bound_s, 100 * r.gap if r.gap is not None else float("nan"), r.bound_method)
        rows.append(row)
    return rows, model


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--cases")
    ap.add_argument("--no-gaps", action="store_true")
    args = ap.parse_args(argv)
    runs = load(args.dir, args.cases)
    if len(runs) < 2:
        print(f"need at least two recorded cases under {args.dir}", file=sys.stderr)
        return 2
    print(f"vLLM timing, {datetime.date.today()}: linear model fitted leaving each case out")
    rows = timing_table(runs)
    print(f"{'case':<22}{'step APE':>9}{'pred TTFT':>10}{'meas TTFT':>10}{'err':>8}{'pred e2e':>10}{'meas e2e':>10}"
          f"{'err':>8}{'runs':>5}{'e2e spread':>11}")
    for r in rows:
        print(f"{r['case']:<22}{r['step_median_ape']:>8.1%}{r['pred_ttft_s']:>10.3f}{r['meas_ttft_s']:>10.3f}"
              f"{r['ttft_err']:>+8.1%}{r['pred_e2e_s']:>10.3f}{r['meas_e2e_s']:>10.3f}{r['e2e_err']:>+8.1%}"
              f"{r['runs']:>5}{r['e2e_spread']:>10.1%}")
    errs = np.abs([[r["ttft_err"], r["e2e_err"]] for r in rows])
    print(f"median |error|: TTFT {np.median(errs[:, 0]):.1%}, e2e {np.median(errs[:, 1]):.1%}; "
          f"median held-out step APE {np.median([r['step_median_ape'] for r in rows]):.1%}")
    if not args.no_gaps:
        gaps, model = gap_table(runs)
        print(f"\ncertified gaps of vLLM's schedules under the model fitted to all cases ({model.coefficients})")
        print(f"{'case':<22}{'makespan s':>11}{'bound':>9}{'gap %':>7}{'TTFT s':>9}{'bound':>9}{'gap %':>7}"
              f"{'e2e s':>9}{'bound':>9}{'gap %':>7}")
        for r in gaps:
            cells = "".join(f"{r[o][0]:>10.3f}{r[o][1]:>9.3f}{r[o][2]:>7.1f}" for o in ("latency", "ttft", "e2e"))
            print(f"{r['case']:<22}{cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
