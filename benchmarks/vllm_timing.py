"""Timing on the real engine and how far vLLM is from optimal (issue 37 items 5 and 6).

Reads the runs ``benchmarks/vllm_fidelity.py --record`` wrote under DIR (``DIR/<case>``, repetitions in
``DIR/<case>/rep<k>``). Item 5: the linear cost model is fitted to vLLM's measured step times
(:mod:`infermax.engines.timing`) leaving each case out in turn; its held-out per-step error, and per case
the mean TTFT and e2e predicted from vLLM's schedule (replayed under the model fitted without that case)
beside the measured ones, with the spread of the repeated runs. Item 6: under the model fitted to every
case, the certified gaps of vLLM's real schedules (makespan, mean TTFT, mean e2e: the replayed value
against ``lower_bound``'s certified bound, through ``check_scheduler``), and beside them those of infermax's
bound-guided schedules (``bound-e2e``, ``bound-e2e-ef``, ``bound-ttft``, simulated on the same workloads and
limits), each objective's bound computed once for all of them.

    python benchmarks/vllm_timing.py --dir DIR [--cases a,b] [--no-gaps] [--no-timing] [--gaps-csv F]
                                     [--write-fit F]
"""
from __future__ import annotations

import argparse
import csv
import datetime
import json
import sys
from pathlib import Path

import numpy as np
from vllm_catalogue import select

from infermax import simulate
from infermax.bounds.check import check_scheduler, reference_bound
from infermax.costmodel.accuracy import error_stats
from infermax.engines.records import load_engine_run, step_times
from infermax.engines.timing import (
    batch_features,
    fit_step_model,
    means_on_batch_clock,
    measured_means,
    predicted_steps,
    predicted_vs_measured,
    run_features,
)


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


def _spread(values: list[float]) -> float:
    return max(values) / min(values) - 1 if len(values) > 1 else float("nan")


def timing_table(runs: dict[str, list], reps: dict[str, list], clock: str, loss: str) -> list[dict]:
    """Per case: the model fitted to the other cases' step times on ``clock`` (wall or cpu), its held-out
    step error, and mean TTFT / e2e predicted from the case's schedule beside the measured ones. Wall:
    replayed with the workload's arrivals against what the engine's clock measured; cpu: both on the
    batch clock (:func:`means_on_batch_clock`), measured CPU step times against predicted ones."""
    rows = []
    for name, mine in runs.items():
        others = [(s, w, m) for other, rs in runs.items() if other != name for s, w, _, m in rs]
        model = fit_step_model(*run_features(others, clock), name=f"fit-without-{name}", loss=loss)
        s, w, lim, m = mine[0]
        feats, dur = batch_features(s, w), step_times(m.records, clock)[1]
        row = {"case": name, "step_median_ape": error_stats(predicted_steps(model, feats), dur)["median_ape"]}
        if clock == "wall":
            row.update(predicted_vs_measured(s, w, lim, m, model))
            spread = [measured_means(w2, m2)[1] for _, w2, _, m2 in reps.get(name, mine)]
        else:
            (pt, pe), (mt, me) = (means_on_batch_clock(s, w, m, predicted_steps(model, feats)),
                                  means_on_batch_clock(s, w, m, dur))
            row.update(pred_ttft_s=pt, meas_ttft_s=mt, ttft_err=pt / mt - 1, pred_e2e_s=pe, meas_e2e_s=me,
                       e2e_err=pe / me - 1)
            spread = [means_on_batch_clock(s2, w2, m2, step_times(m2.records, "cpu")[1])[1]
                      for s2, w2, _, m2 in reps.get(name, mine)]
        row["runs"], row["e2e_spread"] = len(spread), _spread(spread)
        rows.append(row)
    return rows


def print_timing(rows: list[dict], clock: str, loss: str) -> None:
    print(f"\n{clock} clock: linear model fitted to {clock} step times ({loss} loss), leaving each case out")
    print(f"{'case':<22}{'step APE':>9}{'pred TTFT':>10}{'meas TTFT':>10}{'err':>8}{'pred e2e':>10}{'meas e2e':>10}"
          f"{'err':>8}{'runs':>5}{'e2e spread':>11}")
    for r in rows:
        print(f"{r['case']:<22}{r['step_median_ape']:>8.1%}{r['pred_ttft_s']:>10.3f}{r['meas_ttft_s']:>10.3f}"
              f"{r['ttft_err']:>+8.1%}{r['pred_e2e_s']:>10.3f}{r['meas_e2e_s']:>10.3f}{r['e2e_err']:>+8.1%}"
              f"{r['runs']:>5}{r['e2e_spread']:>10.1%}")
    errs = np.abs([[r["ttft_err"], r["e2e_err"]] for r in rows])
    print(f"median |error|: TTFT {np.median(errs[:, 0]):.1%}, e2e {np.median(errs[:, 1]):.1%}; "
          f"median held-out step APE {np.median([r['step_median_ape'] for r in rows]):.1%}")


