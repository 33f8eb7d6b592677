"""``infermax solve``: JSON output, files, errors."""
from __future__ import annotations

import argparse
import json

import pytest

from infermax import Schedule, replay
from infermax.csp.cli import add_subcommands

pytestmark = pytest.mark.solver


def _run(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_subcommands(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_solve_prints_json_and_writes_the_schedule(tmp_path, capsys):
    code = _run(["solve", "--workload", "fixed:I=4,O=3,B=3", "--limits", "M=8,C=64", "--time-limit", "20",
                 "--json", "--out", str(tmp_path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == "optimal" and out["objective"] > 0
    sched = Schedule.from_json(tmp_path / "schedule.json")
    assert len(sched) == out["num_batches"]
    assert replay(sched, "fixed:I=4,O=3,B=3", "M=8,C=64").num_batches == out["num_batches"]
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "optimal"


def test_policy_flags_and_table_output(capsys):
    assert _run(["solve", "--workload", "fixed:I=3,O=3,B=3", "--limits", "M=6,C=64", "--no-eviction",
                 "--time-limit", "20"]) == 0
    text = capsys.readouterr().out
    assert "status" in text and "num_evictions  0" in text


def test_better_than_reports_no_such_schedule(capsys):
    assert _run(["solve", "--workload", "fixed:I=2,O=2,B=2", "--limits", "M=8,C=64", "--better-than", "1e-6",
                 "--time-limit", "20"]) == 0
    assert "no schedule is 10% better than 1e-6" in capsys.readouterr().out


def test_errors_exit_through_the_main_cli(capsys):
    from infermax.cli import main

    assert main(["solve", "--workload", "fixed:I=9,O=4,B=2", "--limits", "M=8"]) == 2
    assert "cannot fit in M" in capsys.readouterr().err


def test_solve_out_replays_on_its_own(tmp_path, capsys):
    """``solve --out`` writes what ``replay`` needs next to the schedule (workload, limits, cost)."""
    from infermax.cli import main

    out = tmp_path / "solved"
    assert main(["solve", "--workload", "fixed:I=3,O=2,B=3", "--limits", "M=6,C=64", "--time-limit", "20",
                 "-q", "--out", str(out)]) == 0
    capsys.readouterr()
    assert {"schedule.json", "workload.json", "result.json"} <= {p.name for p in out.iterdir()}
    assert main(["replay", str(out / "schedule.json"), "--json"]) == 0
    judged = json.loads(capsys.readouterr().out)
    assert judged["valid"] and judged["latency_s"] == pytest.approx(
        json.loads((out / "result.json").read_text())["objective"], rel=1e-12)


@pytest.mark.parametrize("flag,value,field", [("--time-limit", "nan", "time_limit_s"),
                                              ("--time-limit", "0", "time_limit_s"),
                                              ("--time-limit", "-1", "time_limit_s"), ("--gap", "-1", "rel_gap"),
                                              ("--threads", "0", "threads"), ("--horizon", "0", "horizon"),
                                              ("--warm-start", "foo", "foo")])
def test_solver_flags_are_validated(capsys, flag, value, field):
    from infermax.cli import main

    code = main(["solve", "--workload", "fixed:I=2,O=2,B=2", "--limits", "M=8,C=64", flag, value])
    err = capsys.readouterr().err
    assert code == 2 and field in err and "Traceback" not in err


def test_ctrl_c_writes_the_best_schedule_so_far(tmp_path, capsys, monkeypatch):
    """Ctrl-C inside a stage: the warm start (the best known then) is written to --out, exit 130, one line."""
    from infermax.cli import main
    from infermax.csp import api

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "_lower_bound", interrupted)
    out = tmp_path / "stopped"
    code = main(["solve", "--workload", "fixed:I=3,O=2,B=3", "--limits", "M=6,C=64", "--out", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 130
    assert json.loads(captured.out)["stopped"].startswith("interrupted")
    assert "interrupted" in captured.err and "Traceback" not in captured.err
    assert replay(Schedule.from_json(out / "schedule.json"), "fixed:I=3,O=2,B=3", "M=6,C=64").num_batches > 0


def test_progress_lines_wait_for_a_long_solve(capsys):
    """Events of a solve shorter than the threshold print nothing; once it runs longer, the held state and
    every later event print one line each on stderr."""
    from infermax.csp.cli import _ProgressLines
    from infermax.csp.progress import SolveProgress

    show = _ProgressLines(enabled=True, after_s=2.0)
    show(SolveProgress("warm start", 0.1, 1.0, None, None))
    show(SolveProgress("lower bound", 0.5, 1.0, 0.9, 0.1))
    assert capsys.readouterr().err == ""
    show(SolveProgress("per-request MILP", 2.5, 0.95, 0.9, 0.05))
    show(SolveProgress("done", 3.0, 0.95, 0.9, 0.05))
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("]")[1].split()[0] for line in lines] == ["lower", "per-request", "done"]
    quiet = _ProgressLines(enabled=False)
    quiet(SolveProgress("per-request MILP", 9.0, 0.95, 0.9, 0.05))
    assert capsys.readouterr().err == ""
