"""Several schedulers from one command line (infermax.multirun), tested without the command line."""
from __future__ import annotations

import pytest

from infermax.multirun import exit_status, run_each, schedulers_to_run
from infermax.types import Limits, Workload

LIMITS = Limits(M=4000, C=256)
SMALL, LONG = Workload.from_spec("fixed:I=16,O=8,B=4"), Workload.from_spec("fixed:I=300,O=4,B=4")


def test_named_schedulers_run_as_named_and_unknown_ones_fail_first():
    assert schedulers_to_run("vllm, sarathi", "sarathi-pc", LONG, LIMITS) == (["vllm", "sarathi"], [])
    with pytest.raises(ValueError, match="'nope'"):
        schedulers_to_run("vllm,nope", "vllm", SMALL, LIMITS)
    with pytest.raises(ValueError, match=r"--scheduler ',' names no scheduler"):
        schedulers_to_run(",", "vllm", SMALL, LIMITS)


def test_the_default_set_leaves_out_what_cannot_serve_the_workload():
    assert schedulers_to_run(None, "vllm,sarathi", SMALL, LIMITS) == (["vllm", "sarathi"], [])
    names, notes = schedulers_to_run(None, "vllm,sarathi,vllm-ef", LONG, LIMITS)
    assert names == ["sarathi"] and len(notes) == 1 and notes[0].startswith("vllm, vllm-ef left out")
    names, notes = schedulers_to_run(None, "vllm", LONG, LIMITS)
    assert names == ["sarathi"] and notes[-1].startswith("running sarathi instead")


def test_run_each_keeps_results_beside_refusals_and_failures():
    def run(name):
        if name == "refuses":
            raise ValueError("no\nchunked prefill")
        if name == "bug":
            raise KeyError("x")
        return name.upper()

    runs = run_each(["a", "refuses", "b"], run)
    assert runs.done == [("a", "A"), ("b", "B")] and [r.scheduler for r in runs.refused] == ["refuses"]
    assert runs.refused[0].line() == "refuses: refused: no; chunked prefill" and exit_status(runs) == 4
    assert exit_status(run_each(["refuses"], run)) == 5 and exit_status(run_each(["a"], run)) == 0
    failed = run_each(["a", "bug"], run)
    assert failed.refused[0].internal and exit_status(failed) == 1 and "KeyError" in failed.refused[0].traceback
