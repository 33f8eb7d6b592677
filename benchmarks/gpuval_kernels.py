"""Steps 1 and 2 of ``gpu_validation.py``: every Triton kernel against its reference, and its speed.

Shapes are Llama-3-8B's attention (32 query heads, 8 KV heads, head_dim 128, 16-token pages),
contexts 1K-128K and batches 1-64 (``--tiny``: 4/1/32 and a few dozen tokens, for the CPU
interpreter). Inputs are drawn on the device in the run's dtype; references compute in float32
from those same inputs. Error: max |kernel - reference| over the output ("max_abs"), the same
divided by max |reference| ("rel"), and the lse's max abs error; a case passes when both are
within ``TOLERANCES[dtype]``. Where ``scaled_dot_product_attention`` computes the same thing its
error against the same reference is given beside ours.

Speed: the kernel's public wrapper (what the model calls) beside SDPA restricted to the flash
backend on the same data in the dense layout it needs, and beside the physical limit
(decode and merge: bytes moved / HBM bandwidth; prefill and CSA: FLOPs of the causal (kept)
pairs / dense bf16 peak). Ratios > 1 mean slower than SDPA or than the limit.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gpuval_common import TOLERANCES, Ctx, Timer, device_info

FULL_HEADS, TINY_HEADS = (32, 8, 128), (4, 1, 32)          # (q heads, kv heads, head_dim); group 4 in both
PAGE = 16


@dataclass(frozen=True)
class Case:
    op: str                     # prefill | decode | merge | merge2 | csa
    shape: tuple                # op-specific, see _inputs
    check: bool = True          # False: timing only (the reference would not fit)

    @property
    def name(self) -> str:
        return f"{self.op}{self.shape}"


def cases(tiny: bool) -> list[Case]:
    if tiny:
        return [Case("prefill", (2, 24, 16)), Case("decode", (3, 40)), Case("merge", (3, 4)), Case("merge2", (5,)),
                Case("csa", (24, 8, 2, 0.5))]
    return [Case("prefill", (1, 0, 1024)), Case("prefill", (4, 3584, 512)), Case("prefill", (1, 32256, 512)),
            Case("prefill", (1, 130816, 256)),
            Case("decode", (1, 131072)), Case("decode", (8, 32768)), Case("decode", (16, 16384)),
            Case("decode", (64, 1024)), Case("decode", (64, 8192)),
            Case("merge", (64, 16)), Case("merge2", (4096,)),
            Case("csa", (4096, 512, 4, 0.5)), Case("csa", (32768, 4096, 4, 0.5), check=False)]


# ---------------------------------------------------------------- inputs

def _paged(ctx: Ctx, batch: int, m: int, c: int, seed: int) -> dict[str, Any]:
    """``batch`` sequences of m cached + c new tokens on shuffled pages; every token's KV already written."""
    import torch

    hq, hkv, d = TINY_HEADS if ctx.tiny else FULL_HEADS
    dev, dt = ctx.device, ctx.torch_dtype
    gen = torch.Generator(device=dev).manual_seed(seed)
    n, nb = m + c, -(-(m + c) // PAGE)
    k_cache = torch.randn(batch * nb, PAGE, hkv, d, generator=gen, device=dev, dtype=dt)
    v_cache = torch.randn(batch * nb, PAGE, hkv, d, generator=gen, device=dev, dtype=dt)
    table = torch.randperm(batch * nb, generator=gen, device=dev).view(batch, nb).to(torch.int32)
    q = torch.randn(batch * c, hq, d, generator=gen, device=dev, dtype=dt)
    return {"q": q, "k_cache": k_cache, "v_cache": v_cache, "block_table": table,
            "cu_seqlens": (torch.arange(batch + 1, device=dev) * c).to(torch.int32),
            "context_lens": torch.full((batch,), m, dtype=torch.int32, device=dev),
            "seq_lens": torch.full((batch,), n, dtype=torch.int32, device=dev), "batch": batch, "m": m, "c": c}


def _dense_kv(x: dict[str, Any]) -> tuple[Any, Any]:
    """K, V as [batch, kv heads, m + c, head_dim], the layout SDPA reads."""
    n = x["m"] + x["c"]
    idx = x["block_table"].long()
    k = x["k_cache"][idx].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    v = x["v_cache"][idx].flatten(1, 2)[:, :n].transpose(1, 2).contiguous()
    return k, v


def _inputs(ctx: Ctx, case: Case, seed: int = 0) -> dict[str, Any]:
    import torch

    hq, hkv, d = TINY_HEADS if ctx.tiny else FULL_HEADS
    dev, dt = ctx.device, ctx.torch_dtype
    gen = torch.Generator(device=dev).manual_seed(seed)
    if case.op == "prefill":
        return _paged(ctx, *case.shape, seed)
    if case.op == "decode":
        return _paged(ctx, case.shape[0], case.shape[1] - 1, 1, seed)
    if case.op in ("merge", "merge2"):
        tokens, states = (case.shape[0], case.shape[1]) if case.op == "merge" else (case.shape[0], 2)
        o_dtype = torch.float32 if case.op == "merge" else dt          # decode partials are float32; KVP shards not
        o = torch.randn(tokens, states, hq, d, generator=gen, device=dev).to(o_dtype)
        lse = torch.randn(tokens, states, hq, generator=gen, device=dev) * 3
        lse[:, -1, ::3] = float("-inf")                                 # some empty states
        return {"o": o, "lse": lse}
    n, seg, levels, p = case.shape
    return {"q": torch.randn(n, hq, d, generator=gen, device=dev, dtype=dt),
            "k": torch.randn(n, hkv, d, generator=gen, device=dev, dtype=dt),
            "v": torch.randn(n, hkv, d, generator=gen, device=dev, dtype=dt),
            "importance": torch.rand(hq, n, generator=gen, device=dev), "args": (seg, levels, p)}


# ---------------------------------------------------------------- kernel, reference, SDPA per op

def _kernel(case: Case, x: dict[str, Any]):
    """A call of the kernel's public wrapper returning (o, lse)."""
    from infermax.kernels.csa import csa_attention
    from infermax.kernels.decode_attention import decode_attention
    from infermax.kernels.merge import merge_states, merge_states_multi
    from infermax.kernels.prefill_attention import prefill_attention

    if case.op == "prefill":
        return lambda: prefill_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["cu_seqlens"],
                                         x["context_lens"], return_lse=True, backend="triton", max_query_len=x["c"])
    if case.op == "decode":
        return lambda: decode_attention(x["q"], x["k_cache"], x["v_cache"], x["block_table"], x["seq_lens"],
                                        return_lse=True, backend="triton")
    if case.op == "merge":
        return lambda: merge_states_multi(x["o"], x["lse"], backend="triton")
    if case.op == "merge2":
        o, lse = x["o"], x["lse"]
        return lambda: merge_states(o[:, 0], lse[:, 0], o[:, 1], lse[:, 1], backend="triton")
    return lambda: csa_attention(x["q"], x["k"], x["v"], x["importance"], *x["args"], return_lse=True,
                                 backend="triton")


