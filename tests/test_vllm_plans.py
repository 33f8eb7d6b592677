"""vLLM executes infermax plans step for step (the ``vllm`` extra; issue 37 item 4).

Run with ``python -m pytest -m vllm tests/test_vllm_plans.py`` (kept out of the default run; skipped when
vllm is not installed). One engine start-up (~20 s on a CPU) serves every plan of the module.
"""
import importlib.util
import json

import pytest

from infermax import Limits, Request, Schedule, Workload, replay, simulate
from infermax.engines.fidelity import judge
from infermax.engines.plans import offline, plan_steps
from infermax.engines.records import load_engine_run, num_preemptions
from infermax.schedule import Batch

pytestmark = [pytest.mark.vllm, pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                                   reason="the vllm extra is not installed")]

LIM = Limits(M=128, C=64, R_max=4, block_size=32)          # 4 blocks of 32
W = Workload.from_lengths([40, 20, 8], [3, 4, 4])
# chunks, a decode-phase eviction (request 1, refilled with its prompt + 2 generated tokens), a hybrid batch
HAND = Schedule([Batch([0, 1], [30, 20]), Batch([0, 1], [10, 1]), Batch([0, 2], [1, 8], evict=[1]),
                 Batch([0, 1, 2], [1, 22, 1]), Batch([1, 2], [1, 1]), Batch([2], [1])], {"producer": "hand"})
# arrivals 0, 0.5, 1 s: a plan made offline must wait on the engine for requests 1 and 2
ONLINE = Workload(requests=[Request(id=r.id, input_len=r.input_len, output_len=r.output_len, arrival_s=0.5 * k)
                            for k, r in enumerate(W)], name="online")
FIXED = Workload.from_spec("fixed:I=40,O=8,B=5")


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    from infermax.engines import vllm_engine, vllm_plan

    tokens = []          # each run's output token ids per infermax id (the model really ran the plan)
    drive = vllm_engine.drive

    def recording_drive(engine, workload, recorder, **kw):
        step, out = engine.step, {}

        def wrapped():
            outs = step()
            out.update({o.request_id: list(o.outputs[0].token_ids) for o in outs if o.finished})
            return outs
        engine.step = wrapped
        try:
            res = drive(engine, workload, recorder, **kw)
        finally:
            engine.step = step
        tokens.append({res[0][k]: v for k, v in out.items()})
        return res

    bound = simulate(FIXED, "bound-e2e", LIM).schedule
    items = [("own", None, W), ("hand", HAND, W), ("online", HAND, ONLINE), ("bound-e2e", bound, FIXED),
             ("own-fixed", None, FIXED)]
    vllm_engine.drive = recording_drive
    try:
        runs = vllm_plan.execute_plans(items, LIM, "llama-tiny", cache_dir=tmp_path_factory.mktemp("models"))
    finally:
        vllm_engine.drive = drive
    return {r.label: r for r in runs}, dict(zip([label for label, _, _ in items], tokens))


def test_every_plan_runs_batch_for_batch_as_planned_and_the_model_generates_the_same_tokens(executed):
    runs, tokens = executed
    for label in ("hand", "online", "bound-e2e"):
        run = runs[label]
        assert run.as_planned, (label, run.comparison.divergence_text())
        assert [b.to_dict() for b in run.schedule] == [b.to_dict() for b in run.plan]
        assert judge(run.schedule, offline(run.workload), LIM) == "valid"
    assert num_preemptions(runs["hand"].measurements.records) == 1
    # greedy decoding of the same prompts: the tokens do not depend on the schedule (KV and refill are right)
    assert tokens["hand"] == tokens["own"] == tokens["online"]
    assert tokens["bound-e2e"] == tokens["own-fixed"]
    assert runs["own"].plan is None and not runs["own"].as_planned     # vLLM's own scheduling in between


def test_a_batch_waits_on_the_engine_clock_until_its_requests_have_arrived(executed):
    runs, _ = executed
    m = runs["online"].measurements
    t = {r.id: r for r in m.requests}
    steps = [r for r in m.records if r.num_tokens]
    # batch 0 needs request 1 (arrives at 0.5 s), batch 2 first schedules request 2 (at 1 s)
    assert t[1].submitted_s >= 0.5 and steps[0].start_s >= t[1].submitted_s
    assert t[2].submitted_s >= 1.0 and steps[2].start_s >= t[2].submitted_s


def test_a_plan_the_engine_cannot_follow_stops_with_the_batch_and_request_named(tmp_path):
    from infermax.engines import vllm_plan

    w = Workload.from_lengths([40, 40], [2, 2])
    tight = Limits(M=64, C=64, R_max=4, block_size=32)         # 2 blocks: 0 takes both
    plan = Schedule([Batch([0], [40]), Batch([0, 1], [1, 20]), Batch([1], [20]), Batch([1], [1])])
    with pytest.raises(ValueError, match=r"\[M-blocks\]"):      # refused before the engine starts
        vllm_plan.execute_plans([("bad", plan, w)], tight, "llama-tiny", cache_dir=tmp_path)
    engine, _ = vllm_plan.vllm_engine.make_engine(tight, w, vllm_plan.vllm_engine.resolve_model("llama-tiny", tmp_path),
                                                   scheduler_cls=vllm_plan.SCHEDULER_CLS, max_model_len=42)
    sched = vllm_plan.vllm_engine.engine_scheduler(engine)
    sched.load_plan(plan_steps(plan))                          # past the check: the engine itself refuses
    recorder = vllm_plan.vllm_engine.Recorder(engine)
    with pytest.raises(vllm_plan.PlanError, match="plan batch 1: vLLM cannot allocate the KV blocks of request 1"):
        vllm_plan.vllm_engine.drive(engine, w, recorder, gate=sched)


def test_cli_execute_writes_what_vllm_ran_beside_the_plan(tmp_path, capsys):
    from infermax.cli import main

    plan_dir, out = tmp_path / "plan", tmp_path / "run"
    assert main(["simulate", "--workload", "fixed:I=40,O=6,B=3", "--scheduler", "bound-e2e", "--limits",
                 "M=256,C=64,R_max=4,block=32", "--out", str(plan_dir), "--json"]) == 0
    capsys.readouterr()
    assert main(["vllm", "execute", "--schedule", str(plan_dir / "schedule.json"), "--model-cache",
                 str(tmp_path / "models"), "--out", str(out), "--json"]) == 0
    row = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert row["as_planned"] and row["identical"] == row["plan_batches"] == row["executed_batches"]
    schedule, workload, limits, m = load_engine_run(out)
    replay(schedule, workload, limits)
    assert [b.to_dict() for b in schedule] == [b.to_dict() for b in Schedule.from_json(out / "plan.json")]
