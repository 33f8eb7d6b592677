"""The cluster policies by name (PecSched §3.2, §5, §6.2, §6.4): each a queue discipline and flags.

A :class:`ClusterPolicy` names its queue discipline (``queue``: how the global queue is walked,
:mod:`~infermax.cluster.disciplines`, one class each) and sets flags (what may interrupt a gang,
where decodes run, how gangs are priced); it is checked on construction. The engine asks the
policy, never its names: its replicas' scheduler, its role plan (elastic or not), its executed
plans and the replicas' limits (Medha's 4K-token chunks), its hooks (LoongServe's scale-down), its
gangs' pricing and the options the run records.

Every policy serves long requests (tag ``long``) on a gang of replicas running
sequence parallelism, as §6.2 does for every method; they differ in what may
interrupt the gang and where short requests decode:

=================  ==========  =============  ===========  =======  ================================
policy             preempts    disaggregates  colocates    fast SP  global queue
                   long        short decode   long decode
                   prefill
=================  ==========  =============  ===========  =======  ================================
fifo               no          no             no           ring     first come, first served
reservation        no          no             no           ring     long only on the reserved majority
priority           no          no             no           ring     short first (long may starve)
pecsched           yes         yes            yes          yes      short first; §5 placement
pecsched-pe        **no**      yes            yes          yes      (ablation /PE)
pecsched-dis       yes         **no**         yes          yes      (ablation /Dis)
pecsched-col       yes         yes            **no**       yes      (ablation /CoL: shorts preempt
                                                                    long decode too)
pecsched-fsp       yes         yes            yes          **ring** (ablation /FSP)
=================  ==========  =============  ===========  =======  ================================

``pecsched-fifo``, ``pecsched-reservation`` and ``pecsched-priority`` name the
three baselines as the PecSched paper does.

Medha (Medha §3.3–3.5, §5.3) dispatches first come, first served, runs the
``medha`` replica scheduler unless ``--local`` says otherwise, and executes the
cluster's plan (``spp``, ``kvp``) stage by stage and group by group
(:mod:`~infermax.cluster.plans`, ``plan`` = its preset there):

=================  ====================================================================
medha-3d           TP × SPP × KVP, KVP groups onboarded as a request's KV grows (Fig. 12)
medha-2d           TP × SPP (the cluster's kvp must be 1)
medha-3d-static    ablation: every request striped over all KVP groups (Fig. 11's setting)
medha-3d-pp        ablation: plain PP instead of SPP (a chunk waits for its predecessor to
                   leave the last stage, Fig. 7a)
=================  ====================================================================

The CSPS policies (CSPS; :mod:`~infermax.cluster.csps`) carry a
:class:`~infermax.cluster.csps.CspsVariant`: ``csps`` (SP-NTP or SP-TP per
request, CSA, three-phase pipelining, Q-shipping decode colocated with shorter
requests' work) and its ablations ``csps-nocsa``, ``csps-nopipe``, ``csps-ntp``
(fixed SP-NTP), ``csps-tp`` (fixed SP-TP), ``csps-plain`` (neither CSA nor
pipelining), ``csps-kvdecode`` (the decode gathers KV instead of shipping Q);
first come, first served, no preemption.

Vidur's global schedulers (:mod:`~infermax.cluster.routers`) send each request, as it
arrives, to a replica chosen at once — ``round-robin``, ``random`` or ``lor`` (least
outstanding requests) — instead of holding it until a replica accepts work; first come,
first served, no preemption.

``loongserve`` (Medha §2.2–2.3; :mod:`~infermax.cluster.elastic`): first come,
first served; every request prefills on an *elastic* gang sized by its prompt
(striped ring attention, no preemption), then *scales down*: its KV moves to the decode
pool (disaggregated), where it decodes. ``loongserve-reserve`` (Medha §5.4,
Fig. 23) sets two prefill instances apart for requests that need no gang; the two
pools queue separately.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any

import numpy as np

from infermax.types import Limits, Workload

from .csps import VARIANTS, CspsVariant
from .disciplines import DISCIPLINES, QueueDiscipline
from .elastic import ScaleDown, elastic_roles
from .gang import Gang, make_gang
from .plans import PRESETS, Plans, check_plan_holds, plan_options
from .roles import Roles, plan_roles
from .routers import ROUTES
from .spec import Cluster

RING_ATTENTION = ("striped", "contiguous")   # how a plain ring shards the sequence (engine option ring_attention)
MEDHA_CHUNK_TOKENS = 4096      # a policy's plan run by a medha scheduler: prefill tokens per batch unless limits
                               # are given (Medha §3.3)
_FLAG_FIELDS = ("preempt_prefill", "disaggregate", "colocate", "fast_sp", "elastic", "scale_down", "striped")
#: (field, accepts its value, what it must be) for the fields whose values are not names
_FIELD_CHECKS = (
    ("name", lambda v: isinstance(v, str) and v != "", "a non-empty string"),
    ("queue", lambda v: isinstance(v, str), "a queue discipline's name (a string)"),
    *((flag, lambda v: isinstance(v, bool), "True or False") for flag in _FLAG_FIELDS),
    ("plan", lambda v: isinstance(v, str), "a plan preset's name or ''"),
    ("local", lambda v: isinstance(v, str), "a replica scheduler's name or ''"),
    ("csps", lambda v: v is None or isinstance(v, CspsVariant), "a CspsVariant or None"),
    ("route", lambda v: v in ("", *ROUTES), f"one of {', '.join(ROUTES)} (or empty)"),
    ("route_seed", lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
)


def _known(value: str, names: "tuple[str, ...] | list[str]") -> str:
    near = get_close_matches(value, names, n=1) if isinstance(value, str) else []
    return (f" (did you mean {near[0]}?)" if near else "") + f"; known: {', '.join(names)}"


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """What a cluster policy does (see the module table): a queue discipline
    (:mod:`~infermax.cluster.disciplines`, by name) and flags, checked on construction — a ``ValueError``
    names the field, the value and what it may be."""

    name: str
    queue: str                 # the queue discipline's name (disciplines.DISCIPLINES)
    preempt_prefill: bool = False
    disaggregate: bool = False
    colocate: bool = False
    fast_sp: bool = False
    plan: str = ""             # executed-plan preset (cluster/plans.py PRESETS); "" = its default
    local: str = ""            # the replica scheduler it runs when none is given ("" = the caller's)
    csps: Any = None           # a CspsVariant: the gang runs CSPS's SP plans (queue "csps")
    elastic: bool = False      # gang size from the prompt length and the free replicas (LoongServe)
    scale_down: bool = False   # after its prefill a gang's KV migrates to the decode pool (LoongServe)
    striped: bool = False      # ring attention load-balanced by striping the sequence (LoongServe)
    route: str = ""            # a router sends each arrival at once (cluster/routers.py); "" = shortest queue
    route_seed: int = 0        # the random router's seed

    def __post_init__(self) -> None:
        for field, ok, must in _FIELD_CHECKS:
            value = getattr(self, field)
            if not ok(value):
                raise ValueError(f"ClusterPolicy.{field} must be {must}, got {value!r}")
        for field, names, what in (("queue", DISCIPLINES, "queue discipline"), ("plan", PRESETS, "plan preset")):
            value = getattr(self, field)
            if value not in names and not (field == "plan" and value == ""):
                raise ValueError(f"ClusterPolicy.{field}: unknown {what} {value!r}{_known(value, list(names))}"
                                 + (" (or '' for the default)" if field == "plan" else ""))
        if self.scale_down and not self.disaggregate:
            raise ValueError("ClusterPolicy.scale_down = True moves a gang's KV to the decode pool, which only "
                             "disaggregate = True sets apart")
        self.discipline.check(self)

    # --- what the engine and the dispatcher ask ------------------------------------------------------------
    @property
    def discipline(self) -> QueueDiscipline:
        """How its global queue is walked (:mod:`~infermax.cluster.disciplines`)."""
        return DISCIPLINES[self.queue]

    @property
    def exclusive(self) -> bool:
        """A gang's replicas take no other work from its formation to its request's completion."""
        return self.discipline.exclusive

    @property
    def plain_ring(self) -> bool:
        """Its gangs run plain ring attention (the PecSched baselines, ``pecsched-fsp``), sharded as the engine's
        ``ring_attention`` option says; the others price their gangs their own way."""
        return not (self.fast_sp or self.csps is not None or self.elastic or self.plan)

    @property
    def takes_reserved_replicas(self) -> bool:
        """The option ``reserved_replicas`` means something for it (a reservation that is not elastic)."""
        return self.discipline.reserves and not self.elastic

    def sharded(self, ring_attention: str) -> "ClusterPolicy":
        """The policy as a run with that ``ring_attention`` option runs it (checked)."""
        if ring_attention not in RING_ATTENTION:
            raise ValueError(f"ring_attention must be one of {', '.join(RING_ATTENTION)}, got {ring_attention!r}")
        return dataclasses.replace(self, striped=ring_attention == "striped") if self.plain_ring else self

    def scheduler(self, given: Any) -> Any:
        """Each replica's scheduler: the one given, else the policy's own (``medha`` under medha-*), else vLLM."""
        return given if given is not None else (self.local or "vllm")

    def roles(self, workload: Workload, cluster: Cluster, limits: "Limits | str | None", long_tag: str,
              sp_replicas: int | None, decode_replicas: int | None, reserved_replicas: int | None) -> Roles:
        """Who serves what (:mod:`~infermax.cluster.roles`; elastic gangs: :mod:`~infermax.cluster.elastic`),
        after checking that an executed plan holds every request."""
        if self.plan or cluster.executes_plan:     # a plan that cannot hold a request says which degree to raise
            check_plan_holds(workload, cluster)
        if not self.elastic:
            return plan_roles(workload, cluster, self, limits, long_tag, sp_replicas, decode_replicas,
                              reserved_replicas)
        if reserved_replicas is not None:
            raise ValueError(f"reserved_replicas = {reserved_replicas!r} sets the reservation policy's long-only "
                             f"replicas; {self.name!r} sizes its gangs elastically and reserves none")
        return elastic_roles(workload, cluster, self, limits, sp_replicas, decode_replicas)

    def plans(self, workload: Workload, cluster: Cluster, roles: Roles, kvp_group_tokens: int | None) -> Plans | None:
        """The executed plans of a cluster with spp or kvp > 1 (its preset, else Medha 3D), else None."""
        if cluster.executes_plan:                  # spp or kvp > 1: timing executed per stage and group
            return Plans(cluster, workload, plan_options(self.plan or "3d", kvp_group_tokens), roles, self)
        if kvp_group_tokens is not None:
            raise ValueError(f"kvp_group_tokens = {kvp_group_tokens!r} needs a cluster with kvp > 1, got "
                             f"{cluster.to_spec()}")
        return None

    def replica_limits(self, lim: Limits, limits: "Limits | str | None", scheduler: Any, max_num_seqs: int | None,
                       plans: Plans | None) -> Limits:
        """Every replica's limits: the role plan's ``lim``, R_max from ``max_num_seqs`` unless the given ``limits``
        set it, and (a Medha plan run by a medha scheduler, no limits given) 4K-token chunks at most (§3.3)."""
        if lim.R_max is None and max_num_seqs is not None:
            lim = lim.replace(R_max=max_num_seqs)
        if plans is not None and self.plan and limits is None and str(scheduler).startswith("medha"):
            lim = lim.replace(P=min(lim.P, MEDHA_CHUNK_TOKENS))
        return lim

    def decode_serves(self, n: int) -> np.ndarray | None:
        """Per request whether the decode pool may serve it: all under scale-down (a gang's KV moves there), else
        None (the short ones only)."""
        return np.ones(n, dtype=bool) if self.scale_down else None

    def attach(self, engine: Any) -> None:
        """Its hooks on a built engine: under scale-down, the gangs' KV to the decode pool (LoongServe)."""
        if self.scale_down:
            engine.gangs.scale_down = ScaleDown(engine)

    def gang(self, cluster: Cluster, gid: int, request: int, members: tuple[int, ...], input_len: int,
             output_len: int, striped: bool | None = None) -> Gang:
        """A gang of ``members`` for one long request, its prefill priced as the policy prices it: fast SP, its
        CSPS variant's plan, or ring attention (striped as the policy's, unless ``striped`` says otherwise)."""
        return make_gang(cluster, gid, request, members, input_len, output_len, self.fast_sp, self.csps,
                         self.striped if striped is None else striped)

    def run_options(self, roles: Roles, ring_attention: str, plans: Plans | None) -> dict[str, Any]:
        """The engine options a run records beyond the common ones, as the policy used them."""
        out: dict[str, Any] = {"ring_attention": ring_attention} if self.plain_ring else {}
        if plans is not None:
            out["kvp_group_tokens"] = plans.group_tokens
        if self.takes_reserved_replicas and roles.is_long.any():
            out["reserved_replicas"] = int(roles.eligible_long.sum())
        return out


_POLICIES = {
    "fifo": ClusterPolicy("fifo", "fifo"),
    "reservation": ClusterPolicy("reservation", "reservation"),
    "priority": ClusterPolicy("priority", "priority"),
    "pecsched": ClusterPolicy("pecsched", "pecsched", True, True, True, True),
    "pecsched-pe": ClusterPolicy("pecsched-pe", "pecsched", False, True, True, True),
    "pecsched-dis": ClusterPolicy("pecsched-dis", "pecsched", True, False, True, True),
    "pecsched-col": ClusterPolicy("pecsched-col", "pecsched", True, True, False, True),
    "pecsched-fsp": ClusterPolicy("pecsched-fsp", "pecsched", True, True, True, False),
    "medha-3d": ClusterPolicy("medha-3d", "fifo", plan="3d", local="medha"),
    "medha-2d": ClusterPolicy("medha-2d", "fifo", plan="2d", local="medha"),
    "medha-3d-static": ClusterPolicy("medha-3d-static", "fifo", plan="3d-static", local="medha"),
    "medha-3d-pp": ClusterPolicy("medha-3d-pp", "fifo", plan="3d-pp", local="medha"),
    **{name: ClusterPolicy(name, "csps", colocate=True, csps=v) for name, v in VARIANTS.items()},
    "loongserve": ClusterPolicy("loongserve", "fifo", disaggregate=True, elastic=True, scale_down=True,
                                striped=True),
    "loongserve-reserve": ClusterPolicy("loongserve-reserve", "reservation", disaggregate=True, elastic=True,
                                        scale_down=True, striped=True),
    **{name: ClusterPolicy(name, "fifo", route=name) for name in ROUTES},
}
_ALIASES = {"pecsched-fifo": "fifo", "pecsched-reservation": "reservation", "pecsched-priority": "priority"}
POLICIES = tuple(_POLICIES) + tuple(_ALIASES)


_FLAGS = {"preempt_prefill": "short requests preempt long prefills", "disaggregate": "decodes disaggregated",
          "colocate": "long decodes colocated with short work", "fast_sp": "fast SP",
          "elastic": "elastic prefill gangs", "scale_down": "KV scaled down to a decode pool",
          "striped": "striped ring attention"}
_VALUES = {"plan": "executed plan {}", "local": "replicas run {} unless --local", "csps": "CSPS {}"}


def _shown(value: Any) -> str:
    if hasattr(value, "__dataclass_fields__"):
        return ", ".join(f"{f}={getattr(value, f)}" for f in value.__dataclass_fields__)
    return str(value)


def describe_policies() -> dict[str, str]:
    """One line per cluster policy name (aliases included), read from its fields: ``infermax schedulers``
    lists them beside the replica schedulers."""
    out = {}
    for name in POLICIES:
        if name in _ALIASES:
            out[name] = f"the PecSched paper's name for {_ALIASES[name]}"
            continue
        policy, parts = _POLICIES[name], []
        for f in dataclasses.fields(ClusterPolicy):
            value = getattr(policy, f.name)
            if f.name in ("name", "queue") or value == f.default:
                continue
            field = f.name
            parts.append(_FLAGS.get(field, field) if value is True
                         else _VALUES.get(field, field + " {}").format(_shown(value)))
        out[name] = f"global queue {policy.queue}" + "".join(f"; {p}" for p in parts)
    return out


def get_policy(name: "str | ClusterPolicy") -> ClusterPolicy:
    """The policy called ``name`` (or its PecSched-paper alias); a clear error otherwise."""
    if isinstance(name, ClusterPolicy):
        return name
    key = _ALIASES.get(str(name), str(name))
    if key not in _POLICIES:
        near = get_close_matches(str(name), POLICIES, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"unknown cluster policy {name!r}{hint}; known: {', '.join(POLICIES)}")
    return _POLICIES[key]
