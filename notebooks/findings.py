"""What every reproduction notebook shares: the run mode, figure saving, and the table of the papers' claims.

Run mode: ``INFERMAX_NOTEBOOK_MODE`` = ``small`` (default; the test suite's quick grids) or ``full`` (the
papers' grids). Only FULL runs write ``figures/``: the figures, and each notebook's raw numbers as
``figures/<notebook>_results.csv``. With ``INFERMAX_NOTEBOOK_CACHE=DIR`` a FULL run keeps its sweep tables in
DIR and a re-run resumes from them (to redraw figures without recomputing).

Claims. Every paper claim a notebook reproduces is one :class:`Claim` (``claims_infermax.py``,
``claims_longctx.py``): the paper's statement and number, a tolerance, and a function that measures our
number on a notebook's results table. The verdict is computed from them, never written by hand:

- ``reproduced``: ours within the tolerance of the paper's number (a claim without a number: the stated
  ordering holds in every cell of the grid);
- ``direction only``: the same sign or ordering, the magnitude outside the tolerance (an ordering: it holds
  in most cells, not all);
- ``differs``: not even the direction; the claim's cause says why;
- ``not run``: no full-scale result, or nothing of ours to compare with (the cause says which).

The table ``FINDINGS.md`` / ``FINDINGS.csv`` is computed from the committed FULL results only::

    python notebooks/findings.py --write    # recompute the table from figures/*_results.csv (seconds)
    python notebooks/findings.py --rerun    # re-execute every notebook in FULL mode first, then --write

A notebook calls :func:`check` with its own results: it shows its claims, this run's numbers beside the
committed full-scale verdicts. SMALL grids are not the papers' size, so a SMALL run checks directions only:
it raises when a claim reproduced at full scale points the other way. (A claim that holds only in most cells
at full scale, ``direction only``, may well fail in a SMALL grid's few cells: it is shown, not checked.)
"""
from __future__ import annotations

import argparse
import importlib
import math
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import pandas as pd

HERE = Path(__file__).resolve().parent
FIGURES = HERE / "figures"
TABLE_MD, TABLE_CSV = HERE / "FINDINGS.md", HERE / "FINDINGS.csv"
CLAIM_MODULES = ("claims_infermax", "claims_longctx")
NOTEBOOKS = ("01_high_contention", "02_eviction_free", "03_memory_sweep", "04_optimal_evictions", "05_rmax",
             "06_ranking", "07_long_context")
REPRODUCED, DIRECTION_ONLY, DIFFERS, NOT_RUN = "reproduced", "direction only", "differs", "not run"
VERDICTS = (REPRODUCED, DIRECTION_ONLY, DIFFERS, NOT_RUN)
COLUMNS = ["notebook", "paper", "section", "claim", "paper_number", "ours", "tolerance", "verdict", "cause"]
# the tolerance of every number the papers state, and why (FINDINGS.md repeats this)
EFFECT_TOLERANCE = 0.25
TOLERANCE_NOTE = (
    "A factor or percentage the paper states is reproduced when our effect (factor − 1; a reduction by r is "
    "the factor 1 / (1 − r)) is within ±25 % of the paper's effect (a range is widened by 25 % at each end). "
    "Why 25 %: the paper's numbers come from its own cost-model fit, which it reports to be 3–30 % off the real "
    "system (InferMax App. A.2); ours is another fit of the same kind of profiles, so a ratio of two simulated "
    "runs cannot be expected to agree more closely. A bound the paper states (> 90 %, < 20 %) is its own "
    "tolerance. A claim without a number (an ordering) is reproduced when it holds in every cell of the grid "
    "the paper shows, direction only when it holds in most of them.")


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


def results_file(name: str) -> Path | None:
    """Where a FULL run keeps a sweep's table so that a re-run resumes instead of recomputing:
    ``$INFERMAX_NOTEBOOK_CACHE/<name>.parquet`` (no cache when the variable is unset, or in SMALL mode)."""
    root = os.environ.get("INFERMAX_NOTEBOOK_CACHE")
    return Path(root) / f"{name}.parquet" if root and mode() == "full" else None


# --- what a paper states ----------------------------------------------------------------------------
def fmt_factor(v: float, unit: str) -> str:
    """A factor the way the paper writes it: ``13x``, ``+6.9 %`` (an increase), ``40.9 %`` (a reduction)."""
    if not math.isfinite(v):
        return str(v)
    if unit == "%+" and v < 3:
        return f"{(v - 1) * 100:+.1f} %"
    if unit == "%-" and v > 0:
        return f"{(1 - 1 / v) * 100:.1f} % less"
    return f"{v:.3g}x"


