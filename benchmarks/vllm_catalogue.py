"""The catalogue of workloads on which vLLM's real schedules are recorded, judged and reproduced.

Small enough for a CPU (each case well under a minute on the tiny random-weight Llama), varied
enough to exercise every rule of vLLM's scheduler that infermax models: offline and Poisson online
arrivals, uniform and long-tailed lengths (the shipped Splitwise traces, clipped with ``max_len``),
with and without preemption pressure, token budgets from 32 to 512, ``R_max`` binding, and prompts
longer than the budget (chunked prefill). Cases sharing limits share one engine (``group``).
Nothing here imports an engine.
"""
from __future__ import annotations

from typing import NamedTuple

from infermax.types import Limits, Workload


class Case(NamedTuple):
    """One catalogue workload: a name, its workload and limits specs, and what it exercises."""

    name: str
    workload: str
    limits: str
    exercises: str

    def build(self) -> tuple[Workload, Limits]:
        spec = self.workload
        w = lengths_workload(spec) if spec.startswith("lengths:") else Workload.from_spec(spec)
        return Workload(requests=w.requests, name=self.name), Limits.from_spec(self.limits)


def lengths_workload(spec: str) -> Workload:
    """``lengths:I=165/63/24,O=19/22/23``: an offline workload of these prompt and output lengths."""
    opts = dict(part.split("=", 1) for part in spec.removeprefix("lengths:").split(","))
    try:
        ins, outs = ([int(x) for x in opts[k].split("/")] for k in ("I", "O"))
    except (KeyError, ValueError):
        raise ValueError(f"workload {spec!r}: use lengths:I=a/b/...,O=x/y/...") from None
    return Workload.from_lengths(ins, outs, name=spec)


_A = "M=640,C=256,R_max=16,block=32"       # 20 blocks of 32
_B = "M=1024,C=64,R_max=8,block=32"        # budget below the prompts
_C = "M=2048,C=512,R_max=2,block=32"       # R_max binds
_D = "M=1536,C=128,R_max=16,block=32"      # Splitwise traces
_E = "M=512,C=32,R_max=16,block=32"        # a tiny budget, memory pressure
# mixed lengths under pressure, where a request is preempted while another waits whose whole input
# would fit after it: vLLM admits no one in a step that preempted (sarathi-pc would)
_F = "M=256,C=64,R_max=16,block=32"
_G = "M=352,C=256,R_max=16,block=32"
_H = "M=480,C=64,R_max=16,block=32"

CATALOGUE: tuple[Case, ...] = (
    Case("offline-pressure", "fixed:I=100,O=40,B=12", _A, "offline, uniform, preemptions (60 blocks wanted, 20 held)"),
    Case("offline-fits", "fixed:I=48,O=16,B=8", _A, "offline, uniform, no memory pressure"),
    Case("poisson-pressure", "fixed:I=100,O=40,B=12,rate=4,seed=1", _A, "Poisson online, preemptions"),
    Case("offline-chunked", "fixed:I=200,O=12,B=6", _B, "prompts 3x the budget: chunked prefill"),
    Case("poisson-chunked", "fixed:I=200,O=12,B=6,rate=3,seed=2", _B, "online, prompts longer than the budget"),
    Case("offline-rmax", "fixed:I=32,O=24,B=8", _C, "R_max = 2 binds, a large budget"),
    Case("poisson-rmax", "fixed:I=32,O=24,B=8,rate=6,seed=3", _C, "online, R_max = 2 binds"),
    Case("code-offline", "trace:splitwise_code,n=10,max_len=768,offline=1", _D,
         "Splitwise code trace (long-tailed prompts, clipped at 768), offline"),
    Case("code-online", "trace:splitwise_code,n=10,max_len=768", _D, "Splitwise code trace, its own arrivals"),
    Case("conv-online", "trace:splitwise_conv,n=10,max_len=512,time_scale=2", _D,
         "Splitwise conversation trace (long-tailed outputs), arrivals 2x faster"),
    Case("offline-tiny-budget", "fixed:I=48,O=24,B=8", _E, "budget 32: every prompt chunked, preemptions"),
    Case("poisson-tiny-budget", "fixed:I=48,O=24,B=8,rate=8,seed=4", _E, "online, budget 32, preemptions"),
    Case("mixed-preempt-a", "lengths:I=165/63/24/101,O=19/22/23/10", _F,
         "mixed lengths: no admission in a step that preempts"),
    Case("mixed-preempt-b", "lengths:I=37/85/192/69,O=13/14/13/28", _G, "the same, budget 256"),
    Case("mixed-preempt-c", "lengths:I=78/83/114/53/147/28/97/79,O=17/10/9/13/21/28/13/14", _H,
         "the same, 8 requests, budget 64"),
)


def groups(cases: "tuple[Case, ...] | list[Case]" = CATALOGUE) -> dict[str, list[Case]]:
    """Cases by their limits spec (one engine serves each group)."""
    out: dict[str, list[Case]] = {}
    for case in cases:
        out.setdefault(case.limits, []).append(case)
    return out


def select(names: "str | None") -> list[Case]:
    """The cases named (comma separated; all when None), refusing an unknown name."""
    if not names:
        return list(CATALOGUE)
    by_name = {c.name: c for c in CATALOGUE}
    unknown = [n for n in names.split(",") if n not in by_name]
    if unknown:
        raise ValueError(f"unknown catalogue case(s) {', '.join(unknown)}; the cases are {', '.join(by_name)}")
    return [by_name[n] for n in names.split(",")]
