"""FSDPEngine on CPU/gloo: one rank in-process, two ranks in spawned processes where sharding matters."""

import functools
import logging

import pytest
import torch
from torch.distributed.tensor import DTensor

from tests.workers.engine.helpers import (
    RESPONSE,
    compiling_in_this_process,
    lm_loss,
    make_batch,
    run_ranks,
    split,
    value_loss,
)
from verl.models import forward_logprobs, load_causal_lm, load_value_model
from verl.workers.engine import FSDPEngine

OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "betas": [0.9, 0.999], "total_training_steps": 10}
# Adam's first update is lr * g / (|g| + eps): for gradients that nearly cancel, any change in summation
# order (micro-batches, two ranks' reduce-scatter, thread count) changes it by up to lr. When comparing
# against a plain model, a larger eps keeps the update smooth in g.
OPTIM_SMOOTH = {**OPTIM, "eps": 1e-4}
FSDP_FP32 = {"dtype": "float32", "reshard_after_forward": True}


def reference_step(model_dir, batch, micro_batches=1, optim=OPTIM, grad_clip=1.0):
    """One AdamW step of the plain (unsharded) model on the whole batch: what FSDP must reproduce."""
    model = load_causal_lm(model_dir)
    optimizer = torch.optim.AdamW(model.parameters(), lr=optim["lr"], weight_decay=optim["weight_decay"],
                                  eps=optim.get("eps", 1e-8))
    for micro_batch in split(batch, micro_batches):
        lm_loss(model, micro_batch, scale=1 / micro_batches)[0].backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return model, float(norm)


def test_needs_a_process_group(tiny_qwen2_dir):
    with pytest.raises(RuntimeError, match="process group"):
        FSDPEngine(load_causal_lm(tiny_qwen2_dir))


def test_one_rank_step_with_micro_batches_matches_plain_model(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM_SMOOTH)
    module = engine.module
    assert module.lm_head.weight is module.model.embed_tokens.weight
    assert all(isinstance(p, DTensor) for p in module.parameters())
    assert module.config.use_cache is False

    batch = make_batch(module.config.vocab_size)
    stats = engine.train_step(split(batch, 2), lambda m, mb: lm_loss(m, mb, scale=0.5))
    reference, ref_norm = reference_step(tiny_qwen2_dir, batch, micro_batches=2, optim=OPTIM_SMOOTH)

    assert stats["lr"] == OPTIM["lr"] and not stats["update_skipped"] and len(stats["nll"]) == 2
    assert stats["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
    full = engine.full_state_dict()
    for name, value in reference.state_dict().items():
        torch.testing.assert_close(full[name], value, rtol=0, atol=1e-6, msg=name)


def test_non_finite_grad_norm_skips_the_update(single_rank, tiny_llama_dir, caplog):
    engine = FSDPEngine(load_causal_lm(tiny_llama_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM)
    before = engine.full_state_dict()
    batch = make_batch(engine.module.config.vocab_size)
    with caplog.at_level(logging.WARNING):
        stats = engine.train_step([batch], lambda m, mb: lm_loss(m, mb)[0] * float("nan"))
    assert stats["update_skipped"] and "skipping this optimizer step" in caplog.text
    after = engine.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in engine.module.parameters())


def test_gradient_checkpointing_gives_the_same_step(single_rank, tiny_llama_dir):
    batch = make_batch(load_causal_lm(tiny_llama_dir).config.vocab_size)
    results = []
    for checkpointing in (False, True):
        engine = FSDPEngine(load_causal_lm(tiny_llama_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM_SMOOTH,
                            enable_gradient_checkpointing=checkpointing)
        engine.train_step([batch], lm_loss)
        results.append(engine.full_state_dict())
    for name in results[0]:
        torch.testing.assert_close(results[0][name], results[1][name], rtol=0, atol=1e-6)


def test_value_model_trains_like_a_causal_lm(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_value_model(tiny_qwen2_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM)
    batch = make_batch(engine.module.config.vocab_size)
    first = engine.train_step([batch], value_loss)["loss"]
    for _ in range(3):
        last = engine.train_step([batch], value_loss)["loss"]
    assert last < first


def test_mixed_precision_bf16_keeps_fp32_master_weights(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), fsdp_config={"dtype": "bf16"}, optim_config=OPTIM)
    batch = make_batch(engine.module.config.vocab_size)
    with engine.gathered_params():
        assert engine.module.lm_head.weight.dtype == torch.bfloat16
    stats = engine.train_step([batch], lm_loss)
    assert stats["grad_norm"] > 0
    assert all(p.dtype == torch.float32 for p in engine.module.parameters())


def test_reference_engine_cannot_train_and_offload_is_a_no_op_on_cpu(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir),
                        fsdp_config={**FSDP_FP32, "param_offload": True, "optimizer_offload": True})
    with pytest.raises(RuntimeError, match="no optimizer"):
        engine.train_step([], lm_loss)
    engine.offload_params()
    engine.offload_optimizer()
    with engine.on_device(optimizer=True):
        assert all(p.device.type == "cpu" for p in engine.module.parameters())


def test_gathered_params_one_rank(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), fsdp_config=FSDP_FP32)
    shapes = {n: p.shape for n, p in engine.module.named_parameters()}
    with engine.gathered_params() as module:
        assert not any(isinstance(p, DTensor) for p in module.parameters())
        assert {n: p.shape for n, p in module.named_parameters()} == shapes
    assert all(isinstance(p, DTensor) for p in engine.module.parameters())