def _reference(case: Case, x: dict[str, Any]):
    """(o, lse) in float32 from the same inputs."""
    import torch

    from infermax.kernels.csa import csa_attention_reference
    from infermax.kernels.merge import merge_states_multi_reference
    from infermax.kernels.paged import gather_kv
    from infermax.kernels.reference import attention_with_lse, causal_mask

    if case.op in ("prefill", "decode"):
        m, c, outs = x["m"], x["c"], []
        for i in range(x["batch"]):
            k, v = gather_kv(x["k_cache"], x["v_cache"], x["block_table"][i], m + c)
            mask = causal_mask(c, m + c, offset=m, device=k.device)
            outs.append(attention_with_lse(x["q"][i * c:(i + 1) * c], k, v, mask))
        return torch.cat([o for o, _ in outs]), torch.cat([lse for _, lse in outs])
    if case.op in ("merge", "merge2"):
        return merge_states_multi_reference(x["o"].float(), x["lse"])
    return csa_attention_reference(x["q"], x["k"], x["v"], x["importance"], *x["args"])


def _sdpa(case: Case, x: dict[str, Any]) -> tuple[str, Any]:
    """(label, call returning o in the kernel's layout) for SDPA on the flash backend, or (reason, None).

    Tries native GQA first, then K/V expanded to the query heads (which reads group-times more KV)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    if case.op in ("merge", "merge2"):
        return "no SDPA equivalent", None
    if case.op == "csa":        # what CSA saves: dense causal attention over every key
        q, k, v = (t.transpose(0, 1).unsqueeze(0) for t in (x["q"], x["k"], x["v"]))
        batch, c, mask = 1, q.shape[2], None
    else:
        batch, c = x["batch"], x["c"]
        q = x["q"].view(batch, c, *x["q"].shape[1:]).transpose(1, 2)
        k, v = x.get("dense") or _dense_kv(x)
        x["dense"] = (k, v)
        mask = causal_lower_right(c, k.shape[2]) if c > 1 else None
    group, causal, errors = q.shape[1] // k.shape[1], case.op == "csa", []

    def expanded():                      # built only if native GQA is refused (group-times the KV)
        k_x, v_x = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return lambda: _call(sdpa, q, k_x, v_x, mask, causal)

    variants = [("flash, native GQA", lambda: (lambda: _call(sdpa, q, k, v, mask, causal, True))),
                ("flash, KV expanded to the query heads", expanded)]
    for label, make in variants:
        fn = make()

        def run(fn=fn):
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return fn().transpose(1, 2).reshape(-1, q.shape[1], q.shape[3])
        try:
            run()
            return label, run
        except Exception as exc:             # noqa: BLE001 - whatever SDPA refuses with is the answer
            errors.append(f"{label}: {str(exc).splitlines()[0][:160]}")
    return "flash unavailable: " + " | ".join(errors), None


def _call(sdpa, q, k, v, mask, is_causal: bool, gqa: bool = False):
    if is_causal:
        return sdpa(q, k, v, is_causal=True, enable_gqa=gqa)
    return sdpa(q, k, v, attn_mask=mask, enable_gqa=gqa)


# ---------------------------------------------------------------- steps

def correctness(ctx: Ctx) -> dict[str, Any]:
    """Step 1: one record per case, then a summary (all passed? worst rel error)."""
    import torch

    ctx.record("device", **device_info(ctx.device))
    tol_o, tol_lse = TOLERANCES[ctx.dtype]
    done, failed = 0, []
    for case in [c for c in cases(ctx.tiny) if c.check]:
        if ctx.time_left() < 0:
            ctx.record("skipped", case=case.name, reason="step budget spent")
            continue
        start = time.perf_counter()
        x = _inputs(ctx, case)
        o, lse = _kernel(case, x)()
        o_ref, lse_ref = _reference(case, x)
        err = (o.float() - o_ref).abs()
        finite = torch.isfinite(lse_ref)
        lse_err = float((lse[finite] - lse_ref[finite]).abs().max()) if finite.any() else 0.0
        same_inf = bool((torch.isfinite(lse) == finite).all())
        row = {"case": case.name, "max_abs": float(err.max()), "rel": float(err.max() / o_ref.abs().max()),
               "lse_max_abs": lse_err, "lse_empty_rows_match": same_inf, "tol_abs": tol_o, "tol_lse": tol_lse}
        label, sdpa = _sdpa(case, x)
        if sdpa is not None and case.op != "csa":
            row.update(sdpa_max_abs=float((sdpa().float() - o_ref).abs().max()), sdpa=label)
        row["passed"] = row["max_abs"] <= tol_o and lse_err <= tol_lse and same_inf
        row["seconds"] = round(time.perf_counter() - start, 3)
        ctx.record("case", **row)
        done += 1
        failed += [] if row["passed"] else [case.name]
        del x, o, lse, o_ref, lse_ref, err
        _free(ctx)
    return {"cases": done, "failed": failed, "passed": done > 0 and not failed,
            "tolerance": {"o_max_abs": tol_o, "lse_max_abs": tol_lse, "dtype": ctx.dtype}}


def speed(ctx: Ctx) -> dict[str, Any]:
    """Step 2: kernel time beside SDPA (flash) and beside the physical limit, per case."""
    info = ctx.record("device", **device_info(ctx.device))
    timer = Timer(ctx.device, budget_s=0.0 if ctx.tiny else 0.4, min_reps=1 if ctx.tiny else 5)
    rows = []
    for case in cases(ctx.tiny):
        if ctx.time_left() < 0:
            ctx.record("skipped", case=case.name, reason="step budget spent")
            continue
        x = _inputs(ctx, case)
        kernel_s = timer(_kernel(case, x))
        label, sdpa = _sdpa(case, x)
        baseline_s = timer(sdpa) if sdpa is not None else None
        if case.op in ("merge", "merge2"):
            from infermax.kernels.merge import merge_states_multi_reference
            label, baseline_s = "torch reference (no SDPA equivalent)", timer(
                lambda x=x: merge_states_multi_reference(x["o"], x["lse"]))
        kind, amount = _work(ctx, case, x)
        peak = info["peak_flops"] if kind == "flops" else info["hbm_bytes_per_s"]
        limit_s = amount / peak if peak else None
        row = {"case": case.name, "kernel_ms": kernel_s * 1e3, "baseline": label,
               "baseline_ms": None if baseline_s is None else baseline_s * 1e3,
               "kernel_over_baseline": None if baseline_s is None else kernel_s / baseline_s,
               "limit": f"{kind} / {'peak' if kind == 'flops' else 'HBM bandwidth'}", "work": amount,
               "limit_ms": None if limit_s is None else limit_s * 1e3,
               "kernel_over_limit": None if limit_s is None else kernel_s / limit_s,
               "baseline_over_limit": None if limit_s is None or baseline_s is None else baseline_s / limit_s}
        rows.append(ctx.record("case", **row))
        del x
        _free(ctx)
    return {"cases": len(rows), "spec": info["spec"], "peak_flops": info["peak_flops"],
            "hbm_bytes_per_s": info["hbm_bytes_per_s"]}


def _work(ctx: Ctx, case: Case, x: dict[str, Any]) -> tuple[str, float]:
    """("flops", FLOPs) or ("bytes", bytes moved) of the case, the physical limit's numerator."""
    hq, hkv, d = TINY_HEADS if ctx.tiny else FULL_HEADS
    elem = x["o"].element_size() if "o" in x else x["q"].element_size()
    if case.op == "prefill":
        pairs = x["batch"] * (x["c"] * x["m"] + x["c"] * (x["c"] + 1) / 2)
        return "flops", 4.0 * hq * d * pairs                       # QK^T and PV, 2 FLOPs per multiply-add
    if case.op == "decode":
        n = x["m"] + x["c"]
        return "bytes", x["batch"] * (2 * n * hkv * d + 2 * hq * d) * elem
    if case.op in ("merge", "merge2"):
        tokens, states = x["lse"].shape[:2]
        return "bytes", tokens * hq * (states * (d * elem + 4) + d * elem + 4)
    from infermax.costmodel.communication import csa_kv_fractions

    n, seg, levels, p = case.shape
    return "flops", 4.0 * hq * d * csa_kv_fractions(n, seg, levels, p).attended * n * (n + 1) / 2


