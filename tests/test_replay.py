"""replay is the judge: valid schedules give exact traces; each broken rule has its own error."""
import numpy as np
import pytest
from factories import make_workload

from infermax import Batch, Limits, Schedule, ScheduleError, metrics, replay
from infermax.costmodel import get_cost_model


def sched(*batches):
    return Schedule(tuple(Batch(**b) for b in batches))


W = make_workload([(4, 3), (2, 2)])
LIM = Limits(M=100, C=8)


def good():
    return sched(dict(ids=[0, 1], tokens=[4, 2]),            # both prefills finish: 1 token each
                 dict(ids=[0, 1], tokens=[1, 1]),            # decodes: r1 done (O=2)
                 dict(ids=[0], tokens=[1], evict=[0]),       # evict r0 (decode phase, m=5): inp -> 6; refill 1
                 dict(ids=[0], tokens=[5]))                  # refill the other 5: 3rd token, r0 done


def test_hand_made_valid_schedule_and_its_accounting():
    # batch 2 evicts r0 and restarts its refill with a 1-token chunk in the same batch
    tr = replay(good(), W, LIM)
    m = metrics(tr)
    assert m["num_evictions"] == 1 and m["refill_tokens"] == 5
    assert tr.batches["num_decode"].tolist() == [0, 2, 0, 0]
    assert tr.batches["kv_tokens"].tolist() == [6, 8, 1, 6]
    assert tr.requests["completion_s"][1] == tr.batches["start_s"][1] + tr.batches["duration_s"][1]
    cost = get_cost_model()
    t0 = cost.batch_time(np.array([4, 2]), np.array([0, 0]), np.array([False, False]))
    assert tr.batches["duration_s"][0] == t0


@pytest.mark.parametrize("batches,rule,who", [
    ([dict(ids=[0], tokens=[5])], "prefill-chunk", 0),
    ([dict(ids=[0], tokens=[4]), dict(ids=[0], tokens=[2])], "decode-chunk", 0),
    ([dict(ids=[0, 1], tokens=[4, 2]), dict(ids=[1], tokens=[1]), dict(ids=[1], tokens=[1])], "finished", 1),
    ([dict(ids=[0], tokens=[0])], "tokens", 0),
    ([dict(ids=[0, 0], tokens=[1, 1])], "duplicate", 0),
    ([dict(ids=[1], tokens=[1], evict=[0])], "evict", 0),
    ([dict(ids=[7], tokens=[1])], "unknown-request", None),
    ([dict(ids=[0, 1], tokens=[4, 2])], "incomplete", 0),
])
def test_each_rule_has_its_error(batches, rule, who):
    with pytest.raises(ScheduleError) as err:
        replay(sched(*batches), W, LIM)
    assert err.value.rule == rule
    assert err.value.request_id == who
    assert f"[{rule}]" in str(err.value)


def test_limits_are_enforced_per_batch():
    two = [dict(ids=[0, 1], tokens=[4, 2])]
    with pytest.raises(ScheduleError, match=r"batch 0: \[C\] 6 tokens > C = 5"):
        replay(sched(*two), W, Limits(M=100, C=5))
    with pytest.raises(ScheduleError, match=r"\[P\] 6 prefill tokens > P = 4"):
        replay(sched(*two), W, Limits(M=100, C=8, P=4))
    with pytest.raises(ScheduleError, match=r"\[M\] KV cache would hold 6 tokens > M = 5"):
        replay(sched(*two), make_workload([(4, 1), (2, 1)]), Limits(M=5, C=8))
    with pytest.raises(ScheduleError, match=r"\[R_max\] 2 running requests > R_max = 1"):
        replay(sched(*two), W, Limits(M=100, C=8, R_max=1))


def test_online_batches_wait_for_arrivals():
    w = make_workload([(2, 1), (2, 1)], arrivals=[0.0, 5.0])
    tr = replay(sched(dict(ids=[0], tokens=[2]), dict(ids=[1], tokens=[2])), w, LIM)
    assert tr.batches["start_s"][1] == 5.0
    tr2 = replay(sched(dict(ids=[0], tokens=[2], not_before_s=1.0), dict(ids=[1], tokens=[2])), w, LIM)
    assert tr2.batches["start_s"][0] == 1.0
