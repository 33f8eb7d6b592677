"""Every registered cluster policy runs, finishes every request and is judged valid; policies are checked on
construction; a new queue discipline is a class and a policy entry (issue 38 item 3).

The registry test iterates :data:`~infermax.cluster.policies.POLICIES` (no hand-kept list): a policy added
there is run here on a small cluster chosen from what it is (an executed plan, CSPS, disaggregation).
"""
from __future__ import annotations

import numpy as np
import pytest

from infermax import Request, Workload
from infermax.cluster import ClusterPolicy, ClusterSchedule, get_policy, replay_cluster, simulate_cluster
from infermax.cluster import disciplines as disciplines_module
from infermax.cluster import policies as policies_module
from infermax.cluster.csps import VARIANTS
from infermax.cluster.disciplines import DISCIPLINES, QueueDiscipline, register
from infermax.cluster.plans import PRESETS
from infermax.cluster.policies import POLICIES, describe_policies

REGISTERED = tuple(p for p in POLICIES if get_policy(p).name == p)      # (aliases name the same policies)
_LENGTHS = [(120, 4, 0.0, "short"), (30000, 4, 0.001, "long"), (200, 5, 0.05, "short"), (80, 3, 0.3, "short"),
            (40000, 3, 0.31, "long"), (150, 6, 0.5, "short"), (60, 2, 1.2, "short"), (90, 4, 1.5, "short")]


def _workload(long_scale: int = 1, plan: bool = False) -> Workload:
    """Two long requests (on gangs) and six short ones; for an executed plan (no gangs) prompts cut to 3000
    tokens, untagged."""
    reqs = (Request(id=k, input_len=min(i, 3000), output_len=o, arrival_s=t) if plan else
            Request(id=k, input_len=i * long_scale if tag == "long" else i, output_len=o, arrival_s=t, tag=tag)
            for k, (i, o, t, tag) in enumerate(_LENGTHS))
    return Workload(requests=tuple(reqs), name="policies")


def run_of(name: str) -> tuple[Workload, str, dict]:
    """(workload, cluster spec, engine options) a policy runs on, read from what it is (each replica runs the
    policy's own scheduler, else ``sarathi``: chunked, so a long prompt that runs on one replica fits it)."""
    pol = get_policy(name)
    if pol.plan:            # an executed plan: spp 2, and kvp 2 where the preset allows it
        kvp = 1 if PRESETS[pol.plan].max_kvp == 1 else 2
        return _workload(plan=True), f"a100:nodes=1,gpus_per_node=4,kvp={kvp},spp=2,model=mistral-7b-v0.3", {}
    options = {} if pol.csps is not None or pol.elastic else {"sp_replicas": 2}
    if pol.disaggregate:
        options["decode_replicas"] = 1
    spec = "a100:nodes=1,gpus_per_node=6,model=mistral-7b-v0.3"   # (loongserve-reserve: 2 short-only instances)
    return _workload(long_scale=5 if pol.csps is not None else 1), spec, options   # (CSPS: prompts over SPTs)


def judged(res, w: Workload) -> None:
    """Every request finished, and the judge, reading the schedule back from JSON, recomputes its times."""
    assert np.isfinite(res.trace.requests["completion_s"]).all()
    out = replay_cluster(ClusterSchedule.from_json(res.cluster_schedule().to_json()), w)
    for key in ("first_scheduled_s", "first_token_s", "completion_s"):
        np.testing.assert_array_equal(out.requests[key], res.trace.requests[key], err_msg=key)
    assert out.metrics()["e2e_mean_s"] == res.metrics["e2e_mean_s"]


@pytest.mark.parametrize("name", REGISTERED)
def test_every_registered_policy_runs_finishes_and_is_judged_valid(name):
    w, spec, options = run_of(name)
    res = simulate_cluster(w, spec, name, get_policy(name).local or "sarathi", **options)
    assert res.policy == name
    assert bool(res.gangs) != bool(get_policy(name).plan)       # the long requests ran on gangs (plans take none)
    judged(res, w)


