import pytest
import torch

from verl.models import (
    forward_logprobs,
    forward_values,
    load_causal_lm,
    load_value_model,
    logprobs_and_entropy_from_hidden,
)


def naive_logprobs_entropy(hidden, weight, labels, temperature):
    logits = (hidden.float() @ weight.float().T) / temperature
    logp_all = torch.log_softmax(logits, dim=-1)
    log_probs = logp_all.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return log_probs, entropy


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_chunked_matches_full_logits_with_gradients(temperature):
    torch.manual_seed(0)
    hidden = torch.randn(3, 10, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    labels = torch.randint(0, 50, (3, 10))
    a, b = torch.randn(3, 10), torch.randn(3, 10)

    lp, ent = logprobs_and_entropy_from_hidden(hidden, weight, labels, temperature=temperature, chunk_size=7)
    ((lp * a).sum() + (ent * b).sum()).backward()
    got_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None

    ref_lp, ref_ent = naive_logprobs_entropy(hidden, weight, labels, temperature)
    ((ref_lp * a).sum() + (ref_ent * b).sum()).backward()

    assert lp.shape == ent.shape == (3, 10) and lp.dtype == torch.float32
    assert (lp - ref_lp).abs().max() < 1e-5
    assert (ent - ref_ent).abs().max() < 1e-5
    assert (got_grads[0] - hidden.grad).abs().max() < 1e-5
    assert (got_grads[1] - weight.grad).abs().max() < 1e-5


def test_entropy_off_and_no_grad():
    hidden, weight, labels = torch.randn(4, 8), torch.randn(20, 8), torch.randint(0, 20, (4,))
    with torch.no_grad():
        lp, ent = logprobs_and_entropy_from_hidden(hidden, weight, labels, compute_entropy=False, chunk_size=3)
    assert ent is None
    assert (lp - naive_logprobs_entropy(hidden, weight, labels, 1.0)[0]).abs().max() < 1e-5


def test_backward_never_keeps_a_full_logits_tensor():
    n, vocab = 64, 100
    hidden = torch.randn(n, 8, requires_grad=True)
    weight = torch.randn(vocab, 8, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, ent = logprobs_and_entropy_from_hidden(hidden, weight, torch.randint(0, vocab, (n,)), chunk_size=16)
    (lp.sum() + ent.sum()).backward()
    # Only the chunk's inputs are stored; its 16 x 100 logits are recomputed in backward.
    assert max(saved) <= vocab * 8


def _batch(vocab, batch=2, prompt=5, response=4):
    torch.manual_seed(1)
    input_ids = torch.randint(0, vocab, (batch, prompt + response))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0  # left padding on the first prompt
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return input_ids, attention_mask, position_ids


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_forward_logprobs_matches_model_logits(tiny_qwen2_dir, temperature):
    model = load_causal_lm(tiny_qwen2_dir)
    input_ids, attention_mask, position_ids = _batch(model.config.vocab_size)
    response = 4

    lp, ent = forward_logprobs(model, input_ids, attention_mask, position_ids, response, temperature, chunk_size=3)
    (lp.sum() + 0.3 * ent.sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()

    logits = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    logp_all = torch.log_softmax(logits[:, -response - 1:-1].float() / temperature, dim=-1)
    ref_lp = logp_all.gather(-1, input_ids[:, -response:].unsqueeze(-1)).squeeze(-1)
    ref_ent = -(logp_all.exp() * logp_all).sum(-1)
    (ref_lp.sum() + 0.3 * ref_ent.sum()).backward()

    assert lp.shape == (2, response)
    assert (lp - ref_lp).abs().max() < 1e-5
    assert (ent - ref_ent).abs().max() < 1e-5
    for name, p in model.named_parameters():
        assert (grads[name] - p.grad).abs().max() < 1e-5, name


def test_forward_logprobs_rejects_bad_response_length(tiny_qwen2_dir):
    model = load_causal_lm(tiny_qwen2_dir)
    input_ids, attention_mask, position_ids = _batch(model.config.vocab_size)
    with pytest.raises(ValueError, match="response_length"):
        forward_logprobs(model, input_ids, attention_mask, position_ids, input_ids.shape[1])


def test_forward_values_reads_positions_before_each_response_token(tiny_qwen2_dir):
    model = load_value_model(tiny_qwen2_dir)
    input_ids, attention_mask, position_ids = _batch(model.config.vocab_size)
    values = forward_values(model, input_ids, attention_mask, position_ids, 4)
    full = model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits[..., 0]
    assert values.shape == (2, 4)
    torch.testing.assert_close(values, full[:, 4:8])
