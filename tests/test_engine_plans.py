"""Plans for a real engine, the pure part (no vLLM needed): a Schedule as per-step orders, the refusals made
before an engine starts (each naming the limit), the arrival gate, and plan-vs-executed comparison (issue 37
item 4). The engine itself runs in tests/test_vllm_plans.py (``-m vllm``)."""
import sys

import pytest

from infermax import Limits, Request, Schedule, Workload, simulate
from infermax.cli import main
from infermax.costmodel import get_cost_model
from infermax.engines.plans import PlanStep, check_plan, executed_as_planned, missing, offline, plan_steps, ready
from infermax.rundir import write_run
from infermax.schedule import Batch

LIM = Limits(M=128, C=64, R_max=4, block_size=32)          # 4 blocks of 32
W = Workload.from_lengths([40, 20, 8], [3, 4, 4])


def _plan():
    # 0 fills in two chunks while 1 fills at once; 1 is evicted in decode and refilled (20 + 2 generated);
    # batch 3 holds 4 blocks of 32 (0: 42 tokens, 1: 22, 2: 9)
    return Schedule([Batch([0, 1], [30, 20]), Batch([0, 1], [10, 1]), Batch([0, 2], [1, 8], evict=[1]),
                     Batch([0, 1, 2], [1, 22, 1]), Batch([1, 2], [1, 1]), Batch([2], [1])])


def test_a_plan_becomes_one_step_per_batch_with_its_tokens_and_evictions_in_order():
    steps = plan_steps(_plan())
    assert steps[0] == PlanStep({0: 30, 1: 20}, ()) and steps[2] == PlanStep({0: 1, 2: 8}, (1,))
    assert list(steps[3].tokens.items()) == [(0, 1), (1, 22), (2, 1)] and steps[3].ids == (0, 1, 2)
    assert check_plan(_plan(), W, LIM) == steps


def test_plans_of_registered_schedulers_pass_the_check_and_compare_identical_to_themselves():
    w = Workload.from_spec("fixed:I=60,O=12,B=5")
    lim = Limits(M=256, C=64, R_max=4, block_size=32)
    for name in ("vllm-v1", "sarathi", "bound-e2e", "bound-e2e-ef"):
        plan = simulate(w, name, lim).schedule
        assert len(check_plan(plan, w, lim)) == len(plan)
        c = executed_as_planned(plan, plan)
        assert c.identical == len(plan) and c.first_divergence is None


@pytest.mark.parametrize("limits, rule", [
    (Limits(M=128, C=64, P=32, R_max=4, block_size=32), "Limits.P = 32 differs from C = 64"),
    (Limits(M=128, C=64, R_max=4), "Limits.block_size = 1"),
    (Limits(M=128, C=40, R_max=4, block_size=32), r"\[C\] 50 tokens > C = 40"),
    (Limits(M=96, C=64, R_max=4, block_size=32), r"\[M-blocks\]"),
    (Limits(M=128, C=64, R_max=1, block_size=32), r"\[R_max\] 2 running requests > R_max = 1"),
])
def test_a_plan_the_engine_cannot_run_is_refused_naming_the_limit(limits, rule):
    with pytest.raises(ValueError, match=rule):
        check_plan(_plan(), W, limits)


def test_an_empty_batch_and_an_unfinished_plan_are_refused():
    empty = Schedule([Batch([], []), *_plan()])
    with pytest.raises(ValueError, match="plan batch 0 schedules no tokens"):
        check_plan(empty, W, LIM)
    with pytest.raises(ValueError, match="cannot run on the engine"):
        check_plan(Schedule(list(_plan())[:-1]), W, LIM)


