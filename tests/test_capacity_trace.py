"""Capacity search (infermax/capacity.py) and the Chrome-trace / Perfetto export (infermax/chrome_trace.py),
through the library and the CLI (``infermax capacity``, ``infermax trace-export``)."""
import json
import math

import numpy as np
import pytest

from infermax import Limits, Workload, replay, simulate
from infermax.capacity import Target, find_capacity, workload_at
from infermax.chrome_trace import cluster_trace, schedule_trace
from infermax.cli import main
from infermax.cluster import Cluster, simulate_cluster

SPEC = "fixed:I=128,O=32,B=60,seed=2,rate={rate}"


def test_targets_parse_and_judge():
    t = Target.parse("ttft_p99_s<=0.5")
    assert (t.metric, t.op, t.bound) == ("ttft_p99_s", "<=", 0.5) and t.met(0.5) and not t.met(0.51)
    assert Target.parse(" slo_attainment >= 0.9").met(0.95) and not Target.parse("slo_attainment>=0.9").met(math.nan)
    for bad in ("ttft_p99_s<0.5", "0.5>=x", "ttft_p99_s<=inf", ""):
        with pytest.raises(ValueError, match="capacity: target"):
            Target.parse(bad)


def test_the_rate_goes_where_the_spec_says():
    assert workload_at(SPEC, 2.5) == "fixed:I=128,O=32,B=60,seed=2,rate=2.5"
    assert workload_at("mix:LILO+SISO,B=32", 3) == "mix:LILO+SISO,B=32,rate=3"
    with pytest.raises(ValueError, match="fixes its rate"):
        workload_at("fixed:I=8,O=8,B=8,rate=2", 1)
    with pytest.raises(ValueError, match="no {rate} placeholder"):
        workload_at("trace:splitwise_conv,n=100", 1)


def test_the_capacity_passes_the_next_rate_up_fails_and_the_bracket_is_narrow():
    res = find_capacity(SPEC, "sarathi", "M=20000,C=1024", target="ttft_p99_s<=0.2", lo_rps=2.0,
                        rel_tol=0.1, executor="serial", workers=2)
    assert res.rate_rps is not None and res.failing_rps is not None
    assert res.failing_rps - res.rate_rps <= 0.1 * res.rate_rps
    by_rate = {p.rate_rps: p for p in res.probes}
    assert by_rate[res.rate_rps].met and not by_rate[res.failing_rps].met
    # the probe's value is the simulation's own metric
    direct = simulate(workload_at(SPEC, res.rate_rps), "sarathi", "M=20000,C=1024").metrics["ttft_p99_s"]
    assert by_rate[res.rate_rps].value == direct


def test_no_passing_rate_and_bad_inputs_are_said():
    res = find_capacity(SPEC, "sarathi", "M=20000,C=1024", target="ttft_p99_s<=1e-6", lo_rps=1.0, hi_rps=2.0,
                        executor="serial")
    assert res.rate_rps is None and res.failing_rps == 1.0
    with pytest.raises(ValueError, match="hi_rps = 1.0 must exceed lo_rps = 2.0"):
        find_capacity(SPEC, lo_rps=2.0, hi_rps=1.0, executor="serial")
    with pytest.raises(ValueError, match="metric 'ttft_p42_s' is not among"):
        find_capacity(SPEC, target="ttft_p42_s<=1", lo_rps=1.0, hi_rps=2.0, executor="serial")


def test_capacity_cli_json(capsys):
    code = main(["capacity", "--workload", SPEC, "--scheduler", "sarathi", "--limits", "M=20000,C=1024",
                 "--target", "ttft_p99_s<=0.2", "--lo", "2", "--tol", "0.2", "--executor", "serial", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["target"] == "ttft_p99_s<=0.2" and out["capacity_rps"] < out["failing_rps"]


def _check_document(doc, num_batches: int, trace) -> None:
    json.dumps(doc)                                   # plain JSON
    batches = [e for e in doc["traceEvents"] if e.get("cat") == "batch"]
    assert len(batches) == num_batches
    np.testing.assert_allclose([e["ts"] for e in batches], trace.batches["start_s"] * 1e6)
    np.testing.assert_allclose([e["dur"] for e in batches], trace.batches["duration_s"] * 1e6)
    assert {e["name"] for e in batches} <= {"prefill", "decode", "mixed"}
    spans = [e for e in doc["traceEvents"] if e.get("cat") == "request"]
    assert sum(e["ph"] == "b" for e in spans) == sum(e["ph"] == "e" for e in spans) > 0


def test_a_schedule_exports_every_batch_as_the_judge_times_it():
    w = Workload.from_spec("fixed:I=200,O=12,B=16,rate=30")
    lim = Limits(M=3000, C=256)
    res = simulate(w, "sarathi", lim)
    doc = schedule_trace(res.schedule, w, lim)
    _check_document(doc, len(res.schedule), replay(res.schedule, w, lim))
    mixed = [e for e in doc["traceEvents"] if e.get("name") == "mixed"]
    assert mixed and all(e["args"]["prefill_tokens"] < e["args"]["tokens"] for e in mixed)


def test_a_cluster_exports_one_process_per_replica():
    w = Workload.from_spec("fixed:I=128,O=8,B=24,rate=50")
    res = simulate_cluster(w, Cluster.from_spec("a100:nodes=1,gpus_per_node=4,model=llama2-7b"), "round-robin", "vllm")
    doc = cluster_trace(res.cluster_schedule(), w)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e.get("name") == "process_name"}
    assert {"replica 0", "replica 1", "replica 2", "replica 3", "requests"} <= names
    batches = [e for e in doc["traceEvents"] if e.get("cat") == "batch"]
    assert len(batches) == sum(len(s) for s in res.schedules)


def test_trace_export_cli(capsys, tmp_path):
    main(["simulate", "--scheduler", "vllm", "--workload", "fixed:I=32,O=8,B=16", "--out", str(tmp_path)])
    capsys.readouterr()
    out = tmp_path / "trace.json"
    code = main(["trace-export", str(tmp_path / "schedule.json"), "--out", str(out), "--no-requests"])
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert code == 0 and "ui.perfetto.dev" in text and "chrome://tracing" in text
    assert doc["displayTimeUnit"] == "ms" and not any(e.get("cat") == "request" for e in doc["traceEvents"])
