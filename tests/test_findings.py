"""The claims table (notebooks/FINDINGS.md) and the paper's findings on the live simulator.

The table is computed from the committed full-scale results (notebooks/figures/*_results.csv) by
notebooks/findings.py; these tests recompute it, so a table that does not follow from the committed numbers
(stale, or edited by hand) fails. The simulation tests below re-measure a few of the paper's own cells with the
current code; each asserts the paper's direction, never our own deviation from it.
"""
import re
import sys
from pathlib import Path

import pandas as pd
import pytest

from infermax import Limits, Workload, simulate

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import claimlib  # noqa: E402  (notebooks/ is not a package: the notebooks import these by name too)
import findings  # noqa: E402

# the design notes' copies of the papers, beside the checkout (or one of its parents), if present
PAPERS = next((p / "shared" / "papers" for p in Path(__file__).resolve().parents if (p / "shared" / "papers").is_dir()),
              Path("/nonexistent"))
PAPER_FILES = {"InferMax": "infermax.txt", "Medha": "medha.txt", "PecSched": "pecsched.txt", "CSPS": "csps.txt",
               # issue 39's papers: only their abstracts are at hand (no text to search for the numbers)
               "Jaillet": "jaillet2025.txt", "Ao": "ao2025.txt"}
PAPER = Limits(M=100_000, C=4096)


# --- the table ------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def table():
    return findings.table()


def test_the_committed_table_follows_from_the_committed_results(table):
    committed = pd.read_csv(findings.TABLE_CSV, dtype=str, keep_default_na=False)
    assert committed.to_dict("records") == table.astype(str).to_dict("records"), \
        "FINDINGS.csv is stale: run `python notebooks/findings.py --write`"
    assert findings.TABLE_MD.read_text() == findings.markdown(table)


def test_every_claim_has_a_paper_number_a_tolerance_a_verdict_and_a_cause_when_not_reproduced(table):
    assert len(table) >= 50 and set(table["verdict"]) <= set(findings.VERDICTS)
    for row in table.to_dict("records"):
        assert row["paper"] in PAPER_FILES and row["section"] and row["claim"], row
        if row["paper_number"] == "-":           # nothing of ours to compare with: it can only be "not run"
            assert row["verdict"] == findings.NOT_RUN and row["tolerance"] == "-", row
        else:
            assert row["tolerance"] not in ("", "-"), row
        assert (row["verdict"] == findings.REPRODUCED) == (row["cause"] == ""), \
            f"a verdict other than 'reproduced' needs a written cause (and only those): {row}"


def test_every_claim_with_a_target_is_measured_on_the_full_scale_results(table):
    # "not run" only where there is nothing of ours to compare with (a baseline we do not have)
    assert (table["verdict"] == findings.NOT_RUN).sum() == (table["paper_number"] == "-").sum()


def test_a_small_run_raises_when_a_claim_reproduced_at_full_scale_points_the_other_way(monkeypatch):
    monkeypatch.setenv("INFERMAX_NOTEBOOK_MODE", "small")
    results = findings.load_results("02_eviction_free")
    findings.check("02_eviction_free", results)                  # the full-scale numbers themselves pass
    swapped = results.replace({"scheduler": {"vllm": "vllm-ef", "vllm-ef": "vllm"}})
    with pytest.raises(AssertionError, match="point the other way"):
        findings.check("02_eviction_free", swapped)


def _paper_numbers(claim) -> list[float]:
    """The numbers the target was built from, in the unit the paper writes them."""
    t = claim.target
    if isinstance(t, claimlib.PerCell):
        t = t.effect
    if isinstance(t, claimlib.Effect) and t.source:     # a factor computed from numbers the paper states
        return [round(v, 2) for v in t.source]
    if isinstance(t, claimlib.Effect):
        values = [t.lo] + ([] if t.hi is None else [t.hi])
        unit = {"x": lambda v: v, "%+": lambda v: (v - 1) * 100, "%-": lambda v: (1 - 1 / v) * 100,
                "to": lambda v: 1 / v}[t.unit]
        return [round(unit(v), 2) for v in values]
    if isinstance(t, claimlib.Share) and not t.why:     # (a Share with `why` reads a word, e.g. "close")
        return [round(v * 100, 2) for v in (t.lo, t.hi) if 0 < v < 1]
    return []


def test_every_target_is_the_number_the_claim_quotes_from_the_paper():
    # a target equal to our own number would have to be quoted in the statement, and found in the paper
    for claim in findings.claims():
        quoted = {round(float(x), 2) for x in re.findall(r"\d+(?:\.\d+)?", claim.statement.replace(",", ""))}
        for number in _paper_numbers(claim):
            assert number in quoted, f"{claim.statement!r}: target {number} is not the number it quotes"
        paper = PAPERS / PAPER_FILES[claim.paper]
        if paper.exists():
            text = paper.read_text().replace(",", "")      # (its thousands separators, as the statement's)
            for number in _paper_numbers(claim):
                assert f"{number:g}" in text, f"{number:g} ({claim.statement!r}) does not occur in {paper.name}"


