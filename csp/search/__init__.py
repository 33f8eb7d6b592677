"""infermax.csp.search — exact and anytime search over class states, with its relaxations and LP bounds.

For an offline workload and the latency objective, requests with the same (I, O) are
interchangeable; a schedule is then a path through counts per token level. The map, in the order
data flows through it:

- :mod:`.batchcount` — the chain-packing relaxation: the least number of batches any schedule
  needs (breadth-first search over its states, an area bound, and refuting small counts with a
  backend).
- :mod:`.batchtable` — :class:`~.batchtable.RemainingBatches`, the exact batches left from any
  relaxation state, built backwards from the goal, and what one batch must run to leave one fewer.
- :mod:`.classstate` — :class:`~.classstate.ClassStateSpace`: states (counts per level), batches as
  moves with their time, and the admissible remaining-cost bound.
- :mod:`.trajectorylp` — the trajectory LP (column generation over per-class paths) for a fixed
  batch count; :mod:`.configlp` — the same with every batch a convex combination of whole batches.
- :mod:`.trajectorybound` — their Lagrangian tables for every batch count worth solving, turned into
  a bound on the time left from any class state.
- :mod:`.astar` — A* (exact, anytime), the pilot search and the beam search over
  :mod:`.classstate`, bounded by :mod:`.batchtable` and :mod:`.trajectorybound`.

It reads the cost model's linear coefficients and the identical-request classes from
:mod:`infermax.csp.milp` and never builds the per-request model.
"""
