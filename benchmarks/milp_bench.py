"""MILP benchmark: the §4.5 grid, the largest homogeneous B, what each strengthening buys, backends.

    python benchmarks/milp_bench.py                       # every section, 60 s per solve
    python benchmarks/milp_bench.py --sections grid,scale --time-limit 60 --json out.json
    python benchmarks/milp_bench.py --sections incumbents
    python benchmarks/milp_bench.py --sections astar --time-limit 300
    python benchmarks/milp_bench.py --sections rootlp --time-limit 120

Sections (all numbers are measured by this script on the machine it runs on):

- grid: InferMax §4.5 — B = O = 4, I ∈ {1, 2, 4, …, 1024}, M = max(2I, I+O-1),
  C = 4096, latency. The optimum, whether it evicts, the optimum of the
  eviction-free class and the saving, time to proven optimality and gap.
- scale: fixed:I=16,O=16 with M = 4(I+O) = 128 for B = 2 … 16: the largest B
  proven optimal within the time limit, and the gap left beyond it.
- incumbents: schedules without proof for B = 8, 12, 16 — beam search (ranked by
  the lower bound) and the pilot search (ranked by rule-based completions), as
  latency ratios to the width-128 beam run in the same process.
- astar: the exact search without its successor cut, with it, and with the
  trajectory LP's Lagrangian tables, B = 5 … 8, as wall-time ratios (same optimum).
- rootlp: the certified root bound of the trajectory LPs alone and with configuration
  LPs (whole batches, :mod:`infermax.csp.search.configlp`) in the same time, B = 8 … 16, as
  ratios to the pilot search's schedule (the gap each leaves).
- ablation: time to optimality (or the gap left) with one strengthening off, and
  for I=O=16, B=5..7: the class-state search, A* alone (no batches-left table, no
  beam), the aggregated class flows and the per-request model.
- backends: every installed backend on small §4.5 instances.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from infermax.csp import Policy, Strengthening
from infermax.csp.backends import ModelTooLarge, available_backends
from infermax.optimal import solve_optimal


def section45(I: int) -> tuple[str, str]:
    return f"fixed:I={I},O=4,B=4", f"M={max(2 * I, I + 3)},C=4096"


def table(rows: list[dict[str, Any]], keys: list[str]) -> None:
    def fmt(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.6g}"
        return "-" if v is None else str(v)

    cells = [[fmt(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) if cells else len(k) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths)))
    sys.stdout.flush()


def _row(r, **extra) -> dict[str, Any]:
    return {"status": r.status, "objective_s": r.objective, "bound_s": r.bound, "gap": r.gap,
            "solve_s": round(r.info.get("solver_wall_s", r.wall_s) if "methods" not in r.info else r.wall_s, 2),
            "wall_s": round(r.wall_s, 2), "method": r.info.get("method"),
            "batches": len(r.schedule) if r.schedule is not None else None,
            "evictions": r.metrics.get("num_evictions"), **extra}


def run_grid(time_limit: float, gap: float) -> list[dict[str, Any]]:
    rows = []
    for I in [2 ** k for k in range(11)]:
        spec, lim = section45(I)
        opt = solve_optimal(spec, lim, time_limit_s=time_limit, rel_gap=gap)
        ef = solve_optimal(spec, lim, time_limit_s=time_limit, rel_gap=gap, policy=Policy(allow_eviction=False))
        saving = (ef.objective - opt.objective) / ef.objective * 100
        rows.append({"I": I, "optimal_ms": opt.objective * 1e3, "evicts": opt.metrics["num_evictions"] > 0,
                     "evictions": opt.metrics["num_evictions"], "batches": len(opt.schedule),
                     "eviction_free_ms": ef.objective * 1e3, "saving_pct": saving,
                     "solve_s": round(opt.wall_s, 2), "gap": opt.gap, "status": opt.status,
                     "ef_solve_s": round(ef.wall_s, 2), "ef_gap": ef.gap, "ef_status": ef.status,
                     "method": opt.info.get("method"),
                     "best_heuristic": opt.warm_start["scheduler"],
                     "best_heuristic_ms": opt.warm_start["objective"] * 1e3})
        print(f"  I={I}: done", file=sys.stderr, flush=True)
    print(f"\n§4.5 grid (B=O=4, M=max(2I,I+3), C=4096, latency; time limit {time_limit} s, gap {gap})")
    table(rows, ["I", "optimal_ms", "evicts", "evictions", "batches", "eviction_free_ms", "saving_pct", "solve_s",
                 "gap", "status", "ef_solve_s", "ef_status", "method", "best_heuristic", "best_heuristic_ms"])
    return rows


def run_scale(time_limit: float, gap: float, max_B: int, min_B: int = 2) -> list[dict[str, Any]]:
    rows = []
    for B in range(min_B, max_B + 1):
        r = solve_optimal(f"fixed:I=16,O=16,B={B}", "M=128,C=4096", time_limit_s=time_limit, rel_gap=gap)
        search = r.info.get("search") or {}
        rows.append(_row(r, B=B, heuristic_s=r.warm_start["objective"], incumbent=search.get("incumbent"),
                         lp_root_s=(search.get("trajectory_lp") or {}).get("root_bound_s")))
        print(f"  B={B}: {r.status} in {r.wall_s:.1f} s", file=sys.stderr, flush=True)
    print(f"\nhomogeneous scale (I=O=16, M=128, C=4096, latency; time limit {time_limit} s)")
    table(rows, ["B", "status", "objective_s", "bound_s", "lp_root_s", "gap", "wall_s", "batches", "evictions",
                 "method", "incumbent", "heuristic_s"])
    solved = [r["B"] for r in rows if r["status"] == "optimal"]
    print(f"largest B proven optimal within {time_limit} s: {max(solved) if solved else None}")
    return rows


ABLATIONS: list[tuple[str, dict[str, Any]]] = [
    ("full (default)", {}),
    ("no class flows", {"strengthening": Strengthening(flows=False)}),
    ("no flows, DFF cuts on indicators", {"strengthening": Strengthening(flows=False, dff=True)}),
    ("no valid inequalities", {"strengthening": Strengthening(cuts=False, flows=False)}),
    ("no symmetry breaking", {"strengthening": Strengthening(symmetry="none")}),
    ("lexicographic symmetry breaking", {"strengthening": Strengthening(symmetry="lex")}),
    ("no dominance", {"strengthening": Strengthening(dominance=False)}),
    ("big-M rows (tight M)", {"strengthening": Strengthening(indicators="big-m")}),
    ("big-M rows (loose M)", {"strengthening": Strengthening(indicators="big-m", big_m="loose")}),
    ("no warm start", {"warm_start": None}),
    ("CP-SAT default portfolio, 2 workers", {"threads": 2}),
]


def run_ablation(time_limit: float, gap: float) -> list[dict[str, Any]]:
    rows = []
    for label, (spec, lim) in (("§4.5 I=64", section45(64)), ("§4.5 I=512", section45(512))):
        for name, kwargs in ABLATIONS:
            r = solve_optimal(spec, lim, time_limit_s=time_limit, rel_gap=gap, method="per-request", **kwargs)
            rows.append(_row(r, instance=label, variant=name))
            print(f"  {label} / {name}: {r.status}", file=sys.stderr, flush=True)
    for B in (5, 6, 7):
        spec = f"fixed:I=16,O=16,B={B}"
        for name, method in (("class-state search", "search"), ("aggregated class flows", "aggregate"),
                             ("per-request model", "per-request")):
            r = solve_optimal(spec, "M=128,C=4096", time_limit_s=time_limit, rel_gap=gap, method=method)
            rows.append(_row(r, instance=f"I=O=16 B={B}", variant=name))
            print(f"  B={B} / {name}: {r.status}", file=sys.stderr, flush=True)
        rows.append(_search_without_table(B, time_limit, gap))
    print(f"\nablation (time limit {time_limit} s; solve_s is the time to reach the gap, or the limit)")
    table(rows, ["instance", "variant", "status", "solve_s", "gap", "objective_s", "bound_s", "method"])
    return rows


def _search_without_table(B: int, time_limit: float, gap: float) -> dict[str, Any]:
    """A* alone from the best heuristic, no table of exact batches left and no beam (what the table buys)."""
    from infermax import Limits, Workload, simulate
    from infermax.costmodel import get_cost_model
    from infermax.csp.search.astar import exact_search

    w, lim, cost = Workload.from_spec(f"fixed:I=16,O=16,B={B}"), Limits.from_spec("M=128,C=4096"), get_cost_model()
    upper = min(simulate(w, name, lim, cost).metrics["latency_s"] for name in ("vllm", "sarathi", "rank-i"))
    found = exact_search(w, lim, cost, Policy(), upper_s=upper, time_budget_s=time_limit, rel_gap=gap)
    row = {"instance": f"I=O=16 B={B}", "variant": "search: A* only (no table, no beam)",
           "status": "optimal" if found.is_complete else "stopped", "solve_s": round(found.wall_s, 2),
           "bound_s": found.bound_s, "objective_s": found.value_s, "method": "search"}
    print(f"  B={B} / A* only: {row['status']}", file=sys.stderr, flush=True)
    return row


def run_incumbents(time_limit: float, max_B: int) -> list[dict[str, Any]]:
    """Schedules without proof: beam (ranked by the lower bound) against pilot (ranked by completions)."""
    from infermax import Limits, Workload, metrics, replay
    from infermax.costmodel import get_cost_model
    from infermax.csp.search.astar import beam_search, pilot_search

    lim, cost = Limits.from_spec("M=128,C=4096"), get_cost_model()
    rows = []
    for B in [b for b in (8, 12, 16) if b <= max_B]:
        w = Workload.from_spec(f"fixed:I=16,O=16,B={B}")
        base = None
        for kind, width in (("beam", 128), ("beam", 512), ("pilot", 1), ("pilot", 4), ("pilot", 16)):
            run = beam_search if kind == "beam" else pilot_search
            t = time.perf_counter()
            found = run(w, lim, cost, Policy(), width=width, time_budget_s=time_limit)
            wall = time.perf_counter() - t
            lat = metrics(replay(found[0], w, lim, cost))["latency_s"] if found is not None else None
            base = base if base is not None else lat
            rows.append({"B": B, "search": f"{kind}-{width}", "latency_s": lat, "wall_s": round(wall, 2),
                         "vs_beam_128": None if lat is None or base is None else round(lat / base, 4),
                         "batches": len(found[0]) if found is not None else None})
            print(f"  B={B} / {kind}-{width}: {lat}", file=sys.stderr, flush=True)
    print(f"\nincumbents (I=O=16, M=128; each search alone, {time_limit} s budget; ratio to beam-128 here)")
    table(rows, ["B", "search", "latency_s", "vs_beam_128", "batches", "wall_s"])
    return rows


def run_astar(time_limit: float, max_B: int) -> list[dict[str, Any]]:
    """A* three ways, from the same table and pilot incumbent: without the successor cut, with it (batches
    that cannot beat the cutoff dropped before their evictions are enumerated), and with the cut and the
    trajectory LP's Lagrangian tables (:mod:`infermax.csp.search.trajectorybound`, given a sixth of the budget, as
    ``solve_optimal`` does) — wall-time ratios in the same process."""
    from infermax import Limits, Workload
    from infermax.costmodel import get_cost_model
    from infermax.csp.search.astar import exact_search, pilot_search
    from infermax.csp.search.batchtable import RemainingBatches

    lim, cost, policy = Limits.from_spec("M=128,C=4096"), get_cost_model(), Policy()
    variants = {"uncut": {"cut_successors": False}, "cut": {}, "lp": {"lp_budget_s": time_limit / 6}}
    rows = []
    for B in [b for b in (5, 6, 7, 8) if b <= max_B]:
        w = Workload.from_spec(f"fixed:I=16,O=16,B={B}")
        rest = RemainingBatches([(16, 16, B)], lim.M, lim.R_max, time_budget_s=time_limit)
        upper = pilot_search(w, lim, cost, policy, width=16, time_budget_s=time_limit)[1]
        runs = {}
        for name, kwargs in variants.items():
            runs[name] = exact_search(w, lim, cost, policy, upper_s=upper, time_budget_s=time_limit, rel_gap=1e-4,
                                      min_batches=rest.num_batches, rest=rest, **kwargs)
            print(f"  B={B} / {name}: {runs[name].wall_s:.1f} s", file=sys.stderr, flush=True)

        def ratio(a: str, b: str) -> float | None:
            done = runs[a].is_complete and runs[b].is_complete
            return round(runs[a].wall_s / runs[b].wall_s, 3) if done else None

        values = {r.value_s for r in runs.values() if r.is_complete}
        rows.append({"B": B, "same_optimum": len(values) == 1 and all(r.is_complete for r in runs.values()),
                     "expanded": runs["cut"].num_expanded, "expanded_lp": runs["lp"].num_expanded,
                     **{f"{name}_s": round(r.wall_s, 2) for name, r in runs.items()},
                     "cut_vs_uncut": ratio("cut", "uncut"), "lp_vs_cut": ratio("lp", "cut")})
    print(f"\nA* successor cut and Lagrangian tables (I=O=16, M=128; same table and incumbent; "
          f"{time_limit} s budget each)")
    table(rows, ["B", "same_optimum", "expanded", "expanded_lp", "uncut_s", "cut_s", "lp_s", "cut_vs_uncut",
                 "lp_vs_cut"])
    return rows


def run_rootlp(time_limit: float, max_B: int) -> list[dict[str, Any]]:
    """Root bounds of the trajectory LPs alone and refined by configuration LPs (each run given
    ``time_limit`` seconds), per batch count Y and least over Y, against the pilot search's schedule.
    No batches-left table: Y starts at the class-state bound's least batch count."""
    from infermax import Limits, Workload
    from infermax.costmodel import get_cost_model
    from infermax.csp.search.astar import pilot_search
    from infermax.csp.search.classstate import ClassStateSpace
    from infermax.csp.search.trajectorybound import TrajectoryBound

    lim, cost, policy = Limits.from_spec("M=128,C=4096"), get_cost_model(), Policy()
    rows, per_y = [], []
    for B in [b for b in (8, 10, 12, 16) if b <= max_B]:
        w = Workload.from_spec(f"fixed:I=16,O=16,B={B}")
        upper = pilot_search(w, lim, cost, policy, width=16, time_budget_s=time_limit)[1]
        sp = ClassStateSpace(w, lim, cost, policy, 0)
        plain = TrajectoryBound(sp, 0, upper, time_limit)
        refined = TrajectoryBound(sp, 0, upper, time_limit, refine=True)
        for y, (bound, ok) in sorted(refined.refined.items()):
            base = plain.root.get(y)        # None if the plain run did not reach this Y
            per_y.append({"B": B, "Y": y, "trajectory_s": base, "configuration_s": round(bound, 6), "converged": ok,
                          "ratio": round(bound / base, 4) if base else None})
        rows.append({"B": B, "incumbent_s": round(upper, 6), "trajectory_s": round(plain.root_bound, 6),
                     "refined_s": round(refined.root_bound, 6),
                     "batch_counts": f"{min(refined.root)}-{max(refined.root)}",
                     "gap_trajectory": round(1 - plain.root_bound / upper, 4),
                     "gap_refined": round(1 - refined.root_bound / upper, 4),
                     "refined_vs_trajectory": round(refined.root_bound / plain.root_bound, 4)})
        print(f"  B={B}: {refined.wall_s:.0f} s", file=sys.stderr, flush=True)
    print(f"\nroot bound per batch count Y: trajectory LP vs configuration LP (I=O=16, M=128; {time_limit} s "
          f"for all Y of a B; the configuration LP's Lagrangian, converged or not)")
    table(per_y, ["B", "Y", "trajectory_s", "configuration_s", "converged", "ratio"])
    print("\nroot bound, least over Y (no batches-left table), against the pilot search's schedule")
    table(rows, ["B", "incumbent_s", "trajectory_s", "refined_s", "batch_counts", "gap_trajectory", "gap_refined",
                 "refined_vs_trajectory"])
    return rows + per_y


