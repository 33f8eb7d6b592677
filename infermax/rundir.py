"""Run directories: what ``simulate --out`` and ``solve --out`` write, and how a schedule is judged again.

A run directory holds ``schedule.json``, ``workload.json`` (every request with its arrival time),
``limits.json`` (``Limits.to_dict()``) and ``cost.json`` (``cost.describe()``, loadable back by
name or, for linear models, from its coefficients). ``replay`` and ``bound --schedule`` judge a
schedule against the inputs given on the command line, else those files, else the schedule's meta
(:func:`schedule_inputs`), and say which they used. Every failure is a ValueError naming the file.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from .costmodel import get_cost_model
from .costmodel.linear import LinearCostModel
from .schedule import Schedule, load_json
from .types import Limits, Workload

#: the files of a run directory that replay reads back, beside schedule.json
RUN_FILES = {"workload": "workload.json", "limits": "limits.json", "cost": "cost.json"}


def one_line(message: str) -> str:
    """A message on one line (the CLI prints one line per error): its lines joined by "; "."""
    return "; ".join(line.strip() for line in str(message).splitlines() if line.strip()) or "(no message)"


def out_dir(path: "str | Path") -> Path:
    """Create the output directory ``path`` now (before any work), or raise a ValueError naming it."""
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {str(out)!r} is a file, not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ValueError(f"--out {str(out)!r}: cannot create the directory: {exc.strerror or exc}") from None
    if not os.access(out, os.W_OK | os.X_OK):
        raise ValueError(f"--out {str(out)!r}: the directory is not writable")
    return out


def write_run(out: Path, schedule, workload, limits, cost) -> None:
    """The files replay reads back: schedule.json, workload.json, limits.json, cost.json."""
    out = out_dir(out)
    schedule.to_json(out / "schedule.json")
    (out / RUN_FILES["workload"]).write_text(json.dumps(workload.to_dict()))
    (out / RUN_FILES["limits"]).write_text(json.dumps(limits.to_dict()))
    (out / RUN_FILES["cost"]).write_text(json.dumps(cost.describe(), indent=2))


def is_cluster_schedule(path: "str | Path") -> bool:
    """Whether ``path`` holds a cluster schedule (its ``format``); False for anything unreadable, which
    :func:`load_schedule` then reports."""
    from .cluster.schedule import FORMAT
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("format") == FORMAT


def load_schedule(path: "str | Path") -> Schedule:
    """Read a schedule JSON file, or raise a ValueError naming the file and what is wrong with it."""
    return Schedule.from_json(Path(path))


def _stored(schedule_path: Path, meta: Mapping[str, Any], key: str) -> tuple[Any, str] | None:
    """What the run directory (first) or the schedule's meta stores for ``key``, and where it was found."""
    beside = schedule_path.parent / RUN_FILES[key]
    if beside.is_file():
        if key == "workload":
            return str(beside), str(beside)
        return load_json(beside, key)[0], str(beside)
    if meta.get(key):
        return meta[key], "the schedule's meta"
    return None


def _load_workload(spec: str, source: str):
    try:
        return Workload.from_spec(spec)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"workload {source!r} is not a saved workload: {type(exc).__name__}: {exc}") from None


def _description(cost) -> Any:
    return json.loads(json.dumps(cost.describe()))


def cost_from_description(desc: Any, source: str):
    """Rebuild a cost model from its ``describe()``: by name when that gives the same description,
    else (a fitted linear model) from the coefficients written in it."""
    if isinstance(desc, str):
        return get_cost_model(desc)
    if not isinstance(desc, Mapping) or not isinstance(desc.get("name"), str):
        raise ValueError(f"cost in {source} must be a cost model description with a 'name', got {desc!r}")
    try:
        model = get_cost_model(desc["name"])
        if _description(model) == json.loads(json.dumps(desc)):
            return model
    except ValueError:
        pass
    if desc.get("kind") == "linear":
        return LinearCostModel.from_json(json.dumps(desc))
    raise ValueError(f"cost model {desc['name']!r} in {source} cannot be rebuilt from its description; "
                     f"pass --cost")


