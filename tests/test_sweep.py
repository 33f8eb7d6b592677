"""Sweeps: grid expansion, executors agree, resume skips finished cells, failing cells become rows."""
from __future__ import annotations

import importlib
import inspect
import json
import os

import numpy as np
import pandas as pd
import pytest

import infermax
from infermax.cli import main
from infermax.sweep import Cell, SweepConfig, run_cells, same_results, sweep

SWEEP_RUN = importlib.import_module("infermax.sweep.run")   # where run_cells finds run_cell (patched below)

SMALL = {"workloads": [{"grid": {"I": [4, 64], "O": [8, 32], "B": [48]}}, "fixed:I=300,O=8,B=4"],
         "schedulers": ["vllm", "sarathi", "vllm-ef"],
         "limits": [{"grid": {"M": [200, 20000], "C": [4096]}}]}


@pytest.fixture(scope="module")
def serial_table():
    return sweep(SMALL, executor="serial")


def test_grid_expands_in_the_order_written():
    cfg = SweepConfig.from_dict({
        "workloads": [{"grid": {"I": [1, 64], "O": [32], "B": [8], "seed": [3]}},
                      {"template": "mix:{mix},B={B}", "grid": {"mix": ["LILO+SISO"], "B": [16, 32]}}],
        "schedulers": [{"grid": {"name": ["vllm", "sarathi"], "R_max": [64, None]}}],
        "limits": {"grid": {"M": ["100K"], "R_max": [128]}}})
    assert cfg.workloads == ("fixed:I=1,O=32,B=8,seed=3", "fixed:I=64,O=32,B=8,seed=3",
                             "mix:LILO+SISO,B=16", "mix:LILO+SISO,B=32")
    assert cfg.schedulers == ("vllm:R_max=64", "vllm:R_max=none", "sarathi:R_max=64", "sarathi:R_max=none")
    cells = cfg.cells()
    assert len(cells) == 4 * 4
    assert cells[0] == Cell("fixed:I=1,O=32,B=8,seed=3", "vllm:R_max=64", "M=100000,C=4096,P=4096,R_max=128")
    assert len({c.cell_id for c in cells}) == len(cells)


def test_same_limits_spelled_twice_are_one_cell():
    cfg = SweepConfig.from_dict({"workloads": "fixed:I=4,O=4,B=4", "schedulers": ["vllm"],
                                 "limits": ["M=100K", "M=100000,C=4096"]})
    assert len({c.cell_id for c in cfg.cells()}) == 1
    assert len(run_cells(cfg.cells(), executor="serial")) == 1


@pytest.mark.parametrize("bad, needle", [
    ({"workloads": ["fixed:I=4,O=4,B=4"], "schedulers": ["nope"]}, "unknown scheduler 'nope'"),
    ({"workloads": ["fixed:I=4,O=4,B=4"], "schedulers": ["vllm"], "limit": ["M=1"]}, "unknown key(s) ['limit']"),
    ({"workloads": [{"grid": {"I": [4], "O": [4]}}], "schedulers": ["vllm"]}, "needs I, O and B"),
    ({"workloads": ["fixed:I=4,O=4,B=4"], "schedulers": ["vllm"], "limits": ["M=x"]}, "Limits.M"),
    ({"schedulers": ["vllm"]}, "'workloads' is required"),
])
def test_bad_config_names_the_field(bad, needle):
    with pytest.raises(ValueError) as err:
        SweepConfig.from_dict(bad)
    assert needle in str(err.value)


def test_table_has_config_metrics_and_error_columns(serial_table):
    df = serial_table
    assert len(df) == 5 * 3 * 2
    for col in ("cell_id", "workload", "scheduler", "limits", "I", "O", "B", "M", "policy", "latency_s", "tps",
                "ttft_mean_s", "tpot_mean_s", "num_evictions", "kv_utilization_mean", "error", "wall_s"):
        assert col in df, col
    ok = df[df["error"].isna()]
    assert (ok["tps"] > 0).all() and ok["I"].isin([4, 64, 300]).all()
    # grid order: workloads outermost, then schedulers, then limits
    assert list(df["scheduler"][:6]) == ["vllm", "vllm", "sarathi", "sarathi", "vllm-ef", "vllm-ef"]
    assert list(df["M"][:2]) == [200, 20000]
    # the same metric the simulator reports
    row = ok.iloc[0]
    direct = infermax.simulate(row["workload"], row["scheduler"], row["limits"]).metrics
    assert row["latency_s"] == direct["latency_s"] and row["num_evictions"] == direct["num_evictions"]


def test_a_failing_cell_is_a_row_with_its_error(serial_table):
    bad = serial_table[serial_table["error"].notna()]
    assert len(bad) == 3                                   # I=300,O=8 cannot fit in M=200, for 3 schedulers
    assert set(bad["workload"]) == {"fixed:I=300,O=8,B=4"} and set(bad["M"]) == {200}
    assert bad["error"].str.contains("cannot fit in M").all()
    assert bad["tps"].isna().all()


def test_local_processes_equal_serial(serial_table):
    local = sweep(SMALL, executor="local", workers=2)
    assert same_results(local, serial_table)
    assert not same_results(local.iloc[::-1], serial_table)     # order matters: rows sorted by cell


def test_infermax_sweep_is_the_package_and_calling_it_sweeps():
    assert inspect.ismodule(infermax.sweep) and infermax.sweep is importlib.import_module("infermax.sweep")
    assert inspect.isfunction(sweep) and infermax.sweep.sweep is sweep is SWEEP_RUN.sweep
    assert infermax.sweep.run is SWEEP_RUN and infermax.sweep.config.SweepConfig is SweepConfig
    df = infermax.sweep({"workloads": ["fixed:I=4,O=4,B=4"], "schedulers": ["vllm"]}, executor="serial")
    assert len(df) == 1 and df["error"].isna().all()


