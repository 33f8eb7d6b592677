import json

import numpy as np
import pytest

from infermax.cli import main
from infermax.costmodel import get_cost_model


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    """Through the ``infermax`` entry point: it reports the errors the handlers raise (exit status 2)."""
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_report_json(capsys, tmp_path):
    code, out, _ = run(["costmodel", "report", "--profile", "a100/Llama-2-7b-hf", "--json",
                        "--plot", str(tmp_path / "p.png")], capsys)
    report = json.loads(out)
    assert code == 0 and (tmp_path / "p.png").exists()
    for key in ("non_attention", "attention", "batch"):
        assert set(report[key]) >= {"median_ape", "p90_ape"}
    assert report["non_attention"]["median_ape"] <= 0.05


def test_report_text(capsys):
    code, out, _ = run(["costmodel", "report", "--profile", "a100/Llama-2-7b-hf", "--folds", "3",
                        "--compare-attention-forms"], capsys)
    assert code == 0 and "median APE" in out and "non_attention" in out and "roofline" in out
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["causal"], ["square"])]
    assert [r[0] for r in rows] == ["causal", "square"] and all(len(r) == 1 + 4 * 3 for r in rows)


def test_list_show_and_errors(capsys):
    code, out, _ = run(["costmodel", "list", "--json"], capsys)
    assert code == 0 and "a100/llama2-7b" in json.loads(out)["cost_models"]
    code, out, _ = run(["costmodel", "show", "roofline:h100/llama3-8b", "--json"], capsys)
    assert code == 0 and json.loads(out)["kind"] == "roofline"
    code, _, err = run(["costmodel", "show", "nope"], capsys)
    assert code == 2 and err.startswith("infermax: error: unknown cost model") and err.count("\n") == 1


def test_fit_writes_a_loadable_model(capsys, tmp_path, batches):
    out_path = tmp_path / "a100_llama3.json"
    code, out, _ = run(["costmodel", "fit", "--profile", "a100/Meta-Llama-3-8B", "--out", str(out_path), "--json"],
                       capsys)
    assert code == 0 and json.loads(out)["out"] == str(out_path)
    # the same fit as the packaged one, up to the numerical libraries' last digits
    refit, shipped = get_cost_model(str(out_path)), get_cost_model("a100/llama3-8b")
    predicted = np.array([[refit.batch_time(*b), shipped.batch_time(*b)] for b in batches])
    np.testing.assert_allclose(predicted[:, 0], predicted[:, 1], rtol=1e-4)


def test_fit_reads_the_folder_profile_writes(capsys, tmp_path):
    pytest.importorskip("torch")
    code, _, _ = run(["profile", "--device", "cpu", "--tiny", "--out", str(tmp_path / "prof"), "-q",
                      "--tokens", "1,32,128"], capsys)
    assert code == 0 and (tmp_path / "prof" / "cpu" / "llama-tiny" / "mlp.csv").exists()
    code, out, err = run(["costmodel", "fit", "--profile", str(tmp_path / "prof"), "--out",
                          str(tmp_path / "f.json"), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["kind"] == "linear" and get_cost_model(str(tmp_path / "f.json")).name == "f"


def test_profile_cpu_tiny(capsys, tmp_path):
    pytest.importorskip("torch")
    code, out, _ = run(["profile", "--device", "cpu", "--tiny", "--out", str(tmp_path), "--json",
                        "--tokens", "1,32,128"], capsys)
    payload = json.loads(out)
    assert code == 0 and (tmp_path / "cpu" / "llama-tiny" / "mlp.csv").exists() and payload["device"] == "cpu"
    code, _, err = run(["profile", "--device", "cuda", "--tiny", "--out", str(tmp_path)], capsys)
    import torch
    assert code == (0 if torch.cuda.is_available() else 2)
