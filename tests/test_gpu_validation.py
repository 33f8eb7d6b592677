"""benchmarks/gpu_validation.py: the CPU dry run of every step, in the GPU machine's package set.

The GPU machine has only Python, PyTorch, Triton, transformers, NumPy, pandas, pyarrow, SciPy,
matplotlib, networkx, PyYAML and tqdm (and what they depend on). The script runs here in a child
interpreter whose import system refuses every other installed distribution (the MILP solvers,
pytest, hypothesis, ray, ...), so that an import the GPU machine cannot satisfy fails here first.
"""
from __future__ import annotations

import functools
import importlib.metadata as md
import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "gpu_validation.py"
GPU_MACHINE = ("torch", "triton", "transformers", "numpy", "pandas", "pyarrow", "scipy", "matplotlib", "networkx",
               "pyyaml", "tqdm", "pip", "setuptools", "wheel", "infermax",
               # transformers' own requirements (it is not installed here, so its closure cannot be read)
               "huggingface-hub", "tokenizers", "safetensors", "regex", "requests", "packaging", "filelock",
               "certifi", "charset-normalizer", "idna", "urllib3", "fsspec")
SOLVERS = ("ortools", "highspy", "pulp", "gurobipy")
RUNNER = """
import importlib.machinery, runpy, sys
HIDDEN = set(sys.argv[1].split(","))
path_find_spec = importlib.machinery.PathFinder.find_spec


def find_spec(name, path=None, target=None):      # a hidden package is absent: no spec, as if not installed
    return None if name.split(".")[0] in HIDDEN else path_find_spec(name, path, target)


importlib.machinery.PathFinder.find_spec = staticmethod(find_spec)
script, sys.argv = sys.argv[2], sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(roots) -> set[str]:
    """Installed distributions reachable from ``roots`` by their unconditional (non-extra) requirements."""
    seen, todo = set(), [_norm(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [_norm(re.split(r"[\s;<>=!~\[(]", r, maxsplit=1)[0]) for r in requires if "extra ==" not in r]
    return seen


@functools.lru_cache(maxsize=1)
def hidden_modules() -> tuple[str, ...]:
    """Top-level modules of every installed distribution the GPU machine does not have."""
    keep = _closure(GPU_MACHINE)
    return tuple(sorted(module for module, dists in md.packages_distributions().items()
                  if not any(_norm(d) in keep for d in dists) and module not in sys.stdlib_module_names
                  and not module.startswith("_")))


def _run(args: list[str], hide, timeout: float = 600,
         script: Path = SCRIPT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RUNNER, ",".join(hide), str(script), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)


def test_infermax_imports_and_simulates_without_what_the_gpu_machine_lacks(tmp_path):
    script = tmp_path / "use.py"
    script.write_text("import infermax, infermax.execute.validation, infermax.costmodel.accuracy\n"
                      "r = infermax.simulate('fixed:I=8,O=2,B=2', 'vllm')\n"
                      "print('latency', r.metrics['latency_s'])\n"
                      "import ortools\n")                    # must be absent in this interpreter
    proc = _run([], hide=hidden_modules(), timeout=120, script=script)
    assert "latency" in proc.stdout, proc.stderr
    assert proc.returncode != 0 and "No module named 'ortools'" in proc.stderr


def test_the_hidden_set_holds_the_solvers_and_not_what_the_gpu_machine_has():
    hidden = hidden_modules()
    installed_solvers = [s for s in SOLVERS if s in md.packages_distributions()]
    assert set(installed_solvers) <= set(hidden)
    assert not {"torch", "triton", "numpy", "pandas", "scipy", "matplotlib", "yaml", "infermax"} & set(hidden)


def test_refuses_to_start_when_a_needed_package_is_missing(tmp_path):
    proc = _run(["--device", "cpu", "--tiny", "--out", str(tmp_path / "out")], hide=["triton", "scipy"], timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "cannot start, missing package(s)" in proc.stderr
    assert "triton (needed for the kernels" in proc.stderr and "scipy (needed for" in proc.stderr
    assert not (tmp_path / "out").exists()                  # refused before anything was written


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The whole script on the CPU with tiny shapes, every package the GPU machine lacks hidden."""
    for name in ("torch", "triton"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} is not installed")
    out = tmp_path_factory.mktemp("gpu_validation")
    start = time.monotonic()
    proc = _run(["--device", "cpu", "--tiny", "--out", str(out)], hide=hidden_modules())
    return proc, out, time.monotonic() - start


