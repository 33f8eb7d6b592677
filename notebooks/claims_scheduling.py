"""InferMax's claims of §4.5-4.7 and App. A.3 (InferMax), measured on notebooks 04-06's results tables.

Notebook 04's table holds the heuristics and the two solver cells per I (``optimal``, ``optimal:no-eviction``,
with the solver's ``bound``); 05's adds ``R_max``; 06's has one row per (``mix``, ``B``, ranking). "Up to"
claims take the maximum over the grid the paper's statement is about; ratios are oriented so that > 1 is the
paper's direction.
"""
from __future__ import annotations

import pandas as pd
from claimlib import TIE, Claim, Effect, Missing, Near, Ordering, Ours, Share, cells, peak, registrar, steps, wide

CLAIMS: list[Claim] = []
claim = registrar(CLAIMS, paper="InferMax")


# --- 04: optimal schedules (§4.5) -------------------------------------------------------------------
NB4 = "04_optimal_evictions"
SHORT, LONG = (lambda i: i < 128), (lambda i: i >= 128)


def solved(df):
    lat = wide(df, "latency_s", "I", "scheduler")
    ev = wide(df, "num_evictions", "I", "scheduler")
    ef_bound = df[df["scheduler"] == "optimal:no-eviction"].set_index("I")["bound"]
    # the best schedule evicts, and is proven better than every eviction-free schedule
    proven = (ev["optimal"] > 0) & (lat["optimal"] < ef_bound.reindex(lat.index))
    return lat, ev, proven


def _select(index, keep):
    chosen = [i for i in index if keep(i)]
    if not chosen:
        raise Missing("no I on this side of 128")
    return chosen


@claim(NB4, "§4.5", "I < 128: the optimal schedule evicts (ours: proven faster than every eviction-free "
       "schedule)", Ordering())
def _(df):
    lat, ev, proven = solved(df)
    return cells(proven.loc[_select(lat.index, SHORT)])


@claim(NB4, "§4.5", "I < 128: evicting cuts latency vs the best eviction-free schedule, up to 35.2 %",
       Effect(lo=1 / (1 - 0.352), unit="%-"))
def _(df):
    lat, _, _ = solved(df)
    short = _select(lat.index, SHORT)
    r = (lat["optimal:no-eviction"] / lat["optimal"]).loc[short].rename_axis("I")
    return peak(r, "%-")


@claim(NB4, "§4.5", "I ≥ 128: the optimal schedule does not evict", Ordering(),
       "at I = 128 the best schedule found evicts (2 evictions) and is 3.7 % faster than the proven eviction-free "
       "optimum: with our fitted prefill cost, refilling a 128-token prompt is cheaper than waiting; the balance "
       "tips between 128 and 256")
def _(df):
    lat, ev, _ = solved(df)
    long_ = _select(lat.index, LONG)
    best_evicts = (ev["optimal"] > 0) & (lat["optimal"] < lat["optimal:no-eviction"])
    return cells(~best_evicts.loc[long_])


@claim(NB4, "§4.5", "I ≥ 128: eviction-free schedules beat evicting ones (ours: the eviction-free optimum vs "
       "evicting vLLM), up to 27.5 %", Effect(lo=1 / (1 - 0.275), unit="%-"))
def _(df):
    lat, ev, _ = solved(df)
    long_ = _select(lat.index, LONG)
    r = (lat["vllm"] / lat["optimal:no-eviction"]).loc[long_].rename_axis("I")
    out = peak(r, "%-")
    return out._replace(holds=out.holds and bool((ev["vllm"].loc[long_] > 0).all()))


@claim(NB4, "§4.5", "vLLM (I < 128) and vLLM-ef (I ≥ 128) come close to the optimum (ours: their largest gap "
       "to the best schedule found)",
       Share(hi=0.10, why="'close' read as within 10 % (direction: below this section's effects, 27.5 %)"),
       "vLLM-ef at I = 1024 is 10.7 % slower than the best schedule found (and at most 11.5 % slower than the "
       "certified eviction-free bound), just over the 10 % reading of 'close'; within 4 % at I = 128 .. 512")
