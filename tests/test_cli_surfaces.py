"""What a newcomer meets first: ``--version``, ``infermax schedulers`` (replica schedulers and cluster
policies), an unknown name under ``--cluster``, and ``simulate --cluster --out DIR`` judged by ``replay``."""
import json

import pytest

import infermax
from infermax.cli import main
from infermax.cluster import POLICIES
from infermax.schedulers import available

CLUSTER = "a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3"
LONG_MIX = "pecsched:splitwise_conv,n=16,hi=200000"     # one request above the 95th percentile: a gang


def run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"infermax {infermax.__version__}"


def test_schedulers_lists_cluster_policies_marked_as_such(capsys):
    code, out, _ = run(capsys, "schedulers")
    assert code == 0
    cluster_part = out.split("cluster policies")[1]
    for name in POLICIES:
        assert any(line.split()[:2] == [name, "[cluster]"] for line in cluster_part.splitlines()), name
    replica_part = out.split("cluster policies")[0]
    assert "[cluster]" not in replica_part and all(f"\n{n} " in "\n" + replica_part for n in ("vllm", "sarathi"))
    code, out, _ = run(capsys, "schedulers", "--json")
    doc = json.loads(out)
    assert set(doc["cluster_policies"]) == set(POLICIES)
    assert set(available()) <= set(doc)                     # replica schedulers stay keyed by name
    assert doc["cluster_policies"]["pecsched-fifo"].endswith("fifo")


def test_an_unknown_name_under_cluster_lists_both_kinds(capsys):
    code, _, err = run(capsys, "simulate", "--cluster", CLUSTER, "--scheduler", "fifoo",
                       "--workload", "fixed:I=8,O=4,B=4", "-q")
    assert code == 2
    assert "unknown name 'fifoo' under --cluster (did you mean fifo?)" in err
    policies, schedulers = err.split("neither a cluster policy (")[1].split(") nor a replica scheduler (")
    assert "pecsched" in policies and "loongserve" in policies and "vllm" in schedulers and "sarathi" in schedulers
    # a replica scheduler with options and an import path are not unknown names
    assert run(capsys, "simulate", "--cluster", CLUSTER, "--scheduler", "sarathi:P=64",
               "--workload", "fixed:I=8,O=4,B=4", "-q", "--json")[0] == 0


def test_simulate_cluster_out_writes_a_run_that_replay_judges(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "--cluster", CLUSTER, "--scheduler", "fifo,pecsched",
                       "--decode-replicas", "1", "--workload", LONG_MIX, "-q", "--out", str(tmp_path))
    assert code == 0 and "wrote schedule.json, workload.json, cluster.json, metrics.json" in out
    for policy in ("fifo", "pecsched"):
        run_dir = tmp_path / policy / "sarathi"
        assert {p.name for p in run_dir.iterdir()} == {"schedule.json", "workload.json", "cluster.json",
                                                       "metrics.json"}
        stored = json.loads((run_dir / "metrics.json").read_text())
        assert json.loads((run_dir / "cluster.json").read_text())["spec"] == CLUSTER
        code, out, _ = run(capsys, "replay", str(run_dir / "schedule.json"), "--json")
        judged = json.loads(out)
        assert code == 0 and judged["valid"] is True and judged["num_gangs"] >= 1
        assert judged["latency_s"] == pytest.approx(stored["metrics"]["latency_s"], rel=1e-12)
    doc = json.loads((tmp_path / "fifo" / "sarathi" / "schedule.json").read_text())
    doc["replicas"][0]["batches"][0]["tokens"][0] += 10 ** 6      # a tampered schedule is refused
    bad = tmp_path / "fifo" / "sarathi" / "schedule.json"
    bad.write_text(json.dumps(doc))
    code, _, err = run(capsys, "replay", str(bad))
    assert code == 2 and "infermax: error:" in err


def test_one_cluster_run_writes_into_out_itself(capsys, tmp_path):
    code, _, _ = run(capsys, "simulate", "--cluster", CLUSTER, "--scheduler", "sarathi",
                     "--workload", "fixed:I=32,O=4,B=8", "-q", "--json", "--out", str(tmp_path))
    assert code == 0 and (tmp_path / "schedule.json").is_file()
    code, out, _ = run(capsys, "replay", str(tmp_path / "schedule.json"))
    assert code == 0 and "beside the schedule" in out and "valid cluster schedule: 2 replicas" in out