# ------------------------------------------------------------------------------------ two ranks (forked)
def _two_rank_step(rank, model_dir):
    engine = FSDPEngine(load_causal_lm(model_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM_SMOOTH)
    module = engine.module
    assert module.lm_head.weight is module.model.embed_tokens.weight
    vocab = module.config.vocab_size
    assert module.lm_head.weight.to_local().shape[0] == (vocab + 1) // 2 if rank == 0 else vocab - (vocab + 1) // 2

    batch = make_batch(vocab)
    mine = split(batch, 2)[rank]  # each rank: half the batch, its own mean loss; FSDP averages grads
    stats = engine.train_step(split(mine, 2), lambda m, mb: lm_loss(m, mb, scale=0.5))
    full = engine.full_state_dict()
    if rank == 0:
        reference, ref_norm = reference_step(model_dir, batch, micro_batches=4, optim=OPTIM_SMOOTH)
        assert stats["grad_norm"] == pytest.approx(ref_norm, rel=1e-5)
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(full[name], value, rtol=0, atol=2e-6, msg=name)
    else:
        assert full == {}


def test_two_ranks_step_matches_one_process_with_tied_embeddings(tiny_qwen2_dir, tmp_path):
    run_ranks(_two_rank_step, 2, tmp_path, tiny_qwen2_dir)


def _two_rank_gathered(rank, model_dir):
    engine = FSDPEngine(load_causal_lm(model_dir), fsdp_config=FSDP_FP32, optim_config=OPTIM)
    vocab, hidden = engine.module.config.vocab_size, engine.module.config.hidden_size
    batch = make_batch(vocab, batch=2, seed=rank)
    with engine.gathered_params() as module, torch.no_grad():
        weight = module.lm_head.weight
        assert not isinstance(weight, DTensor) and weight.shape == (vocab, hidden)
        for _ in range(3 + 4 * rank):  # rank 1 runs more forwards than rank 0: no collective may be involved
            forward_logprobs(module, batch["input_ids"], batch["attention_mask"], batch["position_ids"], RESPONSE)
    assert all(isinstance(p, DTensor) for p in engine.module.parameters())
    # Sharded training still works afterwards.
    stats = engine.train_step([batch], lm_loss)
    assert stats["grad_norm"] > 0


def test_two_ranks_gathered_params_allow_uneven_forwards(tiny_qwen2_dir, tmp_path):
    run_ranks(_two_rank_gathered, 2, tmp_path, tiny_qwen2_dir, timeout=90)


def test_compiled_layers_stay_eager_when_called_with_a_kv_cache(monkeypatch):
    """use_torch_compile compiles training/log-prob forwards; generate's cached calls stay eager."""
    from verl.workers.engine import fsdp as fsdp_module

    monkeypatch.setattr(torch, "compile", lambda fn, dynamic: lambda *a, **k: ("compiled", fn(*a, **k)))
    forward = fsdp_module._compiled_unless_cached(lambda x, cache=None, past_key_values=None: x)
    assert forward(1) == ("compiled", 1) and forward(1, cache=None) == ("compiled", 1)
    assert forward(1, cache=object()) == 1 and forward(1, past_key_values=object()) == 1


def _log_prob_pass_then_training_pass(model):
    """What a step asks of the compiled layers: a no-grad log-prob forward, then a forward and backward."""
    ids = torch.randint(0, 300, (2, 24))
    mask, positions = torch.ones_like(ids), torch.arange(24).expand(2, -1)
    with torch.no_grad():
        forward_logprobs(model, ids, mask, positions, 8)
    log_probs, _ = forward_logprobs(model, ids, mask, positions, 8)
    log_probs.sum().backward()


def test_compiled_layers_trace_each_grad_mode_once(monkeypatch):
    """A decoder layer compiles once per grad mode (a no-grad log-prob pass, then a training pass): two AOT
    autograd compiles, no third one aborted and restarted over a float (which no cache would keep, so every warm
    start paid for it again). AOT autograd without Inductor, to stay fast on a CPU."""
    from torch._dynamo.utils import counters
    from transformers import AutoModelForCausalLM, Qwen2Config

    from verl.workers.engine import fsdp as fsdp_module

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager"))
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                                         num_attention_heads=4, num_key_value_heads=2,
                                                         intermediate_size=64))
    with compiling_in_this_process():
        counters.clear()
        assert fsdp_module.compile_decoder_layers(model)
        _log_prob_pass_then_training_pass(model)
        assert dict(counters["aot_autograd"]) == {"total": 2, "ok": 2}


