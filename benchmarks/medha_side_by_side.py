"""Medha as its authors released it, side by side: Vidur 0.0.26's ``mnemosyne_<order>`` against
infermax's ``mnemosyne-<order>`` (schedulers/mnemosyne.py) and ``medha`` (Medha §4), all three
timed by Vidur's own linear-regression predictor (:class:`vidur_harness.VidurSetup`: A100,
Llama-3-8B, TP 1, M = 399,360 KV tokens in blocks of 16, at most 128 requests, target batch time
0.05 s).

Per long-context mix and order: the share of Vidur's batches that infermax's variant reproduces
exactly (the same requests with the same tokens, batch by batch, up to the first difference: a
batch is identical only if every batch before it was), evictions, and the median / p99 TTFT and
TPOT of the short and the long requests on each side (TPOT = (completion - first token) / (O - 1),
requests with O > 1).

    python benchmarks/medha_side_by_side.py [--orders lrs,fcfs,edf] [--mixes a,b,c] [--cache DIR]
        [--num-blocks 24960] [--ordered-batches] [--json-out FILE]

Mix ``e`` (decode-heavy, with ``--num-blocks 12000``) evicts; there Vidur's batch keeps its requests in
a ``set``, so the decode it evicts depends on object addresses, and the two part at the first
eviction unless ``--ordered-batches`` keeps Vidur's batches in join order.

Skips with a message when vidur is not installed. The first run trains Vidur's predictor
(minutes) into the cache folder; later runs load it.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from vidur_harness import VidurCost, VidurSetup, run_vidur, shared_predictor, vidur_available

from infermax import Limits, Workload, simulate
from infermax.workloads.long import medha_mix

MEDHA_CHUNK_TOKENS = 4096      # medha's prefill tokens per batch (§3.3; Vidur's predictor stops at 4096-token chunks)
# name -> (B, long share, long prompt range, arrival rate per s, seed)
MIXES = {
    "t": (30, 0.1, (8_000, 16_000), 2.0, 5),     # a tiny one, to try the harness
    "a": (200, 0.05, (131_000, 131_072), 1.0, 0),   # the mix: ~10 prompts of 128K
    "b": (200, 0.10, (32_000, 64_000), 2.0, 1),
    "c": (200, 0.05, (64_000, 128_000), 0.5, 2),
    "d": (60, 0.5, (96_000, 128_000), 2.0, 3),      # half of them long
    "e": "fixed:I=2048,O=3000,B=120,rate=4,seed=1",  # decode-heavy: the KV cache runs out (evictions)
}


def mix(name: str) -> Workload:
    if isinstance(MIXES[name], str):
        return Workload.from_spec(MIXES[name])
    B, frac, (lo, hi), rate, seed = MIXES[name]
    w = medha_mix(B, long_frac=frac, lo=lo, hi=hi, rate_per_s=rate, seed=seed)
    t0 = float(w.arrivals_s.min())      # both sides start their clocks at the first arrival
    return Workload(requests=tuple(dataclasses.replace(r, arrival_s=r.arrival_s - t0) for r in w.requests),
                    name=f"mix-{name}")


def identical_prefix(vidur: list[tuple[np.ndarray, np.ndarray]], ours) -> int:
    """How many leading batches agree (as {request: tokens})."""
    k = 0
    for (vi, vt), b in zip(vidur, ours):
        if dict(zip(vi.tolist(), vt.tolist())) != dict(zip(b.idx.tolist(), b.tok.tolist())):
            break
        k += 1
    return k


def latencies(w: Workload, first: np.ndarray, done: np.ndarray) -> dict[str, float]:
    long = np.array([r.tag == "long" for r in w.requests])
    ttft = first - w.arrivals_s
    multi = w.output_lens > 1
    tpot = np.where(multi, (done - first) / np.maximum(w.output_lens - 1, 1), np.nan)
    out = {}
    for group, mask in (("short", ~long), ("long", long)):
        if not mask.any():
            out.update({f"{group}_{k}": float("nan") for k in ("ttft_p50", "ttft_p99", "tpot_p50", "tpot_p99")})
            continue
        out[f"{group}_ttft_p50"] = float(np.median(ttft[mask]))
        out[f"{group}_ttft_p99"] = float(np.percentile(ttft[mask], 99))
        t = tpot[mask & multi]
        out[f"{group}_tpot_p50"] = float(np.median(t)) if t.size else float("nan")
        out[f"{group}_tpot_p99"] = float(np.percentile(t, 99)) if t.size else float("nan")
    return out


class _Batches:
    """An infermax schedule's batches as workload indices and tokens."""

    def __init__(self, schedule, w: Workload) -> None:
        self.items = [type("B", (), {"idx": w.indices_of(b.ids), "tok": np.asarray(b.tokens)}) for b in schedule]

    def __iter__(self):
        return iter(self.items)


