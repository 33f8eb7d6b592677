"""Medha's 3D-parallelism claims (Medha §3.3–3.5, §5.3), measured on notebook 09's results.

The results table (notebooks/medha_runs.py) has one row per cluster run, column ``experiment`` one of
``kvp`` (Fig. 11), ``spp`` (Fig. 9), ``spp_decode`` (Fig. 10), ``prefill_128`` (Figs. 7–8), ``tradeoff``
(Fig. 13) and ``3d`` (Figs. 17–18). Every run executes its plan in the cluster engine (infermax/cluster/plans.py);
the KVP merge term of the cost model was calibrated to Fig. 11 (costmodel/parallel.py), so the Fig. 11 rows check
that the executed plan reproduces what the calibration priced, the other rows are predictions.
"""
from __future__ import annotations

import pandas as pd
from claimlib import Claim, Effect, Missing, Near, Ordering, Ours, Share, cells, comparable, fmt_factor, registrar

CLAIMS: list[Claim] = []
NB9 = "09_medha"
CALIBRATED = ("the KVP merge term of the cost model was calibrated on this figure (costmodel/parallel.py): the "
              "executed plan reproduces what the calibration priced, a consistency check, not a prediction")
medha = registrar(CLAIMS, paper="Medha", notebook=NB9)


def block(df: pd.DataFrame, experiment: str) -> pd.DataFrame:
    return df[df["experiment"] == experiment]


def _tpot(df: pd.DataFrame, context: int, kvp: int) -> float:
    b = block(df, "kvp")
    return float(b[(b["context"] == context) & (b["kvp"] == kvp)]["tpot_s"].iloc[0])


def _kvp_ratio(df: pd.DataFrame, context: int, k: int) -> Ours:
    t1, tk = _tpot(df, context, 1), _tpot(df, context, k)
    return Ours(t1 / tk, f"{fmt_factor(t1 / tk, 'x')} ({t1 * 1e3:.1f} -> {tk * 1e3:.1f} ms)")


@medha("§3.5, Fig. 11c", "KVP 1 -> 4 cuts the TPOT of a 4M-token decode by 1.7x (Llama-3 8B, TP 8, SPP 4)",
       Effect(lo=1.7), construction=CALIBRATED)
def _(df):
    return _kvp_ratio(df, int(block(df, "kvp")["context"].min()), 4)


@medha("§3.5, Fig. 11c", "...and of a 10M-token decode by 2.5x", Effect(lo=2.5), construction=CALIBRATED)
def _(df):
    return _kvp_ratio(df, int(block(df, "kvp")["context"].max()), 4)


@medha("§3.5, Fig. 11c", "KVP 2 cuts the TPOT of a 10M-token decode by almost 40 %",
       Effect(lo=1 / (1 - 0.4), unit="%-"), construction=CALIBRATED)
def _(df):
    r = _kvp_ratio(df, int(block(df, "kvp")["context"].max()), 2)
    return r._replace(text=f"{fmt_factor(r.value, '%-')} ({r.text.split(' ', 1)[1]})")


@medha("§3.3, Fig. 9a", "SPP cuts TTFT near-linearly: 80 %+ scaling efficiency up to 16 stages (1M tokens, TP 8, "
       "4K chunks; ours: TTFT(1) / (16 TTFT(16)))", Share(lo=0.8, hi=1.0))
def _(df):
    b = block(df, "spp")
    b = b[(b["context"] == b["context"].min()) & b["feasible"].astype(bool)].set_index("spp")["ttft_s"]
    p = int(b.index.max())
    eff = float(b[1] / (p * b[p]))
    return Ours(eff, f"{eff:.0%} at SPP {p} ({b[1]:.1f} s -> {b[p]:.2f} s)")


@medha("§3.3, Fig. 9a", "the 10M-token prompt does not fit the plans with few stages (red crosses); with enough it "
       "scales as well (ours: 10M rows refused by the engine, efficiency from the fewest stages that fit)", Ordering())
