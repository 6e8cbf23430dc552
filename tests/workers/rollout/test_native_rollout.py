"""NativeRollout on tiny random models (CPU, fp32): token-identical to transformers' greedy decoding,
exact log-probs, sampling statistics, continuous batching, weight sharing."""

import math

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, Qwen3Config

from verl.protocol import DataProto
from verl.workers.rollout import HFRollout, NativeRollout, get_rollout_class
from verl.workers.rollout.native import UnsupportedModelError
from verl.workers.rollout.native.sampling import filter_logits

RESPONSE_LENGTH = 8
TEXTS = ["Natalia sold clips to her friends", "The answer", "How many clips did", "Betty is saving money"]
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "intermediate_size": 128, "max_position_embeddings": 2048}


def _from_config(config):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    # Larger random weights than the default init, so the next-token distribution has structure.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
    return model.eval()


@pytest.fixture(scope="module")
def models(tiny_qwen2_dir, tiny_llama_dir, tiny_tokenizer):
    vocab = len(tiny_tokenizer)
    return {
        "qwen2": _from_config(AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).config),
        "llama": AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval(),
        "qwen3": _from_config(Qwen3Config(vocab_size=vocab, head_dim=32, **SMALL)),
        "llama3_rope_bias_tied": _from_config(LlamaConfig(
            vocab_size=vocab, attention_bias=True, mlp_bias=True, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 16, "rope_theta": 500000.0}, **SMALL)),
    }


def make_config(**overrides):
    config = {"name": "native", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "n": 1,
              "response_length": RESPONSE_LENGTH, "ignore_eos": False, "max_num_seqs": 1024,
              "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False}}
    config.update(overrides)
    return OmegaConf.create(config)


def make_prompts(tokenizer, texts=TEXTS, **meta_info):
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    position_ids = torch.clamp(enc.attention_mask.cumsum(dim=1) - 1, min=0)
    return DataProto.from_dict(
        {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "position_ids": position_ids},
        {"uid": [f"u{i}" for i in range(len(texts))]}, meta_info)


def recomputed_log_probs(model, batch, temperature):
    P = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, P - 1:-1]
    scaled = logits / temperature
    return torch.log_softmax(scaled, dim=-1).gather(-1, batch["responses"][..., None]).squeeze(-1), scaled


@pytest.mark.parametrize("arch", ["qwen2", "llama", "qwen3", "llama3_rope_bias_tied"])
def test_greedy_matches_generate_and_hf_engine(models, tiny_tokenizer, arch):
    model = models[arch]
    prompts = make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=[])
    ours = NativeRollout(make_config(), model, tiny_tokenizer).generate_sequences(prompts).batch
    hf = HFRollout(make_config(), model, tiny_tokenizer).generate_sequences(prompts).batch
    with torch.no_grad():
        generated = model.generate(input_ids=prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"],
                                   max_new_tokens=RESPONSE_LENGTH, min_new_tokens=RESPONSE_LENGTH, do_sample=False,
                                   pad_token_id=tiny_tokenizer.pad_token_id)
    assert torch.equal(ours["responses"], generated[:, prompts.batch["input_ids"].shape[1]:])
    assert torch.equal(ours["responses"], hf["responses"])
    assert (ours["rollout_log_probs"] - hf["rollout_log_probs"]).abs().max() < 1e-4
    for key in ("input_ids", "attention_mask", "position_ids", "response_mask"):
        assert torch.equal(ours[key], hf[key]), key


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
def test_sampled_log_probs_match_recomputation(models, tiny_tokenizer, arch):
    model = models[arch]
    temperature = 0.7
    prompts = make_prompts(tiny_tokenizer, seed=1, eos_token_id=[])
    config = make_config(n=3, temperature=temperature, top_k=20, top_p=0.95)
    batch = NativeRollout(config, model, tiny_tokenizer).generate_sequences(prompts).batch
    expected, scaled = recomputed_log_probs(model, batch, temperature)
    assert (batch["rollout_log_probs"] - expected).abs().max() < 1e-4
    rank = (scaled > scaled.gather(-1, batch["responses"][..., None])).sum(dim=-1)
    assert (rank < 20).all()


@pytest.mark.parametrize("top_k,top_p,kept", [
    (0, 0.6, [0, 2, 3]),  # mass before the tie is 0.5 < 0.6: both tied tokens stay
    (0, 0.5, [2]),  # 0.5 is not < 0.5
    (0, 0.55, [0, 2, 3]),
    (2, 1.0, [0, 2, 3]),  # the 2nd largest logit is tied: every token at least as large stays
    (1, 1.0, [2]),
    (2, 0.55, [2]),  # top-p over the top-k mass 0.9: 0.5 / 0.9 = 0.556 is not < 0.55
    (3, 0.6, [0, 2, 3]),  # 0.556 < 0.6
    (0, 1.0, [0, 1, 2, 3]),
])
def test_filters_by_hand(top_k, top_p, kept):
    """Probabilities 0.2, 0.1, 0.5, 0.2 (a tie at 0.2), temperature 2: filters judge the raw logits and
    the tempered probabilities, and keep ties whole."""
    logits = torch.tensor([[0.2, 0.1, 0.5, 0.2]]).log() * 2.0
    scaled = logits / 2.0
    out = filter_logits(logits, scaled, top_k, top_p)
    assert torch.nonzero(out[0] > float("-inf")).flatten().tolist() == kept
    assert torch.equal(out[out > float("-inf")], scaled[out > float("-inf")])


