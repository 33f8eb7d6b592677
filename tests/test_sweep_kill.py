"""A sweep killed from outside leaves no process behind, and SIGTERM ends it with one line (issue 36 §7).

Each test starts ``infermax sweep`` in a subprocess on cells that take seconds, waits until its
workers run, signals it, and looks for every process that was its descendant.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLI = [sys.executable, "-m", "infermax"]
SLOW_CELLS = ("workloads: ['fixed:I=1024,O=1024,B=2048', 'fixed:I=1024,O=1024,B=2049', 'fixed:I=8,O=4,B=4']\n"
              "schedulers: [sarathi, vllm]\n")


def _children() -> dict[int, int]:
    """pid -> parent pid of every process readable in /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            out[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    return out


def _descendants(pid: int) -> set[int]:
    parents = _children()
    found, frontier = set(), {pid}
    while frontier:
        frontier = {p for p, pp in parents.items() if pp in frontier} - found
        found |= frontier
    return found


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (a zombie has ended)."""
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


def _start(tmp_path: Path, executor: str) -> tuple[subprocess.Popen, set[int]]:
    cfg = tmp_path / "grid.yaml"
    cfg.write_text(SLOW_CELLS)
    proc = subprocess.Popen([*CLI, "sweep", str(cfg), "--executor", executor, "--workers", "2", "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            # (the pure path: the compiled loop would finish these cells before the signal)
                            env={**os.environ, "RAY_AUTH_MODE": "disabled", "INFERMAX_PURE": "1"})
    deadline, seen = time.monotonic() + 120, set()
    while time.monotonic() < deadline and proc.poll() is None:
        seen |= _descendants(proc.pid)
        if len(seen) >= 4:         # the fork server, the resource tracker and two workers (Ray: its own)
            time.sleep(1.0)        # the workers have taken their cells
            return proc, seen | _descendants(proc.pid)
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"the sweep did not start its workers: {proc.communicate()}")


def _wait_gone(pids: set[int], timeout_s: float = 30.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    return _alive(pids)


def test_a_local_sweep_killed_with_sigkill_leaves_no_process(tmp_path):
    proc, tree = _start(tmp_path, "local")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    left = _wait_gone(tree)
    assert not left, f"left running after SIGKILL: {sorted(left)}"


def test_a_local_sweep_stopped_with_sigterm_exits_130_with_one_line(tmp_path):
    proc, tree = _start(tmp_path, "local")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infermax: interrupted: sweep stopped (terminated (SIGTERM))")
    assert "resume" in lines[0] and not _wait_gone(tree)


@pytest.mark.slow   # starts and stops a local Ray instance (~10 s)
def test_a_ray_sweep_stopped_with_sigterm_exits_130_with_one_line(tmp_path):
    pytest.importorskip("ray")
    proc, tree = _start(tmp_path, "ray")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infermax: interrupted: sweep stopped (terminated (SIGTERM))")
    assert not _wait_gone(tree, timeout_s=120)      # Ray's agents exit by themselves once its raylet has
