"""The decisions behind ``infermax bound --cluster``: each cluster policy's measured value against the fluid
cluster bound (:mod:`infermax.bounds.cluster`), the bound computed once per objective for every policy."""
from __future__ import annotations

from typing import Any, Sequence

from infermax.bounds.objectives import spec_of

from .engine import POLICIES, simulate_cluster

#: the cluster policy checked when none is named
DEFAULT_POLICY = "fifo"


def policies_to_check(spec: str | None) -> list[str]:
    """The cluster policies of ``spec`` (comma separated; ``None``: :data:`DEFAULT_POLICY`), each a known one."""
    from infermax.schedulers import split_specs

    policies = split_specs(spec or DEFAULT_POLICY)
    for policy in policies:
        if policy not in POLICIES:
            raise ValueError(f"--scheduler {policy!r} is not a cluster policy; with --cluster use "
                             f"{', '.join(POLICIES)}")
    return policies


def beats(objective: str, value: float, bound: float) -> bool:
    """Whether ``value`` is better than the certified ``bound`` (beyond rounding): an accounting bug."""
    sign = -1.0 if spec_of(objective).sense == "max" else 1.0          # throughput's bound is a ceiling
    return sign * (value - bound) < -1e-9 * max(1.0, abs(bound))


def certified_gap(objective: str, value: float, bound: float) -> float:
    """How far ``value`` may be from optimal, as a fraction: of the bound for throughput, of the value else."""
    if spec_of(objective).sense == "max":
        return (bound - value) / bound
    return (value - bound) / value if value else 0.0


def check_policies(workload: Any, cluster: Any, policies: Sequence[str], objectives: Sequence[str],
                   local: Any = None, cost: Any = None) -> tuple[list[dict[str, Any]], int]:
    """(one row per policy and objective, the exit code: 3 when a value beats the bound, else 0). The bound
    of each objective is computed once (it holds for every policy: attention kept by the policies' CSA)."""
    from infermax.bounds.cluster import attention_kept, cluster_lower_bound, measured_value

    share = attention_kept(policies)
    bounds = {o: cluster_lower_bound(workload, cluster, o, cost, attention=share) for o in objectives}
    rows, code = [], 0
    for policy in policies:
        res = simulate_cluster(workload, cluster, policy, local, cost=cost)
        for o, b in bounds.items():
            value = measured_value(o, res)
            code = max(code, 3 if beats(o, value, b.value) else 0)
            rows.append({"policy": policy, "objective": o, "value": value, "bound": b.value,
                         "certified_gap_%": 100 * certified_gap(o, value, b.value), "bound_method": b.method})
    return rows, code
