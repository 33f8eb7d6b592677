import pytest

from infermax.costmodel.specs import GPUS, MODELS, get_gpu_spec, get_model_spec, kv_capacity_tokens


def test_llama2_7b_shape_and_sizes():
    m = get_model_spec("meta-llama/Llama-2-7b-hf")
    assert m.name == "llama2-7b" and m.head_dim == 128
    assert 6.7e9 < m.num_params < 6.8e9                      # the published 6.74B
    assert m.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2        # 512 KiB: medha Eq. 2 at 2 bytes


@pytest.mark.parametrize("alias,name", [("llama2-7b", "llama2-7b"), ("Llama-2-70b-hf", "llama2-70b"),
                                        ("Meta-Llama-3-8B", "llama3-8b"), ("llama3-70b", "llama3-70b"),
                                        ("Mistral-7B-v0.1", "mistral-7b")])
def test_model_aliases(alias, name):
    assert get_model_spec(alias).name == name


@pytest.mark.parametrize("alias,name", [("A100-80G", "a100"), ("h100", "h100"), ("H200", "h200")])
def test_gpu_aliases(alias, name):
    assert get_gpu_spec(alias).name == name


def test_gqa_models_and_param_counts():
    assert get_model_spec("llama2-70b").num_kv_heads == 8
    assert 68e9 < get_model_spec("llama2-70b").num_params < 70e9
    assert 7.9e9 < get_model_spec("llama3-8b").num_params < 8.1e9
    assert 7.1e9 < get_model_spec("mistral-7b").num_params < 7.3e9


def test_kv_capacity_matches_formula():
    m, g = get_model_spec("llama2-7b"), get_gpu_spec("a100")
    expected = int((0.9 * g.memory_bytes - m.weight_bytes) // m.kv_bytes_per_token)
    assert kv_capacity_tokens("llama2-7b", "a100") == expected
    assert 100_000 < expected < 130_000                          # the paper's default M is 100K


def test_kv_capacity_grows_with_tp_and_needs_tp_for_70b():
    assert kv_capacity_tokens("llama2-7b", "a100", tp=2) > 2 * kv_capacity_tokens("llama2-7b", "a100")
    with pytest.raises(ValueError, match="does not fit"):
        kv_capacity_tokens("llama2-70b", "a100")
    assert kv_capacity_tokens("llama2-70b", "a100", tp=4) > 0
    # 8 KV heads over tp=16: each GPU still holds one head, so per-token bytes stop shrinking
    assert kv_capacity_tokens("llama3-70b", "h200", tp=8) > 0


@pytest.mark.parametrize("kwargs,field", [({"util": 0.0}, "util"), ({"tp": 0}, "tp"), ({"pp": 1.5}, "pp")])
def test_kv_capacity_rejects_bad_arguments(kwargs, field):
    with pytest.raises(ValueError, match=field):
        kv_capacity_tokens("llama2-7b", "a100", **kwargs)


def test_unknown_names_are_clear():
    with pytest.raises(ValueError, match="unknown model"):
        get_model_spec("gpt-5")
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu_spec("tpu-v5")


def test_specs_validate():
    import dataclasses
    with pytest.raises(ValueError, match="num_layers"):
        dataclasses.replace(MODELS["llama2-7b"], num_layers=0)
    with pytest.raises(ValueError, match="hbm_bandwidth"):
        dataclasses.replace(GPUS["a100"], hbm_bandwidth=-1.0)
