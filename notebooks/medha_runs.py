"""Notebook 09's runs: Medha's 3D parallelism (Medha §3.3–3.5, §5.3) executed by the cluster engine.

Every number is a cluster run (:func:`infermax.cluster.simulate_cluster`) whose replica executes its plan
stage by stage and KVP group by group (:mod:`infermax.cluster.plans`); nothing here is a formula. Each
function returns one block of the results table (column ``experiment``):

- ``kvp``: TPOT of one request decoding at 4M / 10M tokens of context, Llama-3 8B, TP 8, SPP 4, KVP 1/2/4
  (Fig. 11); its KV spread over every KVP group (the default per-group limit: the request's KV / kvp);
- ``spp``: TTFT of one prompt of 1M / 10M tokens in 4K chunks, TP 8, SPP 1..16 (Fig. 9); plans whose groups
  cannot hold the prompt are rows with ``feasible = False`` (the engine's ValueError, the paper's red crosses);
- ``spp_decode``: TPOT at 2M tokens, TP 8, SPP 1..16 (Fig. 10);
- ``prefill_128``: one 1M-token prompt on 128 H100s (TP 8 × 16): SPP 16 (executed), plain PP 16 (executed,
  the ``medha-3d-pp`` ablation: a chunk waits for its predecessor to leave the last stage) and context
  parallelism (ring SP 16, priced by the cost model's ring term, the prompt in one pass) (Figs. 7–8);
- ``tradeoff``: a long prompt prefilled in fixed chunks (Sarathi, P = chunk) beside short requests decoding,
  TP 4, SPP 4, KVP 1/2/4: the long request's TTFT and the short ones' TPOT (Fig. 13);
- ``3d``: Llama-3 70B on 64 H100s, 2D (TP 8, SPP 8) vs 3D (TP 8, SPP 4, KVP 2), a mixed trace with 5 % of
  2M-token requests under the medha policies (Figs. 17–18), each replica running the ``medha`` scheduler
  (and, for comparison, Sarathi with static 4K chunks).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from infermax.cluster import simulate_cluster
from infermax.types import Request, Workload

LONG_AFTER_S = 0.5       # tradeoff: the long prompt arrives once the short requests decode


def cluster(model: str, tp: int, spp: int = 1, kvp: int = 1) -> str:
    nodes = max(1, tp * spp * kvp // 8)
    parts = [f"h100:nodes={nodes},gpus_per_node=8,model={model},tp={tp}"]
    parts += [f"spp={spp}"] if spp > 1 else []
    parts += [f"kvp={kvp}"] if kvp > 1 else []
    return ",".join(parts)


def one_request(model: str, tp: int, spp: int, kvp: int, prompt: int, output: int, chunk: int,
                policy: str = "medha-3d") -> dict:
    """One request alone on the plan, prefilled in ``chunk``-token chunks (Sarathi, P = chunk)."""
    spec = cluster(model, tp, spp, kvp)
    row = {"model": model, "tp": tp, "spp": spp, "kvp": kvp, "context": prompt, "chunk": chunk, "cluster": spec}
    try:
        r = simulate_cluster(f"fixed:I={prompt},O={output},B=1", spec, policy, "sarathi-pc",
                             limits=f"C={prompt},P={chunk}")
    except ValueError as exc:
        return {**row, "feasible": False, "error": str(exc)[:200]}
    m = r.metrics
    return {**row, "feasible": True, "ttft_s": m["ttft_mean_s"], "tpot_s": m["tpot_mean_s"],
            "num_batches": m["num_batches"], "error": ""}


def kvp_runs(contexts=(4_000_000, 10_000_000), degrees=(1, 2, 4), chunk: int = 4096, output: int = 16):
    rows = [one_request("llama3-8b", 8, 4, k, n, output, chunk) for n in contexts for k in degrees]
    return pd.DataFrame(rows).assign(experiment="kvp")


def spp_runs(contexts=(1_000_000, 10_000_000), degrees=(1, 2, 4, 8, 16), chunk: int = 4096):
    rows = [one_request("llama3-8b", 8, p, 1, n, 2, chunk) for n in contexts for p in degrees]
    return pd.DataFrame(rows).assign(experiment="spp")


def spp_decode_runs(context: int = 2_000_000, degrees=(1, 2, 4, 8, 16), chunk: int = 16384, output: int = 16):
    rows = [one_request("llama3-8b", 8, p, 1, context, output, chunk) for p in degrees]
    return pd.DataFrame(rows).assign(experiment="spp_decode")


def prefill_128_runs(context: int = 1_000_000, chunk: int = 4096):
    rows = []
    for plan, policy, sched, extra, limits in (
            ("SPP 16", "medha-2d", "sarathi-pc", "spp=16", f"C={context},P={chunk}"),
            ("PP 16", "medha-3d-pp", "sarathi-pc", "spp=16", f"C={context},P={chunk}"),
            ("CP (ring SP 16)", "fifo", "vllm", "sp=16,sp_kind=ring", f"C={context},P={context}")):
        spec = f"h100:nodes=16,gpus_per_node=8,model=llama3-8b,tp=8,{extra}"
        r = simulate_cluster(f"fixed:I={context},O=2,B=1", spec, policy, sched, limits=limits)
        rows.append({"model": "llama3-8b", "tp": 8, "context": context, "plan": plan, "cluster": spec,
                     "feasible": True, "ttft_s": r.metrics["ttft_mean_s"], "num_batches": r.metrics["num_batches"],
                     "error": ""})
    return pd.DataFrame(rows).assign(experiment="prefill_128")


def tradeoff_runs(context: int = 1_000_000, chunks=(256, 512, 1024, 2048), degrees=(1, 2, 4),
                  num_short: int = 4, short_prompt: int = 1024):
    """``num_short`` short requests (at t = 0) that decode while a long prompt (arriving ``LONG_AFTER_S`` later,
    once they decode) prefills; the short ones' TPOT is measured over their batches during that prefill."""
    rows = []
    for k in degrees:
        for c in chunks:
            steps = -(-context // c) + 8                       # they decode through the whole prefill
            reqs = [Request(id=0, input_len=context, output_len=2, arrival_s=LONG_AFTER_S, tag="long")]
            reqs += [Request(id=1 + s, input_len=short_prompt, output_len=steps, tag="short") for s in range(num_short)]
            spec = cluster("llama3-8b", 4, 4, k)
            r = simulate_cluster(Workload(requests=tuple(reqs)), spec, "medha-3d", "sarathi-pc",
                                 limits=f"C={context + num_short},P={c}")
            req, b = r.trace.requests, r.trace.batches
            ttft = float(req["first_token_s"][0] - req["arrival_s"][0])
            during = (b["num_prefill_tokens"] > 0) & (b["num_requests"] > 1) & (b["start_s"] >= LONG_AFTER_S)
            short = np.diff(b["start_s"][during])           # one token of each short request per batch
            rows.append({"model": "llama3-8b", "tp": 4, "spp": 4, "kvp": k, "context": context, "chunk": c,
                         "cluster": spec, "feasible": True, "ttft_s": ttft, "tpot_s": float(np.mean(short)),
                         "tpot_p95_s": float(np.percentile(short, 95)),
                         "num_batches": r.metrics["num_batches"], "error": ""})
    return pd.DataFrame(rows).assign(experiment="tradeoff")


def mixed_trace(num_requests: int, qps: float, long_share: float = 0.05, long_prompt: int = 2_000_000,
                seed: int = 0) -> Workload:
    """Poisson arrivals at ``qps``; ``long_share`` of the requests have ``long_prompt`` tokens (tag long), the
    rest ShareGPT-like prompts and outputs (lognormal, medians 1K and 250 tokens)."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / qps, num_requests))
    num_long = max(1, round(long_share * num_requests))
    is_long = np.zeros(num_requests, dtype=bool)
    is_long[rng.choice(num_requests, num_long, replace=False)] = True
    prompts = np.clip(rng.lognormal(np.log(1000), 0.8, num_requests), 16, 16000).astype(int)
    outputs = np.clip(rng.lognormal(np.log(250), 0.6, num_requests), 8, 2000).astype(int)
    reqs = [Request(id=i, input_len=long_prompt if is_long[i] else int(prompts[i]), output_len=int(outputs[i]),
                    arrival_s=float(arrivals[i]), tag="long" if is_long[i] else "short") for i in range(num_requests)]
    return Workload(requests=tuple(reqs))


PLANS_2D_3D = (("2D (TP8, SPP8)", "medha-2d", 8, 1), ("3D (TP8, SPP4, KVP2)", "medha-3d", 4, 2))


def three_d_runs(num_requests: int = 100, qps: float = 1.75, long_prompt: int = 2_000_000,
                 schedulers=("sarathi-pc", "medha")):
    """Per replica scheduler: ``sarathi-pc`` (static 4K chunks, decode first) and ``medha`` (adaptive chunks
    under its 0.2 s batch-time target, slack priority)."""
    w = mixed_trace(num_requests, qps, long_prompt=long_prompt)
    rows = []
    for sched in schedulers:
        for name, policy, spp, kvp in PLANS_2D_3D:
            rows.append(_mixed_run(w, sched, name, policy, spp, kvp, qps, long_prompt))
    return pd.DataFrame(rows).assign(experiment="3d")


def _mixed_run(w: Workload, sched: str, name: str, policy: str, spp: int, kvp: int, qps: float,
               long_prompt: int) -> dict:
    spec = cluster("llama3-70b", 8, spp, kvp)
    r = simulate_cluster(w, spec, policy, sched, limits=f"C={long_prompt},P=4096")
    req = r.trace.requests
    tpot = (req["completion_s"] - req["first_token_s"]) / np.maximum(req["output_len"] - 1, 1)
    ttft = req["first_token_s"] - req["arrival_s"]
    return {"model": "llama3-70b", "tp": 8, "spp": spp, "kvp": kvp, "context": long_prompt, "plan": name,
            "scheduler": sched, "cluster": spec, "feasible": True, "qps": qps, "num_requests": len(w),
            "ttft_p50_s": float(np.median(ttft)), "ttft_p90_s": float(np.percentile(ttft, 90)),
            "tpot_p50_s": float(np.median(tpot)), "tpot_p90_s": float(np.percentile(tpot, 90)),
            "num_batches": r.metrics["num_batches"], "error": ""}
