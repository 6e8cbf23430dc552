import math

import pytest
import torch

from verl.utils import torch_functional as F


def test_masked_sum_and_mean_ignore_masked_values_even_nan():
    values = torch.tensor([[1.0, 2.0, float("nan")], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0], [0, 1, 0]])
    assert F.masked_sum(values, mask).item() == 1 + 2 + 5
    assert F.masked_mean(values, mask).item() == pytest.approx((1 + 2 + 5) / 3)
    assert F.masked_mean(values, mask, axis=-1).tolist() == [(1 + 2) / 2, 5.0]


def test_masked_mean_of_empty_mask_is_zero():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[0, 0], [1, 0]])
    assert F.masked_mean(values, mask, axis=-1).tolist() == [0.0, 3.0]
    assert F.masked_mean(values, torch.zeros_like(mask)).item() == 0.0


def test_masked_var_unbiased_and_biased():
    values = torch.tensor([1.0, 2.0, 3.0, 100.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean 2, squared deviations 1 + 0 + 1 = 2
    assert F.masked_var(values, mask).item() == pytest.approx(2 / (3 - 1))
    assert F.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 3)


def test_masked_var_rejects_too_few_elements():
    values = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="no element"):
        F.masked_var(values, torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="single element"):
        F.masked_var(values, torch.tensor([1, 0]))
    assert F.masked_var(values, torch.tensor([1, 0]), unbiased=False).item() == 0.0


def test_masked_whiten():
    values = torch.tensor([2.0, 4.0, 6.0, 50.0])
    mask = torch.tensor([1, 1, 1, 0])
    # mean 4, unbiased var (4 + 0 + 4) / 2 = 4, std 2
    whitened = F.masked_whiten(values, mask)
    assert whitened[:3].tolist() == pytest.approx([-1.0, 0.0, 1.0])
    assert F.masked_whiten(values, mask, shift_mean=False)[:3].tolist() == pytest.approx([-1 + 4, 0 + 4, 1 + 4])


def test_entropy_of_uniform_logits_is_log_vocab():
    logits = torch.full((2, 3, 7), 0.3)
    assert torch.allclose(F.entropy_from_logits(logits), torch.full((2, 3), math.log(7)))


def test_entropy_two_classes_and_large_logits():
    # p = (1/4, 3/4)
    logits = torch.tensor([[0.0, math.log(3.0)], [1000.0, 1000.0]])
    expected = [-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), math.log(2)]
    assert F.entropy_from_logits(logits).tolist() == pytest.approx(expected, abs=1e-6)


def test_logprobs_from_logits_by_hand():
    logits = torch.tensor([[0.0, math.log(3.0)]])
    labels = torch.tensor([1])
    assert F.logprobs_from_logits(logits, labels).item() == pytest.approx(math.log(3 / 4))


def test_logprobs_from_logits_matches_naive_log_softmax():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(0, 11, (2, 5))
    got = F.logprobs_from_logits(logits, labels)
    naive = torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert got.shape == (2, 5)
    assert torch.allclose(got, naive)
    (grad_got,) = torch.autograd.grad(got.sum(), logits)
    (grad_naive,) = torch.autograd.grad(naive.sum(), logits)
    assert torch.allclose(grad_got, grad_naive)


def test_logprobs_from_bf16_logits_are_float32_and_chunked(monkeypatch):
    monkeypatch.setattr(F, "_FP32_CHUNK_ELEMENTS", 2 * 11)  # two rows per chunk: 5 chunks for 10 rows
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11).to(torch.bfloat16)
    labels = torch.randint(0, 11, (2, 5))
    got = F.logprobs_from_logits(logits, labels)
    naive = torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    assert got.dtype == torch.float32
    assert torch.allclose(got, naive, atol=1e-6)


def test_a_weighted_mask_weighs_each_element():
    values = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([1.0, 0.5, 0.0])
    assert F.masked_sum(values, mask).item() == 2.0  # 1*1 + 0.5*2
    assert F.masked_mean(values, mask).item() == pytest.approx(2 / 1.5)
    # mean 4/3; weighted squared deviations 1*(1/3)^2 + 0.5*(2/3)^2 = 1/9 + 2/9 = 1/3, over Σ mask 1.5 -> 2/9;
    # Bessel with n = 1.5: 2/9 * 1.5 / 0.5 = 2/3.
    assert F.masked_var(values, mask, unbiased=False).item() == pytest.approx(2 / 9)
    assert F.masked_var(values, mask).item() == pytest.approx(2 / 3)
    assert F.masked_mean(values, mask.bool()).item() == 1.5  # a bool mask: plain mean of 1 and 2


