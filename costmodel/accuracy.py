"""How accurate is a fitted cost model? Held-out error per operator and per batch.

Protocol (``cross_validate``): k-fold cross-validation over *groups*, never
rows. Non-attention groups are token counts. Attention groups are, with
``split="clump"`` (default), the clumps of consecutive rows of the sampled
attention profile — a held-out clump is a stretch of configurations the fit has
not seen anything near — or, with ``split="config"``, the profiler's outer sweep
value (decode: the KV size; prefill: the chunk size). Each fold fits on the
other folds and predicts its own; errors are pooled over folds.

Whole batches: Vidur measures operators, not batches, so a held-out *batch* is
composed from held-out measurements of one fold: a decode row (b requests at KV
k), a prefill row (one chunk c after m cached tokens), or both, plus the
non-attention measurement at exactly N = b + c tokens and, when the profile has
an ``lm_head`` column, the LM head at R = b (+1) rows; its measured time is the
sum, its prediction is ``LinearCostModel.batch_time`` on that batch.

LM-head rows are held out with the non-attention token counts (they are the
same rows of ``mlp.csv``) from the fit; the *measured* side of a composed batch
and of the ``non_attention`` operator (non-attention at N tokens plus the LM
head of one request) reads every LM-head measurement, interpolated in R.

Errors are absolute percentage errors as fractions: |pred − meas| / meas.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .fitting import ATTENTION_FORMS, OperatorData, attention_work, fit_operators, operator_data, request_parts
from .linear import LinearCoefficients, LinearCostModel, prefill_attention_work
from .roofline import RooflineCostModel, roofline_terms
from .specs import ModelSpec, get_gpu_spec, get_model_spec

OPERATORS = ("non_attention", "decode_attention", "prefill_attention", "batch")


def error_stats(predicted: np.ndarray, measured: np.ndarray) -> dict[str, float]:
    """Median, p90, mean and max absolute percentage error (fractions), and the count."""
    if len(measured) == 0:
        return {"median_ape": None, "p90_ape": None, "mean_ape": None, "max_ape": None, "n": 0}
    ape = np.abs(np.asarray(predicted) - measured) / measured
    return {"median_ape": float(np.median(ape)), "p90_ape": float(np.quantile(ape, 0.9)),
            "mean_ape": float(ape.mean()), "max_ape": float(ape.max()), "n": int(len(ape))}


def group_folds(groups: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Fold index per row: the distinct groups, shuffled, are dealt round-robin to k folds."""
    unique = np.unique(groups)
    order = np.random.default_rng(seed).permutation(unique)
    fold_of = {g: i % k for i, g in enumerate(order.tolist())}
    return np.array([fold_of[g] for g in groups.tolist()], dtype=np.int64)


@dataclass
class HeldOut:
    """Pooled out-of-fold (measured, predicted) seconds per operator, and the composed batches."""

    measured: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in OPERATORS})
    predicted: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in OPERATORS})

    def add(self, key: str, measured: np.ndarray, predicted: np.ndarray) -> None:
        self.measured[key].extend(np.atleast_1d(measured).tolist())
        self.predicted[key].extend(np.atleast_1d(predicted).tolist())

    def arrays(self, key: str) -> tuple[np.ndarray, np.ndarray]:
        return np.array(self.measured[key]), np.array(self.predicted[key])

    def stats(self) -> dict[str, dict[str, float]]:
        out = {k: error_stats(self.arrays(k)[1], self.arrays(k)[0]) for k in OPERATORS}
        meas = np.r_[self.arrays("decode_attention")[0], self.arrays("prefill_attention")[0]]
        pred = np.r_[self.arrays("decode_attention")[1], self.arrays("prefill_attention")[1]]
        out["attention"] = error_stats(pred, meas)
        meas = np.r_[meas, self.arrays("non_attention")[0]]
        pred = np.r_[pred, self.arrays("non_attention")[1]]
        out["all_operators"] = error_stats(pred, meas)
        return out


# complexity: the batch kinds picked from the rows, each one's row filters written inline as comprehensions
def compose_batches(data: OperatorData, rng: np.random.Generator, per_kind: int = 200
                    ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, float]]:
    """Batches (tokens, kv_before, is_decode, measured_s) built from the rows of ``data``."""
    na = dict(zip(data.nonattn_tokens.tolist(), data.nonattn_s.tolist()))
    dec = [i for i, b in enumerate(data.decode_batch.tolist()) if b in na]
    pf = [j for j, c in enumerate(data.prefill_chunk.tolist()) if c in na]
    sums = data.decode_batch[:, None] + data.prefill_chunk[None, :]
    hybrid = np.argwhere(np.isin(sums, list(na)))
    picks = [(i, None) for i in dec], [(None, j) for j in pf], [tuple(x) for x in hybrid.tolist()]
    batches = []
    for kind in picks:
        chosen = rng.choice(len(kind), size=min(per_kind, len(kind)), replace=False) if kind else []
        for idx in sorted(chosen):
            i, j = kind[idx]
            b = int(data.decode_batch[i]) if i is not None else 0
            c = int(data.prefill_chunk[j]) if j is not None else 0
            tokens = np.r_[np.ones(b, np.int64), [c] if c else []].astype(np.int64)
            kv = np.r_[np.full(b, data.decode_kv[i] if b else 0), [data.prefill_kv[j]] if c else []].astype(np.int64)
            is_decode = np.r_[np.ones(b, bool), np.zeros(1 if c else 0, bool)]
            measured = na[b + c] + (data.decode_s[i] if b else 0.0) + (data.prefill_s[j] if c else 0.0)
            measured += float(data.lm_head_at(tokens.size))
            batches.append((tokens, kv, is_decode, float(measured)))
    return batches


