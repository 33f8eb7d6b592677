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