def test_the_registry_is_consistent():
    assert set(REGISTERED) <= set(describe_policies())
    used = {get_policy(p).queue for p in REGISTERED}
    assert used == set(DISCIPLINES), "every discipline has a registered policy, every policy a discipline"
    for p in REGISTERED:
        pol = get_policy(p)
        assert isinstance(pol.discipline, QueueDiscipline) and pol.discipline.name == pol.queue
        assert pol.exclusive == pol.discipline.exclusive
    assert {get_policy(p).csps for p in REGISTERED if get_policy(p).queue == "csps"} == set(VARIANTS.values())


# --- checked on construction ---------------------------------------------------------------------------------
def test_an_unknown_queue_is_refused_naming_the_field_the_value_and_the_known_ones():
    with pytest.raises(ValueError) as exc:
        ClusterPolicy("typo", "fifoo")
    msg = str(exc.value)
    assert "ClusterPolicy.queue" in msg and "'fifoo'" in msg and "did you mean fifo?" in msg
    assert "known: " + ", ".join(DISCIPLINES) in msg


@pytest.mark.parametrize("field, value, text", [
    ("name", "", "ClusterPolicy.name must be a non-empty string, got ''"),
    ("queue", 3, "ClusterPolicy.queue must be a queue discipline's name (a string), got 3"),
    ("preempt_prefill", "yes", "ClusterPolicy.preempt_prefill must be True or False, got 'yes'"),
    ("disaggregate", 1, "ClusterPolicy.disaggregate must be True or False, got 1"),
    ("fast_sp", None, "ClusterPolicy.fast_sp must be True or False, got None"),
    ("elastic", 0, "ClusterPolicy.elastic must be True or False, got 0"),
    ("striped", "no", "ClusterPolicy.striped must be True or False, got 'no'"),
    ("plan", "4d", "ClusterPolicy.plan: unknown plan preset '4d'; known: 3d, 2d, 3d-static, 3d-pp (or '' for the"),
    ("plan", 3, "ClusterPolicy.plan must be a plan preset's name or '', got 3"),
    ("local", None, "ClusterPolicy.local must be a replica scheduler's name or '', got None"),
    ("csps", "csps", "ClusterPolicy.csps must be a CspsVariant or None, got 'csps'"),
    ("route", "nearest", "ClusterPolicy.route must be one of round-robin, random, lor (or empty), got 'nearest'"),
    ("route_seed", 1.5, "ClusterPolicy.route_seed must be an integer, got 1.5"),
])
def test_a_bad_field_is_refused_naming_it_and_its_value(field, value, text):
    fields = {"name": "mine", "queue": "fifo", field: value}
    with pytest.raises(ValueError) as exc:
        ClusterPolicy(**fields)
    assert text in str(exc.value)


@pytest.mark.parametrize("fields, text", [
    ({"queue": "fifo", "colocate": True}, "ClusterPolicy.colocate = True: under queue 'fifo'"),
    ({"queue": "reservation", "preempt_prefill": True}, "ClusterPolicy.preempt_prefill = True: under queue"),
    ({"queue": "priority", "csps": VARIANTS["csps"]}, "runs under queue 'csps', not 'priority'"),
    ({"queue": "pecsched", "csps": VARIANTS["csps"]}, "runs under queue 'csps', not 'pecsched'"),
    ({"queue": "csps"}, "ClusterPolicy.csps must be a CspsVariant under queue 'csps', got None"),
    ({"queue": "fifo", "elastic": True, "scale_down": True}, "ClusterPolicy.scale_down = True"),
])
def test_flags_a_discipline_gives_no_meaning_are_refused(fields, text):
    with pytest.raises(ValueError, match="ClusterPolicy") as exc:
        ClusterPolicy("mine", **fields)
    assert text in str(exc.value)


