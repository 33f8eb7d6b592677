"""Simulator speed.

Default mode, the paper's heaviest cell: B=1024, I=O=1024, M=100K, C=4096.
Prints, per scheduler, wall time, simulated batches/s and requests/s, and the
speed-up over a baseline run *in the same process*: the same simulator with the
decode fast-forward turned off (one scheduler decision per batch, as a
conventional simulator does). Target (issue 2): under 0.7 s per scheduler.

``--scale`` (issue 19): an online Poisson workload (I=512, O=256, 7 requests/s,
M=100K, C=4096) at B = 1K, 10K, 100K, 1M requests, the schedule streamed to a
temporary file (``simulate(..., schedule_path=...)``). Per B and scheduler: CPU
and wall time of the simulation, CPU time per batch and its ratio to B = 1K (the
cost of a batch should not depend on the trace length), the active-set size
(mean and max running, max waiting: a growing queue would mean the replica is
overloaded) and the peak RSS of the process so far (B grows, so it is the peak
of the largest run). The first size is run --repeat times (best kept) after a
warm-up run; the others once.

``--cells`` (issue 41): the cells of the side by side with Vidur, each with the plain scheduler and its
``-real`` preset: CPU µs per batch of the whole ``simulate`` call (workload parsing and metrics included),
the preset/plain ratio, and — with ``--baseline-python PY`` — the same for another checkout's code (the
interpreter whose ``infermax`` is that checkout, e.g. the system python of /work/main), alternated with
this one repetition by repetition (each repetition of each side a fresh process, run from /tmp): the
before/after ratio per cell, median and min-max of the paired repetitions.

    python benchmarks/simulate_bench.py [--repeat 3] [--workload SPEC]
    python benchmarks/simulate_bench.py --scale [--sizes 1K,10K,100K,1M] [--schedulers vllm,sarathi]
    python benchmarks/simulate_bench.py --cells [--repeat 3] [--baseline-python /usr/bin/python3]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from infermax import Limits, Workload, simulate
from infermax.types import parse_count

SCALE_SPEC = "fixed:I=512,O=256,B={B},rate=7"


def best_of(repeat: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def default(args) -> None:
    w = Workload.from_spec(args.workload)
    lim = Limits(M=100_000, C=4096)
    print(f"workload {w.name}  limits {lim.to_dict()}  best of {args.repeat}")
    print(f"{'scheduler':>12} {'wall_s':>8} {'batches':>8} {'batches/s':>10} {'requests/s':>11} "
          f"{'baseline_s':>10} {'speedup':>8}")
    for name in (args.schedulers or "vllm,sarathi,vllm-ef,sarathi-ef").split(","):
        wall, res = best_of(args.repeat, lambda: simulate(w, name, lim))
        base, ref = best_of(1, lambda: simulate(w, name, lim, fast_forward=False))
        assert ref.trace == res.trace, "fast-forward changed the result"
        nb = res.metrics["num_batches"]
        print(f"{name:>12} {wall:8.3f} {nb:8d} {nb / wall:10.0f} {len(w) / wall:11.0f} {base:10.3f} "
              f"{base / wall:7.1f}x")


def _waiting_max(trace) -> int:
    """Most requests arrived but not yet scheduled at any batch start (the queue)."""
    r, starts = trace.requests, trace.batches["start_s"]
    arrived = np.searchsorted(np.sort(r["arrival_s"]), starts, "right")
    scheduled = np.searchsorted(np.sort(r["first_scheduled_s"]), starts, "right")
    return int((arrived - scheduled).max())


def scale(args) -> None:
    sizes = [parse_count(s, "--sizes") for s in args.sizes.split(",")]
    names = (args.schedulers or "vllm,sarathi").split(",")
    lim = Limits(M=100_000, C=4096)
    print(f"workload {SCALE_SPEC}  limits {lim.to_dict()}  schedule streamed to "
          f"{args.schedule_to or 'a temporary file'}")
    print(f"{'B':>9} {'scheduler':>9} {'load_s':>7} {'cpu_s':>8} {'wall_s':>8} {'batches':>9} "
          f"{'us/batch':>8} {'vs 1st':>6} {'run_mean':>8} {'run_max':>7} {'wait_max':>8} {'rss_GB':>6}")
    first: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = args.schedule_to or os.path.join(tmp, "schedule.json")
        warm = Workload.from_spec(SCALE_SPEC.format(B=min(sizes)))
        for name in names:     # imports, cost-model and compiled-loop loading: not part of any measured run
            simulate(warm, name, lim, schedule_path=path, compiled=True)
        for B in sizes:
            t0 = time.perf_counter()
            w = Workload.from_spec(SCALE_SPEC.format(B=B))
            load = time.perf_counter() - t0
            for name in names:
                cpu, wall = float("inf"), float("inf")
                for _ in range(args.repeat if B == sizes[0] else 1):   # the reference size: best of --repeat
                    c0, t0 = time.process_time(), time.perf_counter()
                    res = simulate(w, name, lim, schedule_path=path)
                    cpu, wall = min(cpu, time.process_time() - c0), min(wall, time.perf_counter() - t0)
                nb = res.metrics["num_batches"]
                per = cpu / nb * 1e6
                first.setdefault(name, per)
                rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20   # KiB on Linux
                b = res.trace.batches
                print(f"{B:9d} {name:>9} {load:7.2f} {cpu:8.2f} {wall:8.2f} {nb:9d} {per:8.1f} "
                      f"{per / first[name]:5.2f}x {b['num_running'].mean():8.1f} {int(b['num_running'].max()):7d} "
                      f"{_waiting_max(res.trace):8d} {rss:6.2f}", flush=True)
                del res
            del w


#: (cell, workload, limits, plain scheduler, its preset): issue 41's cells. The conversation trace (5.6 requests/s
#: as recorded) is compressed to 4/s (time_scale = 4 / 5.595); C = 16384 admits its longest prompt (14,050 tokens)
#: whole, as the plain vLLM needs.
CELLS = [("vLLM B=1024 I=O=1024", "fixed:I=1024,O=1024,B=1024", "M=100000,C=4096", "vllm:R_max=512",
          "vllm-real:R_max=512"),
         ("Sarathi-512 B=1024 I=O=1024", "fixed:I=1024,O=1024,B=1024", "M=100000,C=4096", "sarathi:R_max=512",
          "sarathi-real:R_max=512"),
         ("vLLM B=1024 I=256 O=32", "fixed:I=256,O=32,B=1024", "M=100000,C=4096", "vllm", "vllm-real"),
         ("vLLM conv 10K @ 4/s", "trace:splitwise_conv,n=10000,time_scale=0.715", "M=100000,C=16384", "vllm",
          "vllm-real"),
         ("Sarathi-512 conv 10K @ 4/s", "trace:splitwise_conv,n=10000,time_scale=0.715", "M=100000,C=16384",
          "sarathi", "sarathi-real")]


def worker(runs: list[list[str]]) -> None:
    """One repetition: each (workload, limits, scheduler) once, after a warm-up (imports, the cost model); prints
    {"workload|limits|scheduler": [CPU s of the whole simulate call, batches]} as JSON."""
    try:
        simulate("fixed:I=64,O=8,B=8", "vllm", "M=10000,C=4096", compiled=True)     # (numba's code loaded, once)
    except TypeError:       # (a --baseline-python from before the compiled loop)
        simulate("fixed:I=64,O=8,B=8", "vllm", "M=10000,C=4096")
    out, res = {}, None
    for spec, limits, name in runs:
        res = None          # the last run's result freed, and its garbage collected, before the clock starts
        gc.collect()
        c0 = time.process_time()
        res = simulate(spec, name, limits)
        cpu = time.process_time() - c0
        out["|".join((spec, limits, name))] = [cpu, int(res.metrics["num_batches"])]
    print(json.dumps(out))


def _repetition(python: str, runs: list[list[str]]) -> dict[str, list]:
    done = subprocess.run([python, os.path.abspath(__file__), "--worker", json.dumps(runs)], cwd=tempfile.gettempdir(),
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def cells(args) -> None:
    runs = [[spec, lim, name] for _, spec, lim, plain, preset in CELLS for name in (plain, preset)]
    sides = {"after": sys.executable, **({"before": args.baseline_python} if args.baseline_python else {})}
    got: dict[str, list[dict[str, list]]] = {side: [] for side in sides}
    for r in range(args.repeat):       # alternated, the order flipped every repetition
        for side in (sorted(sides) if r % 2 else sorted(sides, reverse=True)):
            got[side].append(_repetition(sides[side], runs))
            print(f"  repetition {r + 1}/{args.repeat}: {side} done", file=sys.stderr, flush=True)

    def per_batch(side: str, key: str) -> list[float]:
        return [rep[key][0] / rep[key][1] * 1e6 for rep in got[side]]

    print(f"CPU us per batch, whole simulate call, median of {args.repeat} (this code: {sys.executable}"
          + (f"; before: {args.baseline_python}" if args.baseline_python else "") + ")")
    head = f"{'cell':>28} {'scheduler':>24} {'batches':>8} {'after':>7}"
    if "before" in sides:
        head += f" {'before':>7} {'speed-up (min-max)':>20}"
    print(head)
    for cell, spec, lim, plain, preset in CELLS:
        for name in (plain, preset):
            key = "|".join((spec, lim, name))
            after = per_batch("after", key)
            line = f"{cell:>28} {name:>24} {got['after'][0][key][1]:8d} {statistics.median(after):7.1f}"
            if "before" in sides:
                before = per_batch("before", key)
                ratios = [b / a for b, a in zip(before, after)]
                line += (f" {statistics.median(before):7.1f} {statistics.median(ratios):7.2f}x "
                         f"({min(ratios):.2f}-{max(ratios):.2f})")
            print(line)
        for side in sides:
            ratio = [p / q for p, q in zip(per_batch(side, "|".join((spec, lim, preset))),
                                           per_batch(side, "|".join((spec, lim, plain))))]
            print(f"{cell:>28} {'preset/plain (' + side + ')':>24} {'':>8} {statistics.median(ratio):6.2f}x "
                  f"({min(ratio):.2f}-{max(ratio):.2f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", default="fixed:I=1024,O=1024,B=1024")
    ap.add_argument("--schedulers", default=None, help="comma-separated (default: vllm,sarathi,vllm-ef,sarathi-ef; "
                                                       "with --scale vllm,sarathi)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", action="store_true", help="time per batch against the trace length (issue 19)")
    ap.add_argument("--sizes", default="1K,10K,100K,1M", help="with --scale: numbers of requests")
    ap.add_argument("--schedule-to", default=None, help="with --scale: stream the schedule to this path instead of a "
                    "temporary file (/dev/null: the simulator's own cost, without the file system's: 1M requests "
                    "write 2.4 GB)")
    ap.add_argument("--cells", action="store_true", help="issue 41's cells: plain and -real presets, CPU per batch")
    ap.add_argument("--baseline-python", default=None,
                    help="with --cells: an interpreter whose infermax is the code to compare with (before)")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        worker(json.loads(args.worker))
    elif args.cells:
        cells(args)
    else:
        scale(args) if args.scale else default(args)


if __name__ == "__main__":
    main()
