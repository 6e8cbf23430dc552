"""Padding-free forwards equal padded ones at every valid position (fp32 on CPU, tolerance 1e-5)."""

import pytest
import torch

from verl.models import (
    forward_logprobs,
    forward_values,
    load_causal_lm,
    load_value_model,
)
from verl.models.packed import pack
from verl.rewards.model import load_reward_model, sequence_scores


def _ragged_batch(vocab, prompt=7, response=5):
    """Three rows: left-padded prompts of 7, 4 and 2 tokens, right-padded responses of 5, 2 and 3 tokens."""
    torch.manual_seed(3)
    input_ids = torch.randint(0, vocab, (3, prompt + response))
    mask = torch.zeros_like(input_ids)
    for row, (p, r) in enumerate([(7, 5), (4, 2), (2, 3)]):
        mask[row, prompt - p:prompt + r] = 1
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, mask, position_ids, response


def test_pack_by_hand():
    input_ids = torch.tensor([[0, 0, 5, 6, 7], [0, 0, 0, 8, 9]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [0, 0, 0, 1, 1]])
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack(input_ids, mask, positions)
    assert packed.input_ids.tolist() == [[5, 6, 7, 8, 9]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    assert packed.cu_seqlens.tolist() == [0, 3, 5] and packed.cu_seqlens.dtype == torch.int32
    assert packed.max_seqlen == 3
    # The kernel gets an upper bound rounded to a power of two (fewer distinct ints for torch.compile).
    assert packed.model_kwargs()["max_length_q"] == packed.model_kwargs()["max_length_k"] == 4
    assert packed.index.tolist() == [[-1, -1, 0, 1, 2], [-1, -1, -1, 3, 4]]
    valid, before = packed.response_positions(2)  # tokens 6, 7 and 8, 9: predicted from 5, 6 and (none), 8
    assert valid.tolist() == [[True, True], [True, True]]
    assert before.tolist() == [0, 1, 2, 3]  # 8 is the first token of row 1: its "before" is row 0's last


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_packed_logprobs_and_gradients_equal_padded(tiny_qwen2_dir, temperature):
    model = load_causal_lm(tiny_qwen2_dir, remove_padding=True)
    model.config.attention_dropout = 0.0
    input_ids, mask, positions, response = _ragged_batch(model.config.vocab_size)
    valid = mask[:, -response:].bool()
    weights = torch.randn(valid.shape)

    results = {}
    for remove_padding in (False, True):
        model.zero_grad()
        lp, ent = forward_logprobs(model, input_ids, mask, positions, response, temperature, chunk_size=4,
                                   remove_padding=remove_padding)
        ((lp * weights * valid).sum() + 0.3 * (ent * valid).sum()).backward()
        results[remove_padding] = lp, ent, {n: p.grad.clone() for n, p in model.named_parameters()}

    (lp_pad, ent_pad, grads_pad), (lp_packed, ent_packed, grads_packed) = results[False], results[True]
    torch.testing.assert_close(lp_packed[valid], lp_pad[valid], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_packed[valid], ent_pad[valid], atol=1e-5, rtol=0)
    assert (lp_packed[~valid] == 0).all() and (ent_packed[~valid] == 0).all()
    for name, grad in grads_pad.items():
        torch.testing.assert_close(grads_packed[name], grad, atol=1e-5, rtol=1e-4, msg=name)


def test_packed_with_gradient_checkpointing_recomputes_the_same_boundaries(tiny_qwen2_dir):
    """Backward recomputes each layer with the packed keyword arguments: gradients still equal padded ones."""
    model = load_causal_lm(tiny_qwen2_dir, remove_padding=True, use_gradient_checkpointing=True)
    model.train()
    input_ids, mask, positions, response = _ragged_batch(model.config.vocab_size)
    valid = mask[:, -response:].bool()
    grads = []
    for remove_padding in (False, True):
        model.zero_grad()
        lp, _ = forward_logprobs(model, input_ids, mask, positions, response, compute_entropy=False,
                                 remove_padding=remove_padding)
        (lp * valid).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_packed_model_still_serves_padded_batches_and_generate(tiny_qwen2_dir):
    packed_model = load_causal_lm(tiny_qwen2_dir, remove_padding=True)
    sdpa_model = load_causal_lm(tiny_qwen2_dir)
    input_ids, mask, positions, _ = _ragged_batch(packed_model.config.vocab_size)
    with torch.no_grad():
        a = packed_model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
        b = sdpa_model(input_ids=input_ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(a[mask.bool()], b[mask.bool()])
    prompt = input_ids[:, :7], mask[:, :7]
    kwargs = {"max_new_tokens": 3, "do_sample": False, "pad_token_id": 0}
    assert torch.equal(packed_model.generate(input_ids=prompt[0], attention_mask=prompt[1], **kwargs),
                       sdpa_model.generate(input_ids=prompt[0], attention_mask=prompt[1], **kwargs))


def test_packed_values_and_reward_scores_equal_padded(tiny_qwen2_dir):
    value_model = load_value_model(tiny_qwen2_dir, remove_padding=True)
    input_ids, mask, positions, response = _ragged_batch(value_model.config.vocab_size)
    valid = mask[:, -response:].bool()
    with torch.no_grad():
        padded = forward_values(value_model, input_ids, mask, positions, response)
        packed = forward_values(value_model, input_ids, mask, positions, response, remove_padding=True)
    torch.testing.assert_close(packed[valid], padded[valid], atol=1e-5, rtol=0)

    reward_model = load_reward_model(tiny_qwen2_dir, remove_padding=True)
    with torch.no_grad():
        padded = sequence_scores(reward_model, input_ids, mask, positions)
        packed = sequence_scores(reward_model, input_ids, mask, positions, remove_padding=True)
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)


def test_sliding_window_models_are_refused(tiny_qwen2_dir):
    from verl.models.packed import packed_attention

    q = torch.zeros(1, 2, 3, 4)
    with pytest.raises(ValueError, match="use_remove_padding=false"):
        packed_attention(None, q, q, q, None, sliding_window=16, cu_seq_lens_q=torch.tensor([0, 3]), max_length_q=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (varlen flash attention)")
def test_varlen_flash_attention_on_cuda_equals_padded_sdpa_in_bf16(tiny_qwen2_dir):
    """On CUDA in bf16 the packed path runs torch's varlen flash kernel (not the per-sequence fallback)."""
    from verl.models import packed

    assert packed._varlen() is not None, "this torch has no torch.nn.attention.varlen"
    model = load_causal_lm(tiny_qwen2_dir, dtype="bf16", remove_padding=True).cuda()
    input_ids, mask, positions, response = (t.cuda() if isinstance(t, torch.Tensor) else t
                                            for t in _ragged_batch(model.config.vocab_size))
    valid = mask[:, -response:].bool()
    calls = []
    original = packed._per_sequence
    packed._per_sequence = lambda *a, **k: calls.append(1) or original(*a, **k)
    try:
        lp_packed, ent_packed = forward_logprobs(model, input_ids, mask, positions, response, remove_padding=True)
        (lp_packed * valid).sum().backward()
    finally:
        packed._per_sequence = original
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters()}
    model.zero_grad()
    lp_pad, ent_pad = forward_logprobs(model, input_ids, mask, positions, response)
    (lp_pad * valid).sum().backward()
    assert not calls
    # bf16: the two attention kernels round differently; log-probs agree to bf16 precision.
    torch.testing.assert_close(lp_packed[valid], lp_pad[valid], atol=0.05, rtol=0)
    torch.testing.assert_close(ent_packed[valid], ent_pad[valid], atol=0.05, rtol=0)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], p.grad.float(), atol=0.05, rtol=0.05, msg=name)