def test_dry_run_runs_every_step(dry_run):
    proc, out, _ = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "gpu_validation.json").read_text())
    steps = report["steps"]
    assert list(steps) == ["kernels_correct", "kernels_fast", "profile_fit", "execute"]
    assert {name: s["status"] for name, s in steps.items()} == dict.fromkeys(steps, "ok")
    for i, name in enumerate(steps, 1):
        assert f"[{i}] {name}: ok" in proc.stdout
    assert report["meta"]["device_info"]["name"] == "cpu" and report["meta"]["dtype"] == "bfloat16"


def test_dry_run_checks_every_kernel_within_tolerance(dry_run):
    _, out, _ = dry_run
    steps = json.loads((out / "gpu_validation.json").read_text())["steps"]
    cases = [r for r in steps["kernels_correct"]["records"] if r["kind"] == "case"]
    assert {c["case"].split("(")[0] for c in cases} == {"prefill", "decode", "merge", "merge2", "csa"}
    assert all(c["passed"] and c["max_abs"] <= c["tol_abs"] for c in cases)
    timed = [r for r in steps["kernels_fast"]["records"] if r["kind"] == "case"]
    assert len(timed) == len(cases) and all(r["kernel_ms"] > 0 and r["kernel_over_limit"] > 0 for r in timed)


def test_dry_run_fits_a_profile_and_executes_three_schedules(dry_run):
    _, out, _ = dry_run
    steps = json.loads((out / "gpu_validation.json").read_text())["steps"]
    kinds = {r["kind"] for r in steps["profile_fit"]["records"]}
    assert {"vidur", "profiled", "fit", "batches", "summary"} <= kinds
    runs = [r for r in steps["execute"]["records"] if r["kind"] == "schedule"]
    assert [(r["scheduler"], r["backend"]) for r in runs] == [("vllm", "sdpa"), ("sarathi", "sdpa"),
                                                              ("optimal", "sdpa"), ("sarathi", "triton")]
    assert all(r["tokens_consistent"] and r["blocks_in_use"] == 0 for r in runs)
    assert all(r["predicted_latency_s"] > 0 and r["measured_latency_s"] > 0 for r in runs)
    files = sorted(p.name for p in out.iterdir())
    assert files == ["execute.png", "gpu_validation.json", "kernels.png", "profile_cpu_llama-micro.tar.gz",
                     "profile_fit.png", "summary.txt"]          # the GPU machine returns at most 8 files


def test_shipped_optimal_schedules_replay_to_their_objective():
    """The schedules the GPU machine runs were proven optimal here; they replay valid, to the solver's value."""
    import infermax
    from infermax.types import Limits, Schedule, Workload

    data = json.loads((ROOT / "benchmarks" / "data" / "gpu_validation_schedule.json").read_text())
    assert set(data["instances"]) == {"full", "tiny"}
    for entry in data["instances"].values():
        workload, limits = Workload.from_dict(entry["workload"]), Limits.from_spec(entry["limits"])
        trace = infermax.replay(Schedule.from_dict(entry["schedule"]), workload, limits, entry["cost_model"])
        latency = infermax.metrics(trace)["latency_s"]
        assert entry["solver"]["status"] == "optimal"
        assert latency == pytest.approx(entry["solver"]["objective"], rel=1e-12)
        assert latency >= entry["solver"]["bound"] * (1 - 1e-9)
        for name in ("vllm", "sarathi"):
            assert latency <= infermax.simulate(workload, name, limits, entry["cost_model"]).metrics["latency_s"]


def test_a_step_past_its_budget_is_killed_and_keeps_what_it_recorded(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_validation

    def slow_step(ctx):
        ctx.record("case", case="first")
        time.sleep(60)
        return {}

    result = gpu_validation.run_step("slow", slow_step, 5.0, {"device": "cpu", "tiny": True, "dtype": "float32",
                                                             "out": tmp_path, "work": tmp_path, "repo": ROOT})
    assert result["status"] == "timeout"
    assert [r["case"] for r in result["records"] if r["kind"] == "case"] == ["first"]


def test_a_bad_dtype_is_refused_by_name(tmp_path):
    pytest.importorskip("torch")
    from infermax.costmodel.profiler import profile_model
    from infermax.execute import build_model

    with pytest.raises(ValueError, match="dtype must be one of float32, float16, bfloat16, got 'int8'"):
        profile_model("llama-tiny", out_dir=tmp_path, dtype="int8")
    with pytest.raises(ValueError, match="dtype must be float32, float16 or bfloat16, got 'int8'"):
        build_model("llama-tiny", dtype="int8")
    assert not any(tmp_path.iterdir())


@pytest.mark.gpu
def test_kernels_within_tolerance_on_the_gpu(tmp_path):
    """On a CUDA machine: step 1 of the real run (full shapes)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--steps", "kernels_correct", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    steps = json.loads((tmp_path / "gpu_validation.json").read_text())["steps"]
    assert proc.returncode == 0 and steps["kernels_correct"]["summary"]["passed"], proc.stdout[-3000:]
