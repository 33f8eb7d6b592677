"""Simulator speed side by side with Vidur 0.0.26 (issue 41): CPU per batch on the same workloads.

Cells (``simulate_bench.CELLS``, infermax's ``-real`` presets against Vidur's ``vllm`` / ``sarathi``
replica schedulers with chunk 512), plus the long-context mix (``medha_side_by_side`` mix ``a``:
200 requests, 7 of them ~128K tokens) with infermax's ``medha`` against Vidur's ``mnemosyne_lrs``.

Vidur runs at its fastest: its linear-regression predictor (trained once, then loaded from the
cache folder; :mod:`vidur_harness`), metrics, plots and Chrome trace off. Its batch cap is the
cell's ``R_max`` (512 where infermax has none: not binding at M = 100K), its KV the cell's M in
blocks of 16 with a 1 % watermark, its ``max_tokens_in_batch`` the cell's C. infermax uses its
default cost model on the cells; on the mix, ``medha`` is timed twice: with infermax's own
``a100/llama3-8b`` cost model (each simulator with its own cost model: the row the target is
judged on) and with Vidur's predictor (:class:`vidur_harness.VidurCost`, as the issue measured it:
Vidur's predictor calls dominate).

Each repetition runs every (cell, side) in a fresh process, the two sides alternated (the order
flipped every repetition). Per run: the loop's CPU time (Vidur: ``Simulator.run``; infermax: the
whole ``simulate`` call, workload parsing and metrics included) and the whole process's CPU time
(the child's user + sys: imports, Vidur's predictor loading, infermax's compiled code loading where a run uses it;
bytecode and numba's compiled code cached on both sides, after one unmeasured infermax run), each divided by that
side's own number of batches. Ratios are Vidur / infermax per batch, median and min-max over the paired
repetitions, with the target (loop ≥ 30×; the small cell, whole process ≥ 15×; the mix ≥ 10×).

    python benchmarks/vidur_speed.py [--reps 3] [--cells 0,1,2,3,4,mix] [--scale-conv 1.0] [--json-out F]

``--scale-conv f`` runs the conversation cells on the first ``f × 10,000`` requests (to save time on a
busy machine). Skips with a message when vidur is not installed.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

CACHE = str(Path.home() / ".cache" / "infermax-vidur")
MIX_TARGET_S = 0.05


def _cell_setup():
    from vidur_harness import VidurSetup
    # the cells' predictor: batches of up to 512 requests, whole prompts of up to 16K tokens (vLLM's C)
    return VidurSetup(cache_dir=CACHE, max_tokens=32 * 1024, max_batch_size=512, max_chunk=16 * 1024)


def cells(scale_conv: float) -> list[dict]:
    """The runs: per cell its workload, limits, infermax scheduler, Vidur scheduler and target."""
    from simulate_bench import CELLS
    out = []
    for k, (name, spec, limits, _plain, preset) in enumerate(CELLS):
        if "splitwise_conv" in spec and scale_conv != 1.0:
            spec = spec.replace("n=10000", f"n={int(10_000 * scale_conv)}")
            name = name.replace("10K", f"{int(10_000 * scale_conv) // 1000}K")
        sched = "sarathi" if preset.startswith("sarathi") else "vllm"
        r_max = int(preset.split("R_max=")[1]) if "R_max=" in preset else 512
        small = spec.startswith("fixed:I=256")
        out.append({"key": str(k), "name": name, "spec": spec, "limits": limits, "infermax": preset,
                    "vidur": sched, "R_max": r_max, "target": 15.0 if small else 30.0,
                    "judged": "whole" if small else "loop"})
    out.append({"key": "mix", "name": "long-context mix a (200, 7 x 128K)", "spec": "mix:a", "limits": "",
                "infermax": "medha", "vidur": "mnemosyne_lrs", "R_max": 128, "target": 10.0, "judged": "loop"})
    return out


# --- the workers (one run in this process; print one JSON line) ---------------------------------------
def _workload(cell: dict):
    if cell["spec"].startswith("mix:"):
        from medha_side_by_side import mix
        return mix(cell["spec"][4:])
    from infermax import Workload
    return Workload.from_spec(cell["spec"])


def run_infermax(cell: dict, cost: str) -> dict:
    from infermax import Limits, simulate
    # imports, the default cost model and, for the runs that use it (>= 500K tokens: not the small cell, judged on its
    # whole process), the compiled code (numba and its cache: the state's steps, Medha's planner on the mix), loaded
    # on first use: here, outside the loop, as Vidur's imports and its predictor's loading are
    if cell["judged"] == "loop":
        os.environ["INFERMAX_COMPILED"] = "1"
    try:
        simulate("fixed:I=64,O=8,B=8", "vllm", "M=10000,C=4096")
        if cell["key"] == "mix":
            simulate("fixed:I=64,O=8,B=8", "medha", "M=10000,C=4096")
    finally:
        os.environ.pop("INFERMAX_COMPILED", None)
    if cell["key"] == "mix":
        from medha_side_by_side import MEDHA_CHUNK_TOKENS
        from vidur_harness import VidurSetup
        w = _workload(cell)
        setup = VidurSetup(cache_dir=CACHE)
        lim = Limits(M=setup.num_blocks * setup.block_size, C=10**7, P=MEDHA_CHUNK_TOKENS, R_max=setup.batch_size_cap,
                     block_size=setup.block_size)
        if cost == "vidur":
            from vidur_harness import VidurCost, shared_predictor
            model = VidurCost(shared_predictor(setup))
        else:
            from infermax.costmodel import get_cost_model
            model = get_cost_model(cost)
        sched = f"medha:target_batch_s={MIX_TARGET_S},R_max={setup.batch_size_cap}"
        c0 = time.process_time()
        res = simulate(w, sched, lim, model)
    else:
        c0 = time.process_time()
        res = simulate(cell["spec"], cell["infermax"], cell["limits"])
    return {"loop_cpu_s": time.process_time() - c0, "batches": int(res.metrics["num_batches"])}


def run_vidur(cell: dict) -> dict:
    from vidur import config as vc
    from vidur.entities import Request
    from vidur.events import RequestArrivalEvent
    from vidur.scheduler.replica_stage_scheduler.replica_stage_schduler import ReplicaStageScheduler
    from vidur_harness import VidurSetup, make_simulator, patch_vidur, shared_predictor

    from infermax import Limits

    patch_vidur()
    cell_setup = _cell_setup()
    setup = VidurSetup(cache_dir=CACHE) if cell["key"] == "mix" else cell_setup
    predictor = shared_predictor(setup)        # loaded from the cache folder (trained on the first run ever)
    w = _workload(cell)
    if cell["key"] == "mix":
        num_blocks, max_batch = setup.num_blocks, None
        sched = vc.MnemosyneLRSSchedulerConfig(batch_size_cap=setup.batch_size_cap,
                                               target_batch_time=MIX_TARGET_S)
    else:
        lim = Limits.from_spec(cell["limits"])
        num_blocks, max_batch = lim.M // setup.block_size, lim.C
        cap = cell["R_max"]
        sched = (vc.VllmSchedulerConfig(batch_size_cap=cap, max_tokens_in_batch=max_batch) if cell["vidur"] == "vllm"
                 else vc.SarathiSchedulerConfig(batch_size_cap=cap, chunk_size=512))
    replica, _, _pred = setup.configs()
    cache = vc.CacheConfig(block_size=setup.block_size, num_blocks=num_blocks,
                           watermark_blocks_fraction=setup.watermark)
    out = f"/tmp/vidur_speed_{os.getpid()}"
    sim = make_simulator(setup, predictor, replica, sched, cache, _pred, out)
    sim._event_queue = []
    for t, i, o in zip(w.arrivals_s.tolist(), w.input_lens.tolist(), w.output_lens.tolist()):
        r = Request(arrived_at=float(t), num_prefill_tokens=int(i), num_decode_tokens=int(o))
        sim._add_event(RequestArrivalEvent(r.arrived_at, r))
    count = [0]
    shipped = ReplicaStageScheduler.on_schedule

    def on_schedule(self):                      # one Python call per batch: the count
        got = shipped(self)
        if got[0] is not None:
            count[0] += 1
        return got

    ReplicaStageScheduler.on_schedule = on_schedule
    c0 = time.process_time()
    sim.run()
    return {"loop_cpu_s": time.process_time() - c0, "batches": count[0]}


# --- the driver ----------------------------------------------------------------------------------------
#: the workers' environment: bytecode cached (as after any install; Vidur's wheel comes compiled, and an environment
#: that sets PYTHONDONTWRITEBYTECODE would charge infermax's whole process for compiling its sources every time)
_ENV = {**{k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}, "HF_HUB_OFFLINE": "1"}


def _child(side: str, cell: dict, cost: str) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(HERE / "vidur_speed.py"), "--worker", side, "--cost", cost,
                           json.dumps(cell)], capture_output=True, text=True, cwd="/tmp",
                          env=_ENV)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{side} worker failed on cell {cell['name']!r}:\n{done.stderr[-3000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    got["whole_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    got["whole_wall_s"] = wall
    return got


def _stats(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.1f}x ({min(xs):.1f}-{max(xs):.1f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--cells", default="0,1,2,3,4,mix", help="comma-separated cell keys (0-4, mix)")
    ap.add_argument("--scale-conv", type=float, default=1.0, help="share of the conversation trace's 10K requests")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--cost", default="default", help=argparse.SUPPRESS)
    ap.add_argument("cell", nargs="?", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        cell = json.loads(args.cell)
        print(json.dumps(run_vidur(cell) if args.worker == "vidur" else run_infermax(cell, args.cost)))
        return
    from vidur_harness import vidur_available
    if not vidur_available():
        print("vidur is not installed (pip install vidur==0.0.26): skipping the side by side with Vidur")
        return
    wanted = args.cells.split(",")
    todo = [c for c in cells(args.scale_conv) if c["key"] in wanted]
    sides = [("vidur", "-"), ("infermax", "default")]
    _child("infermax", todo[0], "default")       # unmeasured: compiles and caches infermax's bytecode
    runs: dict[tuple[str, str], list[dict]] = {}
    for cell in todo:
        extra = [("infermax", "a100/llama3-8b"), ("infermax", "vidur")] if cell["key"] == "mix" else []
        order = ([("vidur", "-")] + extra) if extra else sides
        for r in range(args.reps):
            for side, cost in (order if r % 2 == 0 else order[::-1]):
                got = _child(side, cell, cost)
                runs.setdefault((cell["key"], f"{side}:{cost}"), []).append(got)
                print(f"  {cell['name']} rep {r + 1} {side}:{cost}: {got['batches']} batches, loop "
                      f"{got['loop_cpu_s']:.2f} CPU s, whole {got['whole_cpu_s']:.2f} CPU s", file=sys.stderr,
                      flush=True)
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"|".join(k): v for k, v in runs.items()}, indent=1))

    def per(rs: list[dict], what: str) -> list[float]:
        return [r[f"{what}_cpu_s"] / r["batches"] * 1e6 for r in rs]

    print(f"CPU µs per batch, median of {args.reps} alternated repetitions (ratio: Vidur / infermax per batch, "
          f"median (min-max) over paired repetitions)")
    print(f"{'cell':>34} {'infermax':>34} {'batches V/i':>15} {'Vidur loop':>10} {'inf loop':>8} {'loop ratio':>19} "
          f"{'Vidur whole':>11} {'inf whole':>9} {'whole ratio':>19} {'target':>12} {'met':>4}")
    for cell in todo:
        v = runs[(cell["key"], "vidur:-")]
        rows = ([("infermax:a100/llama3-8b", "medha (a100/llama3-8b)"), ("infermax:vidur", "medha (Vidur's predictor)")]
                if cell["key"] == "mix" else [("infermax:default", cell["infermax"])])
        for key, label in rows:
            i = runs[(cell["key"], key)]
            ratios = {w: [a / b for a, b in zip(per(v, w), per(i, w))] for w in ("loop", "whole")}
            judged = statistics.median(ratios[cell["judged"]])
            judged_row = key != "infermax:vidur"
            met = ("yes" if judged >= cell["target"] else "no") if judged_row else "-"
            print(f"{cell['name']:>34} {label:>34} {v[0]['batches']:>7}/{i[0]['batches']:<7} "
                  f"{statistics.median(per(v, 'loop')):10.1f} {statistics.median(per(i, 'loop')):8.1f} "
                  f"{_stats(ratios['loop']):>19} {statistics.median(per(v, 'whole')):11.1f} "
                  f"{statistics.median(per(i, 'whole')):9.1f} {_stats(ratios['whole']):>19} "
                  f"{('>= %gx %s' % (cell['target'], cell['judged'])) if judged_row else '':>12} {met:>4}")


if __name__ == "__main__":
    main()