def test_sliding_window_models_are_refused_at_load_time(tmp_path):
    from transformers import MistralConfig

    from verl.models.loader import check_packable

    with pytest.raises(ValueError, match=r"actor_rollout_ref.model.path: .*sliding-window.*"
                                         r"set actor_rollout_ref.model.use_remove_padding=false"):
        check_packable(MistralConfig(sliding_window=4096), "actor_rollout_ref.model.path")
    check_packable(MistralConfig(sliding_window=None), "critic.model.path")


def test_gemma2_soft_capped_attention_loads_eager_and_is_not_packed(tmp_path):
    """SDPA cannot soft-cap attention scores: a Gemma 2 policy loads with transformers' eager attention (which
    transformers would otherwise refuse to load it without), and packed forwards are refused naming the key."""
    from transformers import AutoModelForCausalLM, Gemma2Config

    config = Gemma2Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, pad_token_id=0,
                          attn_logit_softcapping=2.0, sliding_window=None, layer_types=["full_attention"] * 2)
    AutoModelForCausalLM.from_config(config, attn_implementation="eager").save_pretrained(tmp_path)
    model = load_causal_lm(str(tmp_path), remove_padding=False)
    assert model.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match=r"soft-capped attention.*use_remove_padding=false"):
        load_causal_lm(str(tmp_path), remove_padding=True)


def test_compiled_packed_forward_traces_no_cached_function(tiny_qwen2_dir, monkeypatch):
    """The packed attention's one-time lookup of the varlen kernel is not a functools cache: dynamo traces through
    those with a warning ("functools.lru_cache-wrapped function") that every compiled run printed."""
    import functools
    import warnings

    from tests.workers.engine.helpers import compiling_in_this_process
    from verl.workers.engine import fsdp as fsdp_module

    model = load_causal_lm(tiny_qwen2_dir, remove_padding=True)  # packed attention, as in training
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    with compiling_in_this_process():
        assert fsdp_module.compile_decoder_layers(model)
        input_ids, mask, position_ids, response = _ragged_batch(model.config.vocab_size)
        with warnings.catch_warnings(record=True) as caught, torch.no_grad():
            warnings.simplefilter("always")
            forward_logprobs(model, input_ids, mask, position_ids, response, remove_padding=True)
    assert not [w for w in caught if "lru_cache" in str(w.message) and "packed.py" in str(w.message)]
