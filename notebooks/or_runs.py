"""Notebook 13's runs: the operations-research schedulers (MC-SF, WAIT, Nested WAIT) on their papers' setups.

Each function returns one block of the results table (column ``study``), every number simulated and judged
by ``replay``, every optimum proven by ``solve_optimal`` (status ``optimal``) or left out, every gap
certified by ``lower_bound``:

- ``ratio``: Jaillet et al.'s synthetic study — unit time (cost model ``unit``: a batch is a round),
  n requests with prompts U{1..4} and outputs U{1..8} (``typed`` workloads), M = 16, C = P large (a
  prompt whole in its round); offline (all at 0) or online (Poisson arrivals at 1 a round, on whole
  rounds); per instance MC-SF's mean latency and the optimum's, when the solver proves it in its time;
- ``gap``: the same instances at larger n, MC-SF's mean latency against the certified lower bound;
- ``real``: the Splitwise conversation trace on Llama-2-70B, A100s, TP 2 (``a100/llama2-70b@tp=2``,
  M = the KV capacity of that replica), MC-SF against memory-aware greedy baselines;
- ``sweep``: Ao et al.'s study — two request types on Llama-2-7B / A100 (the default cost model), the
  load swept as a share of the fluid stability limit (:mod:`infermax.fluid`), WAIT / Nested WAIT / vLLM /
  Sarathi (and MC-SF): throughput, mean latency and TTFT.
"""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd

from infermax import Limits, Workload, replay, simulate
from infermax.costmodel import get_cost_model, kv_capacity_tokens
from infermax.fluid import equilibrium, fluid_types, stability_limit

UNIT_LIMITS = Limits(M=16, C=1000)
#: Jaillet et al.'s synthetic instances (ours: the paper's generator is not available)
SYNTH = "typed:types=r/1-4/1-8/1,n={n},seed={seed}"
#: the class of Jaillet et al.'s hindsight optimum: no preemption, a prompt whole in the round it starts
RATIO_POLICY = "no-eviction,no-chunked"
REAL_COST = "a100/llama2-70b@tp=2"
#: Ao et al.'s two request types (ours: the paper's are not available): short chats and long answers
AO_TYPES = "short/64-192/16-64/3+long/256-768/128-384/1"
AO_LIMITS = Limits(M=100_000, C=4096)
AO_SCHEDULERS = ("wait", "nested-wait", "vllm", "sarathi", "mcsf")


def synthetic(n: int, seed: int, online: bool) -> Workload:
    spec = SYNTH.format(n=n, seed=seed) + (",tick=1" if online else ",offline=1")
    return Workload.from_spec(spec)


def _judged(w: Workload, name: str, lim: Limits, cost) -> dict:
    r = simulate(w, name, lim, cost)
    if replay(r.schedule, w, lim, cost) != r.trace:
        raise AssertionError(f"{name}: replay differs from the simulation")
    return r.metrics


def ratio_runs(ns=(4, 6, 8), seeds=range(6), time_limit_s: float = 120.0, retry_s: float | None = None,
               retry_max_n: int = 0) -> pd.DataFrame:
    """MC-SF / optimum per instance (rows with status != optimal keep the solver's bound, no ratio). An instance
    with n <= ``retry_max_n`` not proven within ``time_limit_s`` (wall clock) is solved again with ``retry_s``."""
    cost, rows = get_cost_model("unit"), []
    for online in (False, True):
        for n in ns:
            for seed in seeds:
                w = synthetic(n, seed, online)
                mc = _judged(w, "mcsf", UNIT_LIMITS, cost)["e2e_mean_s"]
                row = _solve(w, time_limit_s)
                if row["status"] != "optimal" and retry_s and n <= retry_max_n:
                    row = _solve(w, retry_s)
                rows.append({"study": "ratio", "mode": "online" if online else "offline", "n": n, "seed": seed,
                             "mcsf_s": mc, **row})
    return pd.DataFrame(rows)


