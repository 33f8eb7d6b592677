"""Queue disciplines: how a cluster policy's global queue is walked, one class per discipline.

A cluster policy (:mod:`~infermax.cluster.policies`) is a discipline (its ``queue``, a name
registered here) plus flags (``preempt_prefill``, ``disaggregate``, ``colocate``, ...). The
discipline is the behaviour of the global queue; the dispatcher
(:mod:`~infermax.cluster.dispatch`) and the role plan (:mod:`~infermax.cluster.roles`,
:mod:`~infermax.cluster.elastic`) ask it, and never compare its name:

- **walk order** (``short_first``): the requests in arrival order, or the short ones by index,
  then the long ones by index;
- **tiers** (:meth:`QueueDiscipline.tiers`): the load buckets a request one replica serves tries
  in turn (PecSched Fig. 6 steps 2-5: a replica no gang holds first, then gang replicas);
- **what a blocked request does** (:meth:`~QueueDiscipline.stops_at_gang`,
  :meth:`~QueueDiscipline.stops_at_replica`): a request that finds no gang (no replica) stops the
  walk, or the next request may still go;
- **exclusive**: whether a gang's replicas take no other work from its formation to its end;
- **the role plan** (:meth:`~QueueDiscipline.split`, :meth:`~QueueDiscipline.split_elastic`): which
  replicas may serve long and short requests (the reservation's long-only replicas);
- **its checks** (:meth:`~QueueDiscipline.check`): the flags a policy of this discipline may set.

=================  =============  ==========  ====================================  ===========
discipline         walk order     exclusive   blocked: gang / one replica           role plan
=================  =============  ==========  ====================================  ===========
``fifo``           arrival        yes         stops / stops                         all
``reservation``    arrival        yes         next / next                           long-only
                                                                                    replicas
``priority``       short first    yes         stops if no smaller gang / stops      all
``pecsched``       short first    no          stops if no smaller gang / stops      all
``csps``           arrival        no          next / stops                          all
=================  =============  ==========  ====================================  ===========

To add one: a subclass here with its ``name``, decorated with :func:`register`; a policy that
names it in :data:`~infermax.cluster.policies._POLICIES`; ``tests/cluster/test_policies.py`` then
runs and judges it (docs/howto/cluster.md, "Add a queue discipline").
"""
from __future__ import annotations

from typing import Any, ClassVar, TypeVar

import numpy as np

from .csps import CspsVariant
from .elastic import short_reserve
from .loads import FREE, GANG_DECODE, GANG_PREFILL, GANG_WAIT
from .placement import reservation_split
from .spec import Cluster

Split = tuple[np.ndarray, np.ndarray]     # (may serve long requests, may serve short ones), per replica
# (``policy`` arguments are ClusterPolicy objects, typed Any: policies.py imports this module, not the reverse)


class QueueDiscipline:
    """First come, first served over the whole cluster; the base every discipline overrides in part."""

    name: ClassVar[str] = ""
    short_first: ClassVar[bool] = False   # walk order: short requests by index, then long ones (else arrival)
    exclusive: ClassVar[bool] = True      # a gang's replicas take no other work until its request completes
    reserves: ClassVar[bool] = False      # the role plan sets replicas apart for long requests
    at_once: ClassVar[bool] = False       # one replica and no gang: every request goes there on arrival

    def check(self, policy: Any) -> None:
        """A ``ValueError`` naming the field if ``policy`` sets a flag this discipline gives no meaning."""
        for flag in ("preempt_prefill", "colocate"):
            if self.exclusive and getattr(policy, flag):
                raise ValueError(f"ClusterPolicy.{flag} = True: under queue {self.name!r} a gang's replicas take no "
                                 f"other work, so nothing preempts or colocates with it (queues that share them: "
                                 f"{', '.join(n for n, d in DISCIPLINES.items() if not d.exclusive)})")
        if policy.csps is not None:
            raise ValueError(f"ClusterPolicy.csps = {policy.csps!r} runs under queue 'csps', not {self.name!r}")

    def tiers(self, policy: Any) -> list[tuple[int, ...]]:
        """The load tiers a request one replica serves tries in turn: here, a replica no gang holds."""
        return [(FREE,)]

    def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
        """A request found no gang (``smallest_refused``: the smallest size no longer found; ``smallest_gang``:
        the smallest any request needs): True if the walk stops there, False if the next request may go."""
        return True

    def stops_at_replica(self) -> bool:
        """A request one replica serves found none: True if the walk stops there (for its kind of request:
        long or short), False if the next request may go."""
        return True

    def split(self, policy: Any, cluster: Cluster, prefill_pool: np.ndarray, is_long: np.ndarray,
              peak: np.ndarray, gang: int, reserved_replicas: int | None, long_tag: str) -> Split:
        """The role plan (:func:`~infermax.cluster.roles.plan_roles`): every prefill replica serves both kinds.
        ``peak``: per request its peak KV; ``gang``: the replicas of a long request's gang (1 without gangs)."""
        if reserved_replicas is not None:
            raise ValueError(f"reserved_replicas = {reserved_replicas!r} sets the reservation policy's long-only "
                             f"replicas, but policy {policy.name!r} reserves none")
        return prefill_pool.copy(), prefill_pool.copy()

    def split_elastic(self, policy: Any, cluster: Cluster, prefill_pool: np.ndarray) -> Split:
        """The role plan of an elastic policy (:func:`~infermax.cluster.elastic.elastic_roles`)."""
        return prefill_pool.copy(), prefill_pool.copy()

    def __repr__(self) -> str:
        return f"<queue discipline {self.name}>"


