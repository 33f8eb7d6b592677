"""The CUDA code path (paged Triton kernels) run by the Triton interpreter on CPU tensors.

The executor's ``triton`` backend is what ``device="cuda"`` uses; here the same
kernels run under ``TRITON_INTERPRET=1`` (set in conftest.py) on a model small
enough for the interpreter, on a schedule that evicts in the middle of a refill.
"""
import pytest

torch = pytest.importorskip("torch")

from infermax.kernels import _triton  # noqa: E402

pytestmark = pytest.mark.skipif(not _triton.HAS_TRITON or not (_triton.is_interpreting() or torch.cuda.is_available()),
                                reason="needs triton, and CUDA or TRITON_INTERPRET=1 before triton is imported")


def test_triton_backend_generates_the_reference_tokens():
    from test_executor import refill_schedule

    from infermax.execute import execute, prompt_tokens, reference_tokens
    from infermax.kernels.llama import LlamaConfig, LlamaModel

    device = "cuda" if torch.cuda.is_available() else "cpu"
    net = LlamaModel(LlamaConfig(num_layers=1, hidden_size=64, num_q_heads=4, num_kv_heads=2,
                                 intermediate_size=128, vocab_size=256, seed=3)).to(device)
    schedule, workload, limits = refill_schedule()
    result = execute(schedule, workload, net, device=device, limits=limits, backend="triton", warmup=False)
    assert result.backend == "triton"
    assert dict(result.tokens) == reference_tokens(net, prompt_tokens(workload, 256), workload)
    assert result.blocks_in_use == 0
