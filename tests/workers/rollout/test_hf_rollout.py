"""HFRollout against hand-written references on tiny random Qwen2/Llama models (CPU, fp32)."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.protocol import DataProto
from verl.workers.rollout import HFRollout, get_rollout_class, register_rollout

RESPONSE_LENGTH = 6
TEXTS = ["Natalia sold clips to her friends", "The answer", "How many clips did"]


@pytest.fixture(scope="module", params=["qwen2", "llama"])
def model(request, tiny_qwen2_dir, tiny_llama_dir):
    path = {"qwen2": tiny_qwen2_dir, "llama": tiny_llama_dir}[request.param]
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


@pytest.fixture(scope="module")
def qwen2(tiny_qwen2_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)


def make_config(**overrides):
    config = {"name": "hf", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "n": 1,
              "prompt_length": 16, "response_length": RESPONSE_LENGTH, "ignore_eos": False,
              "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False}}
    config.update(overrides)
    return OmegaConf.create(config)


def make_prompts(tokenizer, texts=TEXTS, **meta_info):
    enc = tokenizer(texts, return_tensors="pt", padding=True)
    assert (enc.attention_mask[:, 0] == 0).any(), "the test needs prompts of mixed lengths"
    position_ids = torch.clamp(enc.attention_mask.cumsum(dim=1) - 1, min=0)
    return DataProto.from_dict(
        {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "position_ids": position_ids},
        {"uid": [f"u{i}" for i in range(len(texts))], "data_source": [f"src{i}" for i in range(len(texts))]},
        meta_info,
    )


@torch.no_grad()
def manual_greedy(model, prompts, steps=RESPONSE_LENGTH):
    """argmax token by token with full forwards (no KV cache), ignoring eos."""
    ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
    for _ in range(steps):
        positions = torch.clamp(mask.cumsum(dim=1) - 1, min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits[:, -1]
        ids = torch.cat([ids, logits.argmax(dim=-1, keepdim=True)], dim=1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return ids[:, prompts.batch["input_ids"].shape[1]:]


def cut_at_eos(responses, eos_ids, pad_id):
    """Expected responses and masks: the first eos kept, pad after it."""
    responses, masks = responses.clone(), torch.ones_like(responses)
    for row in range(responses.shape[0]):
        hits = [i for i, t in enumerate(responses[row].tolist()) if t in eos_ids]
        if hits:
            responses[row, hits[0] + 1:] = pad_id
            masks[row, hits[0] + 1:] = 0
    return responses, masks


def check_layout(out, prompts, n):
    """Shapes, interleaving, and the concatenated ids/masks/positions."""
    B, P = prompts.batch["input_ids"].shape
    R = RESPONSE_LENGTH
    batch = out.batch
    assert batch["prompts"].shape == (B * n, P) and batch["responses"].shape == (B * n, R)
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert batch[key].shape == (B * n, P + R), key
    assert batch["response_mask"].shape == (B * n, R)
    assert batch["rollout_log_probs"].shape == (B * n, R) and batch["rollout_log_probs"].dtype == torch.float32
    assert torch.equal(batch["prompts"], prompts.batch["input_ids"].repeat_interleave(n, dim=0))
    assert torch.equal(batch["input_ids"], torch.cat([batch["prompts"], batch["responses"]], dim=1))
    prompt_mask = prompts.batch["attention_mask"].repeat_interleave(n, dim=0)
    assert torch.equal(batch["attention_mask"], torch.cat([prompt_mask, batch["response_mask"]], dim=1))
    last = prompts.batch["position_ids"][:, -1:].repeat_interleave(n, dim=0)
    assert torch.equal(batch["position_ids"][:, P:], last + torch.arange(1, R + 1))
    assert torch.equal(batch["position_ids"][:, :P], prompts.batch["position_ids"].repeat_interleave(n, dim=0))
    assert (batch["rollout_log_probs"][batch["response_mask"] == 0] == 0).all()
    for key, values in prompts.non_tensor_batch.items():
        assert list(out.non_tensor_batch[key]) == [v for v in values for _ in range(n)]


@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_greedy_matches_manual_loop(model, tiny_tokenizer, micro_batch_size):
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    rollout = HFRollout(make_config(micro_batch_size=micro_batch_size), model, tiny_tokenizer)
    out = rollout.generate_sequences(prompts)
    check_layout(out, prompts, n=1)
    expected, masks = cut_at_eos(manual_greedy(model, prompts), [tiny_tokenizer.eos_token_id],
                                 tiny_tokenizer.pad_token_id)
    assert torch.equal(out.batch["responses"], expected)
    assert torch.equal(out.batch["response_mask"], masks)
    assert out.meta_info["do_sample"] is False


def test_forced_eos_pads_after_it(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    reference = manual_greedy(qwen2, prompts)
    eos = int(reference[0, 2])
    prompts.meta_info["eos_token_id"] = eos
    out = HFRollout(make_config(), qwen2, tiny_tokenizer).generate_sequences(prompts)
    check_layout(out, prompts, n=1)
    expected, masks = cut_at_eos(reference, [eos], tiny_tokenizer.pad_token_id)
    assert masks[0].sum() <= 3 and masks[0, -1] == 0, "row 0 must stop at step 2 or earlier"
    assert torch.equal(out.batch["responses"], expected)
    assert torch.equal(out.batch["response_mask"], masks)


def test_all_rows_stop_early_still_full_length(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    first_tokens = manual_greedy(qwen2, prompts, steps=1)[:, 0].tolist()
    prompts.meta_info["eos_token_id"] = first_tokens  # a list of eos ids: every row ends at step 0
    out = HFRollout(make_config(), qwen2, tiny_tokenizer).generate_sequences(prompts)
    check_layout(out, prompts, n=1)
    assert out.batch["responses"][:, 0].tolist() == first_tokens
    assert (out.batch["responses"][:, 1:] == tiny_tokenizer.pad_token_id).all()
    assert out.batch["response_mask"].sum(dim=1).tolist() == [1, 1, 1]


def test_ignore_eos_gives_full_length(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    reference = manual_greedy(qwen2, prompts)
    prompts.meta_info["eos_token_id"] = int(reference[0, 1])
    out = HFRollout(make_config(ignore_eos=True), qwen2, tiny_tokenizer).generate_sequences(prompts)
    assert torch.equal(out.batch["responses"], reference)
    assert (out.batch["response_mask"] == 1).all()


def test_n_samples_are_interleaved(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, seed=0)
    out = HFRollout(make_config(n=3), qwen2, tiny_tokenizer).generate_sequences(prompts)
    check_layout(out, prompts, n=3)
    assert len(out) == 9 and list(out.non_tensor_batch["uid"][:4]) == ["u0", "u0", "u0", "u1"]
    # Samples of one prompt differ (independent draws over a ~500-token vocabulary).
    assert len({tuple(r) for r in out.batch["responses"][:3].tolist()}) > 1


def test_rollout_log_probs_match_full_forward(model, tiny_tokenizer):
    temperature = 0.7
    prompts = make_prompts(tiny_tokenizer, seed=1)
    config = make_config(n=2, temperature=temperature, top_k=20, top_p=0.95)
    out = HFRollout(config, model, tiny_tokenizer).generate_sequences(prompts)
    batch = out.batch
    P = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, P - 1:-1]
    # Log-probs are under the unfiltered tempered distribution, while sampling applied top-k.
    scaled = logits / temperature
    expected = torch.log_softmax(scaled, dim=-1).gather(-1, batch["responses"][..., None]).squeeze(-1)
    valid = batch["response_mask"].bool()
    assert (batch["rollout_log_probs"][valid] - expected[valid]).abs().max() < 1e-4
    rank = (scaled > scaled.gather(-1, batch["responses"][..., None])).sum(dim=-1)
    assert (rank[valid] < 20).all()


def test_validate_uses_val_kwargs(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer, validate=True, seed=0)
    out = HFRollout(make_config(n=4, temperature=1.5), qwen2, tiny_tokenizer).generate_sequences(prompts)
    check_layout(out, prompts, n=1)
    expected, _ = cut_at_eos(manual_greedy(qwen2, prompts), [tiny_tokenizer.eos_token_id],
                             tiny_tokenizer.pad_token_id)
    assert torch.equal(out.batch["responses"], expected)


@pytest.mark.parametrize("top_k", [-1, 5])
def test_model_generation_config_does_not_leak(tiny_qwen2_dir, tiny_tokenizer, top_k):
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)
    model.generation_config.top_k = 5
    model.generation_config.repetition_penalty = 1.3
    # Near-uniform over ~500 tokens: each draw lands beyond the top 50 (transformers' default
    # top_k) with probability ~0.9, so 36 draws all inside it would mean top-k was not disabled.
    temperature = 100.0
    prompts = make_prompts(tiny_tokenizer, seed=0, eos_token_id=[])
    out = HFRollout(make_config(temperature=temperature, top_k=top_k, n=2), model, tiny_tokenizer) \
        .generate_sequences(prompts)
    batch = out.batch
    P = batch["prompts"].shape[1]
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits[:, P - 1:-1]
    rank = (logits > logits.gather(-1, batch["responses"][..., None])).sum(dim=-1)
    if top_k == -1:
        assert (rank >= 50).any()
    else:
        assert (rank < 5).all()
    assert model.generation_config.top_k == 5 and model.generation_config.repetition_penalty == 1.3


def test_seed_makes_a_call_reproducible(qwen2, tiny_tokenizer):
    rollout = HFRollout(make_config(), qwen2, tiny_tokenizer)
    first = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    second = rollout.generate_sequences(make_prompts(tiny_tokenizer, seed=3)).batch["responses"]
    assert torch.equal(first, second)


def test_eval_mode_during_generation_and_training_mode_restored(qwen2, tiny_tokenizer):
    modes = []
    handle = qwen2.register_forward_pre_hook(lambda module, args: modes.append(module.training))
    qwen2.train()
    try:
        HFRollout(make_config(), qwen2, tiny_tokenizer).generate_sequences(make_prompts(tiny_tokenizer, seed=0))
    finally:
        handle.remove()
    assert modes and not any(modes)
    assert qwen2.training
    qwen2.eval()


def test_right_padded_prompts_are_rejected(qwen2, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer)
    for key in ("input_ids", "attention_mask", "position_ids"):
        prompts.batch[key] = prompts.batch[key].flip(dims=[1])
    with pytest.raises(ValueError, match="left-padded"):
        HFRollout(make_config(), qwen2, tiny_tokenizer).generate_sequences(prompts)


def test_missing_response_length_is_a_clear_error(qwen2, tiny_tokenizer):
    with pytest.raises(ValueError, match="response_length"):
        HFRollout(make_config(response_length=None), qwen2, tiny_tokenizer) \
            .generate_sequences(make_prompts(tiny_tokenizer))


def test_registry():
    assert get_rollout_class("hf") is HFRollout
    with pytest.raises(ValueError, match=r"'vllm' is .*the built-in engines are: hf, native\. "
                                         r"Set actor_rollout_ref\.rollout\.name=hf"):
        get_rollout_class("vllm")
    with pytest.raises(ValueError, match="did you mean hf"):
        get_rollout_class("hff")
    with pytest.raises(ValueError, match="already registered"):
        register_rollout("hf")(type("Other", (), {}))