#: infermax's bound-guided schedulers whose certified gaps are set beside vLLM's (item 6)
BOUND_GUIDED = ("bound-e2e", "bound-e2e-ef", "bound-ttft")
OBJECTIVES = ("latency", "ttft", "e2e")


def cpu_fit(runs: dict[str, list]):
    """The linear model fitted (absolute loss) to every case's CPU step times."""
    return fit_step_model(*run_features([(s, w, m) for rs in runs.values() for s, w, _, m in rs], "cpu"),
                          name="vllm-cpu-fit", loss="absolute")


def gap_table(runs: dict[str, list], model, schedulers: tuple[str, ...] = BOUND_GUIDED) -> list[dict]:
    """Under ``model``, per case and objective: the certified gaps of vLLM's recorded schedule and of each of
    ``schedulers`` (simulated on the case's workload and limits), all against one bound per objective (the
    cheap certified bounds of ``lower_bound``; valid for every schedule of the instance)."""
    rows = []
    for name, mine in runs.items():
        s, w, lim, _ = mine[0]
        own = {o: check_scheduler("vllm", w, lim, model, objective=o, schedule=s, optimum=False) for o in OBJECTIVES}
        simulated = [simulate(w, n, lim, cost=model).metrics["latency_s"] for n in schedulers]
        upper = min([own["latency"].latency_s] + simulated)
        row = {"case": name}
        for objective in OBJECTIVES:
            ref = reference_bound(w, lim, model, objective=objective, upper=upper, optimum=False)
            for who in ("vllm",) + schedulers:
                r = check_scheduler(who, w, lim, model, objective=objective, optimum=False, reference=ref,
                                    schedule=s if who == "vllm" else None)
                row[(who, objective)] = (r.value_s, r.bound_s, 100 * r.gap if r.gap is not None else float("nan"))
        rows.append(row)
    return rows


def print_gaps(gaps: list[dict], model, schedulers: tuple[str, ...] = BOUND_GUIDED) -> None:
    k = model.coefficients
    print(f"\ncertified gaps under the model fitted to all cases' CPU step times (absolute loss) "
          f"(s: {k.nonattn_lines[0][0]:.4g} + {k.nonattn_lines[0][1]:.4g}/token + {k.request_s:.4g}/request + "
          f"{k.decode_kv_s:.4g}/decode KV token + {k.prefill_attn_s:.4g}/prefill pair; "
          f"biases decode {k.decode_bias_s:.3g}, prefill {k.prefill_bias_s:.3g}); vLLM's recorded schedule and "
          f"infermax's bound-guided schedules, each against the same bound")
    for objective, title in zip(OBJECTIVES, ("makespan", "mean TTFT", "mean e2e")):
        print(f"\n{title}: value s (gap %)")
        print(f"{'case':<22}{'bound':>8}" + "".join(f"{w:>20}" for w in ("vllm",) + schedulers))
        for r in gaps:
            cells = "".join(f"{r[(w, objective)][0]:>11.3f} ({r[(w, objective)][2]:>5.1f})"
                            for w in ("vllm",) + schedulers)
            print(f"{r['case']:<22}{r[('vllm', objective)][1]:>8.3f}{cells}")
        med = {w: np.median([r[(w, objective)][2] for r in gaps]) for w in ("vllm",) + schedulers}
        print(f"{'median gap %':<30}" + "".join(f"{med[w]:>20.1f}" for w in ("vllm",) + schedulers))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, type=Path)
    ap.add_argument("--cases")
    ap.add_argument("--reps", type=Path, help="a directory of repeated runs (DIR/<case>/rep<k>) for the spreads")
    ap.add_argument("--no-gaps", action="store_true")
    ap.add_argument("--gaps-csv", type=Path, help="write the certified gaps (one row per case, schedule, objective)")
    ap.add_argument("--write-fit", type=Path, help="write the CPU fit of every case (its describe() JSON)")
    ap.add_argument("--no-timing", action="store_true", help="skip the timing tables")
    args = ap.parse_args(argv)
    runs = load(args.dir, args.cases)
    if len(runs) < 2:
        print(f"need at least two recorded cases under {args.dir}", file=sys.stderr)
        return 2
    reps = load(args.reps, args.cases) if args.reps else {}
    print(f"vLLM timing, {datetime.date.today()}")
    for clock in () if args.no_timing else ("wall", "cpu"):
        for loss in ("relative", "absolute"):
            print_timing(timing_table(runs, reps, clock, loss), clock, loss)
    if args.write_fit:
        args.write_fit.write_text(json.dumps(cpu_fit(runs).describe(), indent=1))
    if not args.no_gaps:
        model = cpu_fit(runs)
        gaps = gap_table(runs, model)
        print_gaps(gaps, model)
        if args.gaps_csv:
            flat = [{"case": r["case"], "schedule": key[0], "objective": key[1], "value_s": r[key][0],
                     "bound_s": r[key][1], "gap_pct": r[key][2]} for r in gaps for key in r if isinstance(key, tuple)]
            with open(args.gaps_csv, "w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(flat[0]))
                writer.writeheader()
                writer.writerows(flat)
    return 0


if __name__ == "__main__":
    sys.exit(main())
