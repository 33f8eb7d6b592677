"""Command-line layer of infermax.costmodel: ``profile`` and ``costmodel {report,list,show,fit,refit-catalog}``.

``add_subcommands(subparsers)`` adds both commands to an argparse subparsers
object; each parser carries ``func(args) -> int``. Every command takes ``--json``.
Handlers raise ValueError for bad input; the ``infermax`` entry point
(``infermax.cli.main``) reports it as every command does (one line, exit status 2).
``--profile`` takes a profile directory or the folder ``infermax profile --out``
wrote (its ``<device>/<model>/`` subfolder is found).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["add_subcommands"]


def _ints(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _jsonable(value: Any, path: str, nulls: dict[str, str]) -> Any:
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        nulls[path] = "NaN: undefined (e.g. no points)" if np.isnan(value) else f"{value}: no finite value"
        return None
    if isinstance(value, dict):
        return {str(k): _jsonable(v, f"{path}.{k}" if path else str(k), nulls) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}[{i}]", nulls) for i, v in enumerate(value)]
    return value


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> int:
    """Text, or with ``--json`` one valid JSON object (NaN/Infinity as null, listed in ``null_values``,
    as infermax.cli.dumps_json does; costmodel imports nothing of the core). Errors are raised: the
    ``infermax`` entry point reports them (one line, exit status 2)."""
    if args.json:
        nulls: dict[str, str] = {}
        clean = _jsonable(payload, "", nulls)
        if nulls:
            clean["null_values"] = nulls
        print(json.dumps(clean, indent=2, allow_nan=False, default=str))
    else:
        print(text)
    return 0


def _profile_arg(profile: str) -> str:
    """A profile directory as given, or the ``<device>/<model>/`` folder ``infermax profile --out`` wrote in it."""
    from .profiles import profile_dir
    return str(profile_dir(profile)) if Path(profile).is_dir() else profile


class _Bar:
    """A tqdm bar on stderr (silent with --json, -q, or when stderr is not a terminal)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm
            self.bar = tqdm(desc=label, unit="pass", leave=False, file=sys.stderr, disable=None)

    def __call__(self, done: int, total: int) -> None:
        if self.bar is not None:
            self.bar.total = total
            self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _fmt(x: float | None) -> str:
    return "   n/a" if x is None else f"{x:6.1%}"


# --- profile ------------------------------------------------------------------------

def _cmd_profile(args: argparse.Namespace) -> int:
    from .profiler import ProfileGrid, measure_batch_s, profile_model
    base = ProfileGrid.tiny() if args.tiny else ProfileGrid()
    overrides = {k: v for k, v in (("num_tokens", args.tokens), ("decode_batch", args.decode_batch),
                                   ("decode_kv", args.decode_kv), ("prefill_chunk", args.prefill_chunk),
                                   ("prefill_kv", args.prefill_kv), ("repeats", args.repeats),
                                   ("warmup", args.warmup)) if v is not None}
    grid = ProfileGrid(**{**{f: getattr(base, f) for f in base.__slots__}, **overrides})
    start = time.perf_counter()
    bar = _Bar(f"profile {args.model} on {args.device}", enabled=not (args.json or args.quiet))
    try:
        folder = profile_model(args.model, device=args.device, out_dir=args.out, grid=grid, seed=args.seed,
                               threads=args.threads, progress=bar)
    finally:
        bar.close()
    payload: dict[str, Any] = {"profile": str(folder), "device": args.device, "model": args.model,
                               "seconds": round(time.perf_counter() - start, 3)}
    text = f"wrote {folder}/mlp.csv and attention.csv in {payload['seconds']} s"
    if args.validate:
        payload["validate"] = _validate(folder, args, measure_batch_s)
        v = payload["validate"]
        text += (f"\nfit -> predict -> measure on {v['n']} random batches ({v['stat']}): "
                 f"median APE {v['median_ape']:.1%}, p90 {v['p90_ape']:.1%}")
    return _emit(args, payload, text)


def _validate(folder: Path, args: argparse.Namespace, measure) -> dict[str, Any]:
    """Fit the new profile, then measure and predict random mixed batches."""
    from .accuracy import error_stats
    from .fitting import fit_operators, operator_data
    from .linear import LinearCostModel
    stat = "min" if args.device == "cpu" else "median"
    model = LinearCostModel(fit_operators(operator_data(folder, args.model, stat=stat)))
    rng = np.random.default_rng(args.seed)
    batches = []
    for _ in range(args.validate):
        num_decode = int(rng.integers(0, 24))
        num_prefill = int(rng.integers(0 if num_decode else 1, 3))
        tokens = np.r_[np.ones(num_decode, np.int64), rng.integers(16, 256, num_prefill)]
        kv = np.r_[rng.integers(32, 1024, num_decode), rng.integers(0, 512, num_prefill)]
        batches.append((tokens, kv, np.r_[np.ones(num_decode, bool), np.zeros(num_prefill, bool)]))
    measured = measure(batches, args.model, device=args.device, threads=args.threads, stat=stat)
    predicted = np.array([model.batch_time(*b) for b in batches])
    return {**error_stats(predicted, measured), "stat": stat}


