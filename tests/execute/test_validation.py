"""``infermax validate``: profile -> fit -> simulate -> execute -> compare, and its JSON answer."""
import json

import pytest

torch = pytest.importorskip("torch")

from infermax.cli import main  # noqa: E402

TINY_WORKLOAD = "fixed:I=24,O=6,B=4"


@pytest.fixture(scope="module")
def tiny_profile(tmp_path_factory):
    """A profile of the executed model measured with the profiler's tiny grid (a few seconds)."""
    from infermax.costmodel.profiler import ProfileGrid, profile_model

    return profile_model("llama-tiny", device="cpu", out_dir=tmp_path_factory.mktemp("profile"),
                         grid=ProfileGrid.tiny())


@pytest.mark.slow  # heavy: the default run stays under its CPU budget
def test_validate_json_has_the_promised_keys(capsys, tiny_profile, tmp_path):
    code = main(["validate", "--scheduler", "vllm,sarathi", "--workload", TINY_WORKLOAD, "--limits", "M=64,C=64",
                 "--profile", str(tiny_profile), "--repeats", "2", "--out", str(tmp_path), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0
    assert data["tokens_identical"] is True
    for key in ("batch_time_median_ape", "e2e_latency_error", "cpu_time_e2e_latency_error"):
        assert isinstance(data[key], float) and data[key] >= 0
    assert set(data["schedulers"]) == {"vllm", "sarathi"}
    for r in data["schedulers"].values():
        assert r["measured_wall_over_cpu"] > 0 and abs(r["cpu_time_e2e_latency_signed_error"]) < 10
    assert data["cost"]["coefficients"]["request_s"] > 0      # the CPU profile has an LM head
    assert data["profile"] == str(tiny_profile)
    for name in ("validation.png", "validation_batches.csv", "validation.json"):
        assert (tmp_path / name).stat().st_size > 0


def test_validate_reuses_a_profile_root_and_prints_a_table(capsys, tiny_profile):
    root = tiny_profile.parent.parent                 # <root>/cpu/llama-tiny holds the CSVs
    code = main(["validate", "--workload", TINY_WORKLOAD, "--limits", "M=64,C=64", "--profile", str(root),
                 "--repeats", "1"])
    out = capsys.readouterr().out
    assert code == 0 and "vllm" in out and "e2e" in out and str(tiny_profile) in out


def test_validate_rejects_unknown_scheduler_before_measuring(capsys):
    code = main(["validate", "--scheduler", "no-such-policy", "--json"])
    assert code == 2 and "unknown scheduler" in json.loads(capsys.readouterr().out)["error"]


@pytest.mark.slow
def test_validate_profiles_from_scratch_with_the_default_grid(capsys, tmp_path):
    code = main(["validate", "--scheduler", "vllm,sarathi", "--profile", str(tmp_path / "profile"), "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["tokens_identical"] is True
    assert (tmp_path / "profile" / "cpu" / "llama-tiny" / "mlp.csv").exists()
