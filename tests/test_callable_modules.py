"""``infermax.replay``, ``metrics``, ``starvation``, ``sweep`` and ``execute`` are modules that call their
function of the same name (infermax/_callable.py): no function shadows its module, whatever was imported first."""
import importlib
import inspect
import pydoc
import subprocess
import sys
import types
from pathlib import Path

import pytest

import infermax
from infermax._callable import CallableModule

ROOT = Path(__file__).resolve().parents[1]
CALLABLE = ("replay", "metrics", "starvation", "sweep", "execute")


@pytest.mark.parametrize("name", CALLABLE)
def test_each_is_its_module_callable_with_its_functions_signature(name):
    module = importlib.import_module(f"infermax.{name}")
    assert getattr(infermax, name) is module and inspect.ismodule(module) and callable(module)
    function = getattr(module, name)
    assert inspect.isfunction(function) and function.__name__ == name
    assert inspect.signature(module) == inspect.signature(function)
    summary = module.__doc__.strip().splitlines()[0]                        # help() is the module's
    assert summary in pydoc.render_doc(module, renderer=pydoc.plaintext)
    exec(f"from infermax import {name} as imported", scope := {})          # the package's name is the module too
    assert scope["imported"] is module


def test_calling_the_module_is_calling_the_function():
    from infermax.replay import replay

    spec, limits = "fixed:I=16,O=4,B=6", "M=200,C=64"
    run = infermax.simulate(spec, "vllm", limits)
    trace, again = infermax.replay(run.schedule, spec, limits), replay(run.schedule, spec, limits)
    assert infermax.metrics(trace) == infermax.metrics.metrics(again) == run.metrics
    assert infermax.metrics.metrics_by_tag(trace) == infermax.metrics_by_tag(again)
    with pytest.raises(TypeError, match="workload"):
        infermax.replay(run.schedule)                                     # the function's own error, unchanged


def test_submodule_names_are_attributes_whatever_was_imported_first():
    """The old shadowing: ``import infermax.replay`` bound the function, so ``infermax.replay.<name>`` failed."""
    code = ("import infermax.replay, infermax.sweep.systems, infermax.execute.validation\n"
            "import infermax\n"
            "assert infermax.replay.ServingState.__name__ == 'ServingState'\n"
            "assert infermax.sweep.systems.run_system.__module__ == 'infermax.sweep.systems'\n"
            "assert infermax.sweep.config.SweepConfig is infermax.sweep.SweepConfig\n"
            "assert infermax.execute.validation.validate is infermax.execute.validate\n"
            "assert infermax.workloads.spec.parse_types is infermax.workloads.typed.parse_types\n"
            "from infermax.replay import replay\n"
            "from infermax import replay as module\n"
            "assert module.replay is replay and module is infermax.replay\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_a_callable_module_without_its_function_says_which_it_lacks():
    module = types.ModuleType("pkg.thing")
    module.__class__ = CallableModule
    with pytest.raises(AttributeError, match="thing"):
        module()
    module.thing = lambda x, y=2: x + y
    assert module(1) == 3 and str(inspect.signature(module)) == "(x, y=2)"