def test_arrivals_gate_steps_not_the_check():
    # a plan made on another clock (here: every batch at t = 0) is checked without arrivals; the engine's
    # step waits for them instead (ready / missing)
    online = Workload(requests=[Request(id=r.id, input_len=r.input_len, output_len=r.output_len,
                                        arrival_s=5.0 * k) for k, r in enumerate(W)])
    assert offline(online).is_offline and offline(W) is W
    steps = check_plan(_plan(), online, LIM)
    assert ready(steps[0], [0, 1]) and not ready(steps[2], [0, 1])
    assert missing(steps[2], {0, 1}) == [2] and missing(steps[3], {0, 2}) == [1]


def test_a_divergence_from_the_plan_is_named():
    plan = _plan()
    other = Schedule([*list(plan)[:2], Batch([0, 2], [1, 8]), *list(plan)[3:]])     # no eviction in batch 2
    c = executed_as_planned(other, plan)
    assert c.identical == len(plan) - 1 and c.first_divergence == 2
    assert "evict [1]" in c.preset_batch and "evict" not in c.engine_batch


def test_cli_execute_refuses_a_plan_before_any_engine_is_imported(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "infermax.engines.vllm_plan", None)   # importing it would fail
    write_run(tmp_path, _plan(), W, LIM, get_cost_model(None))
    code = main(["vllm", "execute", "--schedule", str(tmp_path / "schedule.json"), "--limits",
                 "M=128,C=64,R_max=1,block=32", "--out", str(tmp_path / "x")])
    assert code == 2 and "[R_max] 2 running requests > R_max = 1" in capsys.readouterr().err
    assert main(["vllm", "execute", "--schedule", str(tmp_path / "schedule.json"), "--out", str(tmp_path / "y")]) == 2
    assert "vllm extra" in capsys.readouterr().err            # the valid plan reaches the engine import


# --- the validation's pure parts: predicted and measured values, paired ratios ------------------------------
def test_measured_values_on_a_recorded_run_use_its_cpu_and_wall_clocks():
    from pathlib import Path

    from infermax.engines.records import load_engine_run, step_times
    from infermax.engines.validation import measured_values, predicted_values

    schedule, workload, limits, m = load_engine_run(Path(__file__).parent / "data" / "vllm" / "offline-tiny-budget")
    got = measured_values(schedule, workload, m)
    assert got["cpu_makespan"] == pytest.approx(float(step_times(m.records, "cpu")[1].sum()))
    assert got["wall_makespan"] == pytest.approx(max(t.finish_s for t in m.requests))
    assert 0 < got["cpu_ttft"] < got["cpu_e2e"] <= got["cpu_makespan"] * (1 + 1e-12)
    pred = predicted_values(schedule, workload, limits, get_cost_model(None))
    assert 0 < pred["ttft"] < pred["e2e"] <= pred["makespan"]
    online = Workload(requests=[Request(id=r.id, input_len=r.input_len, output_len=r.output_len, arrival_s=r.id)
                                for r in workload])
    with pytest.raises(ValueError, match="compares offline runs"):
        measured_values(schedule, online, m)


def test_ratios_pair_the_rounds_and_set_the_predicted_ratio_beside():
    from infermax.engines.validation import by_name, ratios

    c = by_name("bound-vs-vllm")
    rows = []
    for rep, (own, bound) in enumerate([(12.0, 10.0), (13.0, 10.0), (9.0, 10.0)]):
        for label, value in (("vllm", own), ("bound-e2e-ef", bound)):
            rows.append({"comparison": c.name, "label": label, "rep": rep,
                         **{f"pred_{k}": (11.0 if label == "vllm" else 10.0) for k in ("makespan", "ttft", "e2e")},
                         **{f"{clock}_{k}": value for clock in ("cpu", "wall") for k in ("makespan", "ttft", "e2e")}})
    e2e, = [r for r in ratios(rows, c) if r["metric"] == "e2e"]
    assert e2e["claimed"] and e2e["reps"] == 3 and e2e["predicted"] == pytest.approx(1.1)
    assert (e2e["cpu_median"], e2e["cpu_min"], e2e["cpu_max"]) == pytest.approx((1.2, 0.9, 1.3))
    with pytest.raises(ValueError, match="unknown comparison 'x'"):
        by_name("x")