def _(df):
    lat, _, _ = solved(df)
    best = lat[["optimal", "optimal:no-eviction"]].min(axis=1)
    near = pd.concat([lat["vllm"].loc[_select(lat.index, SHORT)], lat["vllm-ef"].loc[_select(lat.index, LONG)]])
    gap = near / best.loc[near.index] - 1
    return Ours(float(gap.max()), f"within {gap.max():.1%} (I = {gap.idxmax()})", holds=bool(gap.max() < 0.275))


# --- 05: R_max (§4.6, Fig. 11) ---------------------------------------------------------------------
NB5 = "05_rmax"


def tps_by_rmax(df, O):
    return wide(df[df["O"] == O], "tps", ["policy", "I"], "R_max")


@claim(NB5, "§4.6, Fig. 11", "O = 32: TPS keeps rising with R_max up to 512 (each scheduler and I)", Ordering(),
       "TPS dips exactly where a larger R_max starts evictions, once B (I + O) > M: vLLM at I = 256, 512, 1024 "
       "(by 5.8 %, 3.1 %, 1.0 %), Sarathi P=C at I = 256 (0.2 %)")
def _(df):
    return cells(steps(tps_by_rmax(df, 32), rising=True))


@claim(NB5, "§4.6, Fig. 11", "O = 1024: TPS peaks at R_max = 128 (ours: the median peak over schedulers and I)",
       Near(value=128, tol=0, why="the grid point itself: R_max doubles from one grid point to the next"),
       "our peak moves with I (larger for small I, smaller for large I), as the remark's M / (I + O) predicts; "
       "the direction (an interior peak) holds")
def _(df):
    tps = tps_by_rmax(df, 1024)
    best = tps.idxmax(axis=1)
    interior = (best > tps.columns.min()) & (best < tps.columns.max())
    return Ours(float(best.median()), f"median {best.median():g}; peaks at {sorted(set(best.astype(int)))}",
                holds=bool(interior.mean() > 0.5))


@claim(NB5, "§4.6, Fig. 11", "O = 1024: beyond the peak TPS falls (overload): TPS at R_max = 512 below the peak",
       Ordering())
def _(df):
    tps = tps_by_rmax(df, 1024)
    return cells(tps[tps.columns.max()] < tps.max(axis=1) * (1 - TIE))


@claim(NB5, "§4.6 remark", "the best R_max follows M / (I + O): lower for larger O (each I) and non-increasing "
       "in I (O = 1024)", Ordering(),
       "three cells: Sarathi at O = 32 and I = 256, 512, 1024 has its best R_max (64, 32, 32) below its O = 1024 "
       "one (128, 64, 64); not investigated")
def _(df):
    b32, b1024 = tps_by_rmax(df, 32).idxmax(axis=1), tps_by_rmax(df, 1024).idxmax(axis=1)
    along_I = b1024.unstack("I").astype(float)
    both = pd.concat({32: b32, 1024: b1024}, axis=1).dropna()
    return cells(pd.concat([both[32] >= both[1024], steps(along_I, rising=False, slack=TIE)]))


# --- 06: ranking heterogeneous requests (§4.7, App. A.3, Fig. 15-17) --------------------------------
NB6 = "06_ranking"


def rank_ratio(df, metric, num, den, mixes):
    w = wide(df, metric, ["mix", "B"], "scheduler")
    w = w[w.index.get_level_values("mix").isin(mixes)]
    if w.empty:
        raise Missing("mixes")
    return w[num] / w[den]


def mixes(df, lilo: bool | None = None, exclude: str | None = None):
    all_ = sorted(df["mix"].unique())
    return [m for m in all_ if m != exclude and (lilo is None or ("LILO" in m) == lilo)]