def run_backends(time_limit: float, gap: float) -> list[dict[str, Any]]:
    rows = []
    for label, spec, lim in (("B=2,I=2,O=3,M=5", "fixed:I=2,O=3,B=2", "M=5,C=4096"),
                             ("§4.5 I=1", *section45(1)), ("§4.5 I=4", *section45(4))):
        for be in available_backends():
            try:
                r = solve_optimal(spec, lim, backend=be, time_limit_s=time_limit, rel_gap=gap, method="per-request")
                rows.append(_row(r, instance=label, backend=be, vars=r.info["model"]["variables"]))
            except ModelTooLarge as exc:
                rows.append({"instance": label, "backend": be, "status": "too large",
                             "method": str(exc).split(";")[0].split(": ", 1)[1]})
            print(f"  {label} / {be}: {rows[-1]['status']}", file=sys.stderr, flush=True)
    print(f"\nbackends (per-request model, time limit {time_limit} s)")
    table(rows, ["instance", "backend", "status", "solve_s", "gap", "objective_s", "bound_s", "vars", "method"])
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sections", default="grid,scale,incumbents,astar,ablation,backends")
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--gap", type=float, default=1e-4)
    p.add_argument("--max-B", type=int, default=16)
    p.add_argument("--min-B", type=int, default=2)
    p.add_argument("--json", help="write every row to this file")
    args = p.parse_args(argv)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    for section in args.sections.split(","):
        if section == "grid":
            out["grid"] = run_grid(args.time_limit, args.gap)
        elif section == "incumbents":
            out["incumbents"] = run_incumbents(args.time_limit, args.max_B)
        elif section == "scale":
            out["scale"] = run_scale(args.time_limit, args.gap, args.max_B, args.min_B)
        elif section == "astar":
            out["astar"] = run_astar(args.time_limit, args.max_B)
        elif section == "rootlp":
            out["rootlp"] = run_rootlp(args.time_limit, args.max_B)
        elif section == "ablation":
            out["ablation"] = run_ablation(args.time_limit, args.gap)
        elif section == "backends":
            out["backends"] = run_backends(args.time_limit, args.gap)
        else:
            p.error(f"unknown section {section!r}")
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
