"""The fused log-prob/entropy kernels: in Triton's interpreter on a CPU (subprocess), and on a GPU."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton is not installed")


@needs_triton
def test_kernels_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("logprob_kernel_checks.py"))], env=env,
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": ok") == 4, done.stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_kernels_on_cuda_and_the_full_vocabulary():
    from tests.models import logprob_kernel_checks as checks

    checks.main("cuda")
    checks.check("qwen_vocab_bf16", rows=64, vocab=151936, dtype=torch.bfloat16, temperature=1.0, device="cuda",
                 tol=2e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_triton_and_torch_reductions_agree_through_the_chunked_lm_head():
    from verl.models import logprobs_and_entropy_from_hidden

    torch.manual_seed(0)
    hidden = torch.randn(300, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = (torch.randn(5000, 64, device="cuda") * 0.2).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 5000, (300,), device="cuda")
    out = {}
    for kernel in ("torch", "triton"):
        hidden.grad = weight.grad = None
        lp, ent = logprobs_and_entropy_from_hidden(hidden, weight, labels, temperature=0.9, chunk_size=128,
                                                   kernel=kernel)
        (lp.sum() + 0.5 * ent.sum()).backward()
        out[kernel] = lp, ent, hidden.grad.float(), weight.grad.float()
    for a, b in zip(out["torch"], out["triton"]):
        torch.testing.assert_close(a, b, atol=2e-2, rtol=2e-2)


@needs_triton
@pytest.mark.parametrize("pointer", ["*bf16", "*fp32"])
def test_kernels_compile_for_sm90(pointer, tmp_path, monkeypatch):
    """Compiled for the H100/H200 with the wheel's ptxas: catches what the interpreter does not check."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    from tests.workers.rollout.test_triton_compile import compile_for_sm90
    from verl.models import logprob_kernels as K

    const = {"V": 151936, "BLOCK": 4096}
    scalars = {"row_stride": "i64", "d_row_stride": "i64", "inv_temp": "fp32", "labels_ptr": "*i64",
               "logits_ptr": pointer, "dlogits_ptr": pointer}
    for fn in (K.logprob_entropy_fwd_kernel, K.logprob_entropy_bwd_kernel):
        sig = {n: "constexpr" if n in const else scalars.get(n, "*fp32") for n in fn.arg_names}
        compile_for_sm90(fn, sig, const)
