"""Does the cost model predict the machine? profile -> fit -> simulate -> execute -> compare.

:func:`validate` measures (or reuses) an operator profile of the executor's model
on the executing device with :func:`infermax.costmodel.profiler.profile_model`,
fits a :class:`~infermax.costmodel.linear.LinearCostModel` to it with
:func:`infermax.costmodel.fitting.fit_operators`, simulates each scheduler under
that cost model, runs the resulting Schedule with :func:`.executor.execute`, and
compares predicted with measured batch times and end-to-end latency. It also
checks what no cost model can fake: every request's generated tokens equal a
single-request greedy decode of its prompt, and every KV block is free at the end.

Both sides use the same summary of repeated runs (``stat``): ``min`` on CPU,
where other processes' bursts only ever add time, ``median`` on CUDA. Both
spread their repeats over their whole measurement: the profiler goes round its
grid ``repeats`` times, and the schedulers' runs alternate (one run of each,
then again).

The errors are against wall time. On a shared CPU a batch longer than a
scheduler time slice is rarely run without the core being taken away, which
``min`` cannot undo; each scheduler's comparison therefore also gives the
errors against the batches' CPU time (``cpu_time_*``, the thread's own time)
and ``measured_wall_over_cpu``, so that what the other processes took is seen
apart from what the cost model missed.
"""
from __future__ import annotations

import dataclasses
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from infermax.inputs import resolve_inputs
from infermax.types import Limits, Workload

from .model import DEFAULT_MODEL

DEFAULT_WORKLOAD = "fixed:I=64,O=16,B=16"
DEFAULT_LIMITS = "M=1024,C=256"


@dataclass(frozen=True, kw_only=True, eq=False)
class SchedulerValidation:
    """One scheduler: its comparison dict (``ExecutionResult.compare``) and per-batch times (s)."""

    scheduler: str
    tokens_identical: bool
    blocks_in_use: int
    num_evictions: int
    comparison: dict[str, Any]
    predicted_s: np.ndarray
    measured_s: np.ndarray
    predicted_start_s: np.ndarray
    measured_start_s: np.ndarray
    cpu_s: np.ndarray
    batches: dict[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True, eq=False)
class ValidationReport:
    """Every scheduler's validation plus the fitted cost model and where its profile lives."""

    workload: str
    limits: dict[str, Any]
    device: str
    model: str
    profile: str
    stat: str
    repeats: int
    cost: dict[str, Any]
    results: tuple[SchedulerValidation, ...]

    def summary(self) -> dict[str, Any]:
        """The JSON answer: all schedulers pooled, then each one.

        ``tokens_identical``: every scheduler's tokens equal the reference (and all
        blocks were freed); ``batch_time_median_ape``/``p90``: over the batches of
        all schedulers; ``e2e_latency_error``: the worst scheduler's |pred - meas| /
        meas of the makespan (``cpu_time_e2e_latency_error``: the same against the
        batches' CPU time). Errors are fractions.
        """
        from infermax.costmodel.accuracy import error_stats

        pooled = error_stats(np.concatenate([r.predicted_s for r in self.results]),
                             np.concatenate([r.measured_s for r in self.results]))
        return {"tokens_identical": all(r.tokens_identical and r.blocks_in_use == 0 for r in self.results),
                "batch_time_median_ape": pooled["median_ape"], "batch_time_p90_ape": pooled["p90_ape"],
                "e2e_latency_error": max(r.comparison["e2e_latency_error"] for r in self.results),
                "cpu_time_e2e_latency_error": max(r.comparison["cpu_time_e2e_latency_error"] for r in self.results),
                "workload": self.workload, "limits": self.limits, "device": self.device, "model": self.model,
                "profile": self.profile, "stat": self.stat, "repeats": self.repeats, "cost": self.cost,
                "schedulers": {r.scheduler: {"tokens_identical": r.tokens_identical,
                                             "blocks_in_use": r.blocks_in_use, "num_evictions": r.num_evictions,
                                             "measured_cpu_busy_s": float(r.cpu_s.sum()),
                                             **r.comparison} for r in self.results}}

    def batch_rows(self) -> list[dict[str, Any]]:
        """One row per executed batch (for a CSV): predicted and measured seconds and the batch's shape."""
        rows = []
        for r in self.results:
            for j in range(r.predicted_s.size):
                rows.append({"scheduler": r.scheduler, "batch": j, "predicted_s": float(r.predicted_s[j]),
                             "measured_s": float(r.measured_s[j]), "measured_cpu_s": float(r.cpu_s[j]),
                             **{k: int(v[j]) for k, v in r.batches.items()}})
        return rows