D = TypeVar("D", bound=type[QueueDiscipline])
#: the queue disciplines by name (``ClusterPolicy.queue``), in registration order
DISCIPLINES: dict[str, QueueDiscipline] = {}


def register(cls: D) -> D:
    """Class decorator: one instance of ``cls`` under its ``name`` in :data:`DISCIPLINES`."""
    if not cls.name or cls.name in DISCIPLINES:
        raise ValueError(f"queue discipline {cls.__name__}: name {cls.name!r} is empty or taken")
    DISCIPLINES[cls.name] = cls()
    return cls


@register
class Fifo(QueueDiscipline):
    """``fifo``: first come, first served; the head blocks the queue."""

    name = "fifo"
    at_once = True


@register
class Reservation(QueueDiscipline):
    """``reservation``: first come, first served, long requests only on the reserved replicas (the majority, in
    whole gangs: :func:`~infermax.cluster.placement.reservation_split`) and short ones only on the others, neither
    blocking the other."""

    name = "reservation"
    reserves = True

    def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
        return False

    def stops_at_replica(self) -> bool:
        return False

    def split(self, policy: Any, cluster: Cluster, prefill_pool: np.ndarray, is_long: np.ndarray,
              peak: np.ndarray, gang: int, reserved_replicas: int | None, long_tag: str) -> Split:
        if is_long.any():
            return reservation_split(cluster, int(peak[is_long].max()), gang, reserved_replicas)
        if reserved_replicas is not None:
            raise ValueError(f"reserved_replicas = {reserved_replicas!r} sets the reservation policy's long-only "
                             f"replicas, but no request is tagged {long_tag!r} reserves none")
        return prefill_pool.copy(), prefill_pool.copy()

    def split_elastic(self, policy: Any, cluster: Cluster, prefill_pool: np.ndarray) -> Split:
        return short_reserve(policy, cluster, prefill_pool)


@register
class Priority(QueueDiscipline):
    """``priority``: short requests first (by index); a long request is dispatched only when every short one
    was (long requests may starve)."""

    name = "priority"
    short_first = True

    def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
        return smallest_refused <= smallest_gang      # only long requests are left, and none would find a gang


class _SharedGangs(QueueDiscipline):
    """Gangs whose replicas take short work too (PecSched Fig. 6 steps 3-5, CSPS's colocated decode)."""

    exclusive = False

    def check(self, policy: Any) -> None:
        if policy.csps is not None:
            raise ValueError(f"ClusterPolicy.csps = {policy.csps!r} runs under queue 'csps', not {self.name!r}")

    def tiers(self, policy: Any) -> list[tuple[int, ...]]:
        steps = [(FREE,)]                                              # step 2: a replica no long request holds
        if policy.colocate:                                            # steps 3-4: colocate with a long decode
            steps.append((GANG_DECODE,))
        preemptible = ((GANG_PREFILL, GANG_WAIT) if policy.preempt_prefill else ()) + \
            (() if policy.colocate else (GANG_DECODE,))                # step 5 (/CoL: a long decode too)
        steps.append(tuple(sorted(preemptible)))
        return steps


@register
class PecSched(_SharedGangs):
    """``pecsched``: short first, as ``priority``; a short request may land on a gang's replica (§5 placement)."""

    name = "pecsched"
    short_first = True

    def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
        return smallest_refused <= smallest_gang


@register
class Csps(_SharedGangs):
    """``csps``: first come, first served, a long request that finds no gang lets the next one try; its gangs
    run the policy's CSPS variant (:mod:`~infermax.cluster.csps`), their decode colocated with short work."""

    name = "csps"

    def check(self, policy: Any) -> None:
        if not isinstance(policy.csps, CspsVariant):
            raise ValueError(f"ClusterPolicy.csps must be a CspsVariant under queue 'csps', got {policy.csps!r}")

    def stops_at_gang(self, smallest_refused: int, smallest_gang: int) -> bool:
        return False


__all__ = ["DISCIPLINES", "QueueDiscipline", "register"]