def _solve(w: Workload, time_limit_s: float) -> dict:
    from infermax import solve_optimal

    t0 = time.process_time()
    opt = solve_optimal(w, UNIT_LIMITS, "unit", objective="completion", time_limit_s=time_limit_s,
                        policy=RATIO_POLICY)
    return {"optimum_s": opt.objective if opt.is_optimal else np.nan, "bound_s": opt.bound,
            "status": str(opt.status), "time_limit_s": time_limit_s, "solver_cpu_s": time.process_time() - t0}


def gap_runs(ns=(16, 64, 256), seeds=range(3)) -> pd.DataFrame:
    """MC-SF's certified gap (mean latency against ``lower_bound``'s e2e bound) beyond the proven optima."""
    from infermax import lower_bound

    cost, rows = get_cost_model("unit"), []
    for online in (False, True):
        for n in ns:
            lim = Limits(M=2 * n, C=1000) if not online else UNIT_LIMITS
            for seed in seeds:
                w = synthetic(n, seed, online)
                mc = _judged(w, "mcsf", lim, cost)["e2e_mean_s"]
                b = lower_bound(w, lim, cost, objective="e2e")
                rows.append({"study": "gap", "mode": "online" if online else "offline", "n": n, "seed": seed,
                             "M": lim.M, "mcsf_s": mc, "bound_s": b.value, "gap": (mc - b.value) / mc})
    return pd.DataFrame(rows)


REAL_SCHEDULERS = ("mcsf", "sarathi-la", "sarathi-pc-la", "sarathi-ef", "sarathi", "bound-e2e-ef", "mcsf-fcfs")


def scheduler(name: str):
    """A registered scheduler, or ``mcsf-fcfs``: MC-SF's policy in arrival order (the memory-aware greedy
    that differs from MC-SF only by its order)."""
    if name != "mcsf-fcfs":
        return name
    from dataclasses import replace

    from infermax.schedulers import GetNextBatch
    from infermax.schedulers.mcsf import mcsf_policy

    return GetNextBatch(replace(mcsf_policy(), rank_key="arrival"), name="mcsf-fcfs")


def real_runs(n: int = 2000, schedulers=REAL_SCHEDULERS, time_scales=(1.0,)) -> pd.DataFrame:
    """The Splitwise conversation trace on Llama-2-70B / A100 TP 2: mean latency per scheduler, at the trace's
    own arrival rate and at slower ones (``time_scale`` < 1 stretches the gaps between arrivals)."""
    cost = get_cost_model(REAL_COST)
    lim = Limits(M=kv_capacity_tokens("llama2-70b", "a100", tp=2), C=4096)
    rows = []
    for scale in time_scales:
        w = Workload.from_spec(f"trace:splitwise_conv,n={n},time_scale={scale:g}")
        for name in schedulers:
            m = _judged(w, scheduler(name), lim, cost)
            rows.append({"study": "real", "n": n, "M": lim.M, "time_scale": scale, "scheduler": name,
                         "e2e_mean_s": m["e2e_mean_s"], "ttft_mean_s": m["ttft_mean_s"],
                         "evictions": m["num_evictions"]})
    return pd.DataFrame(rows)


def ao_workload(n: int, rate_per_s: float, seed: int = 0) -> Workload:
    types = "+".join(f"{t.rsplit('/', 1)[0]}/{float(t.rsplit('/', 1)[1]) * rate_per_s / 4:g}"
                     for t in AO_TYPES.split("+"))
    return Workload.from_spec(f"typed:types={types},n={n},seed={seed}")


def fluid_limit_rps(n: int = 4000) -> tuple[float, str]:
    """The fluid stability limit of Ao's mix (requests/s) under the default cost model and AO_LIMITS."""
    w = ao_workload(n, 4.0)
    types = fluid_types(w, 4.0)
    rho, why = stability_limit(types, AO_LIMITS, get_cost_model(None))
    return 4.0 * rho, why