def filtered_probs(logits, temperature, top_k, top_p):
    """The analytic distribution transformers' warpers define (temperature, top-k, top-p)."""
    scaled = logits / temperature
    if top_k > 0:
        kth = scaled.topk(top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        values, order = scaled.sort()
        remove = values.softmax(-1).cumsum(-1) <= 1 - top_p
        remove[-1] = False
        scaled = scaled.masked_fill(torch.zeros_like(remove).scatter(0, order, remove), float("-inf"))
    return scaled.softmax(-1).double()


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 10, 1.0), (1.5, 0, 0.6), (1.0, 30, 0.9)])
def test_first_token_frequencies_match_filtered_softmax(models, tiny_tokenizer, temperature, top_k, top_p):
    model, draws = models["qwen2"], 6000
    prompts = make_prompts(tiny_tokenizer, texts=["The answer"], seed=7, eos_token_id=[])
    config = make_config(n=draws, temperature=temperature, top_k=top_k, top_p=top_p, response_length=1)
    tokens = NativeRollout(config, model, tiny_tokenizer).generate_sequences(prompts).batch["responses"][:, 0]
    with torch.no_grad():
        logits = model(input_ids=prompts.batch["input_ids"]).logits[0, -1]
    probs = filtered_probs(logits, temperature, top_k, top_p)
    counts = torch.bincount(tokens, minlength=probs.numel()).double()
    assert counts[probs == 0].sum() == 0, "sampled a token the filters remove"
    expected = probs * draws
    big = expected >= 5  # Pearson's chi-square over the well-populated tokens plus one bin for the rest
    observed = torch.cat([counts[big], counts[~big].sum()[None]])
    wanted = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = wanted > 0
    chi2 = (((observed - wanted) ** 2)[keep] / wanted[keep]).sum().item()
    dof = int(keep.sum()) - 1
    assert dof >= 5, "the distribution must have some spread for the test to mean anything"
    assert chi2 < dof + 6 * math.sqrt(2 * dof), (chi2, dof)


def test_n_samples_and_slot_reuse_match_one_at_a_time(models, tiny_tokenizer):
    model = models["qwen2"]
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    alone = [NativeRollout(make_config(), model, tiny_tokenizer)
             .generate_sequences(make_prompts(tiny_tokenizer, texts=[t], do_sample=False, eos_token_id=[]))
             .batch["responses"][0] for t in TEXTS]
    # An eos that stops some rows early, so their slots are refilled while others still run.
    eos = int(alone[0][2])
    expected = torch.stack([r for r in alone for _ in range(3)])
    for max_num_seqs in (2, 5, 1024):
        rollout = NativeRollout(make_config(n=3, max_num_seqs=max_num_seqs), model, tiny_tokenizer)
        out = rollout.generate_sequences(make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=eos)).batch
        assert rollout.last_stats["slots"] == min(max_num_seqs, 12)
        mask = out["response_mask"].bool()
        assert torch.equal(out["responses"][mask], expected[mask])
        assert mask[0].sum() <= 3 and mask.sum() > 3 * 12 // 2
    assert len(prompts) == 4


@pytest.mark.parametrize("max_num_seqs", [5, 1024])
def test_shared_prompt_chunks_follow_admission_and_compaction(models, tiny_tokenizer, monkeypatch, max_num_seqs):
    """The chunk table of the shared-prompt decode attention (a CUDA kernel) stays right while slots are refilled
    and packed: 4 prompts x 3 samples through 5 slots or all at once, rows stopping early at an eos, chunks of 2
    (so a prompt's 3 samples make two chunks). The CPU path reads each row's own copy, so the tokens are those
    of a plain run."""
    from tests.workers.rollout.shared_prompt_checks import watch_shared_prompts

    model = models["qwen2"]
    config = make_config(n=3, max_num_seqs=max_num_seqs)
    torch.manual_seed(3)
    free = NativeRollout(config, model, tiny_tokenizer).generate_sequences(
        make_prompts(tiny_tokenizer, eos_token_id=[])).batch["responses"]
    # Eos tokens: the second tokens of the first 8 rows, so that those stop at once and the last 4 (of prompts 2
    # and 3) are packed into the lowest slots, with their chunks.
    eos = sorted(set(free[:8, 1].tolist()) - set(free[8:, :4].flatten().tolist()))
    torch.manual_seed(3)
    want = NativeRollout(config, model, tiny_tokenizer).generate_sequences(
        make_prompts(tiny_tokenizer, eos_token_id=eos)).batch["responses"]
    seen = watch_shared_prompts(monkeypatch, chunk=2)
    torch.manual_seed(3)
    got = NativeRollout(config, model, tiny_tokenizer).generate_sequences(
        make_prompts(tiny_tokenizer, eos_token_id=eos)).batch["responses"]
    assert torch.equal(got, want)
    assert seen["shared_rows"] > 0, seen
    if max_num_seqs == 5:  # rows waited for slots: freed slots were refilled while others decoded
        assert seen["steps"] > RESPONSE_LENGTH, seen
    else:  # the 4 rows still running after the first step moved into the lowest slots
        assert seen["steps_after_moves"] > 0, seen