def _(df):
    b = block(df, "spp")
    b = b[b["context"] >= 10_000_000]
    if b.empty:
        raise Missing("no 10M-token rows")
    ok = b[b["feasible"].astype(bool)].set_index("spp")["ttft_s"]
    refused = sorted(int(s) for s in b[~b["feasible"].astype(bool)]["spp"])
    if ok.empty:
        return Ours(0.0, "no plan held it")
    lo, hi = int(ok.index.min()), int(ok.index.max())
    eff = float(ok[lo] * lo / (hi * ok[hi]))
    o = cells(pd.Series([bool(refused), eff >= 0.8]))
    return o._replace(text=f"{o.text}: refused at SPP {refused}; SPP {lo} -> {hi}: {eff:.0%} efficiency")


@medha("§3.3, Fig. 8", "Medha 2D (SPP + TP) prefills 1M tokens on 128 H100s in under 15 s (4K chunks; ours: TP 8, "
       "SPP 16)", Ordering())
def _(df):
    b = block(df, "spp")
    b = b[(b["context"] == 1_000_000) & (b["spp"] == 16)]
    if b.empty:
        raise Missing("no 1M-token SPP 16 row")
    t = float(b["ttft_s"].iloc[0])
    return cells(pd.Series([t < 15]))._replace(text=f"{t:.2f} s")


def _prefill_128(df: pd.DataFrame) -> pd.Series:
    b = block(df, "prefill_128")
    if b.empty:
        raise Missing("no 128-GPU prefill rows")
    return b.set_index("plan")["ttft_s"]


@medha("§3.3, Fig. 7", "SPP cuts a long prefill's latency against standard PP, whose chunks of one request cannot "
       "overlap across stages (ours: 1M tokens, TP 8, 16 stages)", Ordering())
def _(df):
    t = _prefill_128(df)
    o = cells(pd.Series([t["SPP 16"] < t["PP 16"]]))
    return o._replace(text=f"{o.text}: PP {t['PP 16']:.1f} s, SPP {t['SPP 16']:.2f} s "
                           f"({fmt_factor(t['PP 16'] / t['SPP 16'], 'x')})")


@medha("§3.3, Fig. 8", "Medha 2D (SPP + TP) prefills 1M tokens up to 1.64x faster than context parallelism on 128 "
       "H100s (ours: ring SP 16 × TP 8, the prompt in one pass, vs SPP 16 × TP 8 in 4K chunks)", Effect(lo=1.64),
       "our context parallelism is the cost model's ring-SP price (each layer's KV rotation overlapped with the "
       "attention it feeds, max of the two), with no measured loss at 16 nodes; the paper measured CP's scaling "
       "loss on its cluster. SPP pays its per-chunk overheads and pipeline fill, so ours is slower than that CP")
def _(df):
    t = _prefill_128(df)
    r = float(t["CP (ring SP 16)"] / t["SPP 16"])
    return Ours(r, f"{fmt_factor(r, 'x')} (CP {t['CP (ring SP 16)']:.2f} s, SPP {t['SPP 16']:.2f} s)")


@medha("§3.3, Fig. 10a", "decode latency is only marginally affected by SPP, even with 16 stages (2M tokens, TP 8; "
       "ours: TPOT(16) / TPOT(1))", Near(value=1.0, tol=0.05, why="'marginally' read as within 5 %"))
def _(df):
    b = block(df, "spp_decode").set_index("spp")["tpot_s"]
    p = int(b.index.max())
    r = float(b[p] / b[1])
    return Ours(r, f"{fmt_factor(r, '%+')} ({b[1] * 1e3:.2f} -> {b[p] * 1e3:.2f} ms)")


@medha("§3.5, Fig. 13", "a larger chunk lowers the long request's TTFT and raises the TPOT of the decodes batched "
       "with it (TP 4, SPP 4; ours: every KVP degree, each step to the next chunk size)", Ordering())
