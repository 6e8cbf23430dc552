"""NativeRollout on the decoder families beyond Llama/Qwen (CPU, fp32, tiny random models): Gemma 2, Gemma 3
(text and the multimodal class's text decoder), Mistral, Phi-3, and Qwen2 with sliding-window layers.

Every model here has a sliding window shorter than prompt + response (the longest prompt is 16 tokens), so
windowed masks decide the outputs; Gemma's soft-capping values are small enough to bend the logits (with the
caps removed, transformers' greedy ids for the Gemma 2 model below differ in most positions).
"""

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3Config, Gemma3TextConfig, LlamaConfig,
                          MistralConfig, Phi3Config, Qwen2Config, SiglipVisionConfig)

from verl.workers.rollout import NativeRollout
from verl.workers.rollout.native import UnsupportedModelError
from verl.workers.rollout.native.cache import SlotCache
from verl.workers.rollout.native.model import DecoderWeights, extend, prefill

from .test_native_rollout import TEXTS
from .test_native_rollout import make_config as native_config
from .test_native_rollout import make_prompts as native_prompts

RESPONSE_LENGTH = 12
WINDOW = 4
GEMMA_TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def small(vocab: int, **overrides) -> dict:
    config = {"vocab_size": vocab, "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 256,
              "bos_token_id": None, "eos_token_id": None, "pad_token_id": 0}  # the tiny tokenizer's pad
    config.update(overrides)
    return config


def gemma_text(vocab: int, **overrides) -> dict:
    # query_pre_attn_scalar differs from head_dim, so the query scaling matters too.
    return small(vocab, head_dim=16, query_pre_attn_scalar=24, sliding_window=WINDOW, layer_types=GEMMA_TYPES,
                 **overrides)


def configs(vocab: int) -> dict:
    gemma3_rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}}
    return {
        "gemma2": Gemma2Config(**gemma_text(vocab, attn_logit_softcapping=1.0, final_logit_softcapping=2.0)),
        "gemma3_text": Gemma3TextConfig(**gemma_text(vocab, final_logit_softcapping=2.0,
                                                     rope_parameters=gemma3_rope)),
        "gemma3": Gemma3Config(
            text_config=Gemma3TextConfig(**gemma_text(vocab, rope_parameters=gemma3_rope)), mm_tokens_per_image=4,
            vision_config=SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                             num_attention_heads=2, image_size=28, patch_size=14)),
        "mistral": MistralConfig(**small(vocab, head_dim=16, sliding_window=WINDOW + 1)),
        "phi3": Phi3Config(**small(vocab, sliding_window=WINDOW + 2, rope_parameters={
            "rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
        "qwen2_sliding": Qwen2Config(**small(vocab, use_sliding_window=True, sliding_window=WINDOW,
                                             max_window_layers=1)),
    }


def build(config):
    """Random weights larger than the default init, so greedy outputs vary (Gemma scales embeddings by 8 here)."""
    torch.manual_seed(0)
    # transformers' SDPA path drops Gemma 2's attention soft-cap (it runs uncapped on CUDA); eager applies it.
    attention = "eager" if config.model_type == "gemma2" else None
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, attn_implementation=attention)
    gemma = config.model_type.startswith("gemma")
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "embed_tokens" in name:
                p.normal_(0, 0.02 if gemma else 0.1)
            elif p.dim() == 2:
                p.normal_(0, 0.2 if gemma else 0.1)
            else:  # norms (Gemma's scale by 1 + weight) and biases
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@pytest.fixture(scope="module")
def models(tiny_tokenizer):
    return {name: build(config) for name, config in configs(len(tiny_tokenizer)).items()}


def make_config(**overrides):
    return native_config(**{"response_length": RESPONSE_LENGTH, **overrides})


def make_prompts(tokenizer, **meta_info):
    return native_prompts(tokenizer, **{"eos_token_id": [], **meta_info})


def forward_log_probs(model, batch, temperature: float = 1.0) -> torch.Tensor:
    P = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, P - 1:-1]
    return torch.log_softmax(logits / temperature, dim=-1).gather(-1, batch["responses"][..., None]).squeeze(-1)


