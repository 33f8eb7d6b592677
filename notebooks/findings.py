"""What every reproduction notebook shares: the run mode, figure saving, and the table of the papers' claims.

Run mode: ``INFERMAX_NOTEBOOK_MODE`` = ``small`` (default; the test suite's quick grids) or ``full`` (the
papers' grids). Only FULL runs write ``figures/``: the figures, and each notebook's raw numbers as
``figures/<notebook>_results.csv``. With ``INFERMAX_NOTEBOOK_CACHE=DIR`` a FULL run keeps its sweep tables in
DIR and a re-run resumes from them (to redraw figures without recomputing).

Claims. Every paper claim a notebook reproduces is one :class:`claimlib.Claim` (``claims_contention.py``:
InferMax §4.2-4.4; ``claims_scheduling.py``: §4.5-4.7; ``claims_longctx.py``: Medha and PecSched): the paper's
statement and number, a tolerance, and a function that measures our number on a notebook's results table.
The verdict (reproduced / direction only / differs / by construction / not run; see ``claimlib.py``) is computed from
them,
never written by hand.

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
import os
import time
from pathlib import Path

import pandas as pd
from claimlib import BY_CONSTRUCTION, DIFFERS, DIRECTION_ONLY, NOT_RUN, REPRODUCED, TOLERANCE_NOTE, VERDICTS, Claim

HERE = Path(__file__).resolve().parent
FIGURES = HERE / "figures"
TABLE_MD, TABLE_CSV = HERE / "FINDINGS.md", HERE / "FINDINGS.csv"
CLAIM_MODULES = ("claims_contention", "claims_scheduling", "claims_longctx", "claims_cluster", "claims_optimal",
                 "claims_medha", "claims_capacity", "claims_csps", "claims_or", "claims_vllm")
NOTEBOOKS = ("01_high_contention", "02_eviction_free", "03_memory_sweep", "04_optimal_evictions", "05_rmax",
             "06_ranking", "07_long_context", "08_pecsched_cluster", "09_medha", "10_csps", "11_how_far_long_context",
             "12_real_vllm", "13_or_peers")
COLUMNS = ["notebook", "paper", "section", "claim", "paper_number", "ours", "tolerance", "verdict", "cause"]


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
            f"{c[DIFFERS]} differ, {c[BY_CONSTRUCTION]} by construction, {c[NOT_RUN]} not run.**", "",
            "Tolerances. " + TOLERANCE_NOTE, "",
            "Notebook 04's solves stop at 30 s: those not proven optimal (status `feasible` in "
            "`figures/04_optimal_evictions_results.csv`) can move a little between two runs of the same code.", "",
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
    raise SystemExit(main())