def _add_profile(subparsers: Any) -> None:
    p = subparsers.add_parser("profile", help="measure operator times with PyTorch and write a Vidur-format profile")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:i] (default cpu)")
    p.add_argument("--model", default="llama-tiny", help="model spec to build (default llama-tiny)")
    p.add_argument("--out", default="profiles", help="output directory; writes <out>/<device>/<model>/")
    p.add_argument("--tiny", action="store_true", help="a grid that runs in a few seconds")
    p.add_argument("--tokens", type=_ints, help="non-attention token counts, e.g. 1,16,64,256")
    p.add_argument("--decode-batch", type=_ints, help="decode batch sizes")
    p.add_argument("--decode-kv", type=_ints, help="decode KV sizes")
    p.add_argument("--prefill-chunk", type=_ints, help="prefill chunk sizes")
    p.add_argument("--prefill-kv", type=_ints, help="prefill prefix (cached KV) sizes")
    p.add_argument("--repeats", type=int, help="timed runs per configuration")
    p.add_argument("--warmup", type=int, help="untimed runs per configuration")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: steadier timings)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--validate", type=int, default=0, metavar="N",
                   help="then fit the profile and compare predictions with N measured random batches")
    p.add_argument("--json", action="store_true")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_profile)


# --- costmodel ------------------------------------------------------------------------

def _report_text(r: dict[str, Any]) -> str:
    p = r["protocol"]
    lines = [f"profile {r['profile']}: {r['model']} on {r['gpu'] or 'unknown GPU'}, TP {r['tp']}",
             f"held-out: {p['folds']}-fold CV over groups ({'; '.join(f'{k}: {v}' for k, v in p['groups'].items())}),"
             f" seed {p['seed']}, {p['num_lines']} non-attention lines{', extended features' if p['extended'] else ''}"
             f"{', no request term' if p['request_term'] is False else ''}"
             f"{', request term' if p['request_term'] else ''}"
             f"{', prefill attention fitted to the square W = c(m+c)' if p.get('attention_form') == 'square' else ''}",
             f"{'operator':<20}{'n':>6}  {'median APE':>10}  {'p90 APE':>8}"]
    for key in ("non_attention", "attention", "decode_attention", "prefill_attention", "all_operators", "batch"):
        st = r[key]
        lines.append(f"{key:<20}{st['n']:>6}  {_fmt(st['median_ape']):>10}  {_fmt(st['p90_ape']):>8}")
    if "attention_forms" in r:
        lines.append("prefill-attention work W per chunk: causal c*m + c(c+1)/2 vs square c(m+c) "
                     "(held-out median / p90 APE)")
        keys = ("prefill_attention", "attention", "all_operators", "batch")
        lines.append(f"{'W':<10}" + "".join(f"{key:>20}" for key in keys))
        for form, stats in r["attention_forms"].items():
            lines.append(f"{form:<10}" + "".join(
                f"{_fmt(stats[key]['median_ape']).strip() + ' / ' + _fmt(stats[key]['p90_ape']).strip():>20}"
                for key in keys))
    if "roofline" in r:
        rf = r["roofline"]
        lines.append(f"roofline: {rf['violations']} of {rf['points']} profiled points predicted faster than the "
                     f"roofline (min fitted/roofline {rf['min_ratio']:.2f})")
    lines.append("coefficients (s): " + json.dumps(r["coefficients"]))
    return "\n".join(lines)


def _cmd_report(args: argparse.Namespace) -> int:
    from .accuracy import accuracy_report, plot_accuracy
    report, held = accuracy_report(_profile_arg(args.profile), model=args.model, gpu=args.gpu, tp=args.tp, k=args.folds,
                                   seed=args.seed, split=args.split, num_lines=args.lines, extended=args.extended,
                                   stat=args.stat, request_term=args.request_term,
                                   attention_form=args.attention_form, compare_forms=args.compare_attention_forms)
    if args.plot:
        report["plot"] = str(plot_accuracy(held, args.plot, title=f"{args.profile} (held-out)"))
    text = _report_text(report) + (f"\nplot: {report['plot']}" if args.plot else "")
    return _emit(args, report, text)


def _cmd_list(args: argparse.Namespace) -> int:
    from .profiles import available_profiles
    from .registry import available_cost_models
    from .specs import GPUS, MODELS
    payload = {"cost_models": available_cost_models(), "profiles": available_profiles(),
               "gpus": sorted(GPUS), "models": sorted(MODELS)}
    text = "\n".join(f"{k}: {', '.join(v)}" for k, v in payload.items())
    text += "\nany GPU/model pair: roofline:<gpu>/<model>; any name: <name>@tp=2,pp=2,sp=2,kvp=2,sp_kind=ring"
    return _emit(args, payload, text)


