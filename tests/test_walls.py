"""The walls of docs/design.md ("Boundaries"), read from the import graph of every file of the package.

Every import counts, at module level or inside a function (a lazy import is still a dependency):

- ``csp`` never imports ``infermax.schedulers`` (a warm start arrives as a Schedule);
- solver packages are imported only in ``csp/backends/``;
- ``costmodel`` imports nothing of the core (only ``infermax.costmodel``);
- ``schedulers`` never imports ``csp`` or ``kernels``;
- torch and triton stay in ``kernels``, ``infermax/execute`` and ``costmodel`` (the core never imports them);
- vllm is imported only in ``infermax/engines/`` (an engine is an optional extra);
- no import cycles between files (a package ``__init__`` importing its own children — re-exporting
  them — is not one; a cycle between two children through the package still is).

The folders and the packages they install as come from setup.cfg's ``package_dir``. The rules are
those of ``../shared/tools/walls.py`` (the before-stop hook), one a little stricter: the hook drops
every cycle that passes through a package ``__init__`` together with its children, which hid
trajectorylp <-> configlp (``from . import configlp`` also names the package); here only the
package's own edges into its children are dropped.

Then the same walls transitively (``TRANSITIVE_WALLS``, docs/design.md's layer table): on the closure of
the graph of what importing each module runs — every import, function-level and relative ones included,
the ``__init__`` of each package above it, and the module behind a name a package exports lazily
(``_LAZY``) or re-exports — so that "csp reaches the schedulers" fails though no csp file names them;
and, in a fresh interpreter, which modules ``import infermax``, ``import infermax.costmodel`` and
``import infermax.csp`` really load.
"""
from __future__ import annotations

import ast
import configparser
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[1]
SOLVERS = ("ortools", "highspy", "pulp", "gurobipy", "pyscipopt")


def package_dirs(root: Path) -> dict[str, str]:
    """Folder -> the package it installs as (``csp`` -> ``infermax.csp``), from setup.cfg."""
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(root / "setup.cfg")
    lines = [line.split("=") for line in cfg["options"]["package_dir"].strip().splitlines()]
    return {folder.strip(): package.strip() for package, folder in lines}


