"""Step 3 of ``gpu_validation.py``: profile -> fit, beside Vidur's A100 profile of the same model.

The profiler (infermax.costmodel.profiler) measures a random-weight Llama-3-8B (``--tiny``:
llama-tiny) in the run's dtype with Vidur's operator breakdown (mlp.csv: per-layer norms,
QKV/O/up/down projections, RoPE, activation, adds, embedding and LM head; attention.csv:
KV-cache write, input/output reshapes, decode and prefill attention). Then:

- ``costmodel report``'s held-out table for it (5-fold CV over groups) and for Vidur's A100
  profile of Llama-3-8B, the same function and text as ``infermax costmodel report``;
- fit -> predict -> measure: the linear model fitted to the whole profile predicts random mixed
  batches, which are then run whole through the profiler's forward pass and timed.

The profile's CSVs come back as one ``profile_<device>_<model>.tar.gz`` in the output folder;
the execute step fits its cost model to the same folder (``<work>/profile``).
"""
from __future__ import annotations

import tarfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from gpuval_common import Ctx, device_info, tiny_model

VIDUR_PROFILE = "a100/Meta-Llama-3-8B"


def model_name(ctx: Ctx) -> Any:
    """The model spec (a name, or ``--tiny``'s ModelSpec) that steps 3 and 4 build."""
    return tiny_model() if ctx.tiny else "llama3-8b"


def grid(tiny: bool) -> Any:
    from infermax.costmodel.profiler import ProfileGrid

    if tiny:
        return ProfileGrid(num_tokens=(1, 4, 16, 32, 64, 128), decode_batch=(1, 2, 6), decode_kv=(16, 64, 160),
                           prefill_chunk=(16, 64), prefill_kv=(0, 64), repeats=2, warmup=1)
    return ProfileGrid(num_tokens=(1, 2, 4, 8, 16, 32, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                                   3072, 4096),
                       decode_batch=(1, 2, 4, 8, 16, 32, 64), decode_kv=(128, 256, 512, 1024, 2048, 4096),
                       prefill_chunk=(64, 128, 256, 512, 1024, 2048), prefill_kv=(0, 512, 1024, 2048, 4096),
                       repeats=5, warmup=1)


def profile_folder(ctx: Ctx) -> Path:
    """Where the profiler writes (the execute step reads the same folder)."""
    return ctx.work / "profile" / ctx.device.split(":")[0] / _spec_name(ctx)


def _spec_name(ctx: Ctx) -> str:
    from infermax.costmodel.specs import get_model_spec

    return get_model_spec(model_name(ctx)).name


def _label(model: Any) -> str:
    return model if isinstance(model, str) else model.name


def _gpu_spec_name(info: dict[str, Any]) -> str | None:
    """The costmodel GPU spec matching the device (for the report's roofline check), if any."""
    label = (info.get("spec") or "").split(" ")[0]
    return label if label in ("a100", "h100", "h200") else None


def run(ctx: Ctx) -> dict[str, Any]:
    from infermax.costmodel.accuracy import accuracy_report, plot_accuracy
    from infermax.costmodel.cli import _report_text
    from infermax.costmodel.profiler import profile_model

    info = ctx.record("device", **device_info(ctx.device))
    vidur, _ = accuracy_report(VIDUR_PROFILE, k=2 if ctx.tiny else 5)     # --tiny: fewer folds, same code
    ctx.record("vidur", profile=VIDUR_PROFILE, table=_report_text(vidur), report=vidur)
    model, g, start = model_name(ctx), grid(ctx.tiny), time.perf_counter()
    folder = profile_model(model, device=ctx.device, out_dir=ctx.work / "profile", grid=g, seed=0,
                           threads=1 if ctx.device == "cpu" else None, dtype=ctx.dtype)
    archive = ctx.out / f"profile_{ctx.device.split(':')[0]}_{folder.name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for csv in ("mlp.csv", "attention.csv"):
            tar.add(folder / csv, arcname=f"{ctx.device.split(':')[0]}/{folder.name}/{csv}")
    ctx.record("profiled", folder=str(folder), archive=archive.name, seconds=round(time.perf_counter() - start, 2),
               model=_label(model), dtype=ctx.dtype, grid=asdict(g))
    stat = "median" if ctx.cuda else "min"
    report, held = accuracy_report(str(folder), model=model, gpu=_gpu_spec_name(info), stat=stat)
    ctx.record("fit", table=_report_text(report), report=report)
    try:
        plot_accuracy(held, ctx.out / "profile_fit.png",
                      title=f"{_label(model)} {ctx.dtype} on {info['name']} (held-out)")
    except Exception as exc:              # noqa: BLE001 - the numbers are recorded already
        ctx.record("plot_error", error=repr(exc))
    batches = _measured_batches(ctx, model, stat, report["coefficients"]) if ctx.time_left() > 0 else None
    return {"model": _label(model), "dtype": ctx.dtype, "profile": str(folder),
            "non_attention_median_ape": report["non_attention"]["median_ape"],
            "attention_median_ape": report["attention"]["median_ape"],
            "batch_median_ape": report["batch"]["median_ape"], "batch_p90_ape": report["batch"]["p90_ape"],
            "vidur_batch_median_ape": vidur["batch"]["median_ape"],
            "measured_batches_median_ape": None if batches is None else batches["median_ape"]}