@dataclass(frozen=True, kw_only=True, slots=True)
class Effect:
    """A factor the paper reports, ``lo`` (one number) or ``lo``..``hi`` (a range), oriented so that > 1 is
    the paper's direction. ``unit`` is how the paper writes it: ``x``, ``%+`` (an increase) or ``%-`` (a
    reduction by r, stored as the factor 1 / (1 − r)). Ours is within tolerance when its effect, factor − 1,
    lies within ±``tol`` of the paper's effect."""
    lo: float
    hi: float | None = None
    unit: str = "x"
    tol: float = EFFECT_TOLERANCE

    def bounds(self) -> tuple[float, float]:
        hi = self.lo if self.hi is None else self.hi
        return 1 + (self.lo - 1) * (1 - self.tol), 1 + (hi - 1) * (1 + self.tol)

    def contains(self, value: float) -> bool:
        lo, hi = self.bounds()
        return lo <= value <= hi

    def direction(self, value: float) -> bool:
        return value > 1

    def number(self) -> str:
        one = fmt_factor(self.lo, self.unit)
        return one if self.hi is None else f"{one} – {fmt_factor(self.hi, self.unit)}"

    def tolerance(self) -> str:
        lo, hi = self.bounds()
        return f"±{self.tol:.0%} of the effect: {fmt_factor(lo, self.unit)} .. {fmt_factor(hi, self.unit)}"

    def show(self, value: float) -> str:
        return fmt_factor(value, self.unit)


@dataclass(frozen=True, kw_only=True, slots=True)
class Share:
    """A share (0..1) the paper bounds or gives a range for: within ``lo``..``hi``, the range widened by
    ``tol`` (relative) at each end; ``tol = 0`` for a bound, which is its own tolerance. ``why``: the bound
    is our reading of a word of the paper ("close"), not a number it states."""
    lo: float = 0.0
    hi: float = 1.0
    tol: float = 0.0
    why: str = ""

    def contains(self, value: float) -> bool:
        return self.lo * (1 - self.tol) <= value <= min(1.0, self.hi * (1 + self.tol))

    def direction(self, value: float) -> bool | None:
        return None          # a bound has no sign of its own; a claim gives its direction with its number

    def number(self) -> str:
        if self.why:
            return "no number"
        if self.lo == 0:
            return f"< {self.hi:.0%}"
        return f"> {self.lo:.0%}" if self.hi == 1 and self.tol == 0 else f"{self.lo:.0%} – {self.hi:.0%}"

    def tolerance(self) -> str:
        if self.why:
            return self.why
        if self.tol == 0:
            return "the paper's bound"
        return f"±{self.tol:.0%} relative: {self.lo * (1 - self.tol):.0%} .. {min(1.0, self.hi * (1 + self.tol)):.0%}"

    def show(self, value: float) -> str:
        return f"{value:.1%}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Near:
    """A value the paper gives as approximate ("≈ 98", "comparable", "peaks at 128"): within ±``tol``
    (relative) of ``value``; ``why`` says how the tolerance reads the paper's word."""
    value: float
    tol: float
    why: str

    def contains(self, value: float) -> bool:
        return abs(value - self.value) <= self.tol * abs(self.value) + 1e-12

    def direction(self, value: float) -> bool | None:
        return None

    def number(self) -> str:
        return f"≈ {self.value:g}"

    def tolerance(self) -> str:
        return f"±{self.tol:.0%} ({self.why})" if self.tol else self.why

    def show(self, value: float) -> str:
        return f"{value:.3g}"


@dataclass(frozen=True, kw_only=True, slots=True)
class Ordering:
    """A claim without a number: an ordering that should hold in every cell of the grid. Ours is the
    share of cells where it holds."""
    paper: str = "qualitative"

    def contains(self, value: float) -> bool:
        return value == 1

    def direction(self, value: float) -> bool:
        return value > 0.5

    def number(self) -> str:
        return self.paper

    def tolerance(self) -> str:
        return "every cell (direction only: most cells)"

    def show(self, value: float) -> str:
        return f"{value:.0%} of cells"


Target = Effect | Share | Near | Ordering


class Ours(NamedTuple):
    """Our number for a claim: ``value`` (compared with the target), ``text`` (as the table shows it, with
    where it was found) and ``holds``, the claim's direction when it is not the target's own sign."""
    value: float
    text: str
    holds: bool | None = None


