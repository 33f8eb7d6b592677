"""The cluster policies by name, as flags the engine reads (PecSched §3.2, §5, §6.2, §6.4).

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

from dataclasses import dataclass
from typing import Any

from .csps import VARIANTS
from .routers import ROUTES


@dataclass(frozen=True, slots=True)
class ClusterPolicy:
    """What a cluster policy does; see the module table."""

    name: str
    queue: str                 # "fifo", "reservation", "priority" or "pecsched"
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

    @property
    def exclusive(self) -> bool:
        """A gang's replicas take no other work from its formation to its request's completion."""
        return self.queue not in ("pecsched", "csps")


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
RING_ATTENTION = ("striped", "contiguous")   # how a plain ring shards the sequence (engine option ring_attention)
_ALIASES = {"pecsched-fifo": "fifo", "pecsched-reservation": "reservation", "pecsched-priority": "priority"}
POLICIES = tuple(_POLICIES) + tuple(_ALIASES)

# PecSched §6.2: replicas dedicated to short-request decode, per model
DECODE_REPLICAS = {"mistral-7b-v0.3": 4, "phi3-14b": 4, "yi-34b": 1, "llama3.1-70b": 1}


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
        for field, default in ((f, getattr(ClusterPolicy(name, policy.queue), f)) for f in policy.__dataclass_fields__):
            value = getattr(policy, field)
            if field in ("name", "queue") or value == default:
                continue
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
        from difflib import get_close_matches
        near = get_close_matches(str(name), POLICIES, n=1)
        hint = f" (did you mean {near[0]}?)" if near else ""
        raise ValueError(f"unknown cluster policy {name!r}{hint}; known: {', '.join(POLICIES)}")
    return _POLICIES[key]