def side_by_side(name: str, order: str, setup: VidurSetup, cost: VidurCost) -> dict:
    w = mix(name)
    lim = Limits(M=setup.num_blocks * setup.block_size, C=10**7, P=10**7, R_max=setup.batch_size_cap,
                 block_size=setup.block_size)
    t0 = time.perf_counter()
    v = run_vidur(w, order, setup)
    t_vidur = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = simulate(w, f"mnemosyne-{order}:target_batch_s={setup.target_batch_time_s}", lim, cost)
    medha = simulate(w, f"medha:target_batch_s={setup.target_batch_time_s},R_max={setup.batch_size_cap}",
                     lim.replace(P=MEDHA_CHUNK_TOKENS), cost)
    t_ours = time.perf_counter() - t0
    req = ours.trace.requests
    same = identical_prefix(v.batches, _Batches(ours.schedule, w))
    return {"mix": name, "order": order, "n_long": int(sum(r.tag == "long" for r in w.requests)),
            "vidur_batches": len(v.batches), "ours_batches": len(ours.schedule),
            "identical_pct": 100.0 * same / max(len(v.batches), 1),
            "vidur_restarts": int(v.num_restarts.sum()), "ours_evictions": int(ours.metrics["num_evictions"]),
            "vidur": latencies(w, v.first_token_s, v.completion_s),
            "ours": latencies(w, req["first_token_s"], req["completion_s"]),
            "medha": latencies(w, medha.trace.requests["first_token_s"], medha.trace.requests["completion_s"]),
            "wall_vidur_s": t_vidur, "wall_ours_s": t_ours}


def _print(rows: list[dict]) -> None:
    print(f"{'mix':>3} {'order':>5} {'long':>4} {'batches V/i':>13} {'identical %':>11} {'evict V/i':>9}")
    for r in rows:
        print(f"{r['mix']:>3} {r['order']:>5} {r['n_long']:>4} {r['vidur_batches']:>6}/{r['ours_batches']:<6} "
              f"{r['identical_pct']:>11.1f} {r['vidur_restarts']:>4}/{r['ours_evictions']:<4}")
    keys = ["short_ttft_p50", "short_ttft_p99", "short_tpot_p50", "short_tpot_p99",
            "long_ttft_p50", "long_ttft_p99", "long_tpot_p50", "long_tpot_p99"]
    print(f"\n{'mix':>3} {'order':>5} {'side':>16} " + " ".join(f"{k:>14}" for k in keys))
    for r in rows:
        for side in ("vidur", "ours", "medha"):
            label = {"vidur": "vidur mnemosyne", "ours": "infermax variant", "medha": "infermax medha"}[side]
            print(f"{r['mix']:>3} {r['order']:>5} {label:>16} " + " ".join(f"{r[side][k]:>14.4f}" for k in keys))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--orders", default="lrs,fcfs,edf")
    ap.add_argument("--mixes", default="a,b,c")
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "infermax-vidur"))
    ap.add_argument("--json-out", help="write the rows here (JSON) after each one")
    ap.add_argument("--ordered-batches", action="store_true", help="patch Vidur's KVParallelBatch to keep its "
                    "requests in the order they joined (the wheel keeps a set: eviction victims by object address)")
    ap.add_argument("--num-blocks", type=int, default=VidurSetup.num_blocks, help="KV blocks of 16 tokens "
                    "(default 24,960: M = 399,360)")
    args = ap.parse_args()
    if not vidur_available():
        print("vidur is not installed (pip install vidur==0.0.26): skipping the side by side")
        return
    setup = VidurSetup(cache_dir=args.cache, num_blocks=args.num_blocks, ordered_batches=args.ordered_batches)
    cost = VidurCost(shared_predictor(setup))
    rows = []
    for name in args.mixes.split(","):
        for order in args.orders.split(","):
            rows.append(side_by_side(name, order, setup, cost))
            r = rows[-1]
            if args.json_out:
                Path(args.json_out).write_text(json.dumps(rows, indent=1))
            print(f"# mix {name} {order}: {r['identical_pct']:.1f} % identical, vidur {r['wall_vidur_s']:.0f} s, "
                  f"infermax {r['wall_ours_s']:.0f} s", flush=True)
    _print(rows)


if __name__ == "__main__":
    main()
