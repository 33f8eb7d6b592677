"""Sweep configuration: the grid's axes and its cells (results: :mod:`infermax.sweep`).

Config (a YAML file, a dict or a :class:`SweepConfig`; ``examples/grid.yaml`` is a
commented example)::

    name: fig5                        # optional, a label
    out: fig5.parquet                 # optional; relative to the YAML file (CLI --out overrides)
    workloads:                        # a list of items, or one item
      - fixed:I=64,O=32,B=1024        # a spec string (see infermax.workloads.spec)
      - grid: {I: [1, 64, 1024], O: [1, 32, 1024], B: [1024]}     # -> fixed:I=..,O=..,B=..
      - template: "mix:{mix},B={B},seed=1"                         # any spec with {fields} ...
        grid: {mix: [LILO+SILO, SISO+LILO], B: [16, 1024]}        # ... filled from a grid
    schedulers: [vllm, vllm-ef, "sarathi:R_max=128"]   # names with options; items may be grids too
    limits:                           # default [M=100000,C=4096]
      - M=100000,C=4096
      - grid: {M: [100, 1000], C: [4096]}
    costs: [default]                  # cost-model names or JSON paths (default [default])
    solver:                           # optional: one more cell per (workload, limits, cost) ...
      backend: cpsat                  # ... solved by infermax.solve_optimal(**this block);
      objective: latency              # a list of blocks gives one cell per block, labelled
      time_limit_s: 30                # "optimal" or "optimal:<policy>" in the scheduler column
    systems:                          # optional: one more cell per (workload, system): a cluster, a
      - {cluster: "a100:nodes=2,model=llama3-8b,tp=2", policy: loongserve, scheduler: sarathi-pc}
                                      # cluster policy and a replica scheduler (infermax.sweep.systems);
                                      # with systems, schedulers may be left out

A grid item expands to the Cartesian product of its lists, in the order written;
without ``template`` it is ``fixed:I={I},O={O},B={B}`` (workloads),
``M={M},C={C},...`` (limits; every key joined as ``key=value``) or
``{name}:R_max={R_max}`` (schedulers; every key but ``name`` as an option).
"""
from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from ..types import Limits, parse_count

DEFAULT_LIMITS = ("M=100000,C=4096",)
DEFAULT_COSTS = ("default",)
FIXED_TEMPLATE = "fixed:I={I},O={O},B={B}"


# --- configuration -------------------------------------------------------------------------------
# complexity: one branch per axis a grid item names (template, workloads, schedulers), each refused by name
def _expand_grid(axis: str, grid: Mapping[str, Any], template: str | None) -> list[str]:
    """The spec strings of one grid item (Cartesian product, in the order written)."""
    if not isinstance(grid, Mapping) or not grid:
        raise ValueError(f"sweep config: {axis} grid must be a non-empty mapping of lists, got {grid!r}")
    keys = list(grid)
    values = [v if isinstance(v, (list, tuple)) else [v] for v in grid.values()]
    out = []
    for combo in itertools.product(*values):
        point = dict(zip(keys, combo))
        if template is not None:
            try:
                out.append(template.format(**point))
            except KeyError as exc:
                raise ValueError(f"sweep config: {axis} template {template!r} names {exc} missing from its "
                                 f"grid") from None
        elif axis == "workloads":
            extra = {k: v for k, v in point.items() if k not in ("I", "O", "B")}
            missing = {"I", "O", "B"} - set(point)
            if missing:
                raise ValueError(f"sweep config: a workloads grid without a template needs I, O and B; "
                                 f"missing {sorted(missing)}")
            out.append(FIXED_TEMPLATE.format(**point) + "".join(f",{k}={v}" for k, v in extra.items()))
        elif axis == "schedulers":
            if "name" not in point:
                raise ValueError("sweep config: a schedulers grid needs a 'name' list (or a template)")
            opts = ",".join(f"{k}={_none(v)}" for k, v in point.items() if k != "name")
            out.append(f"{point['name']}:{opts}" if opts else str(point["name"]))
        else:
            out.append(",".join(f"{k}={_none(v)}" for k, v in point.items()))
    return out


def _none(value: Any) -> str:
    return "none" if value is None else str(value)


def _axis(raw: Any, axis: str, default: Sequence[str] | None = None) -> tuple[str, ...]:
    """One config axis (a spec, a grid item or a list of them) as a tuple of spec strings."""
    if raw is None:
        if default is None:
            raise ValueError(f"sweep config: '{axis}' is required")
        return tuple(default)
    items = raw if isinstance(raw, (list, tuple)) else [raw]
    out: list[str] = []
    for item in items:
        if isinstance(item, str):
            out.append(item.strip())
        elif isinstance(item, Mapping) and "grid" in item:
            unknown = set(item) - {"grid", "template"}
            if unknown:
                raise ValueError(f"sweep config: {axis} grid item has unknown key(s) {sorted(unknown)}")
            out.extend(_expand_grid(axis, item["grid"], item.get("template")))
        else:
            raise ValueError(f"sweep config: each {axis} item must be a spec string or "
                             f"{{grid: ..., template: ...}}, got {item!r}")
    if not out:
        raise ValueError(f"sweep config: '{axis}' must not be empty")
    return tuple(dict.fromkeys(out))  # drop duplicates, keep order


