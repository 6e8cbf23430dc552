"""NativeRollout on mixture-of-experts decoders (tiny random models): Qwen3-MoE (renormalised top-k or not, with and
without its every-layer sliding window) and Qwen2-MoE (a shared expert, one dense layer, q/k/v biases).

CPU, fp32: greedy ids equal transformers' ``generate`` for left-padded prompts of different lengths, log-probs match
its forward, the grouped matmul and its per-expert fallback agree. The GPU test (skipped on CPU) checks bf16 against
transformers' forward and CUDA-graph decode against eager decode.
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2MoeConfig, Qwen3MoeConfig

from verl.workers.rollout import NativeRollout
from verl.workers.rollout.native import model as native_model
from verl.workers.rollout.native.model import DecoderWeights, decode_capturable

from .test_native_families import (assert_bf16_close_to_transformers, assert_extend_matches_a_full_forward,
                                   forward_log_probs, make_config, make_prompts)
from .test_native_rollout import TEXTS

RESPONSE_LENGTH = 12


def moe_config(family: str, vocab: int):
    common = {"vocab_size": vocab, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 96, "moe_intermediate_size": 32,
              "num_experts_per_tok": 2, "max_position_embeddings": 256, "bos_token_id": None, "eos_token_id": None,
              "pad_token_id": 0}
    if family == "qwen3_moe":
        return Qwen3MoeConfig(head_dim=16, num_experts=8, norm_topk_prob=True, **common)
    if family == "qwen3_moe_unnormalised_sliding":
        return Qwen3MoeConfig(head_dim=16, num_experts=8, norm_topk_prob=False, use_sliding_window=True,
                              sliding_window=5, **common)
    # Layer 1 keeps a dense MLP; the others add a shared expert to 4 routed ones.
    return Qwen2MoeConfig(num_experts=4, shared_expert_intermediate_size=48, mlp_only_layers=[1],
                          norm_topk_prob=family.endswith("normalised"), **common)


FAMILIES = ["qwen3_moe", "qwen3_moe_unnormalised_sliding", "qwen2_moe", "qwen2_moe_normalised"]


def build(config, dtype=torch.float32, device="cpu"):
    """Random weights larger than the default init, so routing and greedy outputs vary from token to token."""
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
            else:  # embeddings, projections, routers, experts (3-D) and biases
                p.normal_(0, 0.1 if p.dim() > 1 else 0.02)
    return model.eval()


@pytest.fixture(scope="module")
def models(tiny_tokenizer):
    return {family: build(moe_config(family, len(tiny_tokenizer))) for family in FAMILIES}


def hf_greedy(model, prompts, pad_token_id):
    ids = prompts.batch["input_ids"]
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=prompts.batch["attention_mask"],
                             max_new_tokens=RESPONSE_LENGTH, min_new_tokens=RESPONSE_LENGTH, do_sample=False,
                             pad_token_id=pad_token_id)
    return out[:, ids.shape[1]:]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_ids_and_log_probs_match_transformers(models, tiny_tokenizer, family):
    model = models[family]
    layers = [type(layer.mlp).__name__ for layer in model.model.layers]
    assert sum("Sparse" in name for name in layers) == (2 if family.startswith("qwen2") else 3)
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    assert len(set(prompts.batch["attention_mask"].sum(1).tolist())) == len(TEXTS)  # left padding of every width
    rollout = NativeRollout(make_config(), model, tiny_tokenizer)
    ours = rollout.generate_sequences(prompts).batch
    assert torch.equal(ours["responses"], hf_greedy(model, prompts, tiny_tokenizer.pad_token_id))
    assert (ours["rollout_log_probs"] - forward_log_probs(model, ours)).abs().max() < 1e-4
    # The engine reads the experts in place: no copy to go stale after an update.
    experts = model.model.layers[0].mlp.experts
    assert rollout.weights.layers[0].experts_gate_up.data_ptr() == experts.gate_up_proj.data_ptr()
    # Sampled tokens reach positions greedy decoding does not, and route to other experts.
    sampled = NativeRollout(make_config(n=2, temperature=0.8), model, tiny_tokenizer) \
        .generate_sequences(make_prompts(tiny_tokenizer, seed=5)).batch
    assert (sampled["rollout_log_probs"] - forward_log_probs(model, sampled, 0.8)).abs().max() < 1e-4


def test_routing_normalisation_changes_the_outputs(models, tiny_tokenizer):
    """Same weights, norm_topk_prob flipped: the outputs differ and each still matches transformers."""
    model = models["qwen2_moe"]
    flipped = build(moe_config("qwen2_moe_normalised", len(tiny_tokenizer)))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), flipped.parameters()))
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    plain, renormed = (NativeRollout(make_config(), m, tiny_tokenizer).generate_sequences(prompts).batch["responses"]
                       for m in (model, flipped))
    assert not torch.equal(plain, renormed)
    assert torch.equal(renormed, hf_greedy(flipped, prompts, tiny_tokenizer.pad_token_id))


def test_per_expert_loop_equals_grouped_matmul(models, tiny_tokenizer, monkeypatch):
    """The fallback for a torch without grouped_mm (or unaligned dimensions) gives the grouped matmul's results."""
    model = models["qwen2_moe"]
    prompts = make_prompts(tiny_tokenizer, n=2, seed=3)
    grouped = NativeRollout(make_config(n=2), model, tiny_tokenizer).generate_sequences(prompts).batch
    monkeypatch.setattr(native_model, "GROUPED_MM", None)
    looped = NativeRollout(make_config(n=2), model, tiny_tokenizer).generate_sequences(prompts).batch
    assert torch.equal(grouped["responses"], looped["responses"])
    torch.testing.assert_close(grouped["rollout_log_probs"], looped["rollout_log_probs"], atol=1e-5, rtol=0)


