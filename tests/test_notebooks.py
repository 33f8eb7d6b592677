"""Every reproduction notebook runs top to bottom in SMALL mode; each raises if a claim reproduced at full scale flips.

The kernel is ``python3``, the spec that ipykernel installs with itself (jupyter_client
also falls back to it when ipykernel is importable) and that runs ``sys.executable``.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NAMES = sorted(p.stem for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))
NEEDS_SOLVER = {"04_optimal_evictions", "11_how_far_long_context", "13_or_peers"}
# all but 12 run with -m slow (about 110 s of CPU together in SMALL mode); 12 (vLLM recorded vs simulated,
# from committed tables: about 10 s) stays in the default run so that one notebook always executes there.
# Each notebook raises if a claim reproduced at full scale (notebooks/FINDINGS.md) points the other way in
# its SMALL run. In the default run, tests/test_findings.py checks the claims table and a few paper cells,
# tests/test_longctx.py claims of 07.
SLOW = {"01_high_contention", "02_eviction_free", "03_memory_sweep", "05_rmax", "06_ranking", "07_long_context",
        "08_pecsched_cluster", "09_medha", "10_csps", "11_how_far_long_context",
        "13_or_peers", "04_optimal_evictions"}
# InferMax §4 and App. A (their FULL-run figures and findings are committed under notebooks/figures/)
REPRODUCTIONS = ("01_high_contention", "02_eviction_free", "03_memory_sweep", "04_optimal_evictions", "05_rmax",
                 "06_ranking")


def _param(name: str):
    marks = [pytest.mark.slow] if name in SLOW else []
    if name in NEEDS_SOLVER:
        missing = importlib.util.find_spec("ortools") is None
        marks += [pytest.mark.solver,
                  pytest.mark.skipif(missing, reason="needs ortools (pip install 'infermax[solvers]')")]
    return pytest.param(name, marks=marks)


def test_the_paper_reproductions_are_there():
    assert set(REPRODUCTIONS) <= set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_notebook_is_committed_without_outputs(name):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code and all(not c.outputs and c.execution_count is None for c in code)
    assert "mode()" in code[0].source              # the run mode is read in the first code cell


@pytest.mark.parametrize("name", [_param(n) for n in NAMES])
def test_notebook_runs_in_small_mode(name, monkeypatch):
    monkeypatch.setenv("INFERMAX_NOTEBOOK_MODE", "small")
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    client = nbclient.NotebookClient(nb, kernel_name="python3", timeout=300,
                                     resources={"metadata": {"path": str(NOTEBOOKS)}})
    client.execute()   # raises CellExecutionError (with the failed claim) if any cell raises
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")
    assert "findings checked" in text
    images = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if "image/png" in o.get("data", {})]
    assert images, "the notebook shows no figure"


@pytest.mark.parametrize("name", NAMES)
def test_full_run_figures_and_results_are_committed(name):
    # written by `INFERMAX_NOTEBOOK_MODE=full` runs (the paper-scale grids); SMALL runs never write them. The
    # claims table notebooks/FINDINGS.md is computed from the results (tests/test_findings.py checks it).
    figures = NOTEBOOKS / "figures"
    assert list(figures.glob(f"{name[:2]}_*.png"))
    assert (figures / f"{name}_results.csv").stat().st_size > 0
    assert not list(figures.glob("*_findings.csv")), "per-notebook findings files were replaced by FINDINGS.csv"