def _free(ctx: Ctx) -> None:
    if ctx.cuda:
        import torch

        torch.cuda.empty_cache()


# ---------------------------------------------------------------- report

def _f(x, spec: str = ".3g") -> str:
    return "-" if x is None or isinstance(x, str) else format(x, spec)


def format_correctness(records: list[dict]) -> list[str]:
    summary = next((r for r in records if r["kind"] == "summary"), {})
    tol = summary.get("tolerance") or {}
    lines = [f"tolerance ({tol.get('dtype', '?')}): max abs <= {tol.get('o_max_abs')}, lse max abs <= "
             f"{tol.get('lse_max_abs')}; rel = max abs / max |reference|; sdpa = flash SDPA's max abs vs the same "
             f"float32 reference",
             f"{'case':<30}{'max_abs':>10}{'rel':>10}{'lse_abs':>10}{'sdpa_abs':>10}{'s':>7}  pass"]
    for r in records:
        if r["kind"] == "case":
            lines.append(f"{r['case']:<30}{_f(r['max_abs']):>10}{_f(r['rel']):>10}{_f(r['lse_max_abs']):>10}"
                         f"{_f(r.get('sdpa_max_abs')):>10}{r['seconds']:>7.1f}  {'yes' if r['passed'] else 'NO'}")
        elif r["kind"] == "skipped":
            lines.append(f"{r['case']:<30}skipped: {r['reason']}")
    if summary:
        lines.append(f"all passed: {summary['passed']} ({summary['cases']} cases; "
                     f"failed: {summary['failed'] or 'none'})")
    return lines