@pytest.mark.parametrize("family", ["qwen3_moe_unnormalised_sliding", "qwen2_moe"])
def test_extend_matches_a_full_forward(models, tiny_tokenizer, family):
    """Multi-turn continuations (variable lengths, right-padded) route like one forward over the whole sequence."""
    model = models[family]
    w = DecoderWeights(model)
    w.bind()
    assert not decode_capturable(w)  # fp32 experts on the CPU: their grouped matmul runs group by group
    assert_extend_matches_a_full_forward(model, tiny_tokenizer)


def test_unsupported_message_names_the_moe_families(tiny_tokenizer):
    from transformers import GPT2Config

    from verl.workers.rollout.native import UnsupportedModelError

    with pytest.raises(UnsupportedModelError, match="mixture of gated experts") as err:
        NativeRollout(make_config(), AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_embd=32, n_layer=1,
                                                                                 n_head=2)), tiny_tokenizer)
    assert "qwen3_moe" in str(err.value) and "qwen2_moe" in str(err.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", ["qwen3_moe", "qwen2_moe"])
@torch.no_grad()
def test_cuda_bf16_graphs_match_eager_and_transformers(tiny_tokenizer, family):
    """On CUDA: fp32 (eager decode: torch's grouped matmul syncs with the host outside bf16) equals transformers
    token for token; in bf16 the MoE decode is captured as CUDA graphs on Hopper/Blackwell and equals bf16 eager,
    and each bf16 token is a near-argmax of transformers' own forward, its log-prob within bf16 noise."""
    model = build(moe_config(family, len(tiny_tokenizer)), device="cuda")
    prompts = make_prompts(tiny_tokenizer, do_sample=False).to("cuda")
    rollout = NativeRollout(make_config(gpu_memory_utilization=0.3), model, tiny_tokenizer)
    ours = rollout.generate_sequences(prompts).batch
    assert rollout.last_stats["graph_captures"] == 0
    assert torch.equal(ours["responses"], hf_greedy(model, prompts, tiny_tokenizer.pad_token_id))
    assert (ours["rollout_log_probs"] - forward_log_probs(model, ours)).abs().max() < 1e-3

    model = model.to(torch.bfloat16)
    graphed_rollout = NativeRollout(make_config(gpu_memory_utilization=0.3), model, tiny_tokenizer)
    graphed = graphed_rollout.generate_sequences(prompts).batch
    capturable = torch.cuda.get_device_capability()[0] in (9, 10)
    assert (graphed_rollout.last_stats["graph_captures"] >= 1) == capturable
    eager = NativeRollout(make_config(gpu_memory_utilization=0.3, enforce_eager=True), model, tiny_tokenizer) \
        .generate_sequences(prompts).batch
    assert torch.equal(graphed["responses"], eager["responses"])
    assert (graphed["rollout_log_probs"] - eager["rollout_log_probs"]).abs().max() < 1e-2
    print(f"{family} bf16: graphs {capturable}")
    assert_bf16_close_to_transformers(model, graphed, family)