def test_resume_skips_finished_cells(tmp_path, monkeypatch, serial_table):
    out = tmp_path / "res.parquet"
    cfg = SweepConfig.from_dict(SMALL)
    cells = cfg.cells()
    calls: list[str] = []
    real = SWEEP_RUN.run_cell

    def counting(cell):
        calls.append(cell.cell_id)
        return real(cell)

    monkeypatch.setattr(SWEEP_RUN, "run_cell", counting)

    class Stop(Exception):
        pass

    def stop_after_10(done, total):
        if done == 10:
            raise Stop

    with pytest.raises(Stop):                    # an interrupted sweep keeps what it finished
        run_cells(cells, out=out, executor="serial", progress=stop_after_10)
    assert len(pd.read_parquet(out)) == 10 and (tmp_path / "res.csv").exists()
    calls.clear()
    resumed = run_cells(cells, out=out, executor="serial")
    assert len(calls) == len(cells) - 10 and not set(calls) & {c.cell_id for c in cells[:10]}
    assert same_results(resumed, serial_table)
    assert same_results(pd.read_parquet(out), serial_table)
    calls.clear()
    run_cells(cells, out=out, executor="serial")
    assert calls == []
    run_cells(cells, out=out, executor="serial", retry_errors=True)
    assert sorted(calls) == sorted(serial_table.loc[serial_table["error"].notna(), "cell_id"])


def test_resume_keeps_rows_of_other_configs(tmp_path):
    out = tmp_path / "r.parquet"
    a = sweep({"workloads": ["fixed:I=4,O=4,B=4"], "schedulers": ["vllm"]}, out=out, executor="serial")
    b = sweep({"workloads": ["fixed:I=8,O=4,B=4"], "schedulers": ["vllm"]}, out=out, executor="serial")
    assert list(b["workload"]) == ["fixed:I=8,O=4,B=4"]                     # the table of this sweep ...
    kept = pd.read_parquet(out)                                             # ... the file keeps both
    assert list(kept["workload"]) == ["fixed:I=8,O=4,B=4", "fixed:I=4,O=4,B=4"]
    assert kept.iloc[1]["latency_s"] == a.iloc[0]["latency_s"]
    fresh = sweep({"workloads": ["fixed:I=8,O=4,B=4"], "schedulers": ["vllm"]}, out=out, executor="serial",
                  resume=False)
    assert len(fresh) == 1


def test_cli_sweep_then_plot(tmp_path, capsys):
    cfg = tmp_path / "grid.yaml"
    cfg.write_text("name: cli\nworkloads:\n  - grid: {I: [4, 64], O: [8, 32], B: [32]}\n"
                   "schedulers: [vllm, sarathi]\nlimits: [M=20000]\n")
    assert main(["sweep", str(cfg), "--executor", "serial", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["cells"] == 8 and summary["errors"] == 0
    assert summary["out"] == str(tmp_path / "grid.parquet") and (tmp_path / "grid.csv").exists()
    csv = pd.read_csv(tmp_path / "grid.csv")
    assert len(csv) == 8 and np.allclose(csv["tps"], pd.read_parquet(tmp_path / "grid.parquet")["tps"])
    png = tmp_path / "fig.png"
    assert main(["plot", summary["out"], "--x", "I", "--metric", "tps", "--out", str(png), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert png.stat().st_size > 1000
    assert info["panels"] == 2 and info["lines"] == 4           # one panel per O, one line per scheduler
    assert main(["sweep", str(tmp_path / "missing.yaml"), "--json"]) == 2
    assert "does not exist" in json.loads(capsys.readouterr().out)["error"]


# --- Ray -----------------------------------------------------------------------------------------
RAY_GRID = {"workloads": {"grid": {"I": [1, 4, 16, 64, 256, 300], "O": [1, 8, 32, 64], "B": [64]}},
            "schedulers": ["vllm", "sarathi", "sarathi-pc", "vllm-ef", "rank-i"],
            "limits": {"grid": {"M": [300, 100000]}}}


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    old = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"         # no auth token written under ~/.ray
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()
    if old is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = old


@pytest.mark.slow   # 240 cells twice (about 10 s of CPU); the resume test below runs Ray by default
def test_ray_sweep_of_240_cells_equals_local(ray_session):
    cells = SweepConfig.from_dict(RAY_GRID).cells()
    assert len(cells) >= 200
    on_ray = run_cells(cells, executor="ray")
    local = run_cells(cells, executor="local", workers=2)
    assert ray_session.is_initialized()               # the sweep used, and left, the caller's Ray
    assert same_results(on_ray, local), "ray and local tables differ"
    unfit = on_ray["I"] + on_ray["O"] - 1 > on_ray["M"]   # e.g. I=300, O=8 in M=300
    assert (on_ray["error"].notna() == unfit).all() and unfit.sum() == 20


def test_ray_resumes_a_local_sweep(ray_session, tmp_path):
    out = tmp_path / "r.parquet"
    small = dict(RAY_GRID, workloads={"grid": {"I": [4, 64], "O": [8], "B": [64]}})
    sweep(dict(small, schedulers=["vllm"]), out=out, executor="local")
    full = sweep(small, out=out, executor="ray")
    assert same_results(full, sweep(small, executor="serial"))
