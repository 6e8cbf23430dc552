"""FSDPEngine on CUDA with NCCL: bf16 mixed precision, offload, gathered parameters, checkpoints."""

import math

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from tests.workers.engine.helpers import (
    RESPONSE,
    lm_loss,
    make_batch,
    resume_is_exact,
    run_ranks,
    split,
)
from verl.models import forward_logprobs, load_causal_lm
from verl.workers.engine import FSDPEngine

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "total_training_steps": 10}
OFFLOAD = {"param_offload": True, "optimizer_offload": True}  # param dtype: bf16, the CUDA default


@pytest.fixture
def cuda_rank(tmp_path):
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/pg", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def params_on(engine, device_type):
    return all(p.device.type == device_type for p in engine.module.parameters())


def test_offload_between_phases(cuda_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), fsdp_config=OFFLOAD, optim_config=OPTIM)
    assert engine.device.type == "cuda" and params_on(engine, "cpu")
    batch = make_batch(engine.module.config.vocab_size, device=engine.device)
    with engine.on_device(optimizer=True):
        assert params_on(engine, "cuda")
        stats = engine.train_step([batch], lm_loss)
    assert math.isfinite(stats["grad_norm"]) and not stats["update_skipped"]
    assert params_on(engine, "cpu")
    moments = [v for s in engine.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert moments and all(v.device.type == "cpu" for v in moments)

    with engine.gathered_params() as module, torch.no_grad():
        weight = module.lm_head.weight
        assert not isinstance(weight, DTensor) and weight.is_cuda and weight.dtype == torch.bfloat16
        log_probs, entropy = forward_logprobs(module, batch["input_ids"], batch["attention_mask"],
                                              batch["position_ids"], RESPONSE)
    assert log_probs.dtype == torch.float32 and torch.isfinite(log_probs).all() and torch.isfinite(entropy).all()
    assert params_on(engine, "cpu")


def test_cpu_offload_policy(cuda_rank, tiny_llama_dir):
    engine = FSDPEngine(load_causal_lm(tiny_llama_dir), fsdp_config={"offload_policy": True}, optim_config=OPTIM)
    assert params_on(engine, "cpu")
    batch = make_batch(engine.module.config.vocab_size, device=engine.device)
    for _ in range(2):
        stats = engine.train_step([batch], lm_loss)
        assert math.isfinite(stats["grad_norm"]) and not stats["update_skipped"]
    full = engine.full_state_dict()
    assert full["lm_head.weight"].shape == (engine.module.config.vocab_size, engine.module.config.hidden_size)
    with engine.gathered_params() as module, torch.no_grad():
        forward_logprobs(module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], RESPONSE)


def test_resume_with_offload_is_exact(cuda_rank, tiny_qwen2_dir, tiny_tokenizer_dir, tmp_path):
    resume_is_exact(0, load_causal_lm, tiny_qwen2_dir, str(tmp_path / "actor"), tiny_tokenizer_dir, OFFLOAD)


def _two_gpus(rank, model_dir, folder, tokenizer_dir):
    # 1. A sharded fp32 step equals one unsharded step on the whole batch.
    smooth = {**OPTIM, "eps": 1e-4}  # see test_fsdp.py: keeps Adam's first step insensitive to summation order
    engine = FSDPEngine(load_causal_lm(model_dir), fsdp_config={"dtype": "float32"}, optim_config=smooth)
    vocab = engine.module.config.vocab_size
    batch = make_batch(vocab, device=engine.device)
    stats = engine.train_step([split(batch, 2)[rank]], lm_loss)
    full = engine.full_state_dict()
    if rank == 0:
        reference = load_causal_lm(model_dir).cuda()
        optimizer = torch.optim.AdamW(reference.parameters(), lr=smooth["lr"], weight_decay=smooth["weight_decay"],
                                      eps=smooth["eps"])
        lm_loss(reference, batch)[0].backward()
        norm = torch.nn.utils.clip_grad_norm_(reference.parameters(), 1.0)
        optimizer.step()
        assert stats["grad_norm"] == pytest.approx(float(norm), rel=1e-4)
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(full[name], value.cpu(), rtol=0, atol=1e-5, msg=name)

    # 2. Inside gathered_params, ranks run different numbers of forwards without any collective.
    mine = make_batch(vocab, batch=2, seed=rank, device=engine.device)
    with engine.gathered_params() as module, torch.no_grad():
        for _ in range(2 + 3 * rank):
            forward_logprobs(module, mine["input_ids"], mine["attention_mask"], mine["position_ids"], RESPONSE)
    assert all(isinstance(p, DTensor) for p in engine.module.parameters())

    # 3. Resume from a checkpoint with bf16 compute and offloaded params/optimizer is exact.
    resume_is_exact(rank, load_causal_lm, model_dir, folder, tokenizer_dir, OFFLOAD)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_gpus(tiny_qwen2_dir, tiny_tokenizer_dir, tmp_path):
    run_ranks(_two_gpus, 2, tmp_path, tiny_qwen2_dir, str(tmp_path / "actor"), tiny_tokenizer_dir, backend="nccl",
              timeout=300)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_compiled_layers_match_eager(cuda_rank, tiny_qwen2_dir, checkpointing):
    """torch.compile'd decoder layers (use_torch_compile) give the eager log-probs and gradients, in
    bf16 tolerance, for packed batches of different token counts (dynamic shapes)."""
    results = {}
    for compiled in (False, True):
        torch.manual_seed(0)
        engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir, remove_padding=True), optim_config=OPTIM,
                            compile_layers=compiled, enable_gradient_checkpointing=checkpointing)
        assert engine.compiled is compiled
        outputs = []
        for rows in (4, 3):  # two token counts
            batch = make_batch(engine.module.config.vocab_size, device=engine.device)
            batch = {k: v[:rows] for k, v in batch.items()}
            log_probs, _ = forward_logprobs(engine.module, batch["input_ids"], batch["attention_mask"],
                                            batch["position_ids"], RESPONSE, remove_padding=True)
            log_probs.sum().backward()
            outputs.append(log_probs.detach().float())
        grads = [p.grad.full_tensor().float() for p in engine.module.parameters() if p.grad is not None]
        results[compiled] = outputs, grads
    for eager, compiled in zip(results[False][0], results[True][0]):
        torch.testing.assert_close(compiled, eager, rtol=0.02, atol=0.02)
    for eager, compiled in zip(results[False][1], results[True][1]):
        torch.testing.assert_close(compiled, eager, rtol=0.05, atol=0.05 * eager.abs().max().item() + 1e-3)
