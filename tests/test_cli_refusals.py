"""What a user meets first (issue 36 §5, §6): defaults that run long prompts, refusals beside results,
one bound for all schedulers, why the optimum is missing, and inputs refused before any work."""
from __future__ import annotations

import importlib
import json

import pytest

import infermax
from infermax.cli import main

SWEEP_RUN = importlib.import_module("infermax.sweep.run")
BOUNDS = importlib.import_module("infermax.bounds")
# a 300-token prompt over C = 256: the schedulers without chunked prefill refuse it
LONG = ("--workload", "fixed:I=300,O=4,B=4", "--limits", "M=4000,C=256")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_default_schedulers_leave_out_those_without_chunked_prefill_and_say_so(capsys):
    code, out, err = run(capsys, "simulate", *LONG, "-q")
    assert code == 0 and err == ""
    rows = [line.split()[0] for line in out.splitlines()[2:] if not line.startswith("note")]
    assert rows == ["sarathi", "sarathi-pc", "sarathi-ef"]
    assert "note: vllm, vllm-ef left out of the default schedulers: no chunked prefill, and a prompt has 300 " \
           "tokens > min(C, P) = 256" in out


def test_a_refused_scheduler_is_reported_beside_the_others(capsys, tmp_path):
    code, out, err = run(capsys, "simulate", *LONG, "--scheduler", "sarathi,vllm-ef", "-q", "--out", str(tmp_path))
    assert code == 4 and "Traceback" not in err and len(err.splitlines()) == 1
    assert "1 of 2 schedulers refused the workload (vllm-ef" in err
    assert out.splitlines()[2].split()[0] == "sarathi" and "vllm-ef: refused: scheduler 'vllm-ef' has no chunked" in out
    assert (tmp_path / "sarathi" / "schedule.json").exists()           # the finished one is written
    code, out, _ = run(capsys, "simulate", *LONG, "--scheduler", "vllm,sarathi", "--json")
    doc = json.loads(out)
    assert code == 4 and doc["exit_code"] == 4 and [r["scheduler"] for r in doc["results"]] == ["sarathi"]
    assert doc["refused"][0]["scheduler"] == "vllm" and "300 prompt tokens" in doc["refused"][0]["error"]
    code, _, err = run(capsys, "simulate", *LONG, "--scheduler", "vllm,vllm-ef", "-q")
    assert code == 5 and err.rstrip().endswith("; no results")


def test_bound_falls_back_to_a_chunked_scheduler_and_reports_refusals(capsys):
    code, out, _ = run(capsys, "bound", *LONG, "-q", "--no-optimum")
    assert code == 0 and "note: vllm left out" in out and "running sarathi instead" in out
    assert out.splitlines()[3].split()[0] == "sarathi"
    code, out, err = run(capsys, "bound", *LONG, "-q", "--no-optimum", "--scheduler", "sarathi,vllm")
    assert code == 4 and "vllm: refused:" in out and "1 of 2 schedulers refused" in err
    code, out, _ = run(capsys, "bound", *LONG, "--no-optimum", "--scheduler", "sarathi,vllm", "--json")
    results = json.loads(out)["results"]
    assert [r["exit_code"] for r in results] == [0, 4] and results[1]["valid"] is None


def test_the_bound_is_computed_once_for_every_scheduler(capsys, monkeypatch):
    calls = []
    real = BOUNDS.lower_bound

    def counted(*args, **kwargs):
        calls.append(kwargs.get("objective"))
        return real(*args, **kwargs)
    monkeypatch.setattr(BOUNDS, "lower_bound", counted)
    code, out, _ = run(capsys, "bound", "--workload", "fixed:I=16,O=8,B=32", "--scheduler", "vllm,vllm,sarathi",
                       "--objective", "latency,ttft", "-q", "--no-optimum", "--json")
    assert code == 0 and len(json.loads(out)["results"]) == 6 and calls == ["latency", "ttft"]


def test_bound_says_why_the_optimum_is_missing(capsys):
    code, out, _ = run(capsys, "bound", "--workload", "fixed:I=16,O=8,B=32", "-q")
    assert code == 0 and "optimum not reported: too large: 32 requests > 6" in out
    code, out, _ = run(capsys, "bound", "--workload", "fixed:I=16,O=8,B=32", "--objective", "ttft_p99", "--json")
    assert json.loads(out)["optimum_s"] is None and "no exact solver" in json.loads(out)["optimum_note"]


@pytest.mark.parametrize("argv, needle", [
    (("--claimed-latency", "nan"), "--claimed-latency must be a finite number"),
    (("--claimed-value", "nan"), "--claimed-value must be a finite number"),
    (("--claimed-value", "inf"), "--claimed-value must be a finite number"),
    (("--claimed-value", "1", "--objective", "ttft,e2e"), "one scheduler's claim on one objective"),
])
def test_bound_refuses_claims_that_cannot_be_checked(capsys, argv, needle):
    code, out, err = run(capsys, "bound", "--workload", "fixed:I=4,O=4,B=4", *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1 and needle in err


def test_check_scheduler_refuses_a_nan_claim():
    with pytest.raises(ValueError, match="claimed_value_s must be a finite number"):
        infermax.check_scheduler("vllm", "fixed:I=4,O=4,B=4", claimed_value_s=float("nan"), optimum=False)


@pytest.mark.parametrize("solver, needle", [
    ("{backend: nope}", "solver: backend = 'nope': unknown backend 'nope'"),
    ("{backend: cpsat, tim_limit_s: 5}", "solver: unknown option(s) ['tim_limit_s']"),
    ("{time_limit_s: -1}", "solver: time_limit_s = -1"),
    ("{objective: fastest}", "solver: objective = 'fastest'"),
])
def test_a_sweep_config_is_checked_whole_before_any_cell(capsys, tmp_path, monkeypatch, solver, needle):
    def never(cell):
        raise AssertionError("a cell ran")
    monkeypatch.setattr(SWEEP_RUN, "run_cell", never)
    cfg = tmp_path / "g.yaml"
    cfg.write_text(f"workloads: ['fixed:I=4,O=4,B=2']\nschedulers: [vllm]\nsolver: {solver}\n")
    code, _, err = run(capsys, "sweep", str(cfg), "--executor", "serial", "-q")
    assert code == 2 and len(err.splitlines()) == 1 and needle in err


def test_sweep_refuses_a_worker_count_below_one(capsys, tmp_path):
    cfg = tmp_path / "g.yaml"
    cfg.write_text("workloads: ['fixed:I=4,O=4,B=2']\nschedulers: [vllm]\n")
    code, _, err = run(capsys, "sweep", str(cfg), "--workers", "-2")
    assert code == 2 and "--workers must be an integer >= 1, got -2" in err
    with pytest.raises(ValueError, match="workers must be an integer >= 1"):
        SWEEP_RUN.run_cells([], workers=0)


@pytest.mark.parametrize("nodes", ["100000", "99999999999999999999"])
def test_a_cluster_too_large_to_simulate_is_refused_naming_the_limit(capsys, nodes):
    code, _, err = run(capsys, "simulate", "--cluster", f"a100:nodes={nodes},gpus_per_node=8,model=mistral-7b-v0.3",
                       "--workload", "fixed:I=8,O=4,B=4", "-q")
    assert code == 2 and "more than the 16,384 this simulator takes" in err