for _other, _x in (("rank-o", 1.3), ("rank-org", 1.4)):
    @claim(NB6, "App. A.3, Fig. 15", f"Rank_I's latency is up to {_x}x lower than {_other}'s (largest on "
           "SILO+LILO, frequent evictions)", Effect(lo=_x),
           "the evictions Rank_I avoids are of SILO requests, whose refill is at most ~1K tokens of cheap prefill "
           "in our fitted model, while the makespan is set by the LILO decodes that every ranking runs at the "
           "same rate")
    def _(df, _other=_other, _x=_x):
        return peak(rank_ratio(df, "latency_s", _other, "rank-i", mixes(df)), majority=False)

for _other, _x in (("rank-o", 3), ("rank-org", 2)):
    @claim(NB6, "App. A.3, Fig. 16", f"Rank_I's TTFT is up to {_x}x lower than {_other}'s (mixes but LISO+LILO)",
           Effect(lo=_x))
    def _(df, _other=_other, _x=_x):
        return peak(rank_ratio(df, "ttft_mean_s", _other, "rank-i", mixes(df, exclude="LISO+LILO")),
                    majority=False)


@claim(NB6, "App. A.3, Fig. 16", "Rank_I has the lowest TTFT on every mix but LISO+LILO (every B)", Ordering(),
       "on SISO+LILO both Rank_I and Rank_O run all SISO requests first; inside each group shortest-output-first "
       "frees KV sooner, so the waiting LILO requests start earlier")
def _(df):
    ttft = wide(df, "ttft_mean_s", ["mix", "B"], "scheduler")
    ttft = ttft[ttft.index.get_level_values("mix").isin(mixes(df, exclude="LISO+LILO"))]
    return cells(ttft["rank-i"] <= ttft.min(axis=1) * (1 + TIE))


@claim(NB6, "App. A.3, Fig. 16", "LISO+LILO: Rank_O has the lowest TTFT (every B)", Ordering(),
       "Rank_O is lowest only from B = 256 on; for B <= 128 the prompts of the whole mix fit in M at once "
       "(B x mean I = 128 x 768 ~ 98K <= 100K), so no request waits for KV and shortest-input-first (Rank_I) "
       "gives the lowest mean TTFT")
def _(df):
    ttft = wide(df[df["mix"] == "LISO+LILO"], "ttft_mean_s", "B", "scheduler")
    return cells(ttft["rank-o"] <= ttft.min(axis=1) * (1 + TIE))


for _other, _x in (("rank-i", 1.6), ("rank-org", 2.1)):
    @claim(NB6, "App. A.3, Fig. 16", f"LISO+LILO: Rank_O's TTFT up to {_x}x lower than {_other}'s", Effect(lo=_x))
    def _(df, _other=_other, _x=_x):
        return peak(rank_ratio(df, "ttft_mean_s", _other, "rank-o", ["LISO+LILO"]), majority=False)

for _other in ("rank-o", "rank-org"):
    @claim(NB6, "App. A.3, Fig. 17", f"mixes with LILO: Rank_I's TPOT up to 1.3x lower than {_other}'s",
           Effect(lo=1.3), "a smaller TPOT gain than the paper's; not investigated")
    def _(df, _other=_other):
        return peak(rank_ratio(df, "tpot_mean_s", _other, "rank-i", mixes(df, lilo=True)),
                    majority=False)

for _other, _x in (("rank-i", 1.7), ("rank-org", 1.3)):
    @claim(NB6, "App. A.3, Fig. 17", f"mixes without LILO: Rank_O's TPOT up to {_x}x lower than {_other}'s",
           Effect(lo=_x), "a smaller TPOT gain than the paper's; not investigated")
    def _(df, _other=_other, _x=_x):
        return peak(rank_ratio(df, "tpot_mean_s", _other, "rank-o", mixes(df, lilo=False)),
                    majority=False)
