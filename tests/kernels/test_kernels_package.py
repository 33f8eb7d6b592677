"""infermax.kernels imports without torch/triton; its public names resolve lazily."""

import subprocess
import sys

import pytest


def test_package_import_pulls_in_neither_torch_nor_triton():
    code = "import sys, infermax.kernels; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_lazy_names_resolve_to_the_module_functions():
    pytest.importorskip("torch")
    import infermax.kernels as kernels
    from infermax.kernels import merge

    assert kernels.merge_states is merge.merge_states
    assert set(kernels.__all__) >= {"prefill_attention", "decode_attention", "PagedKVCache", "LlamaModel"}
    with pytest.raises(AttributeError):
        kernels.no_such_kernel  # noqa: B018