def _limits_spec(lim: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={'none' if v is None else v}" for k, v in lim.items())


def _stored_limits(raw: Any, source: str):
    if isinstance(raw, str):
        return Limits.from_spec(raw)
    if not isinstance(raw, Mapping):
        raise ValueError(f"limits in {source} must be an object like {{\"M\": 1000, \"C\": 256}}, got {raw!r}")
    try:
        return Limits(**raw)
    except TypeError as exc:
        raise ValueError(f"limits in {source}: {exc}") from None


class _Input(NamedTuple):
    """How to build one of the judged inputs, compare two of them, and name one in a note."""

    option: str                          # the command-line option, e.g. "--limits"
    build: Callable[[str], Any]          # from the option's value
    build_stored: Callable[[Any, str], Any]   # from what is stored, and where
    same: Callable[[Any, Any], bool]
    show: Callable[[Any], str]


def _pick(spec: _Input, given: str | None, stored: tuple[Any, str] | None,
          notes: list[str]) -> tuple[Any, str] | None:
    """(value, source): the option given wins — with a note when what is stored with the schedule
    differs or cannot be read — else the stored value; None when there is neither."""
    if given is None:
        return (spec.build_stored(*stored), stored[1]) if stored is not None else None
    value = spec.build(given)
    if stored is not None:
        try:
            kept = spec.build_stored(*stored)
        except ValueError as exc:
            notes.append(f"{spec.option} given; what {stored[1]} stores cannot be read: {one_line(str(exc))}")
        else:
            if not spec.same(kept, value):
                notes.append(f"{spec.option} {spec.show(value)} differs from what is stored with the schedule "
                             f"({stored[1]}): {spec.show(kept)}; judging against {spec.option}")
    return value, spec.option


def _inputs() -> tuple[_Input, _Input, _Input]:
    from .costmodel import get_cost_model
    workload = _Input("--workload", lambda spec: _load_workload(spec, spec), _load_workload,
                      lambda a, b: a.to_dict()["requests"] == b.to_dict()["requests"],
                      lambda w: f"{w.name} ({len(w)} requests)")
    limits = _Input("--limits", Limits.from_spec, _stored_limits, lambda a, b: a == b,
                    lambda lim: _limits_spec(lim.to_dict()))
    cost = _Input("--cost", get_cost_model, cost_from_description,
                  lambda a, b: _description(a) == _description(b), lambda c: c.name)
    return workload, limits, cost


def schedule_inputs(schedule_path: "str | Path", schedule, workload: str | None = None,
                    limits: str | None = None, cost: str | None = None) -> tuple[Any, Any, Any, dict, list[str]]:
    """The workload, limits and cost to judge a schedule file against, where each came from, and notes.

    An option given on the command line wins (a note says when it differs from what is
    stored with the schedule); otherwise the files of the run directory (``workload.json``,
    ``limits.json``, ``cost.json`` beside the schedule), else the schedule's meta, else the
    defaults (with a note; a workload has no default).
    """
    from .costmodel import get_cost_model
    path, meta, notes = Path(schedule_path), dict(schedule.meta), []
    stored = {key: _stored(path, meta, key) for key in RUN_FILES}
    w_input, lim_input, c_input = _inputs()
    by_name = stored["workload"] is not None and stored["workload"][1] == "the schedule's meta"
    # a workload rebuilt from its name may have lost options: never compared with --workload
    picked = _pick(w_input, workload, None if by_name and workload is not None else stored["workload"], notes)
    if picked is None:
        raise ValueError(f"replay needs --workload: there is no {RUN_FILES['workload']} beside {str(path)!r} and "
                         f"the schedule's meta names no workload")
    w, w_src = picked
    if by_name and workload is None:
        notes.append(f"no {RUN_FILES['workload']} beside the schedule: rebuilt the workload from the name in its "
                     f"meta, {w.name!r} (pass --workload to be sure)")
    lim, lim_src = _pick(lim_input, limits, stored["limits"], notes) or (Limits(), "defaults")
    if lim_src == "defaults":
        notes.append(f"no limits stored with the schedule: judging against the defaults {_limits_spec(lim.to_dict())}")
    c, c_src = _pick(c_input, cost, stored["cost"], notes) or (get_cost_model(None), "defaults")
    if c_src == "defaults":
        notes.append(f"no cost model stored with the schedule: judging against the default, {c.name}")
    judged = {"workload": {"name": w.name, "num_requests": len(w), "source": w_src},
              "limits": {**lim.to_dict(), "source": lim_src}, "cost": {"name": c.name, "source": c_src}}
    return w, lim, c, judged, notes


def judged_line(judged: Mapping[str, Any]) -> str:
    w, lim, c = judged["workload"], dict(judged["limits"]), judged["cost"]
    lim_src = lim.pop("source")
    return (f"judged against workload {w['name']} ({w['num_requests']} requests; {w['source']}), "
            f"limits {_limits_spec(lim)} ({lim_src}), cost {c['name']} ({c['source']})")
