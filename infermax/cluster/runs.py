"""The decisions behind ``infermax simulate --cluster``: which (cluster policy, replica scheduler) pairs run,
which options each run takes, what each run reports. The command line parses, calls these and prints.

- :func:`cluster_runs`: the names of ``--scheduler`` are cluster policies (each replica then runs
  ``--local``, else the policy's own, else sarathi) or replica schedulers (each run under every
  ``--policy``, default fifo); the two kinds are not mixed; an unknown name lists both kinds.
- :func:`reserved_options`: ``--reserved-replicas`` goes to the policies that reserve replicas, and is
  refused when no run has one.
- :func:`check_limits_without_M`, :func:`engine_options`, :func:`rescale_to_load`, :func:`run_record`.

The messages name the command line's flags (``--policy``, ``--scheduler``, ``--local``,
``--reserved-replicas``, ``--limits``), whose values the arguments of the same names carry.
"""
from __future__ import annotations

from difflib import get_close_matches
from typing import Any, Sequence

from infermax.types import Workload

from .engine import POLICIES
from .policies import get_policy
from .spec import Cluster

#: each replica's scheduler under a cluster policy named in ``--scheduler`` that has none of its own
DEFAULT_LOCAL = "sarathi"
#: the policy replica schedulers run under when no ``--policy`` is given
DEFAULT_POLICY = "fifo"


def check_limits_without_M(limits: str | None, cluster: Cluster) -> None:
    """A cluster's replicas take ``M`` from the cluster (each replica's KV capacity): a limits spec naming it is
    refused."""
    if limits and any(p.split("=")[0].strip() == "M" for p in limits.split(",")):
        raise ValueError(f"--limits {limits!r}: M comes from --cluster (each replica's KV capacity, "
                         f"{cluster.replica_kv_capacity_tokens} tokens); leave M out")


def check_cluster_name(name: str) -> None:
    """Under ``--cluster`` a name is a cluster policy or a replica scheduler: an unknown one lists both kinds."""
    from infermax.schedulers import available

    base, _, rest = name.strip().partition(":")
    known = available()
    if base.strip() in known or base.strip() in POLICIES or rest.isidentifier():
        return
    near = get_close_matches(base.strip(), [*POLICIES, *known], n=1)
    raise ValueError(f"unknown name {name!r} under --cluster{f' (did you mean {near[0]}?)' if near else ''}: "
                     f"neither a cluster policy ({', '.join(POLICIES)}) nor a replica scheduler "
                     f"({', '.join(known)}); `infermax schedulers` lists both")


def _policies(policy: str | None) -> list[str]:
    from infermax.schedulers import split_specs

    policies = split_specs(policy or DEFAULT_POLICY)
    for name in policies:
        if name not in POLICIES:
            near = get_close_matches(name, POLICIES, n=1)
            raise ValueError(f"--policy: unknown cluster policy {name!r}"
                             f"{f' (did you mean {near[0]}?)' if near else ''}; known: {', '.join(POLICIES)}")
    return policies


def cluster_runs(names: Sequence[str], policy: str | None = None, local: str | None = None) -> list[tuple[str, str]]:
    """(cluster policy, replica scheduler) of each run, in order: first the cluster policies among ``names``
    (each with ``local``, else its own, else :data:`DEFAULT_LOCAL`), then, when ``policy`` (comma-separated
    policies) is given or ``names`` holds no cluster policy, each policy with each replica scheduler of ``names``.
    Names of both kinds without ``policy`` are refused; every name is checked before any work."""
    from infermax.schedulers import get_scheduler

    runs = [(name, local or get_policy(name).local or DEFAULT_LOCAL) for name in names if name in POLICIES]
    locals_ = [name for name in names if name not in POLICIES]
    if policy or not runs:
        runs += [(p, name) for p in _policies(policy) for name in locals_]
    elif locals_:
        raise ValueError(f"--scheduler mixes cluster policies ({', '.join(n for n, _ in runs)}) with replica "
                         f"schedulers ({', '.join(locals_)}); give replica schedulers with --local or --policy")
    for _, name in runs:
        check_cluster_name(name)
        get_scheduler(name)
    return runs


def engine_options(**given: Any) -> dict[str, Any]:
    """The cluster engine's options that were given (``None``: the engine's default)."""
    return {k: v for k, v in given.items() if v is not None}


def rescale_to_load(workload: Workload, cluster: Cluster, load: float, scheduler: Any,
                    options: dict[str, Any]) -> tuple[Workload, float]:
    """(the workload with its arrivals rescaled to ``load`` times the cluster's capacity, that capacity in
    requests/s): FIFO's throughput with every request at t = 0, replicas running ``scheduler``."""
    from .load import at_load, capacity_rps

    cap = capacity_rps(workload, cluster, "fifo", scheduler, **options)
    return at_load(workload, load, cap), cap


def reserved_options(runs: Sequence[tuple[str, str]], reserved_replicas: int | None) -> list[dict[str, Any]]:
    """Per run, the ``reserved_replicas`` option to pass (only to a policy that takes it); a count given when no
    run's policy takes it is refused."""
    reserving = {policy for policy, _ in runs if get_policy(policy).takes_reserved_replicas}
    if reserved_replicas is not None and not reserving:
        raise ValueError(f"--reserved-replicas {reserved_replicas} sets the reservation policy's long-only "
                         f"replicas, but no run uses it (policies: {', '.join(p for p, _ in runs)})")
    return [{"reserved_replicas": reserved_replicas} if reserved_replicas is not None and policy in reserving
            else {} for policy, _ in runs]


def run_record(policy: str, scheduler: str, result: Any) -> dict[str, Any]:
    """What one run reports (``--json``'s ``results``, a run directory's ``metrics.json``)."""
    return {"policy": policy, "scheduler": scheduler, "metrics": result.metrics, "by_tag": result.by_tag,
            "num_preemptions": result.num_preemptions, "num_overtakes": result.num_overtakes,
            "utilization": result.utilization.round(4).tolist()}