@pytest.mark.parametrize("family", ["qwen2", "qwen3_moe"])
def test_compiled_sharded_layers_take_module_ints_as_constants(single_rank, monkeypatch, family):
    """Under fully_shard, a compiled layer's integer attributes (head_dim; a mixture of experts' top_k,
    num_experts, the router's hidden_dim) are constants of the graph, as they are for an unsharded model; dynamo's
    default for FSDP-managed modules made each a symbol of the dynamic-shape graph (and the sympy work it brings
    was most of a warm start's compile time). The graph's symbolic inputs are sizes of the inputs only, and both
    layers share one graph per grad mode."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3MoeConfig

    from verl.workers.engine import fsdp as fsdp_module

    graphs = []

    def record(gm, example_inputs):
        graphs.append({n.name: n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"})
        return gm.forward

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=record))
    torch.manual_seed(0)
    shape = {"vocab_size": 300, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "intermediate_size": 64}
    config = Qwen2Config(**shape) if family == "qwen2" else \
        Qwen3MoeConfig(**shape, head_dim=8, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    with compiling_in_this_process():
        assert fsdp_module.compile_decoder_layers(model)
        fsdp_module.shard_model(model, init_device_mesh("cpu", (1,)), mp_policy=MixedPrecisionPolicy(),
                                reshard_after_forward=True, offload_policy=False)
        _log_prob_pass_then_training_pass(model)
    assert len(graphs) == 2  # no grad, then grad; the second layer reuses each
    symbolic = [name for graph in graphs for name, value in graph.items() if isinstance(value, torch.SymInt)]
    assert symbolic and all(not name.startswith("l_self") for name in symbolic), symbolic


def test_compile_leaves_a_vision_towers_blocks_eager(monkeypatch, tiny_tokenizer_dir, tmp_path):
    """use_torch_compile on Qwen2.5-VL compiles the language model's layers only: the vision blocks' windowed
    attention breaks the graph on a ``.tolist()``, and each new set of image sizes would compile again."""
    from tests.models.vlm_models import save_tiny_qwen2_5_vl
    from verl.models.vision import vision_tower
    from verl.workers.engine import fsdp as fsdp_module

    model = load_causal_lm(save_tiny_qwen2_5_vl(str(tmp_path / "vlm"), tiny_tokenizer_dir), remove_padding=True)
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic: fn)
    with compiling_in_this_process():
        assert fsdp_module.compile_decoder_layers(model)
    compiled = {type(m).__name__ for m in model.modules() if "forward" in vars(m)}
    assert compiled == {"Qwen2_5_VLDecoderLayer"}
    assert not any("forward" in vars(m) for m in vision_tower(model).modules())
    assert sum("forward" in vars(m) for m in model.modules()) == model.config.text_config.num_hidden_layers
