"""Medha's capacity claims (Medha §5.2, Figs. 15–16): Medha vs LoongServe vs Sarathi under load.

:func:`run_capacity` runs the sweep of ``benchmarks/medha_capacity.py`` (7 loads × the
systems, Llama-3 8B on 16 A100s, 5 % long requests, an hour of arrivals measured over
that hour) at a ``scale`` of the hour; :func:`capacity_figure` draws Figs. 15–16 as
curves over the load; :func:`capacity_claims` measures the claims below on the
results and returns their rows in the findings format (``claimlib``). The claims are
registered for notebook 09 (``CLAIMS``); its results table must hold the sweep's
rows (columns ``rate``, ``policy`` = system, and the window metrics).

A median TTFT beyond the window (more than half the requests without a first token
by its end) is ``inf``; the ratios then use ``ttft_p50_lb_s``, a lower bound of that
median (each censored TTFT replaced by window end − arrival), and say so (``≥``).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
from claimlib import Claim, Effect, Missing, Near, Ordering, Ours, cells, comparable, fmt_factor, registrar, wide

sys.path.append(str(Path(__file__).resolve().parents[1] / "benchmarks"))    # the experiment's config lives there
from medha_capacity import LOADS_RPS, WINDOW_S, capacity_config

CLAIMS: list[Claim] = []
NB9 = "09_medha"
medha = registrar(CLAIMS, paper="Medha", notebook=NB9)


# --- the sweep, the figure, the rows ---------------------------------------------------------------------------
def run_capacity(scale: float = 1.0, systems: "Mapping[str, Mapping[str, Any]] | None" = None,
                 loads: Sequence[float] = LOADS_RPS, executor: str = "local", workers: int = 2,
                 out: Any = None, seed: int = 0, long_fracs: Sequence[float] = (0.05, 0.0)) -> pd.DataFrame:
    """The capacity sweep over ``scale`` × an hour (arrivals and window), one row per (mix, load, system):
    ``long_fracs`` 0.05 for Figs. 15(b)/16(b), 0 (short requests only) for 15(a)/16(a)."""
    import infermax

    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 < scale <= 1:
        raise ValueError(f"run_capacity: scale must be in (0, 1] (a share of the hour), got {scale!r}")
    cfg = capacity_config(loads, systems, WINDOW_S * scale, long_fracs, seed=seed)
    df = infermax.sweep(cfg, out=out, executor=executor, workers=workers, resume=out is not None)
    if df["error"].notna().any():
        bad = df[df["error"].notna()].iloc[0]
        raise RuntimeError(f"capacity sweep: {bad['policy']} at {bad['workload']} failed: {bad['error']}")
    return df


def _mix(df: pd.DataFrame, long_frac: float) -> pd.DataFrame:
    """The rows of the mix with ``long_frac`` long requests (:class:`Missing` if the sweep has none)."""
    out = df[np.isclose(df["long_frac"].astype(float), long_frac)] if "long_frac" in df else df.iloc[:0]
    if out.empty:
        raise Missing(f"no cells with long_frac = {long_frac:g}")
    return out


def _median_ttft(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(median TTFT per load × system, with a censored one replaced by its lower bound; True where it was)."""
    t = wide(df, "ttft_p50_s", "rate")
    lb = wide(df, "ttft_p50_lb_s", "rate") if "ttft_p50_lb_s" in df else t
    censored = ~np.isfinite(t)
    return t.where(~censored, lb), censored