def _cmd_show(args: argparse.Namespace) -> int:
    from .registry import get_cost_model
    model = get_cost_model(args.name)
    payload = model.describe()
    return _emit(args, payload, json.dumps(payload, indent=2))


def _cmd_fit(args: argparse.Namespace) -> int:
    from .accuracy import accuracy_report
    from .linear import LinearCoefficients, LinearCostModel
    out = Path(args.out)
    if out.is_dir():
        raise ValueError(f"--out {args.out!r} is a directory; give the cost-model file, e.g. {str(out / 'fit.json')!r}")
    if not out.parent.is_dir():
        raise ValueError(f"--out {args.out!r}: directory {str(out.parent)!r} does not exist")
    report, _ = accuracy_report(_profile_arg(args.profile), model=args.model, gpu=args.gpu, tp=args.tp,
                                num_lines=args.lines, extended=args.extended, stat=args.stat,
                                request_term=args.request_term)
    model = LinearCostModel(LinearCoefficients.from_dict(report["coefficients"]), name=Path(args.out).stem,
                            description=f"fitted to {args.profile} (TP {args.tp})")
    model.to_json(args.out)
    payload = {"out": args.out, **model.describe(), "accuracy": {k: report[k] for k in ("non_attention", "attention",
                                                                                        "batch")}}
    return _emit(args, payload, f"wrote {args.out}\n" + _report_text(report))


def _cmd_refit(args: argparse.Namespace) -> int:
    from .catalog import build_catalog
    written = [str(p) for p in build_catalog(args.out)]
    return _emit(args, {"written": written}, "\n".join(f"wrote {p}" for p in written))


def _fit_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="packaged <gpu>/<model> (e.g. a100/Llama-2-7b-hf) or a directory")
    p.add_argument("--model", help="model spec (default: from the profile's name)")
    p.add_argument("--gpu", help="GPU spec for the roofline bounds (default: from the profile's name)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree to fit (default 1)")
    p.add_argument("--lines", type=int, default=2, help="lines in the non-attention max (default 2)")
    p.add_argument("--extended", action="store_true", help="add a per-prefill-token attention feature")
    p.add_argument("--request-term", dest="request_term", action="store_true", default=None,
                   help="fit request_s (default: only when the profile has an lm_head column)")
    p.add_argument("--no-request-term", dest="request_term", action="store_false",
                   help="leave request_s at 0 even when the profile has an lm_head column")
    p.add_argument("--stat", default="median", choices=("median", "min", "mean"), help="summary of repeated runs")
    p.add_argument("--json", action="store_true")


def _add_costmodel(subparsers: Any) -> None:
    p = subparsers.add_parser("costmodel", help="inspect, fit and evaluate batch-time cost models")
    sub = p.add_subparsers(dest="costmodel_command", required=True)
    r = sub.add_parser("report", help="held-out accuracy of a fit: per operator and whole batches")
    _fit_options(r)
    r.add_argument("--folds", type=int, default=5)
    r.add_argument("--split", default="clump", choices=("clump", "config"), help="attention groups held out together")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--plot", help="write predicted vs measured to this image file")
    r.add_argument("--attention-form", default="causal", choices=("causal", "square"),
                   help="prefill-attention work to fit: causal c*m + c(c+1)/2 (the model's W, default) or the "
                        "pre-causal square c(m+c), for comparison")
    r.add_argument("--compare-attention-forms", action="store_true",
                   help="also cross-validate both forms of W and print their held-out errors side by side")
    r.set_defaults(func=_cmd_report)
    ls = sub.add_parser("list", help="registered cost models, packaged profiles, GPU and model specs")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_cmd_list)
    sh = sub.add_parser("show", help="a cost model's formula and coefficients")
    sh.add_argument("name", help="e.g. default, a100/llama2-7b@tp=2, roofline:h100/llama3-8b, model.json")
    sh.add_argument("--json", action="store_true")
    sh.set_defaults(func=_cmd_show)
    f = sub.add_parser("fit", help="fit a profile and write a cost-model JSON (use it as --cost PATH.json)")
    _fit_options(f)
    f.add_argument("--out", required=True, help="output .json path")
    f.set_defaults(func=_cmd_fit)
    rc = sub.add_parser("refit-catalog", help="re-fit the packaged profiles into data/fitted/*.json")
    rc.add_argument("--out", help="directory (default: the package's data/fitted)")
    rc.add_argument("--json", action="store_true")
    rc.set_defaults(func=_cmd_refit)


def add_subcommands(subparsers: Any) -> None:
    """Add ``profile`` and ``costmodel`` to an argparse subparsers object."""
    _add_profile(subparsers)
    _add_costmodel(subparsers)