def format_speed(records: list[dict]) -> list[str]:
    lines = ["ratios > 1: slower than the baseline / the physical limit (decode, merge: bytes / HBM bandwidth; "
             "prefill, csa: FLOPs / peak); baseline: SDPA flash (merge: the torch reference)",
             f"{'case':<30}{'kernel_ms':>10}{'base_ms':>10}{'k/base':>10}{'limit_ms':>10}{'k/limit':>10}"
             f"{'base/lim':>10}  baseline"]
    for r in records:
        if r["kind"] == "case":
            cells = (r["kernel_ms"], r["baseline_ms"], r["kernel_over_baseline"], r["limit_ms"],
                     r["kernel_over_limit"], r["baseline_over_limit"])
            lines.append(f"{r['case']:<30}" + "".join(f"{_f(x):>10}" for x in cells) + f"  {r['baseline']}")
        elif r["kind"] == "skipped":
            lines.append(f"{r['case']:<30}skipped: {r['reason']}")
    return lines


def plot(correct: dict | None, fast: dict | None, path) -> None:
    """Error / tolerance per case, and kernel and SDPA time / physical limit per case (log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_err, ax_speed) = plt.subplots(1, 2, figsize=(14, 5))
    rows = [r for r in (correct or {}).get("records", []) if r["kind"] == "case"]
    if rows:
        ax_err.barh([r["case"] for r in rows], [max(r["max_abs"] / r["tol_abs"], 1e-6) for r in rows])
        ax_err.axvline(1.0, color="red", lw=1)
        ax_err.set(xscale="log", xlabel="max abs error / tolerance (pass < 1)", title="kernels correct")
    rows = [r for r in (fast or {}).get("records", []) if r["kind"] == "case" and r["kernel_over_limit"]]
    if rows:
        y = range(len(rows))
        ax_speed.barh([i + 0.2 for i in y], [r["kernel_over_limit"] for r in rows], height=0.4, label="kernel")
        ax_speed.barh([i - 0.2 for i in y], [r["baseline_over_limit"] or 0 for r in rows], height=0.4,
                      label="baseline (SDPA flash / torch)")
        ax_speed.set_yticks(list(y), [r["case"] for r in rows])
        ax_speed.axvline(1.0, color="red", lw=1)
        ax_speed.set(xscale="log", xlabel="time / physical limit", title="kernels fast")
        ax_speed.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
