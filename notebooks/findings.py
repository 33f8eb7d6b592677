"""What every reproduction notebook shares: the run mode, figure saving and the findings table.

``INFERMAX_NOTEBOOK_MODE`` = ``small`` (default; the test suite's quick grids) or
``full`` (the paper-scale grids; only FULL runs write ``figures/``). With
``INFERMAX_NOTEBOOK_CACHE=DIR`` a FULL run keeps its sweep tables in DIR and a re-run
resumes from them (to redraw figures without recomputing).
A claim is *asserted*: :meth:`Findings.check` raises when the paper's qualitative
claim fails in our simulation; :meth:`Findings.differs` records a paper number we
do not reproduce and asserts what we observe instead, so that a change of the
simulator or cost model that moves it is noticed.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

FIGURES = Path(__file__).resolve().parent / "figures"


def mode() -> str:
    value = os.environ.get("INFERMAX_NOTEBOOK_MODE", "small").strip().lower()
    if value not in ("small", "full"):
        raise ValueError(f"INFERMAX_NOTEBOOK_MODE must be 'small' or 'full', got {value!r}")
    return value


def save(fig, name: str) -> None:
    """Write ``figures/<name>`` in FULL mode (the committed figures come from FULL runs only)."""
    if mode() == "full":
        from infermax.plots import save as save_figure

        save_figure(fig, FIGURES / name)


class Findings:
    """Paper claim vs our number, one row each; a failed claim raises at once."""

    def __init__(self, notebook: str) -> None:
        self.notebook = notebook
        self.rows: list[dict] = []

    def check(self, claim: str, paper: str, ours: str, holds: bool, note: str = "") -> None:
        """A claim we reproduce (qualitatively): raise if ``holds`` is false."""
        self.rows.append({"claim": claim, "paper": paper, "ours": ours, "reproduced": "yes", "note": note})
        if not bool(holds):
            raise AssertionError(f"[{self.notebook}] claim does not hold: {claim} (paper: {paper}; ours: {ours})")

    def differs(self, claim: str, paper: str, ours: str, holds: bool, why: str) -> None:
        """A paper number we do not reproduce; ``holds`` asserts our own observation."""
        self.rows.append({"claim": claim, "paper": paper, "ours": ours, "reproduced": "no", "note": why})
        if not bool(holds):
            raise AssertionError(f"[{self.notebook}] our recorded deviation changed: {claim} (ours: {ours}); "
                                 "re-examine this notebook's text")

    def table(self) -> pd.DataFrame:
        """The findings so far (a FULL run also writes them to ``figures/<notebook>_findings.csv``)."""
        df = pd.DataFrame(self.rows, columns=["claim", "paper", "ours", "reproduced", "note"])
        if mode() == "full":
            FIGURES.mkdir(exist_ok=True)
            df.to_csv(FIGURES / f"{self.notebook}_findings.csv", index=False)
        return df


def results_file(name: str) -> Path | None:
    """Where a FULL run keeps a sweep's table so that a re-run resumes instead of recomputing:
    ``$INFERMAX_NOTEBOOK_CACHE/<name>.parquet`` (no cache when the variable is unset, or in SMALL mode)."""
    root = os.environ.get("INFERMAX_NOTEBOOK_CACHE")
    return Path(root) / f"{name}.parquet" if root and mode() == "full" else None
