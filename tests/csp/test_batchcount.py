"""The least-batch-count search (csp/search/batchcount.py), its table of batches left (csp/search/batchtable.py) and the
per-request cost term in the MILP."""
from __future__ import annotations

import itertools
from collections import Counter

import pytest
from conftest import heuristic_schedules
from factories import ALL_SCHEDULERS, small_instances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infermax import Limits, Workload
from infermax.costmodel.linear import LinearCoefficients, LinearCostModel
from infermax.csp.backends import cpsat
from infermax.csp.search.batchcount import area_bound, is_applicable, min_batch_count, refute_batch_counts
from infermax.csp.search.batchtable import RemainingBatches
from infermax.csp.search.classstate import classes_of
from infermax.optimal import solve_optimal


def _brute_force_batches(workload: Workload, M: int) -> int:
    """Least number of bins packing every request's chain of items I+t (t < O) in order; tiny cases only."""
    chains = [(int(I), int(O)) for I, O in zip(workload.input_lens, workload.output_lens)]
    for Y in itertools.count(max(O for _, O in chains)):
        # each chain picks O strictly increasing bins out of Y
        choices = [list(itertools.combinations(range(Y), O)) for _, O in chains]
        for pick in itertools.product(*choices):
            load = [0] * Y
            for (I, _), bins in zip(chains, pick):
                for t, b in enumerate(bins):
                    load[b] += I + t
            if max(load) <= M:
                return Y


@pytest.mark.parametrize("lengths,M,expected", [(([4, 4, 4], [3, 3, 3]), 13, None), (([2, 5], [3, 2]), 7, None),
                                                  (([3, 3, 3, 3], [2, 2, 2, 2]), 9, None)])
def test_search_matches_brute_force(lengths, M, expected):
    w = Workload.from_lengths(*lengths)
    r = min_batch_count(w, Limits(M=M, C=64))
    assert r.is_exact
    assert r.num_batches == _brute_force_batches(w, M)


def test_search_proves_what_the_area_bound_cannot():
    """B=7, I=O=16, M=128: the KV area allows 21 batches, the packing needs 23."""
    r = min_batch_count(Workload.from_lengths([16] * 7, [16] * 7), Limits(M=128, C=4096))
    assert (r.num_batches, r.is_exact) == (23, True)


@pytest.mark.slow
@pytest.mark.solver
def test_the_count_rows_let_the_solver_refute_22_batches_for_seven_requests():
    """The same B=7 instance by the count model: 22 refuted in 10-20 s here (without the ⌊M/θ⌋ rows CP-SAT
    did not decide 22 in 30 s)."""
    assert refute_batch_counts([(16, 16, 7)], 128, None, 21, _cpsat, 120.0) == 23


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=5, max_len=6, online=True))
def test_search_never_exceeds_any_heuristic(cost, inst):
    workload, limits = inst
    if not is_applicable(limits):
        return
    r = min_batch_count(workload, limits, time_budget_s=5.0)
    for name, h in heuristic_schedules(workload, limits, cost, names=ALL_SCHEDULERS):
        assert r.num_batches <= len(h.schedule), name


def _cpsat(model, time_limit_s):
    return cpsat.solve(model, time_limit_s, threads=2)


@pytest.mark.solver
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=5, max_len=6, online=False))
def test_the_solver_refutes_exactly_the_batch_counts_the_search_rules_out(inst):
    """From the area bound up, the first Y the count model does not refute is the search's exact least count."""
    workload, limits = inst
    if not is_applicable(limits):
        return
    exact = min_batch_count(workload, limits, time_budget_s=30.0)
    assert exact.is_exact
    classes = [(int(workload.input_lens[i]), int(workload.output_lens[i]), 1) for i in range(len(workload))]
    area = area_bound(classes, limits.M, limits.R_max)
    assert area <= exact.num_batches
    assert refute_batch_counts(classes, limits.M, limits.R_max, area, _cpsat, 60.0) == exact.num_batches


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
@pytest.mark.solver
def test_the_solver_refutes_the_area_bound_of_ten_requests():
    """B=10, I=O=16, M=128: the area allows 30 batches; the count model refutes 30 in seconds (the
    table of batches left cannot be built in a minute) and finds a 31-batch packing."""
    classes = [(16, 16, 10)]
    assert area_bound(classes, 128, None) == 30
    assert refute_batch_counts(classes, 128, None, 30, _cpsat, 60.0) == 31
    with pytest.raises(ValueError, match="M=20"):
        refute_batch_counts([(16, 16, 1)], 20, None, 16, _cpsat, 1.0)


