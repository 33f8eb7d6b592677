"""The command line fails cleanly (issue 18 §5, §6): exit status 2 and one line ``infermax: error: ...``
naming the thing, never a traceback; ``--json`` errors are a JSON object; JSON output has no NaN;
replay judges the instance stored with a schedule; Ctrl-C is one line and leaves no workers behind."""
from __future__ import annotations

import importlib
import inspect
import json
import multiprocessing
import shutil
from pathlib import Path

import pandas as pd
import pytest

import infermax
from infermax.cli import main
from infermax.sweep import Cell, run_cells

SWEEP_RUN = importlib.import_module("infermax.sweep.run")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SMALL = ("--workload", "fixed:I=16,O=8,B=32", "--limits", "M=400,C=256")


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def strict_json(text: str):
    """json.loads that refuses NaN / Infinity (not JSON, though Python writes them by default)."""
    def refuse(token):
        raise AssertionError(f"JSON output holds {token}")
    return json.loads(text, parse_constant=refuse)


def one_error_line(err: str, *needles: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith("infermax: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """``simulate --out``: a Sarathi run of a small instance."""
    out = tmp_path_factory.mktemp("runs") / "sarathi"
    assert main(["simulate", "--scheduler", "sarathi", *SMALL, "--out", str(out), "-q"]) == 0
    return out


# --- files that are missing, wrong, or cannot be written --------------------------------------------
@pytest.mark.parametrize("argv,needles", [
    (("replay", "nonexistent.json"), ("nonexistent.json", "does not exist")),
    (("bound", "--schedule", "nonexistent.json"), ("nonexistent.json", "does not exist")),
    (("simulate", *SMALL, "--scheduler", "vllm", "--out", "/proc/x"), ("/proc/x", "cannot create")),
    (("sweep", "nonexistent.yaml"), ("nonexistent.yaml", "does not exist")),
    (("plot", "nonexistent.parquet"), ("nonexistent.parquet", "does not exist")),
    (("validate", "--out", "/proc/x"), ("/proc/x",)),
    (("costmodel", "fit", "--profile", "nonexistent_dir", "--out", "f.json"), ("nonexistent_dir",)),
])
def test_missing_and_unwritable_paths_are_named(capsys, argv, needles):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    one_error_line(err, *needles)
    code, out, err = run(capsys, *argv, "--json")
    assert code == 2 and strict_json(out)["error"] and one_error_line(err, *needles)


def test_wrong_kinds_of_file(capsys, tmp_path, run_dir):
    trace = tmp_path / "some_trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n")
    code, _, err = run(capsys, "replay", str(trace))
    assert code == 2 and one_error_line(err, "some_trace.csv", "not a schedule JSON", "CSV")
    code, _, err = run(capsys, "replay", str(run_dir))                                # a directory
    assert code == 2 and one_error_line(err, str(run_dir), "directory")
    broken = tmp_path / "broken.json"
    broken.write_text('{"format": "infermax.schedule/1",\n "batches": [}')
    code, _, err = run(capsys, "replay", str(broken))
    assert code == 2 and one_error_line(err, "broken.json", "line 2")
    code, _, err = run(capsys, "bound", "--schedule", str(trace))
    assert code == 2 and one_error_line(err, "some_trace.csv", "not a schedule JSON")


def test_directories_given_as_files_and_files_as_directories(capsys, tmp_path, run_dir):
    a_file = run_dir / "metrics.json"
    cases = [(("simulate", *SMALL, "--scheduler", "vllm", "--out", str(a_file)), "is a file"),
             (("sweep", str(EXAMPLES / "grid.yaml"), "--out", str(tmp_path)), "is a directory"),
             (("plot", str(tmp_path)), "is a directory"),
             (("costmodel", "fit", "--profile", "a100/Llama-2-7b-hf", "--out", str(tmp_path)), "is a directory")]
    for argv, needle in cases:
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        one_error_line(err, needle)


# --- replay and bound judge the instance stored with the schedule ------------------------------------
def test_replay_judges_the_stored_instance_of_a_trace_workload(capsys, tmp_path):
    spec = "trace:splitwise_code,n=60,time_scale=2"
    code, out, _ = run(capsys, "simulate", "--scheduler", "sarathi", "--workload", spec, "--out", str(tmp_path),
                       "--json", "-q")
    simulated = strict_json(out)["results"][0]["latency_s"]
    assert {"schedule.json", "workload.json", "limits.json", "cost.json"} <= {p.name for p in tmp_path.iterdir()}
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"), "--json")
    result = strict_json(out)
    assert code == 0 and result["latency_s"] == simulated
    assert result["judged_against"]["workload"]["source"] == str(tmp_path / "workload.json")
    assert result["judged_against"]["limits"]["source"] == str(tmp_path / "limits.json")
    assert result["judged_against"]["cost"]["source"] == str(tmp_path / "cost.json")
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"))
    assert code == 0 and out.startswith("judged against workload") and "workload.json" in out


def test_replay_says_when_given_limits_differ_from_the_stored_ones(capsys, run_dir):
    code, out, _ = run(capsys, "replay", str(run_dir / "schedule.json"), "--limits", "M=10000,C=256", "--json")
    result = strict_json(out)
    assert code == 0 and result["judged_against"]["limits"]["M"] == 10000
    assert any("--limits" in n and "differs" in n and "M=400" in n for n in result["notes"])
    code, out, _ = run(capsys, "replay", str(run_dir / "schedule.json"), "--limits", "M=10000,C=256")
    assert "note: --limits M=10000" in out


def test_replay_of_a_lone_schedule_falls_back_to_its_meta_and_says_so(capsys, tmp_path, run_dir):
    shutil.copy(run_dir / "schedule.json", tmp_path / "schedule.json")
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"), "--json")
    result = strict_json(out)
    assert code == 0 and result["judged_against"]["limits"]["source"] == "the schedule's meta"
    assert any("no workload.json" in n for n in result["notes"])


@pytest.mark.parametrize("cost", ["roofline:h100/llama3-8b", "fitted"])
def test_replay_uses_the_stored_cost_model(capsys, tmp_path, cost):
    if cost == "fitted":                               # a fit under a name nothing registers, then deleted
        model = infermax.costmodel.get_cost_model("a100/llama2-7b")
        fit = tmp_path / "my_fit.json"
        fit.write_text(json.dumps({**model.describe(), "name": "my_fit"}))
        cost = str(fit)
    out_dir = tmp_path / "run"
    code, out, _ = run(capsys, "simulate", "--scheduler", "vllm", *SMALL, "--cost", cost, "--out", str(out_dir),
                       "--json", "-q")
    simulated = strict_json(out)["results"][0]["latency_s"]
    if cost.endswith(".json"):
        Path(cost).unlink()
    code, out, _ = run(capsys, "replay", str(out_dir / "schedule.json"), "--json")
    result = strict_json(out)
    assert code == 0 and result["latency_s"] == simulated
    assert result["judged_against"]["cost"]["name"] != "default"


def test_bound_of_a_schedule_file_uses_its_instance_and_its_author(capsys, tmp_path, run_dir):
    code, out, _ = run(capsys, "bound", "--schedule", str(run_dir / "schedule.json"), "--no-optimum", "--json")
    result = strict_json(out)
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert code == 0 and result["scheduler"] == "sarathi" and result["latency_s"] == metrics["latency_s"]
    assert result["judged_against"]["workload"]["num_requests"] == 32
    assert result["judged_against"]["limits"]["M"] == 400
    doc = json.loads((run_dir / "schedule.json").read_text())
    doc["meta"] = {}                                   # made elsewhere: no scheduler named
    anonymous = tmp_path / "schedule.json"
    anonymous.write_text(json.dumps(doc))
    code, out, _ = run(capsys, "bound", "--schedule", str(anonymous), "--workload", str(run_dir / "workload.json"),
                       "--limits", "M=400,C=256", "--no-optimum")
    assert code == 0 and "vllm" not in out and "unnamed schedule" in out


def test_bound_takes_a_list_of_schedulers_like_simulate(capsys):
    code, out, _ = run(capsys, "bound", "--scheduler", "vllm,sarathi", *SMALL, "--no-optimum", "--json")
    result = strict_json(out)
    assert code == 0 and [r["scheduler"] for r in result["results"]] == ["vllm", "sarathi"]
    code, out, _ = run(capsys, "bound", "--scheduler", "vllm,sarathi", *SMALL, "--no-optimum")
    assert code == 0 and "vllm: bound methods" in out and "sarathi: bound methods" in out


def test_bound_reports_an_invalid_schedule_with_the_common_prefix(capsys, tmp_path, run_dir):
    doc = json.loads((run_dir / "schedule.json").read_text())
    doc["batches"] = doc["batches"][:-1]
    short = tmp_path / "schedule.json"
    short.write_text(json.dumps(doc))
    for name in ("workload.json", "limits.json", "cost.json"):
        shutil.copy(run_dir / name, tmp_path / name)
    code, _, err = run(capsys, "bound", "--schedule", str(short), "--no-optimum")
    assert code == 2 and one_error_line(err, "sarathi", "incomplete")


def test_solve_out_then_replay(capsys, tmp_path):
    pytest.importorskip("ortools")
    code, out, _ = run(capsys, "solve", "--workload", "fixed:I=8,O=4,B=2", "--limits", "M=64,C=256",
                       "--time-limit", "20", "--out", str(tmp_path), "--json", "-q")
    assert code == 0
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"), "--json")
    result = strict_json(out)
    assert code == 0 and result["valid"] and result["judged_against"]["limits"]["M"] == 64
    assert result["judged_against"]["workload"]["source"] == str(tmp_path / "workload.json")


# --- names and options -------------------------------------------------------------------------------
@pytest.mark.parametrize("argv,needles", [
    (("simulate", *SMALL, "--scheduler", "vlm"), ("'vlm'", "did you mean", "vllm")),
    (("simulate", *SMALL, "--scheduler", "vllm:Rmax=128"), ("Rmax",)),
    (("bound", *SMALL, "--scheduler", "vllm,nope"), ("'nope'",)),
    (("simulate", *SMALL, "--scheduler", "nosuchmodule:Policy"), ("nosuchmodule",)),
    (("simulate", "--bogus"), ("--bogus",)),
    (("plot", str(EXAMPLES / "grid.yaml")), ("grid.yaml", "not a sweep results table")),
])
def test_bad_names_and_options_are_one_line(capsys, argv, needles):
    code, out, err = run(capsys, *argv)
    assert code == 2 and one_error_line(err, *needles)
    code, out, err = run(capsys, *argv, "--json")
    assert code == 2 and strict_json(out)["type"] and one_error_line(err, *needles)


def test_warm_start_from_an_unknown_scheduler_is_refused(capsys):
    pytest.importorskip("ortools")
    code, out, err = run(capsys, "solve", "--workload", "fixed:I=8,O=4,B=2", "--warm-start", "foo", "--json")
    assert code == 2 and "'foo'" in strict_json(out)["error"] and one_error_line(err, "'foo'")


def test_an_internal_error_is_one_line_and_exit_1(capsys, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")
    monkeypatch.setattr(infermax, "simulate", broken)
    code, _, err = run(capsys, "simulate", *SMALL, "--scheduler", "vllm")
    assert code == 1 and one_error_line(err, "internal error", "RuntimeError", "a bug", "-v")
    code, _, err = run(capsys, "-v", "simulate", *SMALL, "--scheduler", "vllm")
    assert code == 1 and "Traceback" in err


# --- JSON output is JSON -----------------------------------------------------------------------------
def test_json_output_has_no_nan(capsys, tmp_path):
    one_token = ("--workload", "fixed:I=8,O=1,B=4", "--limits", "M=400,C=256")      # TPOT undefined: NaN
    code, out, _ = run(capsys, "simulate", "--scheduler", "vllm", *one_token, "--out", str(tmp_path), "--json")
    result = strict_json(out)
    assert code == 0 and result["results"][0]["tpot_mean_s"] is None
    assert "NaN" in result["null_values"]["results[0].tpot_mean_s"]
    strict_json((tmp_path / "metrics.json").read_text())
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"), "--json")
    assert code == 0 and strict_json(out)["tpot_mean_s"] is None
    code, out, _ = run(capsys, "bound", "--scheduler", "vllm", *one_token, "--no-optimum", "--json")
    assert code == 0 and strict_json(out)["metrics"]["tpot_mean_s"] is None


# --- the README's examples ---------------------------------------------------------------------------
def test_execute_and_sweep_are_callable_packages():
    assert inspect.ismodule(infermax.execute) and infermax.execute is importlib.import_module("infermax.execute")
    assert inspect.ismodule(infermax.sweep) and callable(infermax.execute) and callable(infermax.sweep)
    assert inspect.signature(infermax.execute) == inspect.signature(infermax.execute.execute)
    from infermax.execute.validation import validate  # noqa: F401


def test_readme_sweep_then_plot(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run(capsys, "sweep", str(EXAMPLES / "grid.yaml"), "--out", "results.parquet", "--executor",
                       "serial", "--json")
    summary = strict_json(out)
    assert code == 0 and summary["errors"] == 0 and Path("results.parquet").exists() and Path("results.csv").exists()
    code, out, _ = run(capsys, "plot", "results.parquet", "--x", "I", "--metric", "tps", "--out", "fig.png")
    assert code == 0 and Path("fig.png").stat().st_size > 1000 and out.startswith("wrote fig.png")


def test_a_sweep_whose_every_cell_fails_exits_5_with_a_summary(capsys, tmp_path):
    cfg = tmp_path / "fail.yaml"
    cfg.write_text("workloads: ['fixed:I=600,O=600,B=4']\nschedulers: [vllm, sarathi]\nlimits: [M=1000]\n")
    code, out, err = run(capsys, "sweep", str(cfg), "--executor", "serial")
    assert code == 5 and "Traceback" not in err and "2 cells (2 errors)" in out
    assert err.splitlines()[-1].startswith("infermax: error: every one of the 2 cells failed")
    code, out, err = run(capsys, "sweep", str(cfg), "--executor", "serial", "--json", "--no-resume")
    assert code == 5 and strict_json(out)["errors"] == 2 and "every one" in strict_json(out)["error"]


def test_a_bad_yaml_is_named_with_its_line(capsys, tmp_path):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("workloads: [a\nschedulers: b\n")
    code, _, err = run(capsys, "sweep", str(cfg))
    assert code == 2 and one_error_line(err, "bad.yaml", "line 2")


# --- Ctrl-C ------------------------------------------------------------------------------------------
def test_ctrl_c_in_simulate_is_one_line(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt
    monkeypatch.setattr(infermax, "simulate", interrupted)
    code, out, err = run(capsys, "simulate", *SMALL, "--scheduler", "vllm")
    assert code == 130 and out == "" and err == "infermax: interrupted\n"


def test_ctrl_c_in_a_sweep_keeps_the_finished_cells(capsys, tmp_path, monkeypatch):
    real, calls = SWEEP_RUN.run_cell, []

    def second_is_interrupted(cell):
        calls.append(cell)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(cell)
    monkeypatch.setattr(SWEEP_RUN, "run_cell", second_is_interrupted)
    cfg = tmp_path / "g.yaml"
    cfg.write_text("workloads: ['fixed:I=8,O=4,B=4']\nschedulers: [vllm, sarathi, vllm-ef]\n")
    code, out, err = run(capsys, "sweep", str(cfg), "--executor", "serial")
    assert code == 130 and "Traceback" not in err and len(err.splitlines()) == 1
    assert err.startswith("infermax: interrupted: sweep stopped; 1 of 3 cells") and "resume" in err
    assert len(pd.read_parquet(tmp_path / "g.parquet")) == 1


def test_an_interrupted_local_sweep_leaves_no_workers(tmp_path):
    cells = [Cell("fixed:I=8,O=4,B=4", "vllm", "M=100000,C=4096")] + [
        Cell(f"fixed:I=1024,O=1024,B={b}", "sarathi", "M=100000,C=4096") for b in (1024, 1025, 1026)]
    seen: list = []

    def stop(done: int, total: int) -> None:
        if done >= 1:
            seen.extend(multiprocessing.active_children())
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        run_cells(cells, out=tmp_path / "r.parquet", executor="local", workers=2, progress=stop)
    assert seen and multiprocessing.active_children() == []
    assert not any(p.is_alive() for p in seen)
    assert len(pd.read_parquet(tmp_path / "r.parquet")) == 1


# --- progress ----------------------------------------------------------------------------------------
def test_profile_and_validate_report_progress(tmp_path):
    pytest.importorskip("torch")
    from infermax.costmodel.profiler import ProfileGrid, profile_model
    from infermax.execute.validation import validate

    passes: list = []
    grid = ProfileGrid(num_tokens=(1, 16), decode_batch=(1,), decode_kv=(32,), prefill_chunk=(16,),
                       prefill_kv=(0,), repeats=1, warmup=0)
    profile_model(out_dir=tmp_path, grid=grid, progress=lambda done, total: passes.append((done, total)))
    assert passes and passes[-1][0] == passes[-1][1]
    stages: list = []
    validate("vllm", "fixed:I=8,O=4,B=2", "M=512,C=256", cost="default", repeats=2,
             progress=lambda *event: stages.append(event))
    assert stages == [("execute", 1, 2), ("execute", 2, 2)]
