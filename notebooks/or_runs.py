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


def ratio_runs(ns=(4, 6, 8), seeds=range(6), time_limit_s: float = 120.0) -> pd.DataFrame:
    """MC-SF / optimum per instance (rows with status != optimal keep the solver's bound, no ratio)."""
    from infermax import solve_optimal

    cost, rows = get_cost_model("unit"), []
    for online in (False, True):
        for n in ns:
            for seed in seeds:
                w = synthetic(n, seed, online)
                mc = _judged(w, "mcsf", UNIT_LIMITS, cost)["e2e_mean_s"]
                t0 = time.process_time()
                opt = solve_optimal(w, UNIT_LIMITS, cost, objective="completion", time_limit_s=time_limit_s,
                                    policy=RATIO_POLICY)
                rows.append({"study": "ratio", "mode": "online" if online else "offline", "n": n, "seed": seed,
                             "mcsf_s": mc, "optimum_s": opt.objective if opt.is_optimal else np.nan,
                             "bound_s": opt.bound, "status": str(opt.status), "solver_cpu_s": time.process_time() - t0})
    return pd.DataFrame(rows)


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


REAL_SCHEDULERS = ("mcsf", "sarathi-la", "sarathi-ef", "vllm-la", "sarathi", "bound-e2e-ef")


def real_runs(n: int = 2000, schedulers=REAL_SCHEDULERS) -> pd.DataFrame:
    """The Splitwise conversation trace on Llama-2-70B / A100 TP 2: mean latency per scheduler."""
    cost = get_cost_model(REAL_COST)
    lim = Limits(M=kv_capacity_tokens("llama2-70b", "a100", tp=2), C=4096)
    w = Workload.from_spec(f"trace:splitwise_conv,n={n}")
    rows = []
    for name in schedulers:
        m = _judged(w, name, lim, cost)
        rows.append({"study": "real", "n": n, "M": lim.M, "scheduler": name, "e2e_mean_s": m["e2e_mean_s"],
                     "ttft_mean_s": m["ttft_mean_s"], "evictions": m["num_evictions"]})
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
