"""Figures in the styles of InferMax §4 (matplotlib, Agg; every function returns the Figure).

- :func:`metric_grid`  a metric vs I, one line per scheduler, one panel per O
  (rows: several metrics, or a second facet such as M) — Fig. 5, 8, 9, 11, 12, 15;
- :func:`tradeoff`     TTFT against TPOT, one marker series per scheduler;
- :func:`kv_usage`     KV tokens held over time, one line per run, M dashed;
- :func:`evictions`    cumulative evictions over time, one line per run;
- :func:`gantt`        requests x batches of a small schedule, coloured by what each
  request does in each batch (prefill, decode, refill, evicted, holding KV).

The table functions take a sweep results table (:mod:`infermax.sweep`); rows with
an ``error`` are left out. The run functions take ``{label: SimResult | Trace |
batch DataFrame}``.

Figures are plain ``matplotlib.figure.Figure`` objects, not pyplot figures: no
global state, no GUI, nothing to close; ``savefig`` renders them with Agg and a
notebook shows them as the value of a cell.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

LABELS = {"latency_s": "latency (s)", "tps": "TPS (tokens/s)", "ttft_mean_s": "mean TTFT (s)",
          "tpot_mean_s": "mean TPOT (s)", "num_evictions": "evictions", "kv_utilization_mean": "mean KV use / M",
          "batch_size_mean": "mean batch size", "running_size_mean": "mean running requests",
          "kv_tokens_mean": "mean KV tokens", "R_max": "R_max", "I": "I (input tokens)",
          "O": "O (output tokens)", "B": "B (requests)", "M": "M (KV tokens)"}
# Gantt cell states, in legend order
GANTT_STATES = ("idle", "holding KV", "prefill", "refill", "decode", "evicted")
GANTT_COLORS = ("#ffffff", "#dddddd", "#4c72b0", "#dd8452", "#55a868", "#c44e52")


def pd_numeric(series) -> bool:
    return series.dtype.kind in "iuf"


def label(name: str) -> str:
    return LABELS.get(name, name)


def _ok(df):
    return df[df["error"].isna()] if "error" in df else df


def _short(value: float) -> str:
    """A tick label: 1024 stays 1024, 100000 is 100K, 1000000 is 1M."""
    if value >= 1e6 and value % 1e6 == 0:
        return f"{value / 1e6:g}M"
    if value >= 1e4 and value % 1e3 == 0:
        return f"{value / 1e3:g}K"
    return f"{value:g}"


def _ticks(ax, values) -> None:
    """Label the x values that occur (at most ~8 of them) instead of matplotlib's log ticks."""
    xs = sorted({float(v) for v in values})
    step = max(1, (len(xs) + 7) // 8)
    shown = xs[::step]
    ax.set_xticks(shown, [_short(v) for v in shown])
    ax.set_xticks([], minor=True)


def _facet(value: Any, name: str) -> str:
    if isinstance(value, (int, float, np.integer, np.floating)):
        return f"{name} = {int(value):,}" if float(value).is_integer() else f"{name} = {value:g}"
    return f"{name} = {value}"


# complexity: one branch per layout choice (col, row, per-metric panels, hues, log axes, legend), read in order
def metric_grid(df, metrics: "str | Sequence[str]" = "tps", x: str = "I", hue: str = "scheduler",
                col: str | None = "O", row: str | None = None, logx: bool = True, logy: bool = False,
                hue_order: Sequence[str] | None = None, title: str | None = None, panel_size=(3.2, 2.4)):
    """One panel per ``col`` value (and per metric, or per ``row`` value), one line per ``hue``.

    Several ``metrics`` stack as rows (then ``row`` must be None). Values of the
    same (panel, hue, x) are averaged.
    """
    metrics = [metrics] if isinstance(metrics, str) else list(metrics)
    if row is not None and len(metrics) > 1:
        raise ValueError("metric_grid: give several metrics or a row facet, not both")
    data = _ok(df)
    for name in (x, hue, *metrics, *(c for c in (col, row) if c)):
        if name not in data:
            raise ValueError(f"metric_grid: the table has no column {name!r}")
    cols = sorted(data[col].dropna().unique()) if col else [None]
    rows = sorted(data[row].dropna().unique()) if row else [None]
    panels = [(r, m) for r in rows for m in metrics]
    hues = list(hue_order) if hue_order is not None else list(dict.fromkeys(data[hue]))
    # legend (and title) in a band of fixed height above the panels
    ncol = max(1, min(len(hues), 6))
    band_in = 0.22 * -(-len(hues) // ncol) + (0.3 if title else 0.0)
    height_in = panel_size[1] * len(panels) + band_in
    fig = Figure(figsize=(panel_size[0] * len(cols), height_in))
    axes = fig.subplots(len(panels), len(cols), squeeze=False, sharex=True, sharey="row")
    for i, (rv, metric) in enumerate(panels):
        for k, cv in enumerate(cols):
            ax = axes[i][k]
            sub = data
            if col:
                sub = sub[sub[col] == cv]
            if row:
                sub = sub[sub[row] == rv]
            for h in hues:
                line = sub[sub[hue] == h].groupby(x)[metric].mean().sort_index()
                if len(line):   # eviction-free variants dashed, so that they stay visible on top of the originals
                    ax.plot(line.index, line.values, marker="o", ms=3, label=str(h),
                            ls="--" if str(h).endswith("-ef") else "-")
            ax.set_xscale("log" if logx else "linear")
            if pd_numeric(data[x]):
                _ticks(ax, data[x].dropna())
            if logy and (sub[metric] > 0).any():
                ax.set_yscale("log")
            parts = [_facet(cv, col) if col else "", _facet(rv, row) if row else ""]
            ax.set_title(", ".join(p for p in parts if p) if i == 0 or row else "", fontsize=9)
            if k == 0:
                ax.set_ylabel(label(metric) if not row else f"{label(metric)}\n{_facet(rv, row)}")
            if i == len(panels) - 1:
                ax.set_xlabel(label(x))
    handles, names = axes[0][0].get_legend_handles_labels()
    top = 1 - band_in / height_in
    if handles:
        fig.legend(handles, names, loc="lower center", ncol=ncol, fontsize=8, bbox_to_anchor=(0.5, top),
                   frameon=False)
    if title:
        fig.suptitle(title, y=0.995, va="top", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, top), pad=0.5)
    return fig


def tradeoff(df, x: str = "ttft_mean_s", y: str = "tpot_mean_s", hue: str = "scheduler", annotate: str | None = None,
             ax=None, log: bool = True):
    """TTFT against TPOT: one marker series per ``hue``; ``annotate`` names a column to print beside points."""
    data = _ok(df)
    for name in (x, y, hue, *((annotate,) if annotate else ())):
        if name not in data:
            raise ValueError(f"tradeoff: the table has no column {name!r}")
    fig, ax = _axes(ax, (4.5, 3.5))
    for h in dict.fromkeys(data[hue]):
        sub = data[data[hue] == h]
        ax.scatter(sub[x], sub[y], s=18, label=str(h))
        if annotate:
            for _, r in sub.iterrows():
                ax.annotate(f"{r[annotate]:g}" if isinstance(r[annotate], (int, float)) else str(r[annotate]),
                            (r[x], r[y]), fontsize=6, xytext=(2, 2), textcoords="offset points")
    if log:
        ax.set_xscale("log")
        ax.set_yscale("log")
    ax.set_xlabel(label(x))
    ax.set_ylabel(label(y))
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _axes(ax, size):
    if ax is None:
        fig = Figure(figsize=size)
        return fig, fig.subplots()
    return ax.figure, ax


def _batches(run: Any):
    """A batch DataFrame from a SimResult, a Trace or a DataFrame."""
    if hasattr(run, "trace"):
        run = run.trace
    if hasattr(run, "batch_frame"):
        return run.batch_frame()
    return run


def kv_usage(runs: Mapping[str, Any], M: int | None = None, ax=None, x: str = "start_s"):
    """KV tokens held in each batch over time (``x="start_s"``) or batch index (``x="batch"``)."""
    fig, ax = _axes(ax, (5, 3))
    for name, run in runs.items():
        b = _batches(run)
        ax.step(b.index if x == "batch" else b[x], b["kv_tokens"], where="post", lw=1, label=name)
    if M is not None:
        ax.axhline(M, color="k", ls="--", lw=0.8, label=f"M = {M:g}")
    ax.set_xlabel("batch" if x == "batch" else "time (s)")
    ax.set_ylabel("KV tokens")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def evictions(runs: Mapping[str, Any], ax=None, x: str = "start_s"):
    """Cumulative evictions over time (or batch index), one line per run."""
    fig, ax = _axes(ax, (5, 3))
    for name, run in runs.items():
        b = _batches(run)
        ax.step(b.index if x == "batch" else b[x], np.cumsum(b["num_evicted"].to_numpy()), where="post",
                lw=1, label=name)
    ax.set_xlabel("batch" if x == "batch" else "time (s)")
    ax.set_ylabel("evictions (cumulative)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def gantt_states(schedule, workload, limits=None, cost=None) -> np.ndarray:
    """(requests x batches) codes into GANTT_STATES, stepping the judge's state through ``schedule``.

    A request is in *prefill* while it processes prompt tokens for the first time,
    in *refill* while it recomputes KV after an eviction, *evicted* in the batch
    before which it lost its KV, and *holding KV* when it keeps KV but sits out.
    """
    from .inputs import resolve_inputs
    from .state import RUNNING, ServingState

    workload, limits, cost = resolve_inputs(workload, limits, cost)
    state = ServingState(workload, limits, cost)
    codes = np.zeros((len(workload), len(schedule)), dtype=np.int8)
    for j, batch in enumerate(schedule):
        idx, evict = workload.indices_of(batch.ids), workload.indices_of(batch.evict)
        codes[state.status == RUNNING, j] = 1
        codes[evict, j] = 5
        evicted_now = np.isin(idx, evict)   # evicted before this batch, then run in it: a refill
        refill = (state.num_evictions[idx] > 0) | evicted_now
        decode = (state.m[idx] >= state.inp[idx]) & ~evicted_now
        codes[idx, j] = np.where(decode, 4, np.where(refill, 3, 2))
        state.apply(idx, batch.tokens, evict, batch.not_before_s)
    return codes


def gantt(schedule, workload, limits=None, cost=None, ax=None, title: str | None = None):
    """Requests (rows) x batches (columns) of a small schedule, coloured by state (see gantt_states)."""
    from .inputs import resolve_inputs

    workload, limits, cost = resolve_inputs(workload, limits, cost)
    codes = gantt_states(schedule, workload, limits, cost)
    n_req, n_batch = codes.shape
    fig, ax = _axes(ax, (min(2 + 0.25 * n_batch, 14), min(1 + 0.3 * n_req, 10)))
    ax.imshow(codes, cmap=ListedColormap(GANTT_COLORS), vmin=0, vmax=len(GANTT_COLORS) - 1,
              aspect="auto", interpolation="nearest")
    ax.set_xticks(np.arange(n_batch))
    ax.set_xticklabels([str(j + 1) for j in range(n_batch)], fontsize=7)
    ax.set_yticks(np.arange(n_req))
    ax.set_yticklabels([f"r{int(i)}" for i in workload.ids], fontsize=7)
    ax.set_xticks(np.arange(-0.5, n_batch), minor=True)
    ax.set_yticks(np.arange(-0.5, n_req), minor=True)
    ax.grid(which="minor", color="#999999", lw=0.4)
    ax.tick_params(which="minor", length=0)
    ax.set_xlabel("batch")
    ax.set_ylabel("request")
    used = sorted(set(np.unique(codes).tolist()) - {0})
    ax.legend(handles=[Patch(color=GANTT_COLORS[c], label=GANTT_STATES[c]) for c in used], fontsize=7,
              loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def save(fig, path) -> None:
    """Save at 150 dpi with a tight box (the notebooks' figures)."""
    from pathlib import Path

    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=150, bbox_inches="tight")