def sweep_runs(n: int = 3000, shares=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25), schedulers=AO_SCHEDULERS
               ) -> pd.DataFrame:
    """Per load (a share of the fluid limit) and scheduler: throughput (requests/s over the span from the first
    arrival to the last completion), mean e2e latency, mean TTFT, evictions."""
    limit, why = fluid_limit_rps()
    cost, rows = get_cost_model(None), []
    for share in shares:
        w = ao_workload(n, share * limit)
        point = equilibrium(fluid_types(w, share * limit), cost)
        for name in schedulers:
            m = _judged(w, name, AO_LIMITS, cost)
            rows.append({"study": "sweep", "n": n, "share": share, "rate_rps": share * limit, "fluid_limit_rps": limit,
                         "fluid_binding": why, "fluid_batch_s": point.batch_time_s if point else np.nan,
                         "scheduler": name, "throughput_rps": n / m["latency_s"], "e2e_mean_s": m["e2e_mean_s"],
                         "ttft_mean_s": m["ttft_mean_s"], "evictions": m["num_evictions"]})
    return pd.DataFrame(rows)


#: the new schedulers of issue 39 (items 1), reported against every registered one that existed before
NEW = ("mcsf", "wait", "nested-wait")
BOUND_OBJECTIVES = ("latency", "ttft", "e2e", "ttft_p99")
#: the earlier schedulers that were the best of all registered ones on some cell and objective of bound_bench
#: (README: its makespan and ttft / e2e / ttft_p99 tables), and the bound-guided ones: the candidates for "best
#: earlier"; a row where a new scheduler beats them all is checked against every registered one (``verify``)
EARLIER = ("vllm", "vllm-ef", "vllm-hy-la", "vllm-hy-ef", "vllm-real", "sarathi", "sarathi-la", "sarathi-nocp",
           "sarathi-nohy", "sarathi-real", "rank-i-ef", "rank-org-ef", "bound-ttft", "bound-e2e", "bound-e2e-ef")


def bound_cells(small: bool = False) -> list[tuple[str, Workload]]:
    """``benchmarks/bound_bench.py``'s cells: B = 1024, I in {16, 256, 1024}, O in {32, 1024}, and the two
    Splitwise traces (n = 2000), all at M = 100K, C = 4096 (``small``: B = 64 and n = 200)."""
    B, n = (64, 200) if small else (1024, 2000)
    cells = [(f"I={I},O={O}", Workload.from_spec(f"fixed:I={I},O={O},B={B}")) for I in (16, 256, 1024)
             for O in (32, 1024)]
    return cells + [(t, Workload.from_spec(f"trace:{t},n={n}")) for t in ("splitwise_conv", "splitwise_code")]


def bound_runs(small: bool = False, objectives=BOUND_OBJECTIVES, earlier=EARLIER, budgets: bool = True,
               cells: "tuple[str, ...] | None" = None, log_path: str | None = None) -> pd.DataFrame:
    """Per cell and objective: each new scheduler's value and certified gap, the best earlier scheduler (of
    ``earlier``, ``bound-e2e-ef`` also at bound_bench's prefill budgets; None: every registered one) and its gap;
    where a new one beats them, the row is checked against every registered scheduler (``verified``). ``cells``:
    only these labels; ``log_path``: each cell's rows are appended there as CSV as soon as they are measured."""
    from infermax.schedulers import available

    lim, cost, rows = Limits(M=100_000, C=4096), get_cost_model(None), []
    variants = [f"bound-e2e-ef:prefill_budget={k * lim.C // 32}" for k in (16, 12, 8, 6, 4, 3, 2)] if budgets else []
    names = [*NEW, *(available() if earlier is None else earlier), *variants]
    for label, w in bound_cells(small):
        if cells is not None and label not in cells:
            continue
        traces = _traces(w, names, lim, cost)
        block = []
        for objective in objectives:
            block += _bound_rows(label, w, objective, traces, lim, cost)
        if any(r["beats_all"] for r in block) and earlier is not None:      # check against every registered one
            traces.update(_traces(w, [n for n in available() if n not in traces], lim, cost))
            for r in block:
                if r["beats_all"]:
                    again = _bound_rows(label, w, r["objective"], traces, lim, cost, bound=r["bound"])
                    r["beats_all"] = next(x["beats_all"] for x in again if x["scheduler"] == r["scheduler"])
                    r["verified"] = True
        rows += block
        if log_path:
            pd.DataFrame(block).to_csv(log_path, mode="a", header=not Path(log_path).exists(), index=False)
    return pd.DataFrame(rows)


