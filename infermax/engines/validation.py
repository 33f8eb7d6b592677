"""The mission's validation on the real engine: where infermax predicts one schedule beats another, does it?

A :class:`Comparison` is a small offline instance and the schedules compared on it: plans infermax makes
(the solver's optimum, its eviction-free optimum, a registered policy such as ``bound-e2e-ef``) and
``vllm``, vLLM's own scheduling. Each schedule's *predicted* value is its replay under the linear cost
model fitted to vLLM's measured CPU step times (:mod:`.timing`; vLLM's own schedule predicted by the
``vllm-v1`` preset, which makes vLLM's batches, :mod:`.fidelity`). Each is then run on vLLM (plans
executed step for step, :mod:`.vllm_plan`) in several alternated repetitions, and its *measured* value
read off the run on two clocks (:func:`measured_values`):

- ``cpu``: the process's CPU time per step, batches back to back (``timing.means_on_batch_clock``): the
  engine's own work, what the cost model was fitted to — the primary clock on a shared machine;
- ``wall``: the engine clock, which also holds whatever else ran on the machine.

:func:`ratios` sets the measured ratio baseline / candidate of each repetition (median, min, max) beside
the predicted one (> 1: the candidate is faster). Offline instances only: with arrivals, a plan waits for
its requests on the engine clock and the CPU clock has no idle time to put them in. Nothing here imports
an engine.
"""
from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..engine import simulate
from ..replay import replay
from ..schedule import Schedule
from ..types import Limits, Workload
from .records import Measurements, step_times
from .timing import means_on_batch_clock, measured_means

#: the metrics compared: makespan (the latency objective), mean TTFT, mean end-to-end latency
METRICS = ("makespan", "ttft", "e2e")
OWN = "vllm"          # the label of vLLM's own scheduling


class Comparison(NamedTuple):
    """An instance, its schedules (label -> how the plan is made: ``optimal``, ``optimal-ef``, a registered
    scheduler's name, or ``vllm``), the metric the claim is about and the (baseline, candidate) pairs."""

    name: str
    workload: str
    limits: str
    schedules: tuple[str, ...]
    metric: str
    pairs: tuple[tuple[str, str], ...]
    claim: str

    def build(self) -> tuple[Workload, Limits]:
        w = Workload.from_spec(self.workload)
        return Workload(requests=w.requests, name=self.name), Limits.from_spec(self.limits)


COMPARISONS: tuple[Comparison, ...] = (
    # InferMax §4.5 scaled to the CPU: small prompts, long outputs, 6 blocks of 32 (3 eviction-free peaks)
    Comparison("evict-vs-ef", "fixed:I=8,O=40,B=6", "M=192,C=64,R_max=16,block=32",
               ("optimal", "optimal-ef", OWN), "makespan", (("optimal-ef", "optimal"), (OWN, "optimal")),
               "the solver's evicting plan beats the best eviction-free plan; vLLM's own comes close to it"),
    # a bound-guided policy against vLLM's FCFS on a slice of the Splitwise code trace (offline)
    Comparison("bound-vs-vllm", "trace:splitwise_code,n=8,max_len=512,offline=1", "M=1024,C=128,R_max=16,block=32",
               ("bound-e2e-ef", OWN), "e2e", ((OWN, "bound-e2e-ef"),),
               "bound-guided e2e (eviction-free) cuts vLLM's mean e2e latency and TTFT"),
)


def by_name(name: str) -> Comparison:
    for c in COMPARISONS:
        if c.name == name:
            return c
    raise ValueError(f"unknown comparison {name!r}; the comparisons are {', '.join(c.name for c in COMPARISONS)}")