class Missing(LookupError):
    """A results table lacks what a claim needs (a SMALL grid without the cells, or no FULL run yet)."""


def cells(mask) -> Ours:
    """An ordering measured over a boolean Series of cells: the share that holds, and ``k/n cells``."""
    mask = pd.Series(mask, dtype=bool)
    if mask.empty:
        raise Missing("no cells")
    return Ours(float(mask.mean()), f"{int(mask.sum())}/{len(mask)} cells")


@dataclass(frozen=True, kw_only=True, slots=True)
class Claim:
    """One paper claim, ours measured by ``measure(results)``; ``target=None``: nothing of ours to compare
    with (the cause says why). ``cause`` explains a verdict other than ``reproduced``."""
    notebook: str
    paper: str
    section: str
    statement: str
    target: Target | None
    measure: Callable[[pd.DataFrame], Ours] | None
    cause: str = ""

    def evaluate(self, results: pd.DataFrame | None) -> dict:
        ours = None
        if self.target is not None and self.measure is not None and results is not None:
            try:
                ours = self.measure(results)
            except (Missing, KeyError):
                ours = None
        verdict = verdict_of(self.target, ours)
        cause = "" if verdict == REPRODUCED else self.cause
        if verdict == NOT_RUN and self.target is not None:
            cause = ("no full-scale result yet (python notebooks/findings.py --rerun " + self.notebook + ")"
                     if results is None else "the results lack the cells this claim needs")
        return {"notebook": self.notebook[:2], "paper": self.paper, "section": self.section,
                "claim": self.statement, "paper_number": "-" if self.target is None else self.target.number(),
                "ours": "-" if ours is None else ours.text,
                "tolerance": "-" if self.target is None else self.target.tolerance(),
                "verdict": verdict, "cause": cause,
                "holds": None if ours is None else holds_of(self.target, ours)}


def holds_of(target: Target, ours: Ours) -> bool | None:
    """The claim's direction in our numbers: the claim's own, else the target's sign (None: the claim has
    no direction apart from its number, e.g. "≈ 98")."""
    return target.direction(ours.value) if ours.holds is None else bool(ours.holds)


def verdict_of(target: Target | None, ours: Ours | None) -> str:
    if target is None or ours is None or not math.isfinite(ours.value):
        return NOT_RUN
    holds, within = holds_of(target, ours), target.contains(ours.value)
    if holds is None:
        return REPRODUCED if within else DIFFERS
    if holds and within:
        return REPRODUCED
    return DIRECTION_ONLY if holds else DIFFERS


# --- the claims, and the results they are measured on ------------------------------------------------
def claims(notebook: str | None = None) -> list[Claim]:
    """Every registered claim (of one notebook), in the order the claim modules list them."""
    out = [c for name in CLAIM_MODULES for c in importlib.import_module(name).CLAIMS]
    return [c for c in out if notebook is None or c.notebook == notebook]


def results_path(notebook: str) -> Path:
    return FIGURES / f"{notebook}_results.csv"


def save_results(notebook: str, df: pd.DataFrame) -> None:
    """A FULL run's numbers, the ones its claims are measured on (timings and schedules left out)."""
    drop = [c for c in ("wall_s", "solver_wall_s", "schedule_json", "cell_id") if c in df.columns]
    FIGURES.mkdir(exist_ok=True)
    df.drop(columns=drop).to_csv(results_path(notebook), index=False, float_format="%.9g")


def load_results(notebook: str) -> pd.DataFrame | None:
    path = results_path(notebook)
    return pd.read_csv(path) if path.exists() else None


def evaluate(notebook: str, results: pd.DataFrame | None) -> pd.DataFrame:
    rows = [c.evaluate(results) for c in claims(notebook)]
    return pd.DataFrame(rows, columns=COLUMNS + ["holds"])


def table() -> pd.DataFrame:
    """The claims table, measured on the committed FULL results (``not run`` where there are none)."""
    parts = [evaluate(nb, load_results(nb)) for nb in NOTEBOOKS]
    return pd.concat(parts, ignore_index=True)[COLUMNS]


