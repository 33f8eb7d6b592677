"""Vidur's global schedulers as routers (microsoft/vidur ``global_scheduler``): which replica a request
goes to, decided the moment it arrives.

Under the default dispatch (:mod:`~infermax.cluster.dispatch`) a request waits in the
global queue until some replica *accepts* work (none of its own requests waits to start)
and then goes to the one with the shortest local queue in tokens. Vidur's global
schedulers do not hold requests: every arrival is sent at once, to

- ``round-robin``: the next replica in turn (request k to replica k mod R);
- ``random``: a replica drawn uniformly (a seeded generator: ``ClusterPolicy.route_seed``,
  0 by default, so a run repeats itself; Vidur draws from Python's global ``random``);
- ``lor`` (least outstanding requests): the replica with the fewest requests waiting to
  start there — dispatched and not yet holding KV, as Vidur counts its replica queue —,
  the lowest index on ties; a request sent in the same decision counts at once.

Only the replicas that may serve the request are candidates (the prefill pool under
disaggregation, the long/short split of the reservation policy), and none that a gang
holds under an exclusive policy; round-robin then takes the next candidate in turn from
where it left off. A long request on a gang of replicas is placed as the policy's queue
says, not routed.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

ROUTES = ("round-robin", "random", "lor")


class Router:
    """Chooses a replica for each arriving request among the candidates it is given."""

    def __init__(self, route: str, num_replicas: int, waiting: Callable[[int], int], seed: int = 0) -> None:
        if route not in ROUTES:
            raise ValueError(f"ClusterPolicy.route must be one of {', '.join(ROUTES)} (or empty), got {route!r}")
        self.route, self._R, self._waiting = route, num_replicas, waiting
        self._next = 0                               # round-robin: the replica whose turn it is
        self._rng = np.random.default_rng(seed)

    def choose(self, candidates: np.ndarray) -> int | None:
        """The replica for the next request among ``candidates`` (a mask over replicas), or None if none."""
        pool = np.flatnonzero(candidates)
        if not pool.size:
            return None
        if self.route == "round-robin":
            k = int(np.searchsorted(pool, self._next))
            r = int(pool[k % pool.size])
            self._next = (r + 1) % self._R
            return r
        if self.route == "random":
            return int(pool[int(self._rng.integers(pool.size))])
        counts = [self._waiting(int(r)) for r in pool]
        return int(pool[int(np.argmin(counts))])