def test_search_rejects_inapplicable_limits():
    with pytest.raises(ValueError, match="M <= C"):
        min_batch_count(Workload.from_lengths([4], [4]), Limits(M=64, C=16))


def test_request_term_is_priced_and_replays(cost):
    """request_s · R (the CPU profile's per-row term) is in the objective: the replayed value matches."""
    k = LinearCoefficients(request_s=2e-3)
    priced = LinearCostModel(k, name="with-request-term")
    # the aggregate model is exact (not a relaxation) without chunked prefill
    for method, policy in (("per-request", None), ("aggregate", "no-chunked")):
        r = solve_optimal("fixed:I=4,O=3,B=3", "M=12,C=64", priced, time_limit_s=30, method=method, policy=policy)
        assert r.status == "optimal", method
        assert r.info["replay_rel_diff"] <= 1e-6, method
    plain = solve_optimal("fixed:I=4,O=3,B=3", "M=12,C=64", cost, time_limit_s=30, policy="no-chunked")
    assert r.objective > plain.objective


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=5, max_len=5, online=False), st.randoms(use_true_random=False))
def test_requirements_say_exactly_which_batches_leave_d_batches(inst, rnd):
    """A set of requests advanced by one batch reaches "at most d batches left" iff it meets one of the
    requirements, checked against the table itself for every subset (the table ignores M per batch here:
    the requirement only speaks of levels)."""
    w, lim = inst[0], inst[1]
    classes = [(I, O, len(idx)) for I, O, idx in classes_of(w)]
    if any(I + O - 1 > lim.M for I, O, _ in classes):
        return
    table = RemainingBatches(classes, lim.M, None, time_budget_s=10)
    if not table.is_complete:
        return
    levels = [sorted(rnd.randint(0, O) for _ in range(n)) for _, O, n in classes]
    offsets = list(itertools.accumulate([0] + [O for _, O, _ in classes]))
    flat = [(c, lv) for c, lvs in enumerate(levels) for lv in lvs]
    here = table(tuple(x for lvs in levels for x in lvs))
    for d in range(max(0, here - 2), here + 1):
        needs = table.requirements(tuple(x for lvs in levels for x in lvs), d)
        for mask in range(1 << len(flat)):
            moved = [(c, lv + ((mask >> k) & 1)) for k, (c, lv) in enumerate(flat)]
            if any(lv > classes[c][1] for c, lv in moved):
                continue
            after = tuple(x for c in range(len(classes)) for x in sorted(lv for cc, lv in moved if cc == c))
            ran = Counter(offsets[c] + lv for k, (c, lv) in enumerate(flat) if (mask >> k) & 1)
            meets = any(all(ran[i] >= r for i, r in alt) for alt in needs)
            assert meets == (table(after) <= d), (levels, d, mask, needs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_instances(max_requests=4, max_len=4, online=False), st.randoms(use_true_random=False))
def test_the_table_is_exact_from_random_states_with_and_without_r_max(inst, rnd):
    """Batches left from a random state: the table against an exhaustive search of the relaxation (each
    batch advances any set of unfinished requests whose items I + level fit in M, at most R_max of them).
    Regression: maximal moves limited by R_max rather than M were once cut, and the table overcounted."""
    w, lim = inst
    classes = [(I, O, len(idx)) for I, O, idx in classes_of(w)]
    if any(I + O - 1 > lim.M for I, O, _ in classes):
        return
    R_max = lim.R_max or sum(n for _, _, n in classes)
    table = RemainingBatches(classes, lim.M, lim.R_max, time_budget_s=10)
    if not table.is_complete:
        return
    chains = [(I, O) for I, O, n in classes for _ in range(n)]

    def canonical(lv):                     # per class sorted, as the table keys its states
        out, k = [], 0
        for _, _, n in classes:
            out += sorted(lv[k:k + n])
            k += n
        return tuple(out)

    memo = {}

    def left(lv: tuple) -> int:
        if all(t == O for t, (_, O) in zip(lv, chains)):
            return 0
        if lv not in memo:
            todo = [k for k, (t, (_, O)) in enumerate(zip(lv, chains)) if t < O]
            best = 10 ** 9
            for r in range(1, min(len(todo), R_max) + 1):
                for run in itertools.combinations(todo, r):
                    if sum(chains[k][0] + lv[k] for k in run) <= lim.M:
                        nxt = list(lv)
                        for k in run:
                            nxt[k] += 1
                        best = min(best, 1 + left(canonical(nxt)))
            memo[lv] = best
        return memo[lv]

    for _ in range(5):
        lv = canonical([rnd.randint(0, O) for _, O in chains])
        assert table(lv) == left(lv), (lv, classes, lim)
