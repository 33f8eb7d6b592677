"""infermax.csp.milp — the §3.3 model of InferMax as a solver-neutral MILP, and its aggregated twin.

The map, in the order data flows through it:

- :mod:`.model` — the solver-neutral model: variables, linear rows, indicators, products.
  Everything below writes into one :class:`~.model.Model`; a backend
  (:mod:`infermax.csp.backends`) only translates it.
- :mod:`.policy` — policy classes (which freedoms a scheduler class removes).
- :mod:`.formulation` — :class:`~.formulation.Formulation` (the model plus its named variable
  families, :class:`~.formulation.Variables`) and constraints (1)–(5), one function per family.
- :mod:`.objectives` — batch time inside the model (the cost model's linear coefficients,
  :func:`infermax.bounds.costs.linear_coefficients`) and every objective built on it.
- :mod:`.strengthening` — valid inequalities, symmetry breaking, dominance, bin-packing cuts.
- :mod:`.flows` — the class-flow extended formulation added to the per-request model.
- :mod:`.aggregate` — the class-flow model alone (no per-request variables), exact for
  interchangeable requests, and its decomposition into a schedule.
- :mod:`.build` — :class:`~.build.Strengthening` (the model options) and :func:`~.build.build`, the
  complete model of one instance: core, objective, strengthening, in that order.
- :mod:`.linearize` — indicators and products as plain rows, for backends that lack them.
- :mod:`.trajectory` — a schedule's per-request state trajectory and the rewrites (dominance,
  symmetry order, merged chunks) that let a schedule hint the model.
- :mod:`.extract` — the per-request model's solution read back as a Schedule.

Nothing here imports :mod:`infermax.csp.search`; the conductor (:mod:`infermax.csp.api`) decides
which model to build and when.
"""
