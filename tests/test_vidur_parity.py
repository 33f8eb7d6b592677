"""Vidur 0.0.26's mnemosyne schedulers against infermax's mnemosyne-* variants, batch for batch, timed by
Vidur's own predictor (benchmarks/medha_side_by_side.py at a small size). Needs ``pip install vidur==0.0.26``;
slow: the first run trains Vidur's predictor (minutes) into ~/.cache/infermax-vidur."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
vidur_harness = pytest.importorskip("vidur_harness")
if not vidur_harness.vidur_available():
    pytest.skip("vidur is not installed (pip install vidur==0.0.26)", allow_module_level=True)
import medha_side_by_side  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("order", ["lrs", "fcfs", "edf"])
def test_the_authors_scheduler_batch_for_batch(order):
    setup = vidur_harness.VidurSetup(cache_dir=str(Path.home() / ".cache" / "infermax-vidur"))
    cost = vidur_harness.VidurCost(vidur_harness.shared_predictor(setup))
    row = medha_side_by_side.side_by_side("t", order, setup, cost)
    assert row["identical_pct"] == 100.0 and row["vidur_batches"] == row["ours_batches"]
    assert row["vidur"] == row["ours"]
