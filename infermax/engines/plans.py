"""An infermax Schedule as the step-by-step orders a real engine executes (the pure part; no engine here).

A plan is a :class:`~infermax.Schedule` (the MILP optimum, a bound-guided policy's, any registered
scheduler's, or one read from ``schedule.json``). Executed on an engine, its batch ``j`` becomes
engine step ``j``: the requests of ``evict`` are preempted first (recompute: their KV dropped, as
vLLM's preemption does), then each request of ``ids`` gets exactly its ``tokens`` (a chunk, a
decode, a refill). :func:`plan_steps` gives these orders (:class:`PlanStep`: infermax id -> tokens,
in the batch's order, and the evictions).

:func:`check_plan` refuses, before any engine starts, a plan the engine could not run as written,
naming the limit: the judge (``replay``, on the workload with its arrivals at 0: see below) under
the engine's limits (``C``, ``M`` in blocks of ``block_size``, ``R_max``, every request served exactly), the limits
vLLM can express
(:func:`.vllm_config.engine_limits`: ``P = C``, blocks > 1, every request fits), and no batch
without tokens. A plan valid under the judge keeps vLLM's own accounting: a request holding ``m``
tokens holds ``⌈m / block_size⌉`` blocks (vLLM allocates the blocks of ``m + c`` before a step),
and the running requests (``m > 0``, those admitted in the batch included, those it completes too)
are vLLM's ``running`` list, capped by ``max_num_seqs``.

Arrivals. A plan's batch may only include requests that have arrived; on the engine clock (real
step times, not the plan's cost model), a batch whose requests have not all been submitted yet
*waits* until they have (:func:`ready`): the engine idles, nothing is reordered. ``not_before_s``
(an idle the plan's own clock asked for) is not reproduced: on the engine only arrivals gate a step.
"""
from __future__ import annotations

from typing import Iterable, NamedTuple

from ..replay import replay
from ..schedule import Schedule
from ..state import ScheduleError
from ..types import Limits, Request, Workload
from .fidelity import Comparison, compare_schedules
from .vllm_config import engine_limits


class PlanStep(NamedTuple):
    """One engine step of a plan: ``tokens`` maps an infermax request id to the tokens it processes (the
    batch's order), ``evict`` lists the ids preempted before the step runs."""

    tokens: dict[int, int]
    evict: tuple[int, ...] = ()

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(self.tokens)


def plan_steps(schedule: Schedule) -> list[PlanStep]:
    """The engine steps of ``schedule``, one per batch (see the module docstring)."""
    return [PlanStep(dict(zip(b.ids.tolist(), b.tokens.tolist())), tuple(b.evict.tolist())) for b in schedule]


def check_plan(schedule: Schedule, workload: Workload, limits: Limits) -> list[PlanStep]:
    """The plan's steps, or a ValueError naming what the engine under ``limits`` cannot run: a limit vLLM
    cannot express (``P``, ``block_size``), a batch without tokens, or the judge's first broken rule
    (``C``, ``M-blocks``, ``R_max``, arrival, ...)."""
    engine_limits(limits, workload)            # P = C, block_size > 1, every request fits
    empty = [j for j, b in enumerate(schedule) if len(b) == 0]
    if empty:
        raise ValueError(f"plan batch {empty[0]} schedules no tokens: an engine step always processes some "
                         f"(move its evictions to the next batch)")
    try:
        replay(schedule, offline(workload), limits)     # arrivals gate engine steps, they are no rule here
    except ScheduleError as exc:
        raise ValueError(f"the plan cannot run on the engine under {limits.to_dict()}: {exc}") from None
    return plan_steps(schedule)


def offline(workload: Workload) -> Workload:
    """``workload`` with every request arrived at 0: the engine waits for arrivals (:func:`ready`), so a plan
    is checked against every other rule whatever clock it was made on."""
    if workload.is_offline:
        return workload
    reqs = [Request(id=r.id, input_len=r.input_len, output_len=r.output_len, arrival_s=0.0, ttft_slo_s=r.ttft_slo_s,
                    tpot_slo_s=r.tpot_slo_s, tag=r.tag) for r in workload]
    return Workload(requests=reqs, name=workload.name)


def ready(step: PlanStep, arrived: Iterable[int]) -> bool:
    """Whether every request of ``step`` has been submitted to the engine (its arrival passed on the
    engine clock): only then may the step run."""
    have = set(arrived)
    return all(i in have for i in step.tokens) and all(i in have for i in step.evict)


def missing(step: PlanStep, arrived: Iterable[int]) -> list[int]:
    """The requests of ``step`` not yet submitted."""
    have = set(arrived)
    return [i for i in (*step.tokens, *step.evict) if i not in have]


def executed_as_planned(recorded: Schedule, plan: Schedule) -> Comparison:
    """The engine's recorded schedule against the plan, batch by batch (same requests, same tokens, same
    evictions first; order within a batch aside): identical on every batch when the plan ran as written."""
    return compare_schedules(recorded, plan)