@pytest.mark.parametrize("target, value, verdict", [
    (claimlib.Effect(lo=13), 11.0, "reproduced"),            # effect 10 within ±25 % of 12
    (claimlib.Effect(lo=13), 7.0, "direction only"),
    (claimlib.Effect(lo=13), 0.9, "differs"),
    (claimlib.Effect(lo=1 / (1 - 0.409), unit="%-"), 1 / (1 - 0.068), "direction only"),
    (claimlib.Effect(lo=1 / (1 - 0.58), hi=1 / (1 - 0.87), unit="%-"), 1 / (1 - 0.70), "reproduced"),
    (claimlib.Effect(lo=1 / (1 - 0.58), hi=1 / (1 - 0.87), unit="%-"), 1 / (1 - 0.994), "direction only"),
    (claimlib.Ordering(), 1.0, "reproduced"),
    (claimlib.Ordering(), 0.7, "direction only"),
    (claimlib.Ordering(), 0.5, "differs"),
    (claimlib.Share(lo=0.9), 0.93, "reproduced"),
    (claimlib.Share(lo=0.9), 0.89, "differs"),
    (claimlib.Near(value=98, tol=0.1, why="-"), 93.1, "reproduced"),
    (claimlib.Near(value=98, tol=0.1, why="-"), 85.0, "differs"),
])
def test_the_verdict_follows_from_the_paper_number_and_ours(target, value, verdict):
    assert claimlib.verdict_of(target, claimlib.Ours(value, "-")) == verdict


def test_a_claim_s_own_direction_overrides_the_sign_and_a_missing_result_is_not_run():
    t = claimlib.Effect(lo=1.017, unit="%+")
    assert claimlib.verdict_of(t, claimlib.Ours(1.015, "-", holds=False)) == "differs"     # up to, but rarely
    assert claimlib.verdict_of(claimlib.Share(lo=0.9), claimlib.Ours(0.89, "-", holds=True)) == "direction only"
    assert claimlib.verdict_of(t, None) == "not run" and claimlib.verdict_of(None, claimlib.Ours(1, "-")) == "not run"


# --- the live simulator on the paper's own cells (§4.3: I = O = B = 1024 and I = 1) ---------------------
@pytest.fixture(scope="module")
def heavy():
    w = Workload.from_spec("fixed:I=1024,O=1024,B=1024")
    return {name: simulate(w, name, PAPER).metrics for name in ("vllm", "vllm-ef", "sarathi", "sarathi-ef")}


def test_high_contention_is_a_scenario_with_frequent_evictions(heavy):
    # §4.3: O = B = 1024 is "a scenario with frequent evictions"
    assert heavy["vllm"]["num_evictions"] > 0 and heavy["sarathi"]["num_evictions"] > 0


def test_eviction_free_trades_ttft_for_tpot(heavy):
    # §4.3: eviction-free variants have lower TPOT, vLLM's also higher TPS
    # (Sarathi's TPS claim differs: see FINDINGS.md)
    assert heavy["vllm-ef"]["tps"] > heavy["vllm"]["tps"]
    for name in ("vllm", "sarathi"):
        assert heavy[f"{name}-ef"]["tpot_mean_s"] < heavy[name]["tpot_mean_s"]


def test_eviction_free_running_size_is_M_over_I_plus_O(heavy):
    # §4.3 remark: effective running size ≈ M / (I + O) = 100K / 2048 ≈ 49 (the table's tolerance, 10 %)
    for name in ("vllm-ef", "sarathi-ef"):
        assert heavy[name]["running_size_mean"] == pytest.approx(PAPER.M / (1024 + 1024), rel=0.10)


def test_small_input_eviction_free_ttft_is_as_much_worse_as_the_paper_says():
    # §4.3: TTFT "up to 1800x" worse for eviction-free vLLM, reached at I = 1 (±25 % of the effect)
    w = Workload.from_spec("fixed:I=1,O=1024,B=1024")
    base, ef = simulate(w, "vllm", PAPER).metrics, simulate(w, "vllm-ef", PAPER).metrics
    assert claimlib.Effect(lo=1800).contains(ef["ttft_mean_s"] / base["ttft_mean_s"])


def test_sarathi_nohy_is_the_slow_one_at_large_input():
    # App. A.1: Sarathi-nohy "exhibits ... high latency as I increases"; vLLM has the lowest latency
    w = Workload.from_spec("fixed:I=1024,O=32,B=32")
    lat = {n: simulate(w, n, PAPER).metrics["latency_s"] for n in
           ["vllm", "sarathi", "sarathi-pc", "sarathi-nocp", "vllm-hy", "sarathi-nohy"]}
    assert max(lat, key=lat.get) == "sarathi-nohy"
    assert lat["vllm"] == min(lat.values())