def make_plan(label: str, workload: Workload, limits: Limits, cost: Any, time_limit_s: float = 40.0
              ) -> tuple[Schedule, dict[str, Any]]:
    """The plan a label names (see :class:`Comparison`), and what its making reported (status, bound, ...).
    ``vllm`` gives the ``vllm-v1`` preset's schedule: the prediction of vLLM's own, not a plan to execute."""
    if label in ("optimal", "optimal-ef"):
        from ..optimal import solve_optimal  # (the solver stack loads only when a plan needs it)
        res = solve_optimal(workload, limits, cost, objective="latency", time_limit_s=time_limit_s,
                            policy="no-eviction" if label == "optimal-ef" else None)
        if res.schedule is None:
            raise ValueError(f"{label}: the solver found no schedule in {time_limit_s} s ({res.status})")
        info = {"status": str(res.status), "objective_s": res.objective, "bound_s": res.bound, "gap": res.gap}
        return Schedule(list(res.schedule), {**res.schedule.meta, "producer": f"solve_optimal ({label})"}), info
    name = "vllm-v1" if label == OWN else label
    return simulate(workload, name, limits, cost=cost).schedule, {"status": f"simulated {name}"}


def predicted_values(schedule: Schedule, workload: Workload, limits: Limits, cost: Any) -> dict[str, float]:
    """Makespan, mean TTFT and mean e2e of ``schedule`` replayed under ``cost``."""
    trace = replay(schedule, workload, limits, cost)
    req = trace.requests
    ends = trace.batches["start_s"] + trace.batches["duration_s"]
    t0 = float(np.min(req["arrival_s"]))
    return {"makespan": float(np.max(ends)) - t0,
            "ttft": float(np.mean(req["first_token_s"] - req["arrival_s"])),
            "e2e": float(np.mean(req["completion_s"] - req["arrival_s"]))}


def measured_values(schedule: Schedule, workload: Workload, m: Measurements) -> dict[str, float]:
    """Per clock (``cpu_*``, ``wall_*``) the measured makespan, mean TTFT and mean e2e of a recorded run."""
    if not workload.is_offline:
        raise ValueError(f"measured_values compares offline runs; {workload.name!r} has arrivals")
    cpu = step_times(m.records, "cpu")[1]
    ttft, e2e = means_on_batch_clock(schedule, workload, m, cpu)
    wall_ttft, wall_e2e = measured_means(workload, m)
    finish = max(t.finish_s - t.arrival_s for t in m.requests)
    return {"cpu_makespan": float(np.sum(cpu)), "cpu_ttft": ttft, "cpu_e2e": e2e,
            "wall_makespan": float(finish), "wall_ttft": wall_ttft, "wall_e2e": wall_e2e}


def ratios(rows: Sequence[Mapping[str, Any]], comparison: Comparison) -> list[dict[str, Any]]:
    """Per (baseline, candidate) pair and metric: the predicted ratio baseline / candidate and, per clock, the
    measured ratio of each repetition paired by its index (median, min, max). ``rows``: one per run, with
    ``comparison``, ``label``, ``rep``, ``pred_<metric>`` and ``<clock>_<metric>``."""
    mine = [r for r in rows if r["comparison"] == comparison.name]
    out = []
    for base, cand in comparison.pairs:
        for metric in METRICS:
            b = {r["rep"]: r for r in mine if r["label"] == base}
            c = {r["rep"]: r for r in mine if r["label"] == cand}
            reps = sorted(set(b) & set(c))
            if not reps:
                continue
            row = {"comparison": comparison.name, "baseline": base, "candidate": cand, "metric": metric,
                   "claimed": metric == comparison.metric, "reps": len(reps),
                   "predicted": b[reps[0]][f"pred_{metric}"] / c[reps[0]][f"pred_{metric}"]}
            for clock in ("cpu", "wall"):
                vals = np.array([b[k][f"{clock}_{metric}"] / c[k][f"{clock}_{metric}"] for k in reps])
                row.update({f"{clock}_median": float(np.median(vals)), f"{clock}_min": float(vals.min()),
                            f"{clock}_max": float(vals.max())})
            out.append(row)
    return out