def _(df):
    b = block(df, "tradeoff").sort_values(["kvp", "chunk"])
    steps = []
    for _, g in b.groupby("kvp"):
        steps += list((g["ttft_s"].diff().iloc[1:] < 0) & (g["tpot_s"].diff().iloc[1:] > 0))
    return cells(pd.Series(steps))


@medha("§3.4, Fig. 13", "with a 4M-token prompt, even 128-token chunks push the P95 decode latency of the requests "
       "batched with it to almost 100 ms (TP 4, SPP 4; the paper names no KVP degree: ours at KVP 1, the others shown)",
       Near(value=0.1, tol=0.25, why="'almost 100 ms' read as within 25 %"),
       "without KVP the 4M-token KV read of every 128-token chunk costs ours ~3x that; KVP 4 brings it to ~100 ms "
       "(the paper's sentence may refer to a KVP plan)")
def _(df):
    b = block(df, "tradeoff")
    b = b[(b["context"] >= 4_000_000) & (b["chunk"] == 128)].set_index("kvp")["tpot_p95_s"]
    if 1 not in b.index:
        raise Missing("no 4M-token, 128-token-chunk row")
    others = ", ".join(f"KVP {int(k)}: {v * 1e3:.0f} ms" for k, v in b.items() if k != 1)
    return Ours(float(b[1]), f"{b[1] * 1e3:.0f} ms ({others})")


@medha("§3.5, Fig. 13", "at a fixed chunk size, more KVP lowers both TTFT and TPOT in most cases (ours: each step "
       "to the next KVP degree)", Ordering())
def _(df):
    b = block(df, "tradeoff").sort_values(["chunk", "kvp"])
    steps = []
    for _, g in b.groupby("chunk"):
        steps += list((g["ttft_s"].diff().iloc[1:] < 0) & (g["tpot_s"].diff().iloc[1:] < 0))
    return cells(pd.Series(steps))


def _plans(df: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(2D, 3D) under the medha replica scheduler (adaptive chunks, slack priority), as in the paper."""
    b = block(df, "3d")
    if "scheduler" in b:
        b = b[b["scheduler"] == "medha"]
    return b[b["kvp"] == 1].iloc[0], b[b["kvp"] > 1].iloc[0]


ADAPTIVE = ("the medha replica scheduler sizes each chunk so that the predicted latency of a batched decode — one "
            "whole pass through the stages — stays within its 0.2 s target, so both plans hold TPOT near that "
            "target and 3D's faster attention shows up as faster prefills (lower TTFT) instead; the paper's "
            "Medha evidently let 2D's decodes run slower")


@medha("§5.3, Fig. 18", "3D (TP 8, SPP 4, KVP 2) cuts the P50 TPOT 2x vs 2D (TP 8, SPP 8): Llama-3 70B, 64 H100s, "
       "5 % 2M-token requests, 1.75 QPS", Effect(lo=2.0), ADAPTIVE)
def _(df):
    two, three = _plans(df)
    r = float(two["tpot_p50_s"] / three["tpot_p50_s"])
    return Ours(r, f"{fmt_factor(r, 'x')} ({two['tpot_p50_s']:.3f} -> {three['tpot_p50_s']:.3f} s)")


@medha("§5.3, Fig. 18", "...and the P90 TPOT 2x", Effect(lo=2.0), ADAPTIVE)
def _(df):
    two, three = _plans(df)
    r = float(two["tpot_p90_s"] / three["tpot_p90_s"])
    return Ours(r, f"{fmt_factor(r, 'x')} ({two['tpot_p90_s']:.3f} -> {three['tpot_p90_s']:.3f} s)")


@medha("§5.3, Fig. 17", "2D and 3D keep comparable TTFT (ours: P50 TTFT, 3D / 2D)",
       comparable(), ADAPTIVE)
def _(df):
    two, three = _plans(df)
    r = float(three["ttft_p50_s"] / two["ttft_p50_s"])
    return Ours(r, f"{r:.2f} ({two['ttft_p50_s']:.2f} s 2D, {three['ttft_p50_s']:.2f} s 3D)")