def attention_groups(data: OperatorData, split: str) -> dict[str, tuple[str, np.ndarray]]:
    """(kind, group label per row) for decode and prefill rows.

    A phase that is a single clump (a full, unsampled profile is one sweep)
    falls back to its configuration groups. With fewer groups than folds, the
    spare folds hold none of that phase out (leave-one-group-out).
    """
    if split not in ("clump", "config"):
        raise ValueError(f"split must be 'clump' or 'config', got {split!r}")
    out = {}
    for phase, clump, config in (("decode_attention", data.decode_group, data.decode_kv),
                                 ("prefill_attention", data.prefill_group, data.prefill_chunk)):
        use_config = split == "config" or np.unique(clump).size < 2
        out[phase] = ("config", config) if use_config else ("clump", clump)
    return out


def _batch_prediction(model: LinearCostModel, attention_form: str, tokens: np.ndarray, kv: np.ndarray,
                      is_decode: np.ndarray) -> float:
    """``model.batch_time``, with prefill attention priced by ``attention_form``'s W (its coefficients were
    fitted to that form; the model itself prices the causal W)."""
    t = model.batch_time(tokens, kv, is_decode)
    if attention_form != "causal" and not is_decode.all():
        c, m = tokens[~is_decode], kv[~is_decode]
        extra = attention_work(attention_form, c, m) - prefill_attention_work(c, m)
        t += model.coefficients.prefill_attn_s * float(extra.sum())
    return t


def cross_validate(data: OperatorData, fit: Callable[[OperatorData], LinearCoefficients], k: int = 5,
                   seed: int = 0, split: str = "clump", batches_per_kind: int = 200,
                   attention_form: str = "causal") -> HeldOut:
    """Pooled out-of-fold predictions of ``fit`` (see the module docstring); ``fit`` fits prefill attention
    to ``attention_form``'s W (fitting.ATTENTION_FORMS), which prices the held-out prefills and batches."""
    if k < 2:
        raise ValueError(f"k must be >= 2, got {k!r}")
    groups = attention_groups(data, split)
    folds = (group_folds(data.nonattn_group, k, seed), group_folds(groups["decode_attention"][1], k, seed + 1),
             group_folds(groups["prefill_attention"][1], k, seed + 2))
    head_fold = group_folds(data.head_rows, k, seed) if data.head_rows.size else np.zeros(0, np.int64)
    rng = np.random.default_rng(seed)
    held = HeldOut()
    for f in range(k):
        test = data.subset(*(fold == f for fold in folds))              # measured side: every LM-head row
        train = data.subset(*(fold != f for fold in folds), head_fold != f)
        coefficients = fit(train)
        model = LinearCostModel(coefficients)
        head_s, decode_request_s = request_parts(train, coefficients)
        held.add("non_attention", test.nonattn_s + test.lm_head_at(1.0),
                 coefficients.nonattention_s(test.nonattn_tokens) + head_s)
        held.add("decode_attention", test.decode_s, coefficients.decode_s(test.decode_batch * (test.decode_kv + 1.0))
                 + decode_request_s * test.decode_batch)
        c = test.prefill_chunk.astype(np.float64)
        held.add("prefill_attention", test.prefill_s,
                 coefficients.prefill_s(attention_work(attention_form, c, test.prefill_kv), c))
        for tokens, kv, is_decode, measured in compose_batches(test, rng, batches_per_kind):
            predicted = _batch_prediction(model, attention_form, tokens, kv, is_decode)
            held.add("batch", np.array([measured]), np.array([predicted]))
    return held


