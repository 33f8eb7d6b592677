"""Frozen dataclasses keep the values they were built with (DESIGN "Named data"; issue 22 §5).

No ``__post_init__`` of a dataclass anywhere in the package rewrites one of its own fields
(``object.__setattr__(self, "<field>", ...)``): a default that depends on another field (Limits.P
= C), a name resolved to a spec (Cluster.gpu), an alias (ParallelConfig.sp_kind) or a coercion
(Workload.requests to a tuple) is resolved in ``__init__`` before the field is first set, so a
field never holds a value it did not end with. Caches that are not fields may still be set.
"""
from __future__ import annotations

import ast
import dataclasses

import pytest
from test_walls import ROOT, package_dirs

from infermax import Limits, Workload
from infermax.cluster.spec import Cluster
from infermax.costmodel.linear import LinearCoefficients
from infermax.costmodel.parallel import ParallelConfig


def _field_names(cls: ast.ClassDef) -> set[str]:
    return {node.target.id for node in cls.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def _rewrites(method: ast.FunctionDef, names: set[str]) -> list[tuple[str, int]]:
    """(field, line) of every ``object.__setattr__(self, "<field>", ...)`` in ``method``."""
    out = []
    for node in ast.walk(method):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "__setattr__"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "object" and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name) and node.args[0].id == "self"
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            out.append((node.args[1].value, node.lineno))
    return out


def test_no_post_init_rewrites_a_field():
    bad = []
    for folder in package_dirs(ROOT):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
                names = _field_names(cls)
                for method in cls.body:
                    if isinstance(method, ast.FunctionDef) and method.name == "__post_init__":
                        bad += [f"{path.relative_to(ROOT)}:{line} {cls.name}.__post_init__ rewrites field {name!r}"
                                for name, line in _rewrites(method, names)]
    assert not bad, "\n".join(bad)


def test_the_checker_catches_a_rewrite():
    source = ("@dataclass(frozen=True)\nclass X:\n    a: int\n    b: int = 0\n"
              "    def __post_init__(self):\n        object.__setattr__(self, 'b', self.a)\n"
              "        object.__setattr__(self, '_cache', 1)\n")
    cls = ast.parse(source).body[0]
    assert _rewrites(cls.body[2], _field_names(cls)) == [("b", 6)]


def test_resolved_at_construction():
    assert Limits(C=512).P == 512 and Limits(C=512, P=128).P == 128
    assert dataclasses.replace(Limits(C=512), M=1000) == Limits(M=1000, C=512)
    assert ParallelConfig(sp_kind="ntp").sp_kind == "ulysses" and ParallelConfig(sp_kind="tp").sp_kind == "megatron"
    c = Cluster("a100", "llama3-8b")
    assert c.gpu.name.lower().startswith("a100") and c.gpus_per_node == c.gpu.gpus_per_node
    assert dataclasses.replace(c, nodes=2).nodes == 2
    k = LinearCoefficients(nonattn_lines=[[1, 2e-5]])
    assert k.nonattn_lines == ((1.0, 2e-5),) and type(k.nonattn_lines[0][0]) is float
    w = Workload.from_spec("fixed:I=4,O=2,B=3")
    assert dataclasses.replace(w, name="y").input_lens.tolist() == [4, 4, 4]


@pytest.mark.parametrize("build, message", [
    (lambda: Limits(C=8, P=9), "Limits.P must be <= C = 8, got 9"),
    (lambda: ParallelConfig(sp_kind="fsdp"), "ParallelConfig.sp_kind must be"),
    (lambda: Cluster("a100", "llama3-8b", spp=0), "Cluster.spp must be an integer >= 1, got 0"),
    (lambda: LinearCoefficients(nonattn_lines=[(1.0, -1.0)]), "LinearCoefficients.nonattn_lines must be a finite"),
])
def test_bad_values_are_named(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()