FAMILIES = ["gemma2", "gemma3_text", "gemma3", "mistral", "phi3", "qwen2_sliding"]


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_ids_and_log_probs_match_transformers(models, tiny_tokenizer, family):
    model = models[family]
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    assert len(set(mask.sum(1).tolist())) == len(TEXTS) and int(mask.sum(1).max()) > 2 * WINDOW
    ours = NativeRollout(make_config(), model, tiny_tokenizer).generate_sequences(prompts).batch
    with torch.no_grad():
        generated = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=RESPONSE_LENGTH,
                                   min_new_tokens=RESPONSE_LENGTH, do_sample=False,
                                   pad_token_id=tiny_tokenizer.pad_token_id)
    assert torch.equal(ours["responses"], generated[:, ids.shape[1]:])
    assert (ours["rollout_log_probs"] - forward_log_probs(model, ours)).abs().max() < 1e-4
    # Fewer slots than rows: rows are admitted as others finish and moved between slots, windows and all.
    few = NativeRollout(make_config(n=2, max_num_seqs=3), model, tiny_tokenizer).generate_sequences(prompts).batch
    assert torch.equal(few["responses"], ours["responses"].repeat_interleave(2, dim=0))
    # Sampled tokens reach positions greedy decoding does not; their log-probs must match as well.
    sampled = NativeRollout(make_config(n=2, temperature=0.8), model, tiny_tokenizer) \
        .generate_sequences(make_prompts(tiny_tokenizer, seed=5)).batch
    assert (sampled["rollout_log_probs"] - forward_log_probs(model, sampled, 0.8)).abs().max() < 1e-4


@pytest.mark.parametrize("family", ["gemma2", "mistral", "phi3"])
def test_extend_with_sliding_windows_matches_a_full_forward(models, tiny_tokenizer, family):
    """Continuations attend to the cached prompt through the window, as one forward over the whole sequence."""
    model = models[family]
    assert_extend_matches_a_full_forward(model, tiny_tokenizer)


def assert_extend_matches_a_full_forward(model, tiny_tokenizer):
    """Right-padded continuations of different lengths, extended into the cached prompts, give the logits of one
    forward over each whole sequence."""
    prompts = make_prompts(tiny_tokenizer)
    ids, valid = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    rows, width = ids.shape
    w = DecoderWeights(model)
    w.bind()
    cache = SlotCache(w.num_layers, rows, w.num_kv_heads, 32, w.head_dim, torch.float32, torch.device("cpu"))
    new = torch.tensor([[5, 6, 7, 8, 9], [8, 9, 0, 0, 0], [11, 12, 13, 0, 0], [14, 15, 16, 17, 18]])
    lengths = torch.tensor([5, 2, 3, 5])
    slots = torch.tensor([2, 0, 3, 1])
    with torch.no_grad():
        prefill(w, cache, ids, valid, 0, slots, torch.arange(rows))
        logits = extend(w, cache, new, lengths, torch.full((rows,), width), (~valid).sum(1), slots)
        for r in range(rows):
            full = torch.cat([ids[r, valid[r]], new[r, :lengths[r]]])[None]
            torch.testing.assert_close(logits[r], model(input_ids=full).logits[0, -1], atol=1e-5, rtol=1e-5)


def assert_an_in_place_update_is_seen(rollout, model, tiny_tokenizer, parameter: torch.nn.Parameter, factor: float):
    """Multiply ``parameter`` in place (an "actor update"): the rollout's next greedy ids change, to transformers'
    greedy ids of the updated model."""
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    before = rollout.generate_sequences(prompts).batch["responses"]
    original = parameter.detach().clone()
    try:
        with torch.no_grad():
            parameter.mul_(factor)
        after = rollout.generate_sequences(prompts).batch
        with torch.no_grad():
            expected = model.generate(input_ids=prompts.batch["input_ids"],
                                      attention_mask=prompts.batch["attention_mask"], max_new_tokens=RESPONSE_LENGTH,
                                      min_new_tokens=RESPONSE_LENGTH, do_sample=False,
                                      pad_token_id=tiny_tokenizer.pad_token_id)
    finally:
        with torch.no_grad():
            parameter.copy_(original)
    assert not torch.equal(before, after["responses"])
    assert torch.equal(after["responses"], expected[:, prompts.batch["input_ids"].shape[1]:])


def test_fused_phi3_weights_are_shared_and_updates_are_seen(models, tiny_tokenizer):
    model = models["phi3"]
    rollout = NativeRollout(make_config(), model, tiny_tokenizer)
    rollout.generate_sequences(make_prompts(tiny_tokenizer, do_sample=False))  # binds the weights
    attn, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    bound = rollout.weights.layers[0]
    assert bound.qkv.data_ptr() == attn.qkv_proj.weight.data_ptr()
    assert bound.gate_up.data_ptr() == mlp.gate_up_proj.weight.data_ptr()
    assert_an_in_place_update_is_seen(rollout, model, tiny_tokenizer, attn.qkv_proj.weight, -2.0)