def test_get_response_mask_stops_after_the_first_eos():
    responses = torch.tensor([[5, 7, 2, 0, 0], [2, 1, 1, 1, 1], [3, 4, 6, 8, 9]])
    assert F.get_response_mask(responses, eos_token=2).tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1] * 5]
    mask = F.get_response_mask(responses, eos_token=[2, 6], dtype=torch.bool)
    assert mask.dtype == torch.bool and mask[2].tolist() == [True, True, True, False, False]


def test_padding_helpers():
    assert F.pad_2d_list_to_length([[1, 2], [3]], 0).tolist() == [[1, 2], [3, 0]]
    assert F.pad_2d_list_to_length([[1, 2], [3]], 0, max_length=4).tolist() == [[1, 2, 0, 0], [3, 0, 0, 0]]
    assert F.pad_2d_list_to_length([[1, 2], [3]], 0, max_length=1).tolist() == [[1, 2], [3, 0]]
    row = torch.tensor([[1, 2]])
    assert F.pad_sequence_to_length(row, 4, 9).tolist() == [[1, 2, 9, 9]]
    assert F.pad_sequence_to_length(row, 4, 9, left_pad=True).tolist() == [[9, 9, 1, 2]]
    assert F.pad_sequence_to_length(row, 1, 9) is row
    assert F.remove_pad_token(torch.tensor([[0, 0, 7, 8], [0, 5, 6, 9]]),
                              torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])) == [[7, 8], [5, 6, 9]]


def test_postprocess_data_pads_and_truncates():
    ids, mask = torch.tensor([[1, 2, 3, 4, 5]]), torch.ones(1, 5, dtype=torch.long)
    padded_ids, padded_mask = F.postprocess_data(ids, mask, 7, pad_token_id=0)  # left padding by default
    assert padded_ids.tolist() == [[0, 0, 1, 2, 3, 4, 5]] and padded_mask.tolist() == [[0, 0, 1, 1, 1, 1, 1]]
    assert F.postprocess_data(ids, mask, 4, 0, truncation="left")[0].tolist() == [[2, 3, 4, 5]]
    assert F.postprocess_data(ids, mask, 4, 0, truncation="right")[0].tolist() == [[1, 2, 3, 4]]
    assert F.postprocess_data(ids, mask, 4, 0, truncation="middle")[0].tolist() == [[1, 2, 4, 5]]  # 2 + 2
    assert F.postprocess_data(ids, mask, 3, 0, truncation="middle")[0].tolist() == [[1, 4, 5]]  # 1 + 2
    with pytest.raises(NotImplementedError, match="larger than max_length"):
        F.postprocess_data(ids, mask, 4, 0)
    with pytest.raises(ValueError, match="truncation"):
        F.postprocess_data(ids, mask, 4, 0, truncation="both")


def test_small_helpers_by_hand():
    x = torch.tensor([-2.0, 0.5, 3.0])
    assert F.clip_by_value(x, torch.tensor([-1.0, 1.0, -1.0]), torch.tensor([1.0, 2.0, 2.0])).tolist() == [-1, 1, 2]
    entropy = F.entropy_from_logits_with_chunking(torch.zeros(5, 4, dtype=torch.bfloat16), chunk_size=2)
    assert entropy.dtype == torch.float32 and entropy.tolist() == pytest.approx([math.log(4)] * 5)
    # Logits at t predict token t + 1: [0, log 3] gives token 0 probability 1/4, [log 3, 0] token 1 1/4.
    logits = torch.tensor([[[0.0, math.log(3.0)], [math.log(3.0), 0.0], [5.0, 5.0]]])
    got = F.log_probs_from_logits_response(torch.tensor([[1, 0, 1]]), logits, response_length=2)
    assert got[0].tolist() == pytest.approx([math.log(0.25), math.log(0.25)])
    assert F.logprobs_from_logits(logits[0], torch.tensor([1, 0, 1]), inplace_backward=False).shape == (3,)
    layer = torch.nn.Linear(2, 1)
    layer.weight.grad, layer.bias.grad = torch.tensor([[3.0, 4.0]]), torch.tensor([12.0])
    assert F.compute_grad_norm(layer) == 169.0  # 9 + 16 + 144: the squared norm