def roofline_check(data: OperatorData, coefficients: LinearCoefficients, roofline: RooflineCostModel,
                   seed: int = 0, attention_form: str = "causal") -> dict[str, Any]:
    """Fitted / roofline at every profiled operator point and at composed batches (ratio >= 1 is sound);
    ``coefficients`` price prefill attention by ``attention_form``'s W."""
    t = roofline.terms
    c = data.prefill_chunk.astype(np.float64)
    K = data.decode_batch * (data.decode_kv + 1.0)
    pairs = prefill_attention_work(c, data.prefill_kv)
    ratios = [coefficients.nonattention_s(data.nonattn_tokens) / t.nonattention_s(data.nonattn_tokens),
              coefficients.decode_s(K) / t.decode_s(K),
              coefficients.prefill_s(attention_work(attention_form, c, data.prefill_kv), c)
              / t.prefill_s(pairs, data.prefill_kv + c)]
    model = LinearCostModel(coefficients)
    batches = compose_batches(data, np.random.default_rng(seed), per_kind=500)
    ratios.append(np.array([_batch_prediction(model, attention_form, *b[:3]) / roofline.batch_time(*b[:3])
                            for b in batches]))
    allr = np.concatenate(ratios)
    return {"points": int(allr.size), "violations": int(np.sum(allr < 1.0)), "min_ratio": float(allr.min())}


def _infer(profile: str, model: "str | ModelSpec | None", gpu: str | None) -> tuple[ModelSpec, str | None]:
    parts = Path(str(profile)).parts
    if model is None:
        try:
            model = get_model_spec(parts[-1])
        except ValueError:
            raise ValueError(f"cannot tell the model of profile {profile!r}; pass model=") from None
    if gpu is None and len(parts) >= 2:
        try:
            gpu = get_gpu_spec(parts[-2]).name
        except ValueError:
            gpu = None
    return get_model_spec(model), gpu


def accuracy_report(profile: str, model: "str | ModelSpec | None" = None, gpu: str | None = None, tp: int = 1,
                    k: int = 5, seed: int = 0, split: str = "clump", num_lines: int = 2, extended: bool = False,
                    batches_per_kind: int = 200, stat: str = "median", request_term: bool | None = None,
                    attention_form: str = "causal", compare_forms: bool = False) -> tuple[dict[str, Any], HeldOut]:
    """Fit a profile with held-out evaluation; returns (report dict, pooled held-out points).

    ``request_term``: fit ``request_s`` (default: when the profile has an LM head); see fitting.py.
    ``attention_form``: the prefill-attention work fitted ("causal", the linear model's W, or the
    pre-causal "square" c(m + c), whose coefficients the linear model does not price; see
    fitting.ATTENTION_FORMS). ``compare_forms``: also cross-validate every form under the same protocol;
    the report's ``attention_forms`` holds each one's held-out errors.
    """
    spec, gpu = _infer(profile, model, gpu)
    data = operator_data(profile, spec, tp, require_attention=False, stat=stat)
    roofline = roofline_terms(spec, gpu, tp) if gpu else None

    def fitter(form: str) -> Callable[[OperatorData], LinearCoefficients]:
        return lambda d: fit_operators(d, roofline, num_lines=num_lines, extended=extended,
                                       request_term=request_term, attention_form=form)

    fit = fitter(attention_form)
    held = cross_validate(data, fit, k, seed, split, batches_per_kind, attention_form)
    final = fit(data)
    groups = {"non_attention": f"{np.unique(data.nonattn_group).size} token counts"}
    groups.update({phase: f"{np.unique(labels).size} {kind}s"
                   for phase, (kind, labels) in attention_groups(data, split).items()})
    report: dict[str, Any] = {
        "profile": str(profile), "model": spec.name, "gpu": gpu, "tp": tp,
        "protocol": {"folds": k, "split": split, "seed": seed, "num_lines": num_lines, "extended": extended,
                     "request_term": request_term, "stat": stat, "groups": groups, "attention_form": attention_form},
        **held.stats(),
        "coefficients": final.to_dict(),
    }
    if compare_forms:
        keys = ("prefill_attention", "attention", "all_operators", "batch")
        report["attention_forms"] = {}
        for form in ATTENTION_FORMS:
            stats = (held if form == attention_form else
                     cross_validate(data, fitter(form), k, seed, split, batches_per_kind, form)).stats()
            report["attention_forms"][form] = {key: stats[key] for key in keys}
    if gpu:
        report["roofline"] = roofline_check(data, final, RooflineCostModel(spec, gpu, tp), seed, attention_form)
    return report, held


def plot_accuracy(held: HeldOut, path: str | Path, title: str = "") -> Path:
    """Predicted vs measured (log-log, held-out) for each operator and for batches; writes ``path``."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 4, figsize=(16, 4))
    for ax, key in zip(axes, OPERATORS):
        meas, pred = held.arrays(key)
        if meas.size:
            ax.loglog(meas * 1e3, pred * 1e3, ".", ms=3, alpha=0.5)
            lo, hi = min(meas.min(), pred.min()) * 1e3, max(meas.max(), pred.max()) * 1e3
            ax.plot([lo, hi], [lo, hi], "k--", lw=1)
            st = error_stats(pred, meas)
            ax.set_title(f"{key}\nmedian {st['median_ape']:.1%}, p90 {st['p90_ape']:.1%}", fontsize=9)
        ax.set_xlabel("measured (ms)")
        ax.set_ylabel("predicted (ms)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
