"""Figures: the right panels, lines and values; the Gantt states follow the schedule; the CLI writes images."""
from __future__ import annotations

import json

import matplotlib.pyplot as plt
import numpy as np
import pytest

import infermax
from infermax import Batch, Schedule, plots
from infermax.cli import main
from infermax.sweep import sweep


@pytest.fixture(scope="module")
def table():
    return sweep({"workloads": [{"grid": {"I": [4, 64], "O": [8, 32], "B": [32]}}, "fixed:I=300,O=8,B=2"],
                  "schedulers": ["vllm", "sarathi"], "limits": ["M=200"]}, executor="serial")


def test_metric_grid_one_panel_per_O_one_line_per_scheduler(table):
    fig = plots.metric_grid(table, ["tps", "latency_s"], x="I", col="O")
    axes = np.array(fig.axes).reshape(2, 2)          # rows: metrics, columns: O = 8, 32
    assert [ax.get_title() for ax in axes[0]] == ["O = 8", "O = 32"]
    assert axes[0][0].get_ylabel() == "TPS (tokens/s)" and axes[1][0].get_xlabel() == "I (input tokens)"
    assert axes[0][0].get_xscale() == "log"
    for ax in axes.flat:
        assert [ln.get_label() for ln in ax.lines] == ["vllm", "sarathi"]
    # the plotted points are the table's values (error rows, here I = 300 that cannot fit in M = 200, left out)
    line = axes[1][1].lines[1]
    want = table[(table["O"] == 32) & (table["scheduler"] == "sarathi")].sort_values("I")
    assert list(line.get_xdata()) == [4, 64]
    assert np.allclose(line.get_ydata(), want["latency_s"])
    assert not plt.get_fignums()                     # no pyplot state left behind


def test_metric_grid_row_facet_and_errors(table):
    fig = plots.metric_grid(table, "tps", x="I", col="O", row="B", hue_order=["sarathi"])
    assert len(fig.axes) == 2 and all(len(ax.lines) == 1 for ax in fig.axes)
    with pytest.raises(ValueError, match="not both"):
        plots.metric_grid(table, ["tps", "latency_s"], row="B")
    with pytest.raises(ValueError, match="no column 'R'"):
        plots.metric_grid(table, "tps", x="R")


def test_tradeoff_one_series_per_scheduler(table):
    ok = table[table["error"].isna()]
    fig = plots.tradeoff(table, annotate="I")
    ax = fig.axes[0]
    assert len(ax.collections) == 2 and ax.get_xscale() == "log"
    pts = ax.collections[0].get_offsets()
    vllm = ok[ok["scheduler"] == "vllm"]
    assert np.allclose(pts[:, 0], vllm["ttft_mean_s"]) and np.allclose(pts[:, 1], vllm["tpot_mean_s"])
    assert len(ax.texts) == len(ok)


def test_kv_usage_and_evictions_follow_the_trace():
    runs = {s: infermax.simulate("fixed:I=16,O=32,B=16", s, "M=200") for s in ("vllm", "vllm-ef")}
    fig = plots.kv_usage(runs, M=200)
    ax = fig.axes[0]
    assert [ln.get_label() for ln in ax.lines] == ["vllm", "vllm-ef", "M = 200"]
    b = runs["vllm"].batches_df
    assert np.array_equal(ax.lines[0].get_ydata(), b["kv_tokens"]) and max(ax.lines[0].get_ydata()) <= 200
    fig = plots.evictions(runs, x="batch")
    ys = [ln.get_ydata()[-1] for ln in fig.axes[0].lines]
    assert ys == [runs["vllm"].metrics["num_evictions"], 0] and ys[0] > 0


def _hand_schedule():
    """Two requests (I=2, O=2) in M=4: r1 is evicted in decode phase and refilled (inp becomes 3)."""
    b = [Batch(ids=[0, 1], tokens=[2, 2]),            # both prefill; m = 2 + 2 = 4 = M
         Batch(ids=[0], tokens=[1], evict=[1]),       # r1 evicted (decode phase: inp -> 3), r0 decodes, done
         Batch(ids=[1], tokens=[3]),                  # r1 refills its 3 tokens; completes
         ]
    return Schedule(tuple(b)), infermax.Workload.from_lengths([2, 2], [2, 2]), infermax.Limits(M=4, C=8)


def test_gantt_states_follow_the_schedule():
    schedule, workload, limits = _hand_schedule()
    codes = plots.gantt_states(schedule, workload, limits)
    S = {name: k for k, name in enumerate(plots.GANTT_STATES)}
    assert codes.tolist() == [[S["prefill"], S["decode"], S["idle"]],
                              [S["prefill"], S["evicted"], S["refill"]]]


def test_gantt_figure_has_a_cell_per_request_and_batch():
    schedule, workload, limits = _hand_schedule()
    fig = plots.gantt(schedule, workload, limits, title="hand")
    ax = fig.axes[0]
    assert ax.get_images()[0].get_array().shape == (2, 3)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["prefill", "refill", "decode", "evicted"]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["r0", "r1"]
    with pytest.raises(infermax.ScheduleError):      # the Gantt replays through the judge's state
        plots.gantt(Schedule((Batch(ids=[0, 1], tokens=[2, 3]),)), workload, limits)


def test_cli_plot_tradeoff_and_where(tmp_path, table, capsys):
    path = tmp_path / "t.parquet"
    table.to_parquet(path)
    out = tmp_path / "tt.png"
    assert main(["plot", str(path), "--kind", "tradeoff", "--where", "O == 32", "--out", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["rows"] == 4 and out.stat().st_size > 1000    # O = 32: I in (4, 64) x 2 schedulers
    assert main(["plot", str(path), "--where", "O ==", "--json"]) == 2
    assert "--where" in json.loads(capsys.readouterr().out)["error"]
