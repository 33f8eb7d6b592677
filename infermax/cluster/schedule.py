"""The cluster schedule: what a cluster run did, as one JSON document that the judge replays.

A :class:`ClusterSchedule` holds

- ``replicas``: per replica, its :class:`~infermax.types.Schedule` (the batches
  its local scheduler ran, with ``not_before_s`` wherever the replica waited —
  for a dispatch, or for a gang it belongs to);
- ``events``: per replica, what the engine told it between batches, each as
  ``[before_batch, time_s, kind, request_id, *args]`` with ``kind`` one of
  ``dispatch`` (the request joins its local queue at ``time_s``), ``hand_off``
  (it leaves after its first token: disaggregated prefill), ``receive`` (it
  arrives holding ``kv_tokens, generated``: a migrated decode) and ``hold``
  (request -1; the KV tokens the replica now holds for gangs: shares and saved
  suspension state);
- ``gangs``: per long request, its members, KV share, prefill price (``prefill_s``
  over ``units`` kernel boundaries, ``switch_s`` to resume) and its steps in
  order: prefill segments ``{"phase": "prefill", "start_s", "end_s", "units":
  [from, to], "switch_s", "suspended"}`` and decode steps ``{"phase": "decode",
  "start_s", "end_s", "gen", "shares", "colocated": [[replica, batch], ...]}`` (a CSPS
  decode step also ``"q_ship": [sent_s, arrived_s]``); a CSPS gang also its SP ``plan``
  (kind, GPUs, micro-partitions, transfer times and bytes per GPU, CSA shares);
- ``migrations``: ``{"request", "src", "dst", "sent_s", "arrive_s", "bytes"}``;
- ``plans`` (only when the cluster executes its plan: spp or kvp > 1): per replica,
  its stages and KVP groups as run (:meth:`~infermax.cluster.plans.PlanExecutor.record`:
  per batch its entry, stage time, stage start times and KV per group after it; every
  KVP onboarding as ``[batch, request, group, first position]``).

Request references are workload ids. ``meta`` names the cluster (its spec
string), the policy, the workload, the limits, the cost model and the engine's
options.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infermax.costmodel.jsonfile import load_json
from infermax.schedule import show_json
from infermax.types import Schedule

from .schedule_doc import ClusterScheduleError, check_array, check_object, check_parts

FORMAT = "infermax.cluster-schedule/1"


@dataclass(frozen=True, eq=False)
class ClusterSchedule:
    """A cluster run's schedule (see the module docstring for its parts)."""

    meta: dict[str, Any]
    replicas: tuple[Schedule, ...]
    events: tuple[tuple[tuple, ...], ...]
    gangs: tuple[dict, ...]
    migrations: tuple[dict, ...]
    plans: tuple[dict, ...] = ()

    @classmethod
    def from_result(cls, result: Any) -> "ClusterSchedule":
        """The schedule of a :class:`~infermax.cluster.engine.ClusterResult`."""
        ids = result.trace.requests["id"]
        events = tuple(tuple((int(b), float(t), k, int(ids[i]) if i >= 0 else -1, *map(int, a))
                             for b, t, k, i, *a in ev) for ev in result.events)
        gangs = tuple({"request": int(ids[g.request]), "members": list(g.members), "share_tokens": g.share_tokens,
                       "input_len": g.input_len, "output_len": g.output_len, "prefill_s": g.prefill_s,
                       "units": g.units, "switch_s": g.switch_s, "sp_plan": g.sp_plan,
                       "steps": [dict(s) for s in g.steps], **_plan_of(g)} for g in result.gangs)
        migrations = tuple(dict(m, request=int(ids[m["request"]])) for m in result.migrations)
        meta = {"cluster": result.cluster.to_spec(), "policy": result.policy, "options": dict(result.options),
                **{k: v for k, v in result.schedules[0].meta.items() if k not in ("replica",)}}
        return cls(meta=meta, replicas=result.schedules, events=events, gangs=gangs, migrations=migrations,
                   plans=tuple(dict(p) for p in result.plans))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "meta": self.meta,
                "replicas": [s.to_dict() for s in self.replicas],
                "events": [[list(e) for e in ev] for ev in self.events],
                "gangs": [dict(g, steps=[_plain(s) for s in g["steps"]]) for g in self.gangs],
                "migrations": list(self.migrations), **({"plans": list(self.plans)} if self.plans else {})}

    def to_json(self, path: "str | Path | None" = None) -> str:
        text = json.dumps(self.to_dict())
        if path is not None:
            Path(path).write_text(text)
        return text

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "ClusterSchedule":
        """Read the document as JSON gives it, as strictly as a single-replica schedule
        (:mod:`~infermax.cluster.schedule_doc`): a :class:`ClusterScheduleError` of rule ``format``
        naming the field and its value for anything it cannot read."""
        if not isinstance(doc, Mapping) or doc.get("format") != FORMAT:
            got = doc.get("format") if isinstance(doc, Mapping) else doc
            raise ClusterScheduleError("format", f"not a cluster schedule: format must be {FORMAT!r}, "
                                       f"got {show_json(got)}")
        check_object(doc, "cluster schedule", _FIELDS[:-1], _FIELDS[-1:])
        check_array(doc["replicas"], "replicas")
        replicas = []
        for r, s in enumerate(doc["replicas"]):
            try:
                replicas.append(Schedule.from_dict(s))
            except ValueError as exc:
                raise ClusterScheduleError("format", f"replicas[{r}]: {exc}") from None
        plans = doc.get("plans", [])
        check_parts(doc["meta"], len(replicas), doc["events"], doc["gangs"], doc["migrations"], plans)
        return cls(meta=dict(doc["meta"]), replicas=tuple(replicas),
                   events=tuple(tuple(tuple(e) for e in ev) for ev in doc["events"]),
                   gangs=tuple(dict(g) for g in doc["gangs"]), migrations=tuple(dict(m) for m in doc["migrations"]),
                   plans=tuple(dict(p) for p in plans))

    @classmethod
    def from_json(cls, text_or_path: "str | Path") -> "ClusterSchedule":
        """Read JSON text (a str starting with ``{``) or a file; errors from a file name it."""
        doc, path = load_json(text_or_path, "cluster schedule")
        try:
            return cls.from_dict(doc)
        except ClusterScheduleError as exc:
            if path is None:
                raise
            raise ClusterScheduleError(exc.rule, f"cluster schedule file {path!r}: {str(exc)[len(exc.rule) + 3:]}"
                                       ) from None

    def check(self) -> None:
        """Check every part's types (what :meth:`from_dict` checks of a document): the judge trusts nothing,
        so a schedule built in Python is read as strictly as one from a file."""
        check_array(self.replicas, "replicas")
        for r, s in enumerate(self.replicas):
            if not isinstance(s, Schedule):
                raise ClusterScheduleError("format", f"replicas[{r}] must be a Schedule, got {type(s).__name__}")
        check_parts(self.meta, len(self.replicas), self.events, self.gangs, self.migrations, self.plans)


_FIELDS = ("format", "meta", "replicas", "events", "gangs", "migrations", "plans")


def _plan_of(gang: Any) -> dict:
    """A CSPS gang's SP plan (CSPS): kind, GPUs, micro-partitions, its transfers per GPU and their times."""
    p = gang.plan
    if p is None:
        return {}
    return {"plan": {"kind": p.kind, "num_gpus": p.num_gpus, "per_node": p.per_node, "micro": p.micro,
                     "comm_in_s": p.comm_in_s, "comm_out_s": p.comm_out_s, "exposed_comm_s": p.exposed_comm_s,
                     "attention_s": p.attention_s, "bytes_per_gpu": p.bytes_per_gpu,
                     "csa_moved": p.csa.moved, "csa_attended": p.csa.attended}}


def _plain(step: dict) -> dict:
    return {k: ([list(x) for x in v] if k == "colocated" else v) for k, v in step.items()}