def resolve_profile(profile: "str | Path | None", model: str, device: str, grid: Any = None,
                    seed: int = 0, threads: int | None = 1, progress: Any = None) -> Path:
    """A profile directory holding mlp.csv and attention.csv, measured now if missing.

    ``profile`` may be the directory of the CSVs, or a root under which the
    profiler writes ``<device>/<model>/`` (reused when already there). None
    profiles into a temporary directory.
    """
    from infermax.costmodel.profiler import profile_model
    from infermax.costmodel.specs import get_model_spec

    if profile is not None:
        root = Path(profile)
        if (root / "mlp.csv").exists():
            return root
        nested = root / device.split(":")[0] / get_model_spec(model).name
        if (nested / "mlp.csv").exists():
            return nested
    else:
        root = Path(tempfile.mkdtemp(prefix="infermax-profile-"))
    return profile_model(model, device=device, out_dir=root, grid=grid, seed=seed, threads=threads,
                         progress=progress)


def fit_cost_model(profile_dir: "str | Path", model: str = DEFAULT_MODEL, stat: str = "min") -> Any:
    """The LinearCostModel fitted to a profile (``stat`` of its repeated runs)."""
    from infermax.costmodel.fitting import fit_operators, operator_data
    from infermax.costmodel.linear import LinearCostModel

    coefficients = fit_operators(operator_data(profile_dir, model, stat=stat))
    return LinearCostModel(coefficients, name=f"fitted-{Path(profile_dir).name}",
                           description=f"fitted to {profile_dir} ({stat} of repeated runs)")


def validate(schedulers: "str | list[str]" = "vllm", workload: "Workload | str" = DEFAULT_WORKLOAD,
             limits: "Limits | str | None" = DEFAULT_LIMITS, *, profile: "str | Path | None" = None,
             device: str = "cpu", model: str = DEFAULT_MODEL, seed: int = 0, repeats: int = 10,
             stat: str | None = None, num_threads: int | None = 1, grid: Any = None,
             cost: Any = None, progress: "Callable[[str, int, int], None] | None" = None) -> ValidationReport:
    """Profile (or reuse ``profile``), fit, then simulate + execute + compare each scheduler.

    ``cost`` skips profiling and fitting and judges that cost model instead.
    ``stat`` (default ``min`` on CPU, ``median`` on CUDA) summarises both the
    profile's and the executor's ``repeats`` runs. ``progress(stage, done, total)``
    reports the profiler's passes (stage ``"profile"``) and the schedule runs
    (``"execute"``).
    """
    import infermax
    from infermax.schedulers import get_scheduler, split_specs

    from .model import build_model, prompt_tokens, reference_tokens

    names = split_specs(schedulers) if isinstance(schedulers, str) else [n for n in schedulers if n]
    for name in names:
        get_scheduler(name)                    # unknown names fail before any measurement
    workload, limits, given_cost = resolve_inputs(workload, limits, cost)
    cost = None if cost is None else given_cost      # a name or path given: the model it names
    workload.check_fits(limits)
    stat = stat or ("median" if device.startswith("cuda") else "min")
    profile_dir = "(given cost model)"
    if cost is None:
        on_pass = None if progress is None else (lambda done, total: progress("profile", done, total))
        folder = resolve_profile(profile, model, device, grid, seed, num_threads, on_pass)
        cost, profile_dir = fit_cost_model(folder, model, stat), str(folder)
    net = build_model(model, device, seed)
    reference = reference_tokens(net, prompt_tokens(workload, net.cfg.vocab_size, seed), workload, num_threads)
    sims = [infermax.simulate(workload, name, limits, cost) for name in names]
    runs = _execute_interleaved([sim.schedule for sim in sims], workload, net, device, seed, limits, repeats, stat,
                                num_threads, progress)
    results = []
    for name, sim, run in zip(names, sims, runs):
        measured = run.measured_trace()
        b = sim.trace.batches
        results.append(SchedulerValidation(
            scheduler=name, tokens_identical=dict(run.tokens) == reference, blocks_in_use=run.blocks_in_use,
            num_evictions=int(sim.metrics["num_evictions"]), comparison=_compare(run, sim.trace),
            predicted_s=b["duration_s"].copy(), measured_s=run.batch_times_s.copy(),
            predicted_start_s=b["start_s"].copy(), measured_start_s=measured.batches["start_s"].copy(),
            cpu_s=run.cpu_times_s.copy(),
            batches={k: b[k].copy() for k in ("num_requests", "num_tokens", "num_prefill_tokens", "num_decode",
                                              "kv_tokens", "num_evicted")}))
    return ValidationReport(workload=workload.name, limits=limits.to_dict(), device=device, model=model,
                            profile=profile_dir, stat=stat, repeats=repeats, cost=cost.describe(),
                            results=tuple(results))