def test_gemma_norm_scales_keep_their_buffers_and_follow_updates(models, tiny_tokenizer):
    """Gemma's float32 ``1 + weight`` scales are computed at each binding into buffers that keep their addresses
    (so CUDA graphs captured over them stay valid), and an update of a norm weight reaches the next generation."""
    model = models["gemma2"]
    rollout = NativeRollout(make_config(), model, tiny_tokenizer)
    rollout.generate_sequences(make_prompts(tiny_tokenizer, do_sample=False))
    layer = model.model.layers[1]
    scale = rollout.weights.layers[1].mlp_norm
    assert scale.dtype == torch.float32 and torch.equal(scale, layer.pre_feedforward_layernorm.weight.float() + 1.0)
    addresses = rollout.weights.pointers()
    assert_an_in_place_update_is_seen(rollout, model, tiny_tokenizer, layer.pre_feedforward_layernorm.weight, -3.0)
    assert rollout.weights.pointers() == addresses


@pytest.mark.parametrize("config,key", [
    (Phi3Config(vocab_size=64, pad_token_id=None, eos_token_id=None, bos_token_id=None, hidden_size=32,
                num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, max_position_embeddings=256,
                original_max_position_embeddings=64,
                rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8,
                                 "long_factor": [2.0] * 8}), "longrope"),
    (LlamaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                 rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), "dynamic"),
])
def test_length_dependent_rope_is_refused(tiny_tokenizer, config, key):
    model = AutoModelForCausalLM.from_config(config)
    with pytest.raises(UnsupportedModelError, match=rf"rope type '{key}' \(config key rope_parameters\['rope_type'\]"
                                                    r".*actor_rollout_ref\.rollout\.name=hf"):
        NativeRollout(make_config(), model, tiny_tokenizer)


def test_unsupported_message_lists_the_families(tiny_tokenizer):
    from transformers import GPT2Config

    with pytest.raises(UnsupportedModelError) as err:
        NativeRollout(make_config(), AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_embd=32, n_layer=1,
                                                                                 n_head=2)), tiny_tokenizer)
    for family in ("llama", "qwen2", "qwen3", "mistral", "phi3", "gemma2", "gemma3_text", "gemma3"):
        assert family in str(err.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("family", FAMILIES)
@torch.no_grad()
def test_cuda_graphs_match_transformers(tiny_tokenizer, family):
    """On CUDA: fp32 under CUDA graphs (Triton RoPE/cache-write kernel where the rotary covers the head, the
    explicit soft-capped attention for Gemma 2) equals transformers token for token; bf16 graphs equal bf16
    eager, and each bf16 token is a near-argmax of transformers' own forward."""
    model = build(configs(len(tiny_tokenizer))[family]).cuda()
    prompts = make_prompts(tiny_tokenizer, do_sample=False).to("cuda")
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]

    def greedy(m):
        out = m.generate(input_ids=ids, attention_mask=mask, max_new_tokens=RESPONSE_LENGTH,
                         min_new_tokens=RESPONSE_LENGTH, do_sample=False, pad_token_id=tiny_tokenizer.pad_token_id)
        return out[:, ids.shape[1]:]

    rollout = NativeRollout(make_config(gpu_memory_utilization=0.3), model, tiny_tokenizer)
    ours = rollout.generate_sequences(prompts).batch
    assert rollout.last_stats["graph_captures"] >= 1
    assert torch.equal(ours["responses"], greedy(model))
    assert (ours["rollout_log_probs"] - forward_log_probs(model, ours)).abs().max() < 1e-3
    model = model.to(torch.bfloat16)
    graphed = NativeRollout(make_config(gpu_memory_utilization=0.3), model, tiny_tokenizer) \
        .generate_sequences(prompts).batch
    eager = NativeRollout(make_config(gpu_memory_utilization=0.3, enforce_eager=True), model, tiny_tokenizer) \
        .generate_sequences(prompts).batch
    assert torch.equal(graphed["responses"], eager["responses"])
    print(f"{family} bf16: greedy==generate {torch.equal(graphed['responses'], greedy(model))}")
    assert_bf16_close_to_transformers(model, graphed, family)


def assert_bf16_close_to_transformers(model, batch, family):
    """bf16 rollout tokens are (near) transformers' argmax and its log-probs agree with transformers' forward
    within bf16 noise."""
    P = batch["prompts"].shape[1]
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"]).logits[:, P - 1:-1].float()
    reference = torch.log_softmax(logits, dim=-1)
    chosen = reference.gather(-1, batch["responses"][..., None]).squeeze(-1)
    gap = reference.max(dim=-1).values - chosen
    diff = (batch["rollout_log_probs"] - chosen).abs()
    print(f"{family} bf16: gap to transformers' argmax max {gap.max():.4f}, log-prob |diff| mean {diff.mean():.4f} "
          f"max {diff.max():.4f}")
    assert gap.max() < 0.15 and diff.mean() < 0.05
