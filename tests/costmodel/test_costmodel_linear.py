import json

import numpy as np
import pytest

from infermax.costmodel import LinearCoefficients, LinearCostModel
from infermax.costmodel.linear import FORMULA


def _manual(k: LinearCoefficients, tokens, kv, is_decode) -> float:
    n = tokens.sum()
    t = max(a + b * n for a, b in k.nonattn_lines)
    if is_decode.any():
        t += k.decode_bias_s + k.decode_kv_s * (kv[is_decode] + tokens[is_decode]).sum()
    if (~is_decode).any():
        c, m = tokens[~is_decode], kv[~is_decode]
        t += k.prefill_bias_s + k.prefill_attn_s * (c * m + c * (c + 1) / 2).sum() + k.prefill_token_s * c.sum()
    return float(t + k.request_s * tokens.size)


def test_batch_time_is_the_documented_formula(batches):
    k = LinearCoefficients(nonattn_lines=((9e-3, 0.0), (4e-3, 6e-5), (0.0, 7e-5)), prefill_token_s=1e-6,
                           request_s=3e-5)
    model = LinearCostModel(k)
    for tokens, kv, is_decode in batches:
        assert model.batch_time(tokens, kv, is_decode) == pytest.approx(_manual(k, tokens, kv, is_decode), rel=1e-12)


def test_default_numbers_are_plausible_for_a100_llama2_7b():
    model = LinearCostModel()
    one_decode = model.batch_time(np.array([1]), np.array([1000]), np.array([True]))
    full_prefill = model.batch_time(np.array([4096]), np.array([0]), np.array([False]))
    assert 8e-3 < one_decode < 12e-3           # weight-read floor ~9 ms
    assert 0.25 < full_prefill < 0.40          # ~260 ms linear layers + ~90 ms attention


def test_request_term_counts_requests_not_tokens():
    k = LinearCoefficients(nonattn_lines=((1e-3, 1e-5),), request_s=2e-4)
    model, base = LinearCostModel(k), LinearCostModel(LinearCoefficients(nonattn_lines=((1e-3, 1e-5),)))
    one_chunk = (np.array([64]), np.array([0]), np.array([False]))
    four_chunks = (np.array([16, 16, 16, 16]), np.zeros(4, np.int64), np.zeros(4, bool))
    assert model.batch_time(*one_chunk) - base.batch_time(*one_chunk) == pytest.approx(2e-4)
    assert model.batch_time(*four_chunks) - base.batch_time(*four_chunks) == pytest.approx(8e-4)
    assert "request_s*R" in FORMULA


@pytest.mark.parametrize("request_s", [0.0, 3.07e-5])
def test_decode_run_closed_form_is_bit_identical(request_s):
    model = LinearCostModel(LinearCoefficients(nonattn_lines=((2.5e-3, 7.4e-5), (1e-14, 7.9e-5)),
                                               decode_bias_s=2.7e-4, decode_kv_s=9.1e-7, request_s=request_s))
    kv = np.array([64, 70, 81, 99, 65, 77, 1000])
    steps = [model.batch_time(np.ones(kv.size, np.int64), kv + s, np.ones(kv.size, bool)) for s in range(9)]
    assert model.decode_run_times(kv, 9).tolist() == steps


def test_json_round_trip(tmp_path):
    model = LinearCostModel(LinearCoefficients(prefill_token_s=2e-7, request_s=4e-5), name="mine",
                            description="test")
    path = tmp_path / "m.json"
    model.to_json(path)
    back = LinearCostModel.from_json(path)
    assert back.coefficients == model.coefficients and back.name == "mine" and back.description == "test"
    data = json.loads(path.read_text())
    assert data["formula"] == FORMULA and data["kind"] == "linear"
    assert LinearCostModel.from_json(model.to_json()).coefficients == model.coefficients
    assert data["coefficients"]["request_s"] == 4e-5
    del data["coefficients"]["request_s"]                     # JSON written before the term existed
    assert LinearCostModel.from_json(json.dumps(data)).coefficients.request_s == 0.0


def test_legacy_floor_bias_token_form_maps_to_two_lines():
    k = LinearCoefficients.from_dict({"nonattn_floor_s": 9.6e-3, "nonattn_bias_s": 4.6e-3, "nonattn_token_s": 6.2e-5,
                                      "decode_bias_s": 1.9e-3, "decode_kv_s": 2.7e-7, "prefill_bias_s": 1.7e-3,
                                      "prefill_attn_s": 5.0e-9})
    assert k.nonattn_lines == ((9.6e-3, 0.0), (4.6e-3, 6.2e-5))
    with pytest.raises(ValueError, match="unknown field"):
        LinearCoefficients.from_dict({"bogus": 1.0})


@pytest.mark.parametrize("kwargs,field", [
    ({"decode_kv_s": -1.0}, "decode_kv_s"), ({"prefill_bias_s": float("nan")}, "prefill_bias_s"),
    ({"nonattn_lines": ()}, "nonattn_lines"), ({"nonattn_lines": ((1.0,),)}, "nonattn_lines"),
    ({"nonattn_lines": ((1.0, -2.0),)}, "nonattn_lines"), ({"request_s": -1e-5}, "request_s")])
def test_coefficients_validate(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LinearCoefficients(**kwargs)


def test_from_json_rejects_other_kinds():
    with pytest.raises(ValueError, match="kind must be 'linear'"):
        LinearCostModel.from_json('{"kind": "roofline"}')


@pytest.mark.parametrize("edit,match", [
    (lambda d: d.pop("coefficients"), "has no coefficients"),
    (lambda d: d["coefficients"].pop("decode_kv_s"), r"missing coefficient\(s\) decode_kv_s"),
    (lambda d: d["coefficients"].update(decode_kv_s="2e-7"), "decode_kv_s must be a finite number >= 0, got '2e-7'"),
    (lambda d: d["coefficients"].update(nonattn_lines=[[True, 1e-5]]), "nonattn_lines must hold"),
    (lambda d: d.update(coefficients={**{k: 0.0 for k in d["coefficients"]}, "nonattn_lines": [[0.0, 0.0]]}),
     "one-token decode batch 0 s"),
])
def test_from_json_refuses_incomplete_or_degenerate_coefficients(tmp_path, edit, match):
    data = LinearCostModel().describe()
    edit(data)
    path = tmp_path / "cost.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=match) as info:
        LinearCostModel.from_json(path)
    assert str(path) in str(info.value)          # a file's errors name the file


def test_from_json_names_the_line_of_a_syntax_error(tmp_path):
    path = tmp_path / "cost.json"
    path.write_text('{\n  "kind": "linear",\n  "coefficients": {,}\n}\n')
    with pytest.raises(ValueError, match="line 3"):
        LinearCostModel.from_json(path)


def test_cost_file_with_the_pre_causal_formula_is_refused():
    data = json.loads(LinearCostModel().to_json())
    data["formula"] = data["formula"].replace("W = sum_prefill c*m + c*(c+1)/2 (causal)", "W = sum_prefill c*(m+c)")
    with pytest.raises(ValueError, match=r"formula prices prefill attention as W = sum c\*\(m\+c\).*refit"):
        LinearCostModel.from_json(json.dumps(data))
    del data["formula"]                                       # hand-written files without a formula load
    assert LinearCostModel.from_json(json.dumps(data)).coefficients == LinearCoefficients()
