"""The one Policy (issue 22 items 3 and 6): rank keys and victim choices as fields, not subclasses."""
import numpy as np
import pytest

from infermax import Limits, Workload, replay, simulate
from infermax.costmodel import get_cost_model
from infermax.optimal import policy_of
from infermax.ordering import RequestView
from infermax.policy import Policy
from infermax.schedulers import GetNextBatch, get_scheduler
from infermax.state import ServingState

#: the example of the docs: longest remaining output first, evict the latest arrival first
LONGEST_REMAINING_EVICT_YOUNGEST = Policy(priority="rank", rank_key=lambda v: -v.remaining_tokens, victim="youngest",
                                          skip_on_fail=True)

# A (40 tokens to generate) ranks first, then C (20), then B (12); C arrived last. The first batch
# fills all three (90 of M = 90 tokens), so A's first decode must evict: the youngest is C, the
# lowest-priority B.
THREE = Workload.from_lengths([30, 30, 30], [40, 12, 20], [0.0, 0.1, 0.2], name="three")
THREE_LIMITS = Limits(M=90, C=128)


def first_plans(policy: Policy, num_batches: int):
    """The plans of the first batches on THREE, every request arrived before the first."""
    state = ServingState(THREE, THREE_LIMITS, get_cost_model(None))
    state.advance_clock(0.2)
    sched = GetNextBatch(policy)
    sched.reset(state)
    plans = []
    for _ in range(num_batches):
        plan = sched.next_batch(state)
        plans.append(plan)
        state.apply(plan.idx, plan.tokens, plan.evict)
    return plans


def test_longest_remaining_first_evict_the_youngest_does_what_it_says():
    first, second = first_plans(LONGEST_REMAINING_EVICT_YOUNGEST, 2)
    assert first.idx.tolist() == [0, 2, 1] and first.evict.size == 0      # 40, 20, 12 tokens to go
    assert second.evict.tolist() == [2]                                    # C: the youngest
    assert 0 in second.idx.tolist()
    plain = first_plans(Policy(priority="rank", rank_key=lambda v: -v.remaining_tokens, skip_on_fail=True), 2)
    assert plain[1].evict.tolist() == [1]                                  # B: the lowest priority
    fcfs = first_plans(Policy(priority="rank", skip_on_fail=True), 1)
    assert fcfs[0].idx.tolist() == [0, 1, 2]


class Recording(GetNextBatch):
    """The example policy, recording (remaining tokens, arrival) of every request before each batch."""

    def next_batch(self, state):
        plan = super().next_batch(state)
        self.seen.append((state.output_lens - state.gen, plan))
        return plan

    def reset(self, state):
        super().reset(state)
        self.seen = []


def test_the_example_orders_every_batch_by_remaining_tokens_and_finishes():
    rng = np.random.default_rng(3)
    w = Workload.from_lengths(rng.integers(4, 40, 30), rng.integers(2, 50, 30),
                              np.sort(rng.uniform(0, 0.2, 30)), name="online")
    lim = Limits(M=260, C=96)
    sched = Recording(LONGEST_REMAINING_EVICT_YOUNGEST, name="lrf-youngest")
    res = simulate(w, sched, lim)
    assert replay(res.schedule, w, lim) == res.trace
    assert res.metrics["num_evictions"] > 0
    for remaining, plan in sched.seen:
        # a batch takes its requests in priority order: most tokens left first, then arrival, then index
        key = np.lexsort((plan.idx, w.arrivals_s[plan.idx], -remaining[plan.idx]))
        assert np.array_equal(key, np.arange(plan.idx.size))
    assert res.schedule.meta["scheduler"]["victim"] == "youngest"


def test_named_keys_and_callables_give_the_same_schedules():
    rng = np.random.default_rng(5)
    w = Workload.from_lengths(rng.integers(4, 60, 40), rng.integers(2, 60, 40), np.sort(rng.uniform(0, 0.3, 40)))
    lim = Limits(M=300, C=128)
    by_name = simulate(w, GetNextBatch(Policy(priority="rank", rank_key="remaining", victim="youngest",
                                              skip_on_fail=True)), lim)
    by_fn = simulate(w, GetNextBatch(Policy(priority="rank", rank_key=lambda v: v.remaining_tokens,
                                            victim=lambda v: -v.arrival_s, skip_on_fail=True)), lim)
    assert by_name.metrics["num_evictions"] > 0
    assert by_name.schedule.batches == by_fn.schedule.batches
    # a static key as a callable (re-evaluated every batch) orders as the static name
    rank_i = simulate(w, "rank-i", lim)
    as_fn = simulate(w, GetNextBatch(Policy(priority="rank", rank_key=lambda v: v.prompt_tokens,
                                            skip_on_fail=True)), lim)
    assert rank_i.schedule.batches == as_fn.schedule.batches


def test_bad_keys_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"Policy.rank_key must be one of arrival, input, output, remaining"):
        Policy(rank_key="longest")
    with pytest.raises(ValueError, match="Policy.victim must be one of lowest-priority, youngest"):
        Policy(victim="oldest")
    with pytest.raises(ValueError, match="Policy.victim must be a name or a callable"):
        Policy(victim=3)
    bad = GetNextBatch(Policy(priority="rank", rank_key=lambda v: v.prompt_tokens[:1]))
    with pytest.raises(ValueError, match=r"Policy.rank_key .*<lambda> must return 3 numbers"):
        simulate(THREE, bad, THREE_LIMITS)


def test_the_view_is_read_only():
    state = ServingState(THREE, THREE_LIMITS, get_cost_model(None))
    view = RequestView.of(state, np.array([2, 0]))
    assert view.remaining_tokens.tolist() == [20, 40] and view.prompt_tokens.tolist() == [30, 30]
    with pytest.raises(ValueError, match="read-only"):
        view.cached_tokens[0] = 5


def test_one_policy_class_for_the_heuristics_and_the_milp():
    from infermax.csp import Policy as MilpPolicy

    assert MilpPolicy is Policy
    sarathi = get_scheduler("sarathi").policy
    assert policy_of("sarathi") == Policy(P=512)                  # its class: the same freedoms
    assert sarathi.to_dict() == policy_of("sarathi").to_dict()
    assert LONGEST_REMAINING_EVICT_YOUNGEST.is_unconstrained               # picking rules restrict no class
    assert not get_scheduler("vllm-ef").policy.is_unconstrained
    assert policy_of("pecsched-fifo") == Policy(allow_eviction=False)