def counts(df: pd.DataFrame) -> dict[str, int]:
    return {v: int((df["verdict"] == v).sum()) for v in VERDICTS}


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def markdown(df: pd.DataFrame) -> str:
    c = counts(df)
    head = ["# Findings: what the notebooks reproduce of the papers", "",
            "Generated by `python notebooks/findings.py --write` from the committed full-scale results "
            "(`notebooks/figures/*_results.csv`, written by `INFERMAX_NOTEBOOK_MODE=full` runs); "
            "`python notebooks/findings.py --rerun` re-runs the notebooks first. Do not edit by hand.", "",
            f"**{len(df)} claims: {c[REPRODUCED]} reproduced, {c[DIRECTION_ONLY]} direction only, "
            f"{c[DIFFERS]} differ, {c[NOT_RUN]} not run.**", "", "Tolerances. " + TOLERANCE_NOTE, "",
            "| nb | paper | § | claim | paper's number | ours | tolerance | verdict | cause |",
            "|---|---|---|---|---|---|---|---|---|"]
    rows = ["| " + " | ".join(_cell(r[k]) for k in COLUMNS) + " |" for r in df.to_dict("records")]
    return "\n".join(head + rows) + "\n"


def write() -> pd.DataFrame:
    df = table()
    TABLE_MD.write_text(markdown(df))
    df.to_csv(TABLE_CSV, index=False)
    return df


def check(notebook: str, results: pd.DataFrame) -> pd.DataFrame:
    """A notebook's claims on this run's ``results`` beside the committed full-scale verdicts. FULL mode
    saves ``results``; SMALL mode raises if a claim reproduced at full scale points the other way here."""
    if mode() == "full":
        save_results(notebook, results)
    here = evaluate(notebook, results)
    committed = pd.read_csv(TABLE_CSV, keep_default_na=False, dtype=str) if TABLE_CSV.exists() else None
    full = {} if committed is None else dict(zip(committed["notebook"] + committed["claim"], committed["verdict"]))
    here["full-scale verdict"] = [full.get(nb + cl, NOT_RUN) for nb, cl in zip(here["notebook"], here["claim"])]
    if mode() == "small":
        flipped = here[(here["full-scale verdict"] == REPRODUCED) & (here["holds"] == False)]  # noqa: E712
        if len(flipped):
            raise AssertionError(f"[{notebook}] claims that hold at full scale point the other way in this "
                                 f"SMALL run: {flipped[['claim', 'ours']].to_dict('records')}")
    shown = here.drop(columns=["notebook", "paper", "holds"]).rename(columns={"verdict": f"verdict ({mode()} run)"})
    print(f"{len(here)} findings checked ({mode()} mode): {counts(here)}")
    return shown


# --- command line --------------------------------------------------------------------------------------
def rerun(names: list[str], cache: str | None = None) -> None:
    """Execute notebooks in FULL mode (they write figures/ and their results). No sweep cache unless
    ``cache`` is given: a cached cell is keyed by its specs, not by the code, so after a change of the cost
    model or the simulator a cache would return the old numbers."""
    import nbclient
    import nbformat

    os.environ["INFERMAX_NOTEBOOK_MODE"] = "full"
    os.environ.pop("INFERMAX_NOTEBOOK_CACHE", None)
    if cache:
        os.environ["INFERMAX_NOTEBOOK_CACHE"] = cache
    for name in names:
        start = time.perf_counter()
        nb = nbformat.read(HERE / f"{name}.ipynb", as_version=4)
        nbclient.NotebookClient(nb, kernel_name="python3", timeout=None,
                                resources={"metadata": {"path": str(HERE)}}).execute()
        print(f"{name}: FULL run done in {time.perf_counter() - start:.0f} s", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python notebooks/findings.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write FINDINGS.md and FINDINGS.csv")
    parser.add_argument("--rerun", nargs="*", metavar="NOTEBOOK", default=None,
                        help="re-execute these notebooks (default: all) in FULL mode, then write the table")
    parser.add_argument("--cache", metavar="DIR", help="with --rerun: resume sweeps from DIR (only when the code "
                        "that produced DIR is the code being run)")
    args = parser.parse_args(argv)
    if args.rerun is not None:
        start = time.perf_counter()
        rerun(args.rerun or list(NOTEBOOKS), args.cache)
        print(f"FULL runs done in {time.perf_counter() - start:.0f} s", flush=True)
    df = write() if args.write or args.rerun is not None else table()
    print(markdown(df) if not (args.write or args.rerun is not None) else
          f"wrote {TABLE_MD.name}, {TABLE_CSV.name}: {counts(df)}")
    return 0


if __name__ == "__main__":
    import findings   # the importable copy: the claim modules register into that one

    raise SystemExit(findings.main())
