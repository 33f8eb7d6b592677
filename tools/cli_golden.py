"""Golden outputs of the front ends: a fixed set of ``infermax simulate`` / ``bound`` / ``replay`` /
``schedulers`` command lines, each run in a fresh interpreter; their stdout, stderr, exit status and the
files they write under ``--out``.

    python tools/cli_golden.py --write golden.json     # on the untouched code
    python tools/cli_golden.py --check golden.json     # after a refactoring: byte-identical or a diff
    PYTHONPATH=/tmp/base python tools/cli_golden.py --write golden.json   # the code of an exported commit

Each command runs with the working directory a fresh temporary folder, so ``--out`` paths are relative
and no temporary path reaches the output; progress bars are off (no terminal). Stripped: only the
wall-clock measurements in the cluster metrics (``scheduling_decision_p99_s``, ``decision_share_p99_*``,
and the solver's ``wall_s``, in stdout and in the written files); the MILP runs only where it proves the
optimum well within its time limit (``bd-optimum``), elsewhere ``--no-optimum``.
"""
from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

CLUSTER = "a100:nodes=1,gpus_per_node=2,model=mistral-7b-v0.3"
CLUSTER4 = "a100:nodes=1,gpus_per_node=4,model=mistral-7b-v0.3"
SMALL = ["--workload", "fixed:I=16,O=8,B=32", "--limits", "M=400,C=256"]
LONG = ["--workload", "fixed:I=300,O=4,B=4", "--limits", "M=4000,C=256"]
MIX = "pecsched:splitwise_conv,n=16,hi=200000"

#: (label, argv after ``infermax``); a label ending in ``+replay`` also replays what it wrote
COMMANDS: list[tuple[str, list[str]]] = [
    ("schedulers", ["schedulers"]),
    ("sim-default", ["simulate", *SMALL]),
    ("sim-json", ["simulate", *SMALL, "--scheduler", "vllm,sarathi", "--json"]),
    ("sim-one-out", ["simulate", *SMALL, "--scheduler", "sarathi", "--out", "out"]),
    ("sim-two-out", ["simulate", *SMALL, "--scheduler", "vllm,sarathi-pc", "--out", "out", "--json"]),
    ("sim-refused-some", ["simulate", *LONG, "--scheduler", "sarathi,vllm"]),
    ("sim-refused-all", ["simulate", *LONG, "--scheduler", "vllm", "--json"]),
    ("sim-default-leftout", ["simulate", *LONG]),
    ("sim-unknown", ["simulate", *SMALL, "--scheduler", "vllm,nope"]),
    ("sim-empty", ["simulate", *SMALL, "--scheduler", ","]),
    ("sim-policy-no-cluster", ["simulate", *SMALL, "--policy", "fifo"]),
    ("sim-too-big", ["simulate", "--workload", "fixed:I=500,O=8,B=2", "--limits", "M=100,C=256"]),
    ("cl-default", ["simulate", "--cluster", CLUSTER, "--workload", "fixed:I=32,O=4,B=8"]),
    ("cl-policies", ["simulate", "--cluster", CLUSTER, "--policy", "fifo,reservation", "--scheduler", "sarathi,vllm",
                     "--workload", "fixed:I=32,O=4,B=8", "--json"]),
    ("cl-as-scheduler-out", ["simulate", "--cluster", CLUSTER, "--scheduler", "fifo,pecsched", "--decode-replicas", "1",
                             "--workload", MIX, "--out", "out"]),
    ("cl-local", ["simulate", "--cluster", "a100:nodes=2,gpus_per_node=2,model=mistral-7b-v0.3", "--scheduler",
                  "reservation", "--local", "sarathi-pc", "--reserved-replicas", "2", "--workload", MIX]),
    ("cl-reservation-refused", ["simulate", "--cluster", CLUSTER4, "--scheduler", "reservation", "--local",
                                "sarathi-pc", "--reserved-replicas", "2", "--workload", MIX]),
    ("cl-one-out-json", ["simulate", "--cluster", CLUSTER, "--scheduler", "sarathi", "--workload", "fixed:I=32,O=4,B=8",
                         "--json", "--out", "out"]),
    ("cl-load", ["simulate", "--cluster", CLUSTER, "--scheduler", "sarathi", "--workload", MIX, "--load", "0.5"]),
    ("cl-unknown", ["simulate", "--cluster", CLUSTER, "--scheduler", "fifoo", "--workload", "fixed:I=8,O=4,B=4"]),
    ("cl-bad-policy", ["simulate", "--cluster", CLUSTER, "--policy", "fifoo", "--workload", "fixed:I=8,O=4,B=4"]),
    ("cl-mixed", ["simulate", "--cluster", CLUSTER, "--scheduler", "fifo,sarathi", "--workload", "fixed:I=8,O=4,B=4"]),
    ("cl-limits-M", ["simulate", "--cluster", CLUSTER, "--limits", "M=100", "--workload", "fixed:I=8,O=4,B=4"]),
    ("cl-reserved-unused", ["simulate", "--cluster", CLUSTER, "--scheduler", "fifo", "--reserved-replicas", "1",
                            "--workload", "fixed:I=8,O=4,B=4"]),
    ("bd-default", ["bound", "--workload", "fixed:I=16,O=8,B=32", "-q"]),
    ("bd-two-json", ["bound", "--scheduler", "vllm,sarathi", *SMALL, "--no-optimum", "--json"]),
    ("bd-two-text", ["bound", "--scheduler", "vllm,sarathi", *SMALL, "--no-optimum"]),
    ("bd-objectives", ["bound", "--scheduler", "sarathi", "--workload", "fixed:I=16,O=8,B=8", "--limits",
                       "M=256,C=32", "--objective", "ttft,e2e_p99", "--no-optimum"]),
    ("bd-all", ["bound", "--scheduler", "sarathi", "--workload", "fixed:I=4,O=4,B=4", "--objective", "all",
                "--no-optimum"]),
    ("bd-optimum", ["bound", "--scheduler", "vllm", "--workload", "fixed:I=3,O=4,B=3", "--limits", "M=24,C=24"]),
    ("bd-ttft-p99-json", ["bound", "--workload", "fixed:I=16,O=8,B=32", "--objective", "ttft_p99", "--json"]),
    ("bd-refused-some", ["bound", *LONG, "--no-optimum", "--scheduler", "sarathi,vllm"]),
    ("bd-refused-some-json", ["bound", *LONG, "--no-optimum", "--scheduler", "sarathi,vllm", "--json"]),
    ("bd-leftout", ["bound", *LONG, "--no-optimum"]),
    ("bd-methods-bad", ["bound", "--workload", "fixed:I=3,O=4,B=6", "--methods", "work,foo"]),
    ("bd-claim", ["bound", "--scheduler", "vllm", "--workload", "fixed:I=3,O=4,B=6", "--limits", "M=24,C=24",
                  "--claimed-latency", "0.0001", "--no-optimum"]),
    ("bd-claim-two", ["bound", "--scheduler", "vllm,sarathi", *SMALL, "--claimed-value", "1"]),
    ("bd-bad-objective", ["bound", *SMALL, "--objective", "nope"]),
    ("bd-schedule", ["bound", "--schedule", "run/schedule.json", "--no-optimum"]),
    ("bd-schedule-json", ["bound", "--schedule", "run/schedule.json", "--no-optimum", "--json"]),
    ("bd-schedule-missing", ["bound", "--schedule", "nonexistent.json"]),
    ("bd-cluster", ["bound", "--cluster", CLUSTER4, "--scheduler", "fifo,reservation", "--workload",
                    "fixed:I=32,O=4,B=8", "--objective", "latency,ttft,throughput"]),
    ("bd-cluster-json", ["bound", "--cluster", CLUSTER4, "--scheduler", "fifo", "--workload", "fixed:I=32,O=4,B=8",
                         "--objective", "all", "--json"]),
    ("bd-cluster-not-policy", ["bound", "--cluster", CLUSTER4, "--scheduler", "vllm"]),
    ("bd-cluster-limits", ["bound", "--cluster", CLUSTER4, "--limits", "M=10"]),
    ("replay", ["replay", "run/schedule.json"]),
    ("solve", ["solve", "--workload", "fixed:I=3,O=4,B=3", "--limits", "M=24,C=24", "-q"]),
    ("solve-json-out", ["solve", "--workload", "fixed:I=3,O=4,B=3", "--limits", "M=24,C=24", "--json", "--out", "out"]),
    ("solve-better-than", ["solve", "--workload", "fixed:I=3,O=4,B=3", "--limits", "M=24,C=24", "-q",
                           "--better-than", "vllm", "--by", "0.5"]),
    ("solve-bad-policy", ["solve", "--workload", "fixed:I=3,O=4,B=3", "--policy", "nope"]),
]
#: made before the commands that read ``run/`` (written by the same code under test)
SETUP = ["simulate", *SMALL, "--scheduler", "vllm", "--out", "run", "--json"]