def _execute_interleaved(schedules: list[Any], workload: Workload, net: Any, device: str, seed: int, limits: Limits,
                         repeats: int, stat: str, num_threads: int | None, progress: Any = None) -> list[Any]:
    """Execute every schedule ``repeats`` times, round-robin (one run of each, then again), and keep ``stat``.

    Each schedule's runs are spread over the whole measurement rather than one
    stretch of it, so a phase of heavy load from other processes slows one run
    of every schedule instead of all runs of one (as the profiler samples).
    """
    from .executor import execute

    total = repeats * len(schedules)

    def run(k: int, schedule: Any) -> Any:
        result = execute(schedule, workload, net, device, seed, limits=limits, repeats=1, num_threads=num_threads)
        if progress is not None:
            progress("execute", k + 1, total)
        return result

    rounds = [[run(r * len(schedules) + i, schedule) for i, schedule in enumerate(schedules)] for r in range(repeats)]
    summarise = getattr(np, stat)
    out = []
    for i, first in enumerate(rounds[0]):
        runs = [r[i] for r in rounds]
        if any(dict(run.tokens) != dict(first.tokens) for run in runs):
            raise RuntimeError("two runs of the same schedule generated different tokens")
        wall, cpu = np.vstack([run.run_times_s for run in runs]), np.vstack([run.cpu_times_s for run in runs])
        out.append(dataclasses.replace(first, batch_times_s=summarise(wall, axis=0), run_times_s=wall,
                                       cpu_times_s=summarise(cpu, axis=0),
                                       blocks_in_use=max(run.blocks_in_use for run in runs)))
    return out


def _compare(run: Any, predicted: Any) -> dict[str, Any]:
    """``run.compare(predicted)`` against wall time, plus its errors against the batches' CPU time."""
    out = run.compare(predicted)
    cpu = dataclasses.replace(run, batch_times_s=run.cpu_times_s).compare(predicted)
    out.update({f"cpu_time_{key}": cpu[key] for key in ("e2e_latency_error", "e2e_latency_signed_error",
                                                         "batch_time_median_ape", "batch_time_p90_ape")})
    out["measured_wall_over_cpu"] = run.busy_s / float(run.cpu_times_s.sum())
    return out


def plot_validation(report: ValidationReport, path: "str | Path") -> Path:
    """Predicted vs measured batch time (scatter, log axes) and per-batch timeline; writes a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_scatter, ax_time) = plt.subplots(1, 2, figsize=(12, 4.8))
    for r in report.results:
        ax_scatter.scatter(r.measured_s * 1e3, r.predicted_s * 1e3, s=14, alpha=0.7, label=r.scheduler)
        line, = ax_time.step(*_timeline(r.measured_start_s, r.measured_s), where="post",
                             label=f"{r.scheduler} measured")
        ax_time.step(*_timeline(r.predicted_start_s, r.predicted_s), where="post", linestyle="--",
                     color=line.get_color(), label=f"{r.scheduler} predicted")
    every = np.concatenate([np.r_[r.measured_s, r.predicted_s] for r in report.results]) * 1e3
    lo, hi = every.min() * 0.8, every.max() * 1.25
    ax_scatter.plot([lo, hi], [lo, hi], color="grey", linewidth=1)
    ax_scatter.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi), xlabel="measured batch time (ms)",
                   ylabel="predicted batch time (ms)", title="per batch")
    ax_scatter.legend()
    ax_time.set(xlabel="time (s)", ylabel="batch time (ms)", title="timeline: measured (solid) vs "
                "predicted (dashed)")
    ax_time.legend(fontsize=7)
    s = report.summary()
    fig.suptitle(f"{report.workload} on {report.device} ({report.model}): batch median APE "
                 f"{s['batch_time_median_ape']:.1%}, worst e2e latency error {s['e2e_latency_error']:.1%}")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _timeline(start_s: np.ndarray, duration_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Step-plot points: each batch's duration (ms) held from its start to the next batch's start."""
    return np.r_[start_s, start_s[-1] + duration_s[-1]], np.r_[duration_s, duration_s[-1]] * 1e3
