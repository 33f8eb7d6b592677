"""InferMax's claims checked on the real vLLM engine (notebook 12, issue 37).

The results table (``figures/12_real_vllm_results.csv``, built by ``vllm_data.results``) has one row per
measured thing, by ``kind``:

- ``fidelity``: per catalogue case, ``value`` = the share (%) of vLLM's recorded steps the ``vllm-v1`` preset
  makes identically (lockstep arrivals);
- ``timing``: per case and ``metric`` (ttft, e2e), ``value`` = the held-out relative error of the mean predicted
  from vLLM's schedule under the linear model fitted to the other cases' CPU step times;
- ``ratio``: per comparison (``case``), ``baseline`` / ``schedule`` (the candidate) and ``metric``, the ratio
  ``predicted`` by the fitted model and measured on vLLM (``cpu_median``, ``cpu_min``, ``cpu_max`` over the
  alternated rounds; ``wall_*`` the same on the engine clock);
- ``gap``: per case, schedule and objective (``metric``), the certified gap (%) under the fitted model.
"""
from __future__ import annotations

import numpy as np
from claimlib import Claim, Effect, Missing, Ordering, Ours, Share, cells, fmt_factor, registrar

CLAIMS: list[Claim] = []
NB12 = "12_real_vllm"
claim = registrar(CLAIMS, paper="InferMax", notebook=NB12)


def _kind(df, kind: str):
    out = df[df["kind"] == kind]
    if out.empty:
        raise Missing(kind)
    return out


def _ratio(df, case: str, baseline: str, candidate: str, metric: str):
    r = _kind(df, "ratio")
    r = r[(r["case"] == case) & (r["baseline"] == baseline) & (r["schedule"] == candidate) & (r["metric"] == metric)]
    if r.empty:
        raise Missing(f"{case}: {baseline} / {candidate} ({metric})")
    return r.iloc[0]


@claim("§4.1", "the vLLM scheduler InferMax simulates is vLLM's (ours: the vllm-v1 preset against vLLM 0.32's "
       "recorded schedules, catalogue cases with every step identical)", Ordering(),
       "not every recorded case is made step for step by the preset")
def _(df):
    f = _kind(df, "fidelity")
    return cells(f["value"] >= 100.0)


@claim("App. A.2", "InferMax's times are within 30 % of the real system's (its relative error reaches 30 %; ours: "
       "mean TTFT and e2e predicted from vLLM's recorded schedules under the model fitted to the other cases' CPU "
       "step times, the largest held-out error)", Share(hi=0.30),
       "one case, mixed-preempt-b (the only case of its engine), ran its steps markedly cheaper than the model fitted "
       "on the others (+62 % e2e, 217 % median step error); every other mean is within 17.6 %, the median error is "
       "7.7 %: the held-out error of a mean is 30 % or less on most cases, not all")
def _(df):
    t = _kind(df, "timing")
    err = t["value"].abs()
    worst = t.loc[err.idxmax()]
    within = float((err <= 0.30).mean())
    return Ours(float(err.max()), f"max {err.max():.1%} ({worst['case']}, {worst['metric']}); "
                f"median {err.median():.1%}; {int((err <= 0.30).sum())}/{len(err)} within 30 %", holds=within > 0.5)


@claim("§4.5", "I < 128: evicting cuts latency vs the best eviction-free schedule, up to 35.2 % (ours: on vLLM, "
       "the solver's evicting plan against its eviction-free plan, both executed step for step, CPU clock)",
       Effect(lo=1 / (1 - 0.352), unit="%-"),
       "the paper's cut is the largest over its grid (O = B = 4, I = 1 .. 64); ours is one CPU-sized cell (I = 8, "
       "O = 40, 6 requests, 6 blocks of 32), where the cost model fitted to vLLM's CPU steps predicts a 24.9 % cut "
       "and vLLM measures a smaller one (median of 5 alternated rounds; on a machine shared with ~10 other jobs one "
       "round measured the eviction-free plan faster: the rounds spread widely)")
def _(df):
    r = _ratio(df, "evict-vs-ef", "optimal-ef", "optimal", "makespan")
    return Ours(float(r["cpu_median"]), f"{fmt_factor(r['cpu_median'], '%-')} (median of {int(r['reps'])} rounds, "
                f"{fmt_factor(r['cpu_min'], '%-')} .. {fmt_factor(r['cpu_max'], '%-')}; predicted "
                f"{fmt_factor(r['predicted'], '%-')})", holds=bool(r["cpu_median"] > 1))


@claim("§4.5", "vLLM comes close to the optimum (ours: measured on vLLM, its own schedule against the solver's plan "
       "executed step for step, CPU clock, makespan)",
       Share(hi=0.10, why="'close' read as within 10 %, either way (a measured difference below the rounds' spread "
                          "is no difference)"))
def _(df):
    r = _ratio(df, "evict-vs-ef", "vllm", "optimal", "makespan")
    gap = float(r["cpu_median"]) - 1
    return Ours(abs(gap), f"{gap:+.1%} (median of {int(r['reps'])} rounds, {r['cpu_min'] - 1:+.1%} .. "
                f"{r['cpu_max'] - 1:+.1%}; predicted {r['predicted'] - 1:+.1%})")


@claim("§3.3", "the CSP directs us toward better schedules: the one the model predicts faster is faster on the real "
       "engine (ours: every pair and metric whose predicted ratio exceeds 1.05, its median measured ratio on vLLM's "
       "CPU clock)", Ordering(),
       "a predicted gain is not measured on vLLM in every pair: see the ratio table of notebook 12")
def _(df):
    r = _kind(df, "ratio")
    r = r[r["predicted"] > 1.05]
    if r.empty:
        raise Missing("no pair predicted faster by 5 %")
    return cells(np.asarray(r["cpu_median"] > 1.0))
