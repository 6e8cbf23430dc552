"""Shared by the engine tests: toy batches, losses, and running a function on several ranks."""

import contextlib
import faulthandler
import os
import random
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from verl.models import forward_logprobs, forward_values
from verl.workers.engine import FSDPEngine, load_full_model_state_dict

RESPONSE = 4
ALL_CONTENTS = ("model", "optimizer", "extra", "hf_model")
RESUME_OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "lr_warmup_steps": 3, "total_training_steps": 10,
                "lr_scheduler_type": "cosine"}


def make_batch(vocab, batch=4, prompt=5, seed=0, device="cpu"):
    """Random token ids, the first prompt left-padded by 2, with matching position ids."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (batch, prompt + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids.to(device), "attention_mask": attention_mask.to(device),
            "position_ids": position_ids.to(device)}


def split(batch, parts):
    return [{k: v.chunk(parts)[i] for k, v in batch.items()} for i in range(parts)]


def lm_loss(module, micro_batch, scale=1.0):
    log_probs, _ = forward_logprobs(module, micro_batch["input_ids"], micro_batch["attention_mask"],
                                    micro_batch["position_ids"], RESPONSE, compute_entropy=False)
    return -log_probs.mean() * scale, {"nll": -log_probs.mean().item()}


def value_loss(module, micro_batch):
    values = forward_values(module, micro_batch["input_ids"], micro_batch["attention_mask"],
                            micro_batch["position_ids"], RESPONSE)
    return ((values - 1.0) ** 2).mean()


def _rank_entry(rank, fn, world_size, backend, init_file, timeout, args):
    faulthandler.dump_traceback_later(timeout - 10, exit=True)  # a hung rank shows where it waits
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        fn(rank, *args)
        # The ranks tear the group down together: a rank that destroyed it and exited while another still worked
        # (rank 0 computing a single-process reference) sometimes aborted in gloo's teardown (SIGABRT, "terminate
        # called without an active exception").
        dist.barrier()
    finally:
        dist.destroy_process_group()


def run_ranks(fn, world_size, tmp_path, *args, backend="gloo", timeout=120):
    """Run fn(rank, *args) in ``world_size`` fresh processes sharing a process group; fail on error or hang.

    Spawned, not forked: forking a process that already ran torch code can deadlock the child.
    """
    root = str(Path(__file__).resolve().parents[3])  # the children import the test modules as tests.workers...
    sys.path.insert(0, root)
    try:
        context = torch.multiprocessing.start_processes(
            _rank_entry, args=(fn, world_size, backend, str(tmp_path / f"pg_{fn.__name__}"), timeout, args),
            nprocs=world_size, join=False, start_method="spawn")
    finally:
        sys.path.remove(root)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1.0):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail(f"{fn.__name__}: ranks still running after {timeout} s (a collective hangs)")


def train_one_step(engine, seed, loss_fn=lm_loss):
    """One train step on this rank's own toy batch (the seed differs per rank), then one scheduler step."""
    batch = make_batch(engine.module.config.vocab_size, batch=2, seed=seed + 100 * engine.rank, device=engine.device)
    with engine.on_device(optimizer=True):
        engine.train_step([batch], loss_fn)
    engine.lr_scheduler_step()


def draw_rngs():
    return torch.rand(3), np.random.rand(3), random.random()


def resume_is_exact(rank, load, model_dir, folder, tokenizer_dir, fsdp_config, loss_fn=lm_loss):
    """Train 2 steps, save, train a 3rd; a fresh engine that loads the save must reach identical weights.

    Returns the full state dict that was saved (on rank 0).
    """
    engine = FSDPEngine(load(model_dir), fsdp_config=fsdp_config, optim_config=RESUME_OPTIM)
    train_one_step(engine, 0, loss_fn)
    train_one_step(engine, 1, loss_fn)
    saved_full = engine.full_state_dict()
    engine.save_checkpoint(folder, save_contents=ALL_CONTENTS, tokenizer=tokenizer_dir)
    rngs_after_save = draw_rngs()
    train_one_step(engine, 2, loss_fn)
    uninterrupted = engine.full_state_dict()

    torch.manual_seed(999)
    resumed = FSDPEngine(load(model_dir), fsdp_config=fsdp_config, optim_config=RESUME_OPTIM)
    resumed.load_checkpoint(folder)
    for got, want in zip(draw_rngs(), rngs_after_save):
        assert np.array_equal(got, want)
    assert resumed.get_lr() == pytest.approx(1e-2 * 2 / 3)  # warmup 3 steps: the 3rd update runs at lr * 2/3
    train_one_step(resumed, 2, loss_fn)
    after_resume = resumed.full_state_dict()
    if rank == 0:
        assert after_resume.keys() == uninterrupted.keys()
        for name in uninterrupted:
            assert torch.equal(after_resume[name], uninterrupted[name]), name
        merged = load_full_model_state_dict(folder)
        assert all(torch.equal(merged[name], saved_full[name]) for name in saved_full)
    return saved_full


# The dynamo options verl.workers.engine.fsdp.compile_decoder_layers sets for its whole process.
COMPILE_OPTIONS = ("cache_size_limit", "specialize_float", "skip_fsdp_guards", "suppress_errors")


@contextlib.contextmanager
def compiling_in_this_process():
    """For a test that compiles in pytest's own process: a fresh dynamo (no graphs, guards or warnings of other
    tests), and afterwards, even on failure, dynamo reset and the options compile_decoder_layers set put back.
    (Not monkeypatch: its undo deletes a torch config attribute, which hides the option from torch itself.)"""
    import torch._dynamo.utils

    config = torch._dynamo.config
    torch._dynamo.reset()
    torch._dynamo.utils.warn_once_cache.clear()  # dynamo warns once per process and message
    try:
        with config.patch({name: getattr(config, name) for name in COMPILE_OPTIONS}):
            yield
    finally:
        torch._dynamo.reset()