def _random_batches(tiny: bool, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Mixed batches inside the profiled grid: decode requests at random KV plus 0-2 prefill chunks."""
    rng = np.random.default_rng(seed)
    max_dec, kv_hi, chunk_hi, prefix_hi = (6, 160, 64, 64) if tiny else (64, 4096, 1024, 2048)
    out = []
    for _ in range(n):
        num_decode = int(rng.integers(0, max_dec + 1))
        num_prefill = int(rng.integers(0 if num_decode else 1, 3))
        tokens = np.r_[np.ones(num_decode, np.int64), rng.integers(16, chunk_hi + 1, num_prefill)]
        kv = np.r_[rng.integers(32, kv_hi + 1, num_decode), rng.integers(0, prefix_hi + 1, num_prefill)]
        out.append((tokens, kv, np.r_[np.ones(num_decode, bool), np.zeros(num_prefill, bool)]))
    return out


def _measured_batches(ctx: Ctx, model: str, stat: str, coefficients: dict) -> dict[str, Any]:
    """Fit -> predict -> measure on random mixed batches run whole (the profiler's forward pass)."""
    from infermax.costmodel.accuracy import error_stats
    from infermax.costmodel.linear import LinearCoefficients, LinearCostModel
    from infermax.costmodel.profiler import measure_batch_s

    fitted = LinearCostModel(LinearCoefficients.from_dict(coefficients))
    batches = _random_batches(ctx.tiny, 6 if ctx.tiny else 40)
    measured = measure_batch_s(batches, model, device=ctx.device, repeats=3, stat=stat,
                               threads=1 if ctx.device == "cpu" else None, dtype=ctx.dtype)
    predicted = np.array([fitted.batch_time(*b) for b in batches])
    stats = {**error_stats(predicted, measured), "stat": stat}
    ctx.record("batches", **stats, rows=[{"decode": int(b[2].sum()), "prefill_tokens": int(b[0][~b[2]].sum()),
                                          "kv_tokens": int(b[1].sum()), "predicted_s": float(p),
                                          "measured_s": float(m)} for b, p, m in zip(batches, predicted, measured)])
    return stats


def format_records(records: list[dict]) -> list[str]:
    lines = []
    for r in records:
        if r["kind"] == "profiled":
            lines.append(f"profiled {r['model']} ({r['dtype']}) in {r['seconds']:.1f} s -> {r['archive']}")
        elif r["kind"] == "fit":
            lines += ["held-out accuracy of the fit to this profile (infermax costmodel report):", r["table"]]
        elif r["kind"] == "batches":
            lines.append(f"fit -> predict -> measure on {r['n']} random mixed batches run whole ({r['stat']}): "
                         f"median APE {r['median_ape']:.1%}, p90 {r['p90_ape']:.1%}, max {r['max_ape']:.1%}")
        elif r["kind"] == "vidur":
            lines += [f"the same table for Vidur's profile {r['profile']}:", r["table"]]
    return lines
