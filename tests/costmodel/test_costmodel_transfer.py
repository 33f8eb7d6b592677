"""``scaled:<gpu>/<model>``: an unmeasured model at the roofline efficiency of a measured one."""
from __future__ import annotations

import numpy as np
import pytest

from infermax.costmodel import get_cost_model
from infermax.costmodel.transfer import reference_for

BATCHES = [  # (tokens, kv_before, is_decode): decodes, a prefill, a mix
    ([1] * 32, [1024] * 32, [True] * 32), ([4096], [0], [False]), ([512, 1, 1], [1024, 300, 2000], [False, True, True]),
]


def _times(model) -> np.ndarray:
    return np.array([model.batch_time(np.array(c), np.array(m), np.array(d)) for c, m, d in BATCHES])


@pytest.mark.parametrize("name", ["a100/llama2-7b", "a100/llama3-8b", "a100/llama2-70b@tp=4"])
def test_scaling_a_measured_model_gives_its_fitted_model(name):
    base, _, tp = name.partition("@")
    scaled = get_cost_model(f"scaled:{base}" + (f"@{tp}" if tp else ""))
    fitted = get_cost_model(name)
    assert np.allclose(_times(scaled), _times(fitted), rtol=1e-12)


def test_the_papers_models_take_a_same_kind_reference_and_order_by_size():
    assert reference_for("a100", "mistral-7b-v0.3") == "a100/llama3-8b"      # GQA, closest size
    assert reference_for("a100", "yi-34b") == "a100/llama2-70b"
    t = {m: _times(get_cost_model(f"scaled:a100/{m}")) for m in ("mistral-7b-v0.3", "phi3-14b")}
    assert (t["phi3-14b"] > t["mistral-7b-v0.3"]).all()
    big = {m: _times(get_cost_model(f"scaled:a100/{m}@tp=4")) for m in ("yi-34b", "llama3.1-70b")}
    assert (big["llama3.1-70b"] > big["yi-34b"]).all()


@pytest.mark.parametrize("model", ["mistral-7b-v0.3", "phi3-14b", "yi-34b@tp=4", "llama3.1-70b@tp=4"])
def test_scaled_models_are_never_faster_than_their_roofline(model):
    scaled, roof = get_cost_model(f"scaled:a100/{model}"), get_cost_model(f"roofline:a100/{model}")
    assert (_times(scaled) >= _times(roof)).all()
    assert "scaled by the roofline ratio" in scaled.description


@pytest.mark.parametrize("spec, message", [
    ("scaled:a100", "needs 'scaled:<gpu>/<model>[@tp=N]'"),
    ("scaled:a100/yi-34b@tp=0", "ParallelConfig.tp must be an integer >= 1, got 0"),
    ("scaled:tpu/yi-34b", "unknown GPU 'tpu'"),
    ("a100/yi-34b", "use 'scaled:a100/yi-34b'"),
])
def test_bad_scaled_specs_say_what_is_wrong(spec, message):
    with pytest.raises(ValueError) as info:
        get_cost_model(spec)
    assert message in str(info.value)
