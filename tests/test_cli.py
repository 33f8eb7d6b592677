"""The CLI, run in-process through main()."""
import json

import pytest

from infermax.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_simulate_table_and_json(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "--scheduler", "vllm,sarathi", "--workload", "fixed:I=32,O=8,B=64",
                       "--out", str(tmp_path))
    assert code == 0 and "vllm" in out and "sarathi" in out and "latency_s" in out
    assert (tmp_path / "vllm" / "schedule.json").exists() and (tmp_path / "sarathi" / "requests.csv").exists()
    code, out, _ = run(capsys, "simulate", "--scheduler", "vllm", "--workload", "fixed:I=32,O=8,B=64",
                       "--limits", "M=500,C=256", "--json")
    data = json.loads(out)
    assert code == 0 and data["limits"]["M"] == 500 and data["results"][0]["num_requests"] == 64


def test_replay_accepts_valid_and_rejects_tampered_schedules(capsys, tmp_path):
    run(capsys, "simulate", "--scheduler", "sarathi", "--workload", "fixed:I=32,O=8,B=16", "--out", str(tmp_path))
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"), "--json")
    assert code == 0 and json.loads(out)["valid"] is True
    doc = json.loads((tmp_path / "schedule.json").read_text())
    doc["batches"][0]["tokens"][0] += 1000
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(doc))
    code, out, err = run(capsys, "replay", str(bad), "--workload", str(tmp_path / "workload.json"), "--json")
    assert code == 2 and "batch 0" in json.loads(out)["error"] and "prefill-chunk" in err


def test_schedulers_lists_every_table1_name(capsys):
    code, out, _ = run(capsys, "schedulers", "--json")
    names = json.loads(out)
    for n in ("vllm", "sarathi", "sarathi-pc", "sarathi-nocp", "vllm-hy", "sarathi-nohy", "rank-org", "rank-i",
              "rank-o"):
        assert n in names and f"{n}-ef" in names


@pytest.mark.parametrize("argv,match", [
    (("simulate", "--scheduler", "nope", "--workload", "fixed:I=4,O=4,B=4"), "unknown scheduler 'nope'"),
    (("simulate", "--workload", "fixed:I=-1,O=4,B=4"), "I must be a positive integer, got -1"),
    (("simulate", "--workload", "fixed:I=600,O=600,B=4", "--limits", "M=1000"), "request 0 cannot fit in M"),
    (("simulate", "--limits", "M=10,C=abc"), "Limits.C must be an integer, got 'abc'"),
])
def test_bad_input_exits_2_with_the_field_named(capsys, argv, match):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert match in err