def test_a_bad_ring_attention_is_refused_before_the_run():
    with pytest.raises(ValueError, match="ring_attention must be one of striped, contiguous, got 'zigzag'"):
        simulate_cluster(_workload(), "a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3", "fifo",
                         ring_attention="zigzag")


def test_the_medha_and_loongserve_cases_are_the_policys():
    medha, loong, fifo = get_policy("medha-3d"), get_policy("loongserve"), get_policy("fifo")
    assert medha.scheduler(None) == "medha" and fifo.scheduler(None) == "vllm" and medha.scheduler("x") == "x"
    assert fifo.plain_ring and not medha.plain_ring and not loong.plain_ring
    assert fifo.sharded("contiguous").striped is False and fifo.sharded("striped").striped is True
    assert loong.sharded("contiguous") is loong              # LoongServe's ring is striped by its own design
    assert loong.decode_serves(3).tolist() == [True] * 3 and fifo.decode_serves(3) is None
    assert get_policy("reservation").takes_reserved_replicas
    assert not get_policy("loongserve-reserve").takes_reserved_replicas and not fifo.takes_reserved_replicas


# --- a new queue discipline: a class and a policy ---------------------------------------------------------------
def test_a_new_discipline_is_a_class_and_a_policy_entry(monkeypatch):
    class HeadSkipped(QueueDiscipline):
        """First come, first served, but a request that finds no room lets the next one try."""
        name = "fifo-skip"

        def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
            return False

        def stops_at_replica(self) -> bool:
            return False

    registry = dict(DISCIPLINES)                       # (the test's registration leaves the real one as it was)
    monkeypatch.setattr(disciplines_module, "DISCIPLINES", registry)
    monkeypatch.setattr(policies_module, "DISCIPLINES", registry)
    register(HeadSkipped)
    policy = ClusterPolicy("fifo-skip", "fifo-skip")
    monkeypatch.setitem(policies_module._POLICIES, "fifo-skip", policy)   # the judge reads it by name
    # M = 15254 tokens a replica: each long request needs a gang of two of the three replicas; the second waits
    # for the first's, and the short one behind it finds the third replica free
    w = Workload(requests=(Request(id=0, input_len=20000, output_len=3, arrival_s=0.0, tag="long"),
                           Request(id=1, input_len=20000, output_len=3, arrival_s=0.001, tag="long"),
                           Request(id=2, input_len=120, output_len=4, arrival_s=0.05, tag="short")), name="skip")
    spec = "a100:nodes=1,gpus_per_node=3,model=llama2-7b,util=0.25"
    res = simulate_cluster(w, spec, "fifo-skip", "sarathi", sp_replicas=2)
    judged(res, w)
    fifo = simulate_cluster(w, spec, "fifo", "sarathi", sp_replicas=2)
    assert fifo.dispatch_s[2] == fifo.dispatch_s[1] > 0.05        # FIFO: the head blocks the short request
    assert res.dispatch_s[2] == 0.05 and res.dispatch_s[1] == fifo.dispatch_s[1]   # the new one: it goes at once


def test_no_module_compares_a_policys_queue_name():
    """The queue discipline is asked, not named: no ``x.queue == "fifo"`` (or ``in (...)``) anywhere in the
    package (the registry lookup in policies.py is the one place the name is used)."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    found = []
    for path in sorted([*(root / "infermax").rglob("*.py"), *(root / "schedulers").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = any(isinstance(s, ast.Attribute) and s.attr == "queue" for s in sides)
            strings = any(isinstance(s, ast.Constant) and isinstance(s.value, str)
                          or isinstance(s, (ast.Tuple, ast.List, ast.Set))
                          and any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in s.elts)
                          for s in sides)
            if names and strings:
                found.append(f"{path.relative_to(root)}:{node.lineno}")
    assert not found, "the queue name compared (ask pol.discipline instead): " + ", ".join(found)