def test_eos_and_response_length_per_row(models, tiny_tokenizer):
    model = models["llama"]
    reference = NativeRollout(make_config(), model, tiny_tokenizer) \
        .generate_sequences(make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=[])).batch["responses"]
    eos = int(reference[1, 3])
    out = NativeRollout(make_config(), model, tiny_tokenizer) \
        .generate_sequences(make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=eos)).batch
    for row in range(len(TEXTS)):
        hits = (reference[row] == eos).nonzero()
        stop = int(hits[0]) + 1 if len(hits) else RESPONSE_LENGTH
        assert out["response_mask"][row].sum() == stop
        assert torch.equal(out["responses"][row, :stop], reference[row, :stop])
        assert (out["responses"][row, stop:] == tiny_tokenizer.pad_token_id).all()
    short = NativeRollout(make_config(response_length=3), model, tiny_tokenizer) \
        .generate_sequences(make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=[])).batch
    assert torch.equal(short["responses"], reference[:, :3])


def test_weights_are_shared_and_updates_are_seen(models, tiny_tokenizer):
    model = models["llama"]
    rollout = NativeRollout(make_config(), model, tiny_tokenizer)
    prompts = make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=[])
    before = rollout.generate_sequences(prompts).batch["responses"]
    layer = model.model.layers[0]
    bound = rollout.weights
    assert bound.layers[0].q.data_ptr() == layer.self_attn.q_proj.weight.data_ptr()
    assert bound.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    module_ptrs = {p.data_ptr() for p in model.parameters()}
    assert {t.data_ptr() for t in bound.tensors()} <= module_ptrs
    # A parameter swapped for new storage (as FSDP's unshard may do) is picked up at the next call.
    original = layer.mlp.down_proj.weight
    layer.mlp.down_proj.weight = torch.nn.Parameter(original.detach().clone())
    try:
        rollout.generate_sequences(prompts)
        assert bound.layers[0].down.data_ptr() == layer.mlp.down_proj.weight.data_ptr() != original.data_ptr()
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)  # an in-place "actor update"
        after = rollout.generate_sequences(prompts).batch["responses"]
        hf_after = HFRollout(make_config(), model, tiny_tokenizer).generate_sequences(prompts).batch["responses"]
    finally:
        with torch.no_grad():
            model.lm_head.weight.mul_(-1.0)
        layer.mlp.down_proj.weight = original
    assert not torch.equal(before, after)
    assert torch.equal(after, hf_after)


def test_cache_freed_or_kept(models, tiny_tokenizer):
    model = models["qwen2"]
    prompts = make_prompts(tiny_tokenizer, seed=0)
    rollout = NativeRollout(make_config(), model, tiny_tokenizer)
    rollout.generate_sequences(prompts)
    assert rollout.cache is None
    kept = NativeRollout(make_config(free_cache_engine=False), model, tiny_tokenizer)
    kept.generate_sequences(prompts)
    pointer = kept.cache.k.data_ptr()
    kept.generate_sequences(prompts)
    assert kept.cache.k.data_ptr() == pointer


def test_seed_reproducible_and_validate_is_greedy(models, tiny_tokenizer):
    model = models["qwen3"]
    rollout = NativeRollout(make_config(n=2), model, tiny_tokenizer)
    first = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    again = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    other = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=4)).batch["responses"]
    assert torch.equal(first, again) and not torch.equal(first, other)
    val = rollout.generate_sequences(make_prompts(tiny_tokenizer, validate=True, seed=5)).batch
    greedy = rollout.generate_sequences(make_prompts(tiny_tokenizer, do_sample=False, n=1)).batch
    assert torch.equal(val["responses"], greedy["responses"])


def test_unsupported_architecture_and_registry(tiny_tokenizer):
    gpt2 = AutoModelForCausalLM.from_config(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(UnsupportedModelError, match=r"model_type 'gpt2'.*rollout\.name=hf"):
        NativeRollout(make_config(), gpt2, tiny_tokenizer)
    assert get_rollout_class("native") is NativeRollout
    read = {"gpu_memory_utilization", "enforce_eager", "free_cache_engine", "max_num_seqs",
            "max_num_batched_tokens", "max_model_len"}
    assert not read & set(NativeRollout.ignored_config_keys)


def test_max_model_len_is_checked(models, tiny_tokenizer):
    with pytest.raises(ValueError, match="max_model_len"):
        NativeRollout(make_config(max_model_len=8), models["qwen2"], tiny_tokenizer) \
            .generate_sequences(make_prompts(tiny_tokenizer))