def _traces(w: Workload, names, lim: Limits, cost) -> dict:
    traces = {}
    for name in names:
        try:
            r = simulate(w, name, lim, cost)
        except ValueError:                 # refuses the instance (no chunked prefill, KV blocks)
            continue
        if name in NEW:
            assert replay(r.schedule, w, lim, cost) == r.trace, name
        traces[name] = r.trace
    return traces


def _bound_rows(label: str, w: Workload, objective: str, traces: dict, lim: Limits, cost,
                bound: float | None = None) -> list[dict]:
    from infermax.bounds import cheap_methods, lower_bound, parse_objective
    from infermax.bounds.objectives import trace_value

    obj = parse_objective(objective)
    values = {n: trace_value(obj, tr) for n, tr in traces.items()}
    old = {n: v for n, v in values.items() if n not in NEW}
    best = min(old, key=old.get)
    b = lower_bound(w, lim, cost, objective=objective, methods=cheap_methods(objective)).value if bound is None \
        else bound
    return [{"study": "bounds", "cell": label, "objective": objective, "scheduler": name, "value": values[name],
             "bound": b, "gap": (values[name] - b) / values[name], "best_existing": best,
             "best_existing_value": old[best], "best_existing_gap": (old[best] - b) / old[best],
             "beats_all": bool(values[name] < old[best] * (1 - 1e-9)), "verified": False} for name in NEW]


def cached(name: str, run, **params) -> pd.DataFrame:
    """``run(**params)``, or in a FULL run with ``INFERMAX_NOTEBOOK_CACHE`` set, the table an earlier FULL run of
    the same code kept there (:func:`findings.results_file`)."""
    from findings import results_file

    path = results_file(name)
    if path is not None and path.exists():
        return pd.read_parquet(path)
    df = run(**params)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        df.to_parquet(path)
    return df


#: the FULL run's parameters (the SMALL run's in ``SMALL``), one entry per block of the results table
FULL = {"ratio": dict(ns=(4, 5, 6), seeds=tuple(range(6)), time_limit_s=60.0, retry_s=240.0, retry_max_n=5),
        "gap": dict(ns=(16, 64, 256), seeds=tuple(range(3))),
        "real": dict(n=2000, time_scales=(1.0, 0.5, 0.25)),
        "sweep": dict(n=3000, shares=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25)),
        "bounds": dict(small=False)}
SMALL = {"ratio": dict(ns=(4,), seeds=(5,), time_limit_s=20.0),
         "gap": dict(ns=(16,), seeds=(0,)),
         "real": dict(n=100, time_scales=(1.0,), schedulers=("mcsf", "sarathi-la")),
         "sweep": dict(n=200, shares=(0.5, 1.25)),
         "bounds": dict(small=True, objectives=("e2e",), earlier=("sarathi", "sarathi-la"), budgets=False)}
RUNS = {"ratio": ratio_runs, "gap": gap_runs, "real": real_runs, "sweep": sweep_runs, "bounds": bound_runs}


def ratio_table(ratio: pd.DataFrame) -> pd.DataFrame:
    """Per mode and n: instances, proven optima, MC-SF / optimum mean and max over the proven ones."""
    r = ratio.assign(ratio=ratio["mcsf_s"] / ratio["optimum_s"])
    return r.groupby(["mode", "n"]).agg(instances=("seed", "size"), proven=("optimum_s", "count"),
                                        ratio_mean=("ratio", "mean"), ratio_max=("ratio", "max"),
                                        solver_cpu_s_max=("solver_cpu_s", "max")).reset_index()


def saturation(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per scheduler: the highest simulated throughput over the sweep (its capacity) and the load (share of the
    fluid limit) where the throughput first falls 5 % below the arrival rate; beside the fluid limit."""
    out = []
    for name, part in sweep.groupby("scheduler", sort=False):
        part = part.sort_values("share")
        behind = part[part["throughput_rps"] < 0.95 * part["rate_rps"]]
        out.append({"scheduler": name, "capacity_rps": part["throughput_rps"].max(),
                    "fluid_limit_rps": part["fluid_limit_rps"].iloc[0],
                    "first_behind_share": behind["share"].min() if len(behind) else np.nan})
    return pd.DataFrame(out).assign(capacity_over_fluid=lambda d: d["capacity_rps"] / d["fluid_limit_rps"])
