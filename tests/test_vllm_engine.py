"""The real vLLM engine (the ``vllm`` extra), recorded, judged and reproduced (issue 37).

Run with ``python -m pytest -m vllm tests/test_vllm_engine.py`` (kept out of the default run; skipped
when vllm is not installed). Each engine start-up takes ~20 s on a CPU.
"""
import importlib.util
import json

import pytest

from infermax import Limits, Workload, replay
from infermax.engines.fidelity import compare_preset, judge
from infermax.engines.records import load_engine_run, num_preemptions

# find_spec, not importorskip: collecting this file in the default run (which deselects it) imports no vllm
pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="the vllm extra is not installed")]

LIMITS = Limits(M=256, C=64, R_max=4, block_size=32)      # 8 blocks: preemptions; I + decodes > C


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from infermax.engines.vllm_engine import run_vllm

    w = Workload.from_spec("fixed:I=60,O=24,B=5")
    return run_vllm(w, LIMITS, "llama-tiny", cache_dir=tmp_path_factory.mktemp("models"))


def test_vllm_schedule_is_valid_under_the_mapped_limits_and_the_preset_makes_it(recorded):
    run = recorded
    assert judge(run.schedule, run.workload, LIMITS) == "valid"
    assert run.measurements.engine["scheduler_config"]["usable_kv_blocks"] == LIMITS.num_blocks
    assert num_preemptions(run.measurements.records) >= 1       # 4 admitted, 2 blocks each: decodes need a 3rd
    comparison, _ = compare_preset(run.schedule, run.workload, LIMITS, run.measurements.requests,
                                   run.measurements.records)
    assert comparison.identical == len(run.schedule), comparison.divergence_text()
    times = [t for t in run.measurements.requests]
    assert all(t.arrival_s <= t.submitted_s <= t.first_token_s <= t.finish_s for t in times)


def test_cli_writes_a_run_directory_replay_and_bound_read(tmp_path, capsys):
    from infermax.cli import main

    out = tmp_path / "run"
    assert main(["vllm", "run", "--workload", "fixed:I=40,O=6,B=3", "--limits", "M=256,C=64,R_max=4,block=32",
                 "--model-cache", str(tmp_path / "models"), "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    schedule, workload, limits, m = load_engine_run(out)
    assert row["steps"] == len(schedule) and limits == Limits.from_spec("M=256,C=64,R_max=4,block=32")
    replay(schedule, workload, limits)
    assert main(["replay", str(out / "schedule.json")]) == 0
    assert main(["bound", "--schedule", str(out / "schedule.json")]) == 0
