"""The capacity claims module (notebooks/claims_capacity.py) on a tiny sweep: its table, figure and claim rows.

Slow (about 6 CPU-s): it runs 12 simulations of notebook 09's sweep; the default run keeps the committed
claims table checked (tests/test_findings.py) and this runs with -m slow, like notebook 09 itself."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "notebooks"))


@pytest.mark.slow
def test_capacity_claims_on_a_small_sweep():
    import matplotlib
    matplotlib.use("Agg")
    import claims_capacity as cc
    from claimlib import VERDICTS

    df = cc.run_capacity(scale=0.01, loads=(0.75, 1.75), executor="serial")     # 36 s windows, two mixes
    assert sorted(df["policy"].unique()) == ["loongserve", "medha", "sarathi"] and len(df) == 12
    assert (df["num_arrived"] <= df["B"]).all() and (df["served_fraction"] <= 1).all()   # (B arrive in ~ the window)
    import matplotlib.pyplot as plt
    fig = cc.capacity_figure(df)
    assert len(fig.axes) == 3
    plt.close(fig)                               # no pyplot state left behind (tests/test_plots.py checks)
    rows = cc.capacity_claims(df)
    assert len(rows) == len(cc.CLAIMS) == 8 and set(rows["verdict"]) <= set(VERDICTS)
    assert (rows["paper"] == "Medha").all() and (rows["notebook"] == "09").all()
    with pytest.raises(ValueError, match="scale must be in"):
        cc.run_capacity(scale=2.0)