def module_name(rel: Path, dirs: dict[str, str]) -> str:
    """``csp/backends/lp.py`` -> ``infermax.csp.backends.lp``; a package's ``__init__`` is the package."""
    parts = [dirs[rel.parts[0]], *rel.with_suffix("").parts[1:]]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def statements(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    """Every statement, nested ones (in functions, classes, if/try/with/match blocks) included: an import is
    a statement, so the expressions need no visit (a tenth of the nodes)."""
    for node in body:
        yield node
        for block in ("body", "orelse", "finalbody", "handlers", "cases"):
            yield from statements(getattr(node, block, ()))


def imported_names(tree: ast.Module, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """(absolute name, line) of every import: ``from a import b`` gives ``a`` and ``a.b``."""
    here = module if is_package else module.rpartition(".")[0]
    for node in statements(tree.body):
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            yield name, node.lineno
            yield from ((f"{name}.{alias.name}", node.lineno) for alias in node.names)


def rule_broken(top: str, rel: str, name: str) -> tuple[str, str] | None:
    """(the wall, what breaks it) if file ``rel`` (in top folder ``top``) importing ``name`` breaks one."""
    first = name.split(".")[0]
    if top == "csp" and name.startswith("infermax.schedulers"):
        return "csp-schedulers", f"csp imports {name} (a warm start arrives as a Schedule)"
    if top == "schedulers" and name.startswith(("infermax.csp", "infermax.kernels")):
        return "schedulers-csp-kernels", f"schedulers imports {name}"
    if top == "costmodel" and name.startswith("infermax.") and not name.startswith("infermax.costmodel"):
        return "costmodel-core", f"costmodel imports {name} (it imports nothing of the core)"
    if first in SOLVERS and not rel.startswith("csp/backends/"):
        return "solvers", f"solver {first} imported outside csp/backends"
    if first in ("torch", "triton") and (top in ("csp", "schedulers")
                                         or (top == "infermax" and not rel.startswith("infermax/execute/"))):
        return "torch", f"{first} imported in {top}"
    if first == "vllm" and not rel.startswith("infermax/engines/"):
        return "vllm", "vllm imported outside infermax/engines (an engine is an optional extra)"
    return None


def broken_walls(root: Path, dirs: dict[str, str] | None = None) -> list[str]:
    """Every broken wall under ``root``, as ``file:line: what`` (cycles as ``import cycle: a -> b``)."""
    dirs = dirs if dirs is not None else package_dirs(root)
    files = {module_name(f.relative_to(root), dirs): f for d in dirs for f in sorted((root / d).rglob("*.py"))}
    broken, graph = [], nx.DiGraph()
    graph.add_nodes_from(files)
    for module, path in files.items():
        rel = path.relative_to(root).as_posix()
        walls_at: set[tuple[int, str]] = set()          # one report per import statement and wall
        for name, line in imported_names(ast.parse(path.read_text()), module, path.name == "__init__.py"):
            found = rule_broken(rel.split("/")[0], rel, name)
            if found is not None and (line, found[0]) not in walls_at:
                walls_at.add((line, found[0]))
                broken.append(f"{rel}:{line}: {found[1]}")
            target = name
            while target and target not in files:      # the longest prefix that is a file of the package
                target = target.rpartition(".")[0]
            if target and target != module and not target.startswith(module + "."):   # not a re-export
                graph.add_edge(module, target)
    for cycle in nx.strongly_connected_components(graph):
        if len(cycle) > 1:
            broken.append("import cycle: " + " -> ".join(sorted(cycle)))
    return broken


def test_the_package_keeps_its_walls():
    broken = broken_walls(ROOT)
    assert not broken, "broken walls (docs/design.md, Boundaries):\n" + "\n".join(broken)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)


DIRS = {"infermax": "infermax", "csp": "infermax.csp", "costmodel": "infermax.costmodel",
        "kernels": "infermax.kernels", "schedulers": "infermax.schedulers"}


def test_every_kind_of_broken_wall_is_named_with_its_file_and_line(tmp_path):
    _write(tmp_path, {
        "infermax/__init__.py": "from .a import x\n",
        "infermax/a.py": "from .b import y\n",
        "infermax/b.py": "def f():\n    from . import a   # lazy, still a cycle\n",
        "infermax/core.py": "import torch\n",
        "infermax/serve.py": "from vllm import LLM\n",
        "csp/__init__.py": "",
        "csp/warm.py": "import math\n\n\ndef f():\n    from infermax.schedulers import available\n",
        "csp/lp.py": "class LP:\n    def solve(self):\n        try:\n            import highspy\n"
                     "        except ImportError:\n"
                     "            from ortools.linear_solver import pywraplp\n",
        "costmodel/__init__.py": "",
        "costmodel/prof.py": "from infermax.execute.forward import Packed\n",
        "schedulers/__init__.py": "",
        "schedulers/x.py": "from infermax.csp import Policy\nfrom infermax import kernels\n",
    })
    broken = broken_walls(tmp_path, DIRS)
    assert sorted(broken) == sorted([
        "csp/warm.py:5: csp imports infermax.schedulers (a warm start arrives as a Schedule)",
        "csp/lp.py:4: solver highspy imported outside csp/backends",
        "csp/lp.py:6: solver ortools imported outside csp/backends",
        "costmodel/prof.py:1: costmodel imports infermax.execute.forward (it imports nothing of the core)",
        "schedulers/x.py:1: schedulers imports infermax.csp",
        "schedulers/x.py:2: schedulers imports infermax.kernels",
        "infermax/core.py:1: torch imported in infermax",
        "infermax/serve.py:1: vllm imported outside infermax/engines (an engine is an optional extra)",
        "import cycle: infermax.a -> infermax.b",
    ]), "\n".join(broken)


def test_what_the_walls_allow_is_not_reported(tmp_path):
    """Solvers in csp/backends, torch in execute and kernels, a package re-exporting its children, the core
    using costmodel and csp using the core."""
    _write(tmp_path, {
        "infermax/__init__.py": "from . import schedulers\nfrom .engine import simulate\n",
        "infermax/engine.py": "from infermax.costmodel import CostModel\nfrom .schedulers import get\n",
        "infermax/execute/__init__.py": "from .forward import run\n",
        "infermax/execute/forward.py": "import torch\nfrom infermax.costmodel.packed import Packed\n",
        "infermax/engines/vllm_engine.py": "import vllm\nfrom infermax.engine import simulate\n",
        "kernels/__init__.py": "import triton\n",
        "csp/__init__.py": "from .api import solve\n",
        "csp/api.py": "from infermax.engine import simulate\nfrom . import backends\n",
        "csp/backends/__init__.py": "def solve():\n    import highspy\n",
        "costmodel/__init__.py": "from .packed import Packed\n",
        "costmodel/packed.py": "import torch\n",
        "schedulers/__init__.py": "from .registry import get\n",
        "schedulers/registry.py": "from infermax.costmodel import CostModel\n",
    })
    assert broken_walls(tmp_path, DIRS) == []


# --- the walls, transitively -----------------------------------------------------------------------------------------
# Importing a module runs every import its file holds when its code runs — module level or inside a function (a
# lazy import is still a dependency: the function runs sooner or later) — and, first, the ``__init__`` of each
# package above it. So the walls are checked on what each module *reaches*: the closure of that graph.


def _under_type_checking(node: ast.stmt) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and isinstance(test, (ast.Name, ast.Attribute)) and \
        (getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == "TYPE_CHECKING")


def _import_nodes(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run: nested ones included, ``if TYPE_CHECKING:`` blocks left out."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not _under_type_checking(node):
            for block in ("body", "orelse", "finalbody", "handlers", "cases"):
                yield from _import_nodes(getattr(node, block, ()))


def lazy_table(tree: ast.Module) -> dict[str, str]:
    """A package's ``_LAZY = {"name": "module", ...}``: the names its PEP 562 ``__getattr__`` loads on first use
    (the module absolute, or relative to the package)."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "_LAZY" for t in node.targets) \
                and isinstance(node.value, ast.Dict):
            return {k.value: v.value for k, v in zip(node.value.keys, node.value.values)
                    if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)}
    return {}


def import_graph(root: Path, dirs: dict[str, str] | None = None) -> nx.DiGraph:
    """Module -> each module of the package that importing it runs: every import (function-level, relative),
    each prefix package of an imported name, a lazily exported name's module (``from infermax import
    simulate`` loads ``infermax.engine``, as ``from infermax.csp import solve_optimal`` loads
    ``infermax.csp.api``), and the package just above the module (its ``__init__`` runs first).
    An edge carries ``line`` (0 for the implicit edge to the parent package)."""
    dirs = dirs if dirs is not None else package_dirs(root)
    files = {module_name(f.relative_to(root), dirs): f for d in dirs for f in sorted((root / d).rglob("*.py"))}
    trees = {m: ast.parse(p.read_text()) for m, p in files.items()}
    lazy: dict[str, dict[str, str]] = {}     # package -> name -> the module that defines it (lazy or re-exported)
    for m, tree in trees.items():
        if files[m].name == "__init__.py":
            lazy[m] = {name: f"{m}.{target}" if f"{m}.{target}" in files else target
                       for name, target in lazy_table(tree).items()}
            for node in tree.body:            # ``from .api import solve``: the name is the child's
                if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
                    lazy[m].update((alias.asname or alias.name, f"{m}.{node.module}") for alias in node.names)
    graph = nx.DiGraph()
    graph.add_nodes_from(files)

    def loads(name: str) -> Iterator[str]:
        parts = name.split(".")
        yield from (p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1)) if p in files)

    for module, tree in trees.items():
        parent = module.rpartition(".")[0]
        if parent in files:
            graph.add_edge(module, parent, line=0)
        here = module if files[module].name == "__init__.py" else parent
        for node in _import_nodes(tree.body):
            if isinstance(node, ast.Import):
                targets = [t for alias in node.names for t in loads(alias.name)]
            else:
                base = here.split(".")[: len(here.split(".")) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else []))
                targets = list(loads(name))
                for alias in node.names:
                    if f"{name}.{alias.name}" in files:
                        targets.append(f"{name}.{alias.name}")
                    elif alias.name in lazy.get(name, {}) and lazy[name][alias.name] in files:
                        targets.extend(loads(lazy[name][alias.name]))
            for t in targets:
                if t != module and not graph.has_edge(module, t):
                    graph.add_edge(module, t, line=node.lineno)
    return graph


def _in(module: str, *packages: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


#: the modules above csp (they resolve names, run the schedulers, call csp): csp never reaches them
ABOVE_CSP = ("infermax.optimal", "infermax.heuristics", "infermax.engine", "infermax.schedulers",
             "infermax.bounds.api", "infermax.bounds.check", "infermax.bounds.cli")
#: what ``import infermax`` itself loads (the workload grammar behind ``Workload.from_spec``); all else is lazy
ROOT_LOADS = ("infermax.workloads", "infermax.types", "infermax.schedule", "infermax.costmodel")


def _front_end(module: str) -> bool:
    """A command-line module (``infermax.csp.cli``): it parses and prints, above the whole library."""
    return module.rpartition(".")[2] == "cli"


#: id -> (the wall, the modules it holds for, the modules they must not reach): docs/design.md, "Boundaries"
TRANSITIVE_WALLS = {
    "csp-schedulers": ("csp reaches the schedulers or the simulator (a warm start arrives as a Schedule)",
                       lambda m: _in(m, "infermax.csp") and not _front_end(m),
                       lambda r: _in(r, "infermax.schedulers", "infermax.heuristics", "infermax.engine")),
    "csp-above": ("csp reaches a layer above it (name resolution, the bounds' public entry, the checker)",
                  lambda m: _in(m, "infermax.csp") and not _front_end(m), lambda r: _in(r, *ABOVE_CSP)),
    "schedulers-csp": ("the schedulers reach csp or kernels",
                       lambda m: _in(m, "infermax.schedulers"), lambda r: _in(r, "infermax.csp", "infermax.kernels")),
    "costmodel-core": ("costmodel reaches the core (beyond what importing the root package loads)",
                       lambda m: _in(m, "infermax.costmodel"),
                       lambda r: r != "infermax" and not _in(r, "infermax.costmodel", *ROOT_LOADS)),
    "root-light": ("importing the root package loads more than the types and the workload grammar",
                   lambda m: m == "infermax", lambda r: not _in(r, *ROOT_LOADS)),
    "judge-simulator": ("the judge (replay) reaches the simulator or the schedulers",
                        lambda m: m == "infermax.replay",
                        lambda r: _in(r, "infermax.engine", "infermax.schedulers", "infermax.heuristics")),
}


def wall_violations(graph: nx.DiGraph, wall: str) -> list[str]:
    """Each module that breaks ``wall`` through what it reaches, with a path that shows it."""
    what, holds, banned = TRANSITIVE_WALLS[wall]
    out = []
    for module in sorted(m for m in graph if holds(m)):
        bad = sorted(r for r in nx.descendants(graph, module) if banned(r))
        if bad:
            path = nx.shortest_path(graph, module, bad[0])
            out.append(f"{what}: {module} reaches {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''} "
                       f"({' -> '.join(path)})")
    return out


def cycles(graph: nx.DiGraph) -> list[str]:
    """Every import cycle, a package's edges into its own modules left out (re-exporting them is not one)."""
    acyclic = nx.DiGraph([(a, b) for a, b in graph.edges if not b.startswith(a + ".")])
    return ["import cycle: " + " -> ".join(sorted(c)) for c in nx.strongly_connected_components(acyclic)
            if len(c) > 1]


def transitive_violations(graph: nx.DiGraph) -> list[str]:
    return [v for wall in TRANSITIVE_WALLS for v in wall_violations(graph, wall)] + cycles(graph)


@pytest.fixture(scope="module")
def graph() -> nx.DiGraph:
    return import_graph(ROOT)


@pytest.mark.parametrize("wall", list(TRANSITIVE_WALLS))
def test_the_package_keeps_its_walls_transitively(graph, wall):
    broken = wall_violations(graph, wall)
    assert not broken, f"{len(broken)} modules break the wall (docs/design.md, Boundaries):\n" + "\n".join(broken)


def test_no_import_cycles_following_every_import(graph):
    found = cycles(graph)
    assert not found, "\n".join(found)


def loaded_by(statement: str) -> list[str]:
    """The modules of the package a fresh interpreter has loaded after ``statement``."""
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(m for m in sys.modules if m.startswith('infermax'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return out.stdout.split()


@pytest.mark.parametrize("statement, banned", [
    ("import infermax.costmodel", ("infermax.schedulers", "infermax.engine", "infermax.csp", "infermax.bounds")),
    ("import infermax.csp", ("infermax.schedulers", "infermax.engine", "infermax.heuristics", "infermax.optimal")),
    ("import infermax.output", ("infermax.schedulers", "infermax.engine", "infermax.csp", "infermax.bounds",
                                "infermax.cluster", "infermax.rundir", "infermax.cli")),
    ("import infermax", ("infermax.schedulers", "infermax.engine", "infermax.csp", "infermax.bounds",
                         "infermax.cluster", "infermax.sweep", "infermax.execute", "infermax.replay",
                         "infermax.metrics", "infermax.starvation", "infermax._callable")),
])
def test_light_imports_stay_light(statement, banned):
    """What really loads (dynamic imports included: the scheduler registry, the lazy names)."""
    loaded = loaded_by(statement)
    heavy = [m for m in loaded if _in(m, *banned)]
    assert not heavy, f"{statement!r} loads {len(loaded)} modules, {len(heavy)} of them it must not: {heavy}"


def test_transitive_walls_follow_parents_lazy_names_and_function_imports(tmp_path):
    """A wall broken only through a parent package's ``__init__``, a function-level import two modules away,
    or a lazily exported name is found, with the path; a lazy ``__init__`` keeps the walls."""
    _write(tmp_path, {
        "infermax/__init__.py": "from .engine import simulate\n",          # eager: every module reaches the engine
        "infermax/types.py": "",
        "infermax/engine.py": "def simulate():\n    from infermax.schedulers import get\n",
        "infermax/replay.py": "from .types import Schedule\n",
        "csp/__init__.py": "",
        "csp/api.py": "from infermax.types import Schedule\n",
        "schedulers/__init__.py": "def get():\n    pass\n",
        "costmodel/__init__.py": "",
    })
    g = import_graph(tmp_path, DIRS)
    assert wall_violations(g, "csp-schedulers")[1] == (
        "csp reaches the schedulers or the simulator (a warm start arrives as a Schedule): infermax.csp.api "
        "reaches infermax.engine, infermax.schedulers (infermax.csp.api -> infermax -> infermax.engine)")
    assert wall_violations(g, "judge-simulator") and wall_violations(g, "costmodel-core")
    _write(tmp_path, {"infermax/__init__.py": '_LAZY = {"simulate": "infermax.engine"}\n'})
    g = import_graph(tmp_path, DIRS)
    assert transitive_violations(g) == []
    _write(tmp_path, {"csp/api.py": "def warm():\n    from infermax import simulate\n"})   # the lazy name's module
    assert wall_violations(import_graph(tmp_path, DIRS), "csp-schedulers") == [
        "csp reaches the schedulers or the simulator (a warm start arrives as a Schedule): infermax.csp.api "
        "reaches infermax.engine, infermax.schedulers (infermax.csp.api -> infermax.engine)"]


def test_a_cycle_through_a_function_level_import_and_a_lazy_name_is_found(tmp_path):
    _write(tmp_path, {
        "infermax/__init__.py": "",
        "infermax/bounds/__init__.py": '_LAZY = {"lower_bound": "combine"}\n',
        "infermax/bounds/combine.py": "def lower_bound():\n    from infermax.csp import solve\n",
        "csp/__init__.py": "from .api import solve\n",
        "csp/api.py": "from infermax.bounds import lower_bound\n",
    })
    assert cycles(import_graph(tmp_path, DIRS)) == [
        "import cycle: infermax.bounds.combine -> infermax.csp.api"]
