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
"""
from __future__ import annotations

import ast
import configparser
from pathlib import Path
from typing import Iterator

import networkx as nx

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