#: wall-clock measurements inside the cluster metrics (the one varying content): the number is replaced
TIMED = re.compile(r'("(?:scheduling_decision_p99_s|decision_share_p99_short|decision_share_p99_long|wall_s)": |'
                   r'^ +wall_s  )[-0-9.e+]+', re.M)


def _strip(text: str) -> str:
    return TIMED.sub(r'\1"<timed>"', text)


def _run(argv: list[str], cwd: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "infermax", *argv], cwd=cwd, capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "COLUMNS": "120", "PYTHONHASHSEED": "0",
                            **({"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {})})
    return {"argv": argv, "rc": p.returncode, "stdout": _strip(p.stdout), "stderr": p.stderr}


def _files(root: Path) -> dict[str, str]:
    return {str(f.relative_to(root)): hashlib.sha256(_strip(f.read_text()).encode()).hexdigest()[:16]
            for f in sorted(root.rglob("*")) if f.is_file()}


def collect(only: set[str] | None = None) -> dict:
    out = {}
    with tempfile.TemporaryDirectory() as base:
        setup = Path(base) / "setup"
        setup.mkdir()
        out["_setup"] = {**_run(SETUP, setup), "files": _files(setup)}
        for label, argv in COMMANDS:
            if only and label not in only:
                continue
            cwd = Path(base) / label
            cwd.mkdir()
            (cwd / "run").symlink_to(setup / "run")
            rec = _run(argv, cwd)
            (cwd / "run").unlink()
            rec["files"] = _files(cwd)
            out[label] = rec
            print(f"{label}: rc {rec['rc']}", file=sys.stderr)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write")
    g.add_argument("--check")
    ap.add_argument("--only", help="labels, comma separated")
    args = ap.parse_args()
    only = set(args.only.split(",")) if args.only else None
    got = collect(only)
    if args.write:
        Path(args.write).write_text(json.dumps(got, indent=1, sort_keys=True))
        print(f"wrote {len(got)} commands to {args.write}")
        return 0
    want = json.loads(Path(args.check).read_text())
    differ = 0
    for label, rec in got.items():
        if rec != want.get(label):
            differ += 1
            a = json.dumps(want.get(label), indent=1, sort_keys=True).splitlines()
            b = json.dumps(rec, indent=1, sort_keys=True).splitlines()
            print(f"--- {label} differs")
            print("\n".join(difflib.unified_diff(a, b, "golden", "now", lineterm="", n=1)))
    print(f"{len(got)} commands, {differ} differ")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