def capacity_figure(df: pd.DataFrame):
    """Fig. 15 (median TTFT), the share served in the hour and Fig. 16 (median TPOT) over the load, one colour
    per system; solid: 5 % long requests, dashed: short requests only (when the sweep has them)."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    colours: dict[str, str] = {}
    for frac, style in ((0.05, "-"), (0.0, "--")):
        try:
            part = _mix(df, frac)
        except Missing:
            continue
        med, censored = _median_ttft(part)
        served, tpot = wide(part, "served_fraction", "rate"), wide(part, "tpot_p50_s", "rate")
        for name in med.columns:
            label = f"{name}{'' if frac else ' (short only)'}"
            line, = axes[0].plot(med.index, med[name], style, marker="o", label=label, color=colours.get(name))
            colours[name] = line.get_color()
            cut = censored[name]
            if cut.any():       # beyond the window: a lower bound, drawn hollow
                axes[0].plot(med.index[cut], med[name][cut], "o", mfc="white", color=colours[name])
            axes[1].plot(served.index, served[name], style, marker="o", color=colours[name])
            axes[2].plot(tpot.index, tpot[name] * 1e3, style, marker="o", color=colours[name])
    axes[0].set(title="median TTFT (hollow: ≥, beyond the hour)", ylabel="s", yscale="log")
    axes[1].set(title="requests with a first token in the hour", ylim=(0, 1.05))
    axes[2].set(title="median decode latency (TPOT)", ylabel="ms", yscale="log")
    for ax in axes:
        ax.set_xlabel("load, requests/s")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Llama-3 8B on 16 A100s (Medha Figs. 15-16)")
    fig.tight_layout()
    return fig


def capacity_claims(df: pd.DataFrame) -> pd.DataFrame:
    """The claims of this module measured on ``df`` (the findings rows, with ``holds``)."""
    from findings import COLUMNS

    return pd.DataFrame([c.evaluate(df) for c in CLAIMS], columns=COLUMNS + ["holds"])


# --- the claims ------------------------------------------------------------------------------------------------
def _ratio_text(r: float, num: float, den: float, censored: bool, where: str) -> str:
    ge = "≥ " if censored else ""
    return f"{ge}{fmt_factor(r, 'x')} ({where}: LoongServe {ge}{num:.4g} s, Medha {den:.4g} s)"


@medha("§1, Fig. 1(a)", "With 5 % long requests LoongServe's TTFT is 30-174x Medha's", Effect(lo=30.0, hi=174.0),
       "Fig. 1 does not state its load; ours is the median TTFT at the lowest load of the sweep (0.25 req/s), where "
       "LoongServe still serves most requests within the hour")
def _(df: pd.DataFrame) -> Ours:
    med, censored = _median_ttft(_mix(df, 0.05))
    at = min(med.index)
    num, den = float(med.loc[at, "loongserve"]), float(med.loc[at, "medha"])
    return Ours(num / den, _ratio_text(num / den, num, den, bool(censored.loc[at, "loongserve"]), f"{at:g} req/s"))


@medha("§5.2, Fig. 15(b)", "With 5 % long requests Medha's median TTFT is up to 30x lower than LoongServe's",
       Effect(lo=30.0),
       "in infermax's A100 cost model a 1M-token prefill of Llama-3 8B takes ≈ 350 s on TP 8 × PP 2 (PP priced as "
       "latency) and ≈ 230 s on LoongServe's six-instance striped ring: the 5 % long requests alone exceed the "
       "16 GPUs' "
       "prefill capacity from the lowest load on, so every system builds a backlog; Medha's slack-first scheduler "
       "keeps short requests moving past it (96-97 % served in the hour at every load) while LoongServe's "
       "first-come-first-served gangs queue them behind every long prefill (78 % served at 0.25 req/s, 12 % at "
       "1.75): the gap is larger than the paper's")
def _(df: pd.DataFrame) -> Ours:
    med, censored = _median_ttft(_mix(df, 0.05))
    ratio = (med["loongserve"] / med["medha"]).replace([np.inf, -np.inf], np.nan).dropna()
    if ratio.empty:
        raise Missing("no load with a finite Medha median")
    at = ratio.idxmax()
    text = _ratio_text(float(ratio[at]), float(med.loc[at, "loongserve"]), float(med.loc[at, "medha"]),
                       bool(censored.loc[at, "loongserve"]), f"{at:g} req/s")
    return Ours(float(ratio[at]), text + f"; > 1 at {int((ratio > 1).sum())}/{len(ratio)} loads",
                holds=bool((ratio > 1).mean() > 0.5))


@medha("§5.2, Fig. 15(b)", "At 0.75 QPS Medha's median TTFT is 30x lower than LoongServe's", Effect(lo=30.0),
       "see the claim above: at 0.75 requests/s our LoongServe is far beyond its capacity (its median request gets "
       "no first token within the hour; the ratio is a lower bound) while Medha serves short requests in seconds")
def _(df: pd.DataFrame) -> Ours:
    med, censored = _median_ttft(_mix(df, 0.05))
    if 0.75 not in med.index:
        raise Missing("no 0.75 req/s cell")
    num, den = float(med.loc[0.75, "loongserve"]), float(med.loc[0.75, "medha"])
    return Ours(num / den, _ratio_text(num / den, num, den, bool(censored.loc[0.75, "loongserve"]), "0.75 req/s"))


@medha("§5.2, Fig. 15(b)", "Sarathi (TP 8, PP 2) degrades quickly with load (HOL blocking): its median TTFT is "
       "above Medha's at every load", Ordering(),
       "Sarathi serves prefills first come, first served in 512-token chunks: a short request behind a 1M-token "
       "prompt waits for all of its chunks")
def _(df: pd.DataFrame) -> Ours:
    med, _ = _median_ttft(_mix(df, 0.05))
    return cells(med["sarathi"] > med["medha"])


@medha("§5.2, Fig. 16(b)", "With long requests Medha's decode latency (median TPOT) is comparable to or better than "
       "LoongServe's and Sarathi's", Ordering(),
       "our `medha` scheduler sizes every chunk to fill its batch-time target (0.2 s without a TPOT SLO), so every "
       "decode sharing a batch with a long prefill chunk waits that long; LoongServe decodes on dedicated "
       "instances and Sarathi's 512-token chunks are short")
def _(df: pd.DataFrame) -> Ours:
    t = wide(_mix(df, 0.05), "tpot_p50_s", "rate")
    return cells(t["medha"] <= 1.25 * t[["loongserve", "sarathi"]].min(axis=1))


@medha("§5.2, Fig. 16(b)", "Sarathi's TPOT reaches about 1 s (static chunks over long sequences)",
       Near(value=1.0, tol=0.5, why="'as high as 1 second': the largest p99 TPOT, ±50 %"),
       "a 512-token chunk at 1M cached tokens takes 0.36 s in our A100 model (TP 8 × PP 2), but a short request's "
       "TPOT averages all its decode steps, few of which share a batch with a late chunk of a long prompt, and the "
       "long requests that would see it every step rarely complete within the hour")
def _(df: pd.DataFrame) -> Ours:
    t = wide(_mix(df, 0.05), "tpot_p99_s", "rate")["sarathi"].dropna()
    if t.empty:
        raise Missing("no Sarathi TPOT")
    return Ours(float(t.max()), f"{t.max():.3g} s p99 at {t.idxmax():g} req/s")


@medha("§5.2, Fig. 16(a)", "Without long requests LoongServe's decode latency (TPOT) is about 5x Medha's, even at "
       "high load (resource fragmentation)", Effect(lo=5.0),
       "without long requests nothing queues at these loads (every system serves every request in the hour, "
       "medians of tens of ms): LoongServe's decodes run on TP 2 instances (≈ 8.4 ms a token), Medha's on TP 8 "
       "(≈ 5.8 ms); the fragmentation the paper sees needs a load that fills the GPUs")
def _(df: pd.DataFrame) -> Ours:
    t = wide(_mix(df, 0.0), "tpot_p50_s", "rate")
    top = max(t.index)
    r = float(t.loc[top, "loongserve"] / t.loc[top, "medha"])
    return Ours(r, f"{fmt_factor(r, 'x')} at {top:g} req/s (LoongServe {t.loc[top, 'loongserve'] * 1e3:.3g} ms, "
                   f"Medha {t.loc[top, 'medha'] * 1e3:.3g} ms)")


@medha("§5.2, Fig. 15(a)", "Without long requests all systems have comparable median TTFT at 0.25 QPS",
       comparable(),
       "with short requests only nothing queues: a median is one prompt's prefill, on TP 8 (Medha ≈ 24 ms; Sarathi "
       "≈ 34 ms, in 512-token chunks) or on one TP 2 instance (LoongServe ≈ 46 ms); within 2x, outside our "
       "one reading of 'comparable' (within 25 %)")
def _(df: pd.DataFrame) -> Ours:
    t = wide(_mix(df, 0.0), "ttft_p50_s", "rate")
    low = t.loc[min(t.index)]
    r = float(low.max() / low.min())
    return Ours(r, f"{r:.3g}x ({', '.join(f'{k} {v:.3g} s' for k, v in low.items())})",
                holds=None)


__all__ = ["CLAIMS", "capacity_claims", "capacity_figure", "run_capacity"]
