"""Factories for the executor tests: one small model, workloads, reference decodes.

Without a CUDA device the Triton kernels run in the interpreter: TRITON_INTERPRET
must be set before the first ``import triton``, so it is set here at import time
(it changes nothing for the executor's default ``sdpa`` backend).
"""

import pytest
from factories import use_triton_interpreter_without_cuda

HAS_CUDA = use_triton_interpreter_without_cuda()


@pytest.fixture(scope="session")
def model():
    """The default executed model (llama-tiny spec, weights from seed 0)."""
    pytest.importorskip("torch")
    from infermax.execute import build_model

    return build_model()


@pytest.fixture(scope="session")
def reference(model):
    """reference(workload) -> {request id: greedy tokens of its prompt alone}, cached per workload."""
    from infermax.execute import prompt_tokens, reference_tokens

    cache = {}

    def ref(workload):
        key = tuple((r.id, r.input_len, r.output_len) for r in workload.requests)
        if key not in cache:
            cache[key] = reference_tokens(model, prompt_tokens(workload, model.cfg.vocab_size, 0), workload)
        return cache[key]

    return ref