@dataclass(frozen=True, kw_only=True, slots=True)
class SweepConfig:
    """The four axes of a sweep (spec strings) and optional solver options."""

    workloads: tuple[str, ...]
    schedulers: tuple[str, ...]
    limits: tuple[str, ...] = DEFAULT_LIMITS
    costs: tuple[str, ...] = DEFAULT_COSTS
    solver: tuple[Mapping[str, Any], ...] = ()
    systems: tuple[Mapping[str, Any], ...] = ()      # cluster systems (infermax.sweep.systems)
    name: str = "sweep"
    out: str | None = None

    # complexity: one check per SweepConfig axis, each naming the field and value, read top to bottom
    def __post_init__(self) -> None:
        from ..schedulers import get_scheduler
        from .systems import canonical_system

        if not isinstance(self.systems, tuple):
            raise ValueError(f"SweepConfig.systems must be a tuple of system mappings, got {self.systems!r}")
        for block in self.systems:
            canonical_system(block)
        for axis in ("workloads", "schedulers", "limits", "costs"):
            value = getattr(self, axis)
            if axis == "schedulers" and value == () and self.systems:
                continue
            if isinstance(value, str) or not value or not all(isinstance(v, str) and v for v in value):
                raise ValueError(f"SweepConfig.{axis} must be a non-empty list of spec strings, got {value!r}")
        for spec in self.schedulers:
            get_scheduler(spec)      # unknown names and bad options fail before any work
        for spec in self.limits:
            Limits.from_spec(spec)
        if not isinstance(self.solver, tuple) or not all(isinstance(b, Mapping) for b in self.solver):
            raise ValueError(f"SweepConfig.solver must be a tuple of solve_optimal option mappings, "
                             f"got {self.solver!r}")
        self._check_whole()

    def _check_whole(self) -> None:
        """The solver blocks and the cost models, checked before any cell runs (a bad value would otherwise
        fail every cell it is in, one error row each): ValueError naming the key and the value."""
        from ..costmodel import get_cost_model
        from ..optimal import check_solve_options

        for i, block in enumerate(self.solver):
            check_solve_options(block, where="sweep config: solver" + (f"[{i}]" if len(self.solver) > 1 else ""))
        for spec in self.costs:
            try:
                get_cost_model(None if spec == "default" else spec)
            except (ValueError, OSError) as exc:
                raise ValueError(f"sweep config: costs: {spec!r}: {exc}") from None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], base_dir: Path | None = None) -> "SweepConfig":
        unknown = set(data) - {"name", "out", "workloads", "schedulers", "limits", "costs", "solver", "systems"}
        if unknown:
            raise ValueError(f"sweep config has unknown key(s) {sorted(unknown)}; "
                             "use workloads, schedulers, limits, costs, solver, systems, name, out")
        raw_systems = data.get("systems")
        systems = () if raw_systems is None else tuple(raw_systems) if isinstance(raw_systems, (list, tuple)) \
            else (raw_systems,)
        out = data.get("out")
        if out is not None and base_dir is not None:
            out = str(base_dir / out)
        return cls(workloads=_axis(data.get("workloads"), "workloads"),
                   schedulers=(() if systems and data.get("schedulers") is None
                               else _axis(data.get("schedulers"), "schedulers")),
                   limits=_axis(data.get("limits"), "limits", DEFAULT_LIMITS),
                   costs=_axis(data.get("costs"), "costs", DEFAULT_COSTS),
                   solver=_solver_blocks(data.get("solver")), systems=systems, name=str(data.get("name", "sweep")),
                   out=out)

    @classmethod
    def load(cls, source: "str | Path | Mapping[str, Any] | SweepConfig") -> "SweepConfig":
        """From a SweepConfig, a dict or a YAML file path."""
        if isinstance(source, SweepConfig):
            return source
        if isinstance(source, Mapping):
            return cls.from_dict(source)
        path = Path(source)
        if not path.exists():
            raise ValueError(f"sweep config file {str(path)!r} does not exist")
        if path.is_dir():
            raise ValueError(f"sweep config {str(path)!r} is a directory, not a YAML file")
        import yaml

        try:
            data = yaml.safe_load(path.read_text())
        except UnicodeDecodeError:
            raise ValueError(f"sweep config {str(path)!r} is not a text file") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" line {mark.line + 1} column {mark.column + 1}" if mark is not None else ""
            raise ValueError(f"sweep config {str(path)!r} is not valid YAML:{where} "
                             f"{getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(data, Mapping):
            raise ValueError(f"sweep config {str(path)!r} must be a YAML mapping, got {type(data).__name__}")
        return cls.from_dict(data, base_dir=path.parent)

    def cells(self) -> list["Cell"]:
        """Every cell, in grid order (workloads outermost)."""
        limits = [canonical_limits(s) for s in self.limits]
        solvers = [(solver_label(b), json.dumps(dict(b), sort_keys=True)) for b in self.solver]
        out = []
        for w in self.workloads:
            out += [Cell(w, s, lim, c) for s in self.schedulers for lim in limits for c in self.costs]
            out += [Cell(w, name, lim, c, opts) for name, opts in solvers for lim in limits for c in self.costs]
            out += [system_cell(w, b) for b in self.systems]
        return out


def _solver_blocks(raw: Any) -> tuple[Mapping[str, Any], ...]:
    if raw is None:
        return ()
    blocks = tuple(raw) if isinstance(raw, (list, tuple)) else (raw,)
    for b in blocks:
        if not isinstance(b, Mapping):
            raise ValueError(f"sweep config: solver must be a mapping of solve_optimal options (or a list), got {b!r}")
    return blocks


def solver_label(options: Mapping[str, Any]) -> str:
    """The scheduler-column label of a solver cell: ``optimal`` or ``optimal:<policy>``."""
    return f"optimal:{options['policy']}" if options.get("policy") else "optimal"


def canonical_limits(spec: str) -> str:
    """One spelling per Limits (``M=100K`` and ``M=100000`` name the same cell)."""
    return ",".join(f"{k}={_none(v)}" for k, v in Limits.from_spec(spec).to_dict().items())


def system_cell(workload: str, block: Mapping[str, Any]) -> "Cell":
    """The cell running ``workload`` on a cluster system (:mod:`infermax.sweep.systems`)."""
    from .systems import canonical_system

    s = canonical_system(block)
    return Cell(workload, s["scheduler"], s["limits"] or "", s["cost"] or "default",
                system=json.dumps(s, sort_keys=True))


@dataclass(frozen=True, slots=True)
class Cell:
    """One run: a scheduler on a workload under limits and a cost — or, when ``solver`` holds
    solve_optimal options, the solver (``scheduler`` is then only a label, e.g. ``"optimal"``)."""

    workload: str
    scheduler: str
    limits: str
    cost: str = "default"
    solver: str | None = None    # canonical JSON of the solve_optimal options (solver cells)
    system: str | None = None    # canonical JSON of a cluster system (system cells; infermax.sweep.systems)

    @property
    def cell_id(self) -> str:
        key = json.dumps([self.workload, self.scheduler, self.limits, self.cost, self.solver]
                         + ([self.system] if self.system is not None else []))
        return hashlib.sha256(key.encode()).hexdigest()[:16]


# --- one cell --------------------------------------------------------------------------------------
def _spec_columns(workload: str) -> dict[str, Any]:
    """Config columns parsed from a workload spec: kind, source/groups, and numeric options."""
    kind, _, rest = workload.partition(":")
    out: dict[str, Any] = {"kind": kind.strip().lower() if rest else "file"}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        if "=" not in part:
            out["source"] = part
            continue
        k, v = (s.strip() for s in part.split("=", 1))
        try:
            out[k] = parse_count(v, k)
        except ValueError:
            try:
                out[k] = float(v)
            except ValueError:
                out[k] = v
    return out


def config_columns(cell: Cell) -> dict[str, Any]:
    """The config part of a cell's row."""
    if cell.system is not None:
        from .systems import system_columns

        sys_cols = system_columns(cell.system)
        lim = Limits.from_spec(cell.limits).to_dict() if cell.limits else {}
        nan = float("nan")
        return {"cell_id": cell.cell_id, "workload": cell.workload, "scheduler": cell.scheduler,
                "limits": cell.limits, "cost": cell.cost, "solver": None, **_spec_columns(cell.workload),
                "policy": sys_cols["system"], **sys_cols, "M": nan, "C": lim.get("C", nan), "P": lim.get("P", nan),
                "R_max": nan if lim.get("R_max") is None else lim["R_max"],
                "system_json": cell.system}
    limits = Limits.from_spec(cell.limits).to_dict()
    return {"cell_id": cell.cell_id, "workload": cell.workload, "scheduler": cell.scheduler,
            "limits": cell.limits, "cost": cell.cost, "solver": cell.solver,
            **_spec_columns(cell.workload), "policy": cell.scheduler.partition(":")[0],
            "M": limits["M"], "C": limits["C"], "P": limits["P"],
            "R_max": float("nan") if limits["R_max"] is None else limits["R_max"]}
