"""Solve the optimal schedule that ``gpu_validation.py``'s execute step runs, and write it to benchmarks/data/.

    python benchmarks/gpuval_make_schedule.py [--time-limit 600]

Run here, not on the GPU machine (which has no MILP solver): needs a backend of infermax.csp
(CP-SAT: ``pip install ortools``). The schedule is optimal under ``COST`` (Vidur's A100 profile
of Llama-3-8B, fitted), the status the solver proved is stored with it, and nothing is written
unless the replayed objective equals the solver's. vLLM's and Sarathi's latencies under the
same cost model are stored beside it for reference.
"""
from __future__ import annotations

import argparse
import json
import sys
from datetime import date
from pathlib import Path

OUT = Path(__file__).resolve().parent / "data" / "gpu_validation_schedule.json"
#: name -> (input lengths, output lengths, limits); "tiny" is the CPU dry run's (``--tiny``)
INSTANCES = {"full": ([64, 64, 16, 16, 16], [4, 4, 8, 8, 8], "M=2048,C=64"),
             "tiny": ([24, 24, 8], [2, 2, 3], "M=2048,C=32")}
COST = "a100/llama3-8b"


def solve(input_lens: list[int], output_lens: list[int], limits_spec: str, time_limit_s: float) -> dict:
    """The instance's entry of the file: workload, limits, solver summary, the schedule, heuristics' latency."""
    import infermax
    from infermax.types import Limits, Workload

    workload = Workload.from_lengths(input_lens, output_lens)
    limits = Limits.from_spec(limits_spec)
    result = infermax.solve_optimal(workload, limits, COST, time_limit_s=time_limit_s, threads=1)
    replayed = infermax.metrics(infermax.replay(result.schedule, workload, limits, COST))["latency_s"]
    if abs(replayed - result.objective) > 1e-9 * max(1.0, replayed):
        raise RuntimeError(f"replayed latency {replayed} != solver objective {result.objective}")
    summary = result.summary()
    return {"workload_spec": f"I={input_lens}, O={output_lens}, offline", "workload": workload.to_dict(),
            "limits": limits_spec, "cost_model": COST, "objective": "latency",
            "solver": {k: v for k, v in summary.items() if k != "warm_start"}, "warm_start": summary["warm_start"],
            "heuristic_latency_s": {name: infermax.simulate(workload, name, limits, COST).metrics["latency_s"]
                                    for name in ("vllm", "sarathi")},
            "schedule": result.schedule.to_dict()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=600.0, help="per instance (s)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args()
    instances = {name: solve(*spec, args.time_limit) for name, spec in INSTANCES.items()}
    data = {"note": "solved by benchmarks/gpuval_make_schedule.py; optimal under cost_model only (solver.status "
                    "says whether proven); gpu_validation.py re-prices it under the cost model fitted on the GPU",
            "created": date.today().isoformat(), "instances": instances}
    Path(args.out).write_text(json.dumps(data, indent=1) + "\n")
    for name, entry in instances.items():
        s = entry["solver"]
        print(f"{name}: {s['status']} latency {s['objective']:.6f} s (bound {s['bound']:.6f}, {s['wall_s']:.1f} s); "
              f"vllm {entry['heuristic_latency_s']['vllm']:.6f}, sarathi {entry['heuristic_latency_s']['sarathi']:.6f}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
