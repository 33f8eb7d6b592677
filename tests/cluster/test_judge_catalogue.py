"""The cluster judge refuses every broken document of tests/cluster_catalogue.py, naming the rule and the field,
read from JSON text the way ``infermax replay`` reads a file (issue 36 §3)."""
from __future__ import annotations

import json

import numpy as np
import pytest
from cluster_catalogue import CASES, INTERNAL, RUNS, base_document, workload_of

from infermax.cluster import ClusterSchedule
from infermax.cluster.judge import ClusterScheduleError, replay_cluster


@pytest.mark.parametrize("base", sorted(RUNS))
def test_the_base_documents_are_valid(base):
    out = replay_cluster(ClusterSchedule.from_json(json.dumps(base_document(base))), workload_of(base))
    assert np.isfinite(out.requests["completion_s"]).all()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_broken_document_is_refused_naming_its_rule_and_field(case):
    doc = base_document(case.base)
    case.mutate(doc)
    with pytest.raises(ClusterScheduleError) as exc:
        replay_cluster(ClusterSchedule.from_json(json.dumps(doc)), workload_of(case.base))
    message = str(exc.value)
    assert exc.value.rule == case.rule, message
    assert case.text in message, message
    assert not any(x in message for x in INTERNAL), message


def test_the_catalogue_covers_every_rule_and_the_issues_kinds():
    rules = {c.rule for c in CASES}
    assert {"format", "M", "M-blocks", "unknown-request", "once", "arrival", "gang-price", "gang-busy", "q-ship",
            "resume", "plan-time", "kvp-placement", "kvp-capacity", "stage-busy", "pipeline-order", "kv-arrival", "P",
            "R_max", "prefill-chunk", "decode-chunk", "evict", "finished"} <= rules
    # (tests/cluster/test_judge.py's catalogue has the rest: dispatch, gang-time, hold, colocate-cap, C)
    names = {c.name for c in CASES}
    assert {"hold_over_M_fifo", "hold_over_M_reservation", "hold_over_M_priority", "share_over_M_fifo",
            "unknown_policy", "members_as_strings", "members_as_floats", "request_id_as_string",
            "request_id_as_float", "before_batch_as_float", "units_as_string", "shares_as_floats",
            "share_tokens_as_float", "hold_tokens_as_float", "migration_src_as_string", "event_as_object",
            "gangs_as_object", "event_time_as_string", "event_time_infinite"} <= names
    counts = {rule: sum(c.rule == rule for c in CASES) for rule in sorted(rules)}
    print(f"cluster catalogue: {len(CASES)} broken documents over {len(rules)} rules: {counts}")


def test_a_file_is_named_in_the_error(tmp_path):
    doc = base_document("fifo")
    doc["gangs"][0]["members"][0] = "0"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ClusterScheduleError, match=r"bad\.json.*gangs\[0\]\.members\[0\] must be an integer"):
        ClusterSchedule.from_json(path)


def test_a_schedule_built_in_python_is_checked_as_strictly():
    s = ClusterSchedule.from_dict(base_document("fifo"))
    broken = ClusterSchedule(meta=s.meta, replicas=s.replicas, events=s.events,
                             gangs=({**s.gangs[0], "members": ["0", "1"]},) + s.gangs[1:], migrations=s.migrations)
    with pytest.raises(ClusterScheduleError, match=r"gangs\[0\]\.members\[0\]"):
        replay_cluster(broken, workload_of("fifo"))


def test_replay_reports_a_field_it_cannot_read_as_a_format_violation(tmp_path, capsys):
    from infermax.cli import main
    doc = base_document("fifo")
    doc["events"][0][0][1] = "0.0"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    (tmp_path / "w.json").write_text(json.dumps(workload_of("fifo").to_dict()))
    assert main(["replay", str(path), "--workload", str(tmp_path / "w.json"), "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["valid"] is False and out["rule"] == "format" and "events[0][0][1] (time_s)" in out["error"]
