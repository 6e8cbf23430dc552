import pytest
import torch

from verl.protocol import DataProto
from verl.rewards.managers import (
    BatchRewardManager,
    DAPORewardManager,
    NaiveRewardManager,
    get_reward_manager_cls,
    register,
)
from verl.rewards.managers.dapo import overlong_penalty

PROMPT_LEN, RESPONSE_LEN = 12, 10


def make_batch(tokenizer, prompts, responses, ground_truths, data_source="openai/gsm8k", extra_info=None):
    """Left-pad prompts and right-pad responses to fixed widths, as the rollout does."""
    pad = tokenizer.pad_token_id
    rows_p, rows_r, masks = [], [], []
    for prompt, response in zip(prompts, responses):
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(response, add_special_tokens=False)
        assert len(p) <= PROMPT_LEN and len(r) <= RESPONSE_LEN
        rows_p.append([pad] * (PROMPT_LEN - len(p)) + p)
        rows_r.append(r + [pad] * (RESPONSE_LEN - len(r)))
        masks.append([0] * (PROMPT_LEN - len(p)) + [1] * (len(p) + len(r)) + [0] * (RESPONSE_LEN - len(r)))
    non_tensors = {
        "data_source": [data_source] * len(prompts),
        "reward_model": [{"style": "rule", "ground_truth": gt} for gt in ground_truths],
    }
    if extra_info is not None:
        non_tensors["extra_info"] = extra_info
    return DataProto.from_dict(
        tensors={"prompts": torch.tensor(rows_p), "responses": torch.tensor(rows_r),
                 "attention_mask": torch.tensor(masks)},
        non_tensors=non_tensors, meta_info={})


def response_lengths(tokenizer, responses):
    return [len(tokenizer.encode(r, add_special_tokens=False)) for r in responses]


def test_registry_lists_the_managers():
    assert get_reward_manager_cls("naive") is NaiveRewardManager
    assert get_reward_manager_cls("batch") is BatchRewardManager
    assert get_reward_manager_cls("dapo") is DAPORewardManager
    with pytest.raises(ValueError, match=r"Unknown reward manager: nope\. Registered: batch, dapo, naive, prime.*"
                                         r"reward_model.reward_manager"):
        get_reward_manager_cls("nope")
    with pytest.raises(ValueError, match="has already been registered"):
        register("naive")(type("Other", (), {}))


def test_naive_rewards_the_last_valid_token(tiny_tokenizer):
    responses = ["#### 72<|im_end|>", "So #### 5<|im_end|>"]
    lengths = response_lengths(tiny_tokenizer, responses)
    assert lengths[0] != lengths[1]
    data = make_batch(tiny_tokenizer, ["What is 8*9?", "What is 2+2?"], responses, ["72", "4"])
    reward = NaiveRewardManager(tiny_tokenizer, num_examine=0)(data)
    assert reward.dtype == torch.float32 and reward.shape == (2, RESPONSE_LEN)
    expected = torch.zeros(2, RESPONSE_LEN)
    expected[0, lengths[0] - 1] = 1.0  # "#### 72" is right; the reward sits on <|im_end|>
    assert torch.equal(reward, expected)  # "#### 5" is wrong: 0 everywhere


def test_naive_passes_decoded_strings_and_extra_info(tiny_tokenizer):
    calls = []

    def scorer(data_source, solution_str, ground_truth, extra_info, bonus=0.0):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5 + bonus

    data = make_batch(tiny_tokenizer, ["What is 8*9?"], ["#### 72<|im_end|>"], ["72"],
                      extra_info=[{"index": 7}])
    reward = NaiveRewardManager(tiny_tokenizer, 0, compute_score=scorer, bonus=0.25)(data)
    # Special tokens are skipped when decoding; manager kwargs reach every call.
    assert calls == [("openai/gsm8k", "#### 72", "72", {"index": 7})]
    assert reward.sum().item() == 0.75


def test_dict_results_fill_reward_extra_info(tiny_tokenizer):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        right = solution_str.endswith(ground_truth)
        return {"score": 1.0 if right else -1.0, "acc": right, "pred": solution_str[-2:]}

    data = make_batch(tiny_tokenizer, ["q1", "q2"], ["#### 72<|im_end|>", "#### 5<|im_end|>"], ["72", "4"])
    out = NaiveRewardManager(tiny_tokenizer, 0, compute_score=scorer)(data, return_dict=True)
    assert out["reward_extra_info"] == {"score": [1.0, -1.0], "acc": [True, False], "pred": ["72", " 5"]}
    assert out["reward_tensor"].sum(-1).tolist() == [1.0, -1.0]


def test_scorer_must_report_the_same_keys_for_every_sample(tiny_tokenizer):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "acc": True} if ground_truth == "72" else 0.0

    data = make_batch(tiny_tokenizer, ["q1", "q2"], ["#### 72<|im_end|>", "#### 5<|im_end|>"], ["72", "4"])
    with pytest.raises(ValueError, match="for 1 of 2 samples; it must return the same keys"):
        NaiveRewardManager(tiny_tokenizer, 0, compute_score=scorer)(data)


def test_scorer_exception_names_source_index_and_ground_truth(tiny_tokenizer):
    def scorer(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "4":
            raise ZeroDivisionError("boom")
        return 0.0

    data = make_batch(tiny_tokenizer, ["q1", "q2"], ["#### 72<|im_end|>", "#### 5<|im_end|>"], ["72", "4"])
    with pytest.raises(RuntimeError) as info:
        NaiveRewardManager(tiny_tokenizer, 0, compute_score=scorer)(data)
    message = str(info.value)
    assert "openai/gsm8k" in message and "sample 1" in message and "'4'" in message
    assert "#### 5" in message and "boom" in message
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_empty_response_gets_its_reward_on_token_zero(tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["q"], [""], ["72"])
    reward = NaiveRewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: -1.0)(data)
    assert reward[0, 0].item() == -1.0 and reward.sum().item() == -1.0


def test_examples_are_printed_per_data_source(tiny_tokenizer, capsys):
    data = make_batch(tiny_tokenizer, ["q1", "q2"], ["#### 72<|im_end|>", "#### 5<|im_end|>"], ["72", "4"])
    NaiveRewardManager(tiny_tokenizer, num_examine=1)(data)
    out = capsys.readouterr().out
    assert out.count("[prompt]") == 1
    assert "[response] #### 72" in out and "[ground_truth] 72" in out and "[score] 1.0" in out


def test_rm_scores_pass_through_unchanged(tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["q"], ["#### 72<|im_end|>"], ["72"])
    rm_scores = torch.full((1, RESPONSE_LEN), 0.3)
    data.batch["rm_scores"] = rm_scores
    manager = NaiveRewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: 1 / 0)
    assert manager(data) is rm_scores
    assert manager(data, return_dict=True)["reward_tensor"] is rm_scores


def test_missing_ground_truth_column_is_reported(tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["q"], ["#### 72<|im_end|>"], ["72"])
    data.non_tensor_batch.pop("data_source")
    with pytest.raises(KeyError, match="data_source"):
        NaiveRewardManager(tiny_tokenizer, 0)(data)


def test_batch_manager_scores_once_with_lists(tiny_tokenizer):
    calls = []

    def batch_scorer(data_sources, solution_strs, ground_truths, extra_infos, scale=1.0):
        calls.append((list(data_sources), list(solution_strs), list(ground_truths), list(extra_infos)))
        return [scale * float(s.endswith(gt)) for s, gt in zip(solution_strs, ground_truths)]

    responses = ["#### 72<|im_end|>", "So #### 5<|im_end|>"]
    lengths = response_lengths(tiny_tokenizer, responses)
    data = make_batch(tiny_tokenizer, ["q1", "q2"], responses, ["72", "5"])
    reward = BatchRewardManager(tiny_tokenizer, 0, compute_score=batch_scorer, scale=2.0)(data)
    assert len(calls) == 1
    assert calls[0] == (["openai/gsm8k"] * 2, ["#### 72", "So #### 5"], ["72", "5"], [None, None])
    assert reward[0, lengths[0] - 1] == 2.0 and reward[1, lengths[1] - 1] == 2.0
    assert reward.sum().item() == 4.0


def test_batch_manager_checks_result_length_and_needs_a_function(tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["q1", "q2"], ["#### 72<|im_end|>", "#### 5<|im_end|>"], ["72", "5"])
    manager = BatchRewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: [1.0])
    with pytest.raises(ValueError, match="returned 1 scores for a batch of 2"):
        manager(data)
    with pytest.raises(ValueError, match="custom_reward_function.path"):
        BatchRewardManager(tiny_tokenizer, 0)


def test_overlong_penalty_by_hand():
    # max 8, buffer 4 -> expected length 4; each token past 4 costs 1/4 of the factor.
    assert overlong_penalty(3, 8, 4, 1.0) == 0.0
    assert overlong_penalty(4, 8, 4, 1.0) == 0.0
    assert overlong_penalty(6, 8, 4, 1.0) == -0.5
    assert overlong_penalty(8, 8, 4, 1.0) == -1.0
    assert overlong_penalty(7, 8, 4, 2.0) == -1.5


def test_dapo_overlong_shaping(tiny_tokenizer):
    # Responses of exactly 3, 6 and 8 tokens (one repeated token) under max 8, buffer 4.
    token = tiny_tokenizer.encode("x", add_special_tokens=False)
    assert len(token) == 1
    pad = tiny_tokenizer.pad_token_id
    lengths = [3, 6, 8]
    responses = torch.tensor([token * n + [pad] * (RESPONSE_LEN - n) for n in lengths])
    prompts = torch.tensor([[pad] * (PROMPT_LEN - 1) + token] * 3)
    mask = torch.tensor([[0] * (PROMPT_LEN - 1) + [1] * (1 + n) + [0] * (RESPONSE_LEN - n) for n in lengths])
    data = DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask},
        non_tensors={"data_source": ["toy"] * 3, "reward_model": [{"ground_truth": "x"}] * 3})
    cfg = {"enable": True, "len": 4, "penalty_factor": 1.0, "log": True}
    manager = DAPORewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: 1.0, max_resp_len=8,
                                overlong_buffer_cfg=cfg)
    out = manager(data, return_dict=True)
    rewards = out["reward_tensor"]
    assert [rewards[i, n - 1].item() for i, n in enumerate(lengths)] == [1.0, 0.5, 0.0]
    assert rewards.sum().item() == 1.5
    # a plain-number scorer's score is recorded as acc, before the penalty (filter_groups.metric=acc)
    assert out["reward_extra_info"] == {"acc": [1.0, 1.0, 1.0], "overlong_reward": [0.0, -0.5, -1.0],
                                        "overlong": [False, True, True]}

    cfg_quiet = {**cfg, "log": False}
    quiet = DAPORewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: 1.0, max_resp_len=8,
                              overlong_buffer_cfg=cfg_quiet)(data, return_dict=True)
    assert quiet["reward_extra_info"] == {"acc": [1.0, 1.0, 1.0]}
    scored = DAPORewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: {"score": 0.5, "pred": "x"},
                               max_resp_len=8, overlong_buffer_cfg=cfg_quiet)(data, return_dict=True)
    assert scored["reward_extra_info"] == {"score": [0.5] * 3, "pred": ["x"] * 3}  # a dict scorer's own keys
    off = DAPORewardManager(tiny_tokenizer, 0, compute_score=lambda **kw: 1.0, max_resp_len=8,
                            overlong_buffer_cfg={**cfg, "enable": False})(data)
    assert off.sum().item() == 3.0


def test_dapo_validates_the_buffer_length(tiny_tokenizer):
    with pytest.raises(ValueError, match="reward_model.overlong_buffer.len=16"):
        DAPORewardManager(tiny_tokenizer, 0, max_resp_len=8, overlong_buffer_cfg={"enable": True, "len": 16})
    with pytest.raises(ValueError, match="max_response_length"):
        DAPORewardManager(tiny_tokenizer, 0, overlong_buffer_cfg={"enable": True, "len": 4})


@pytest.mark.parametrize("returned, expected", [
    ("0.5", r"returned '0.5' \(str\) for sample 0 of the batch; a reward must be a number"),
    (None, r"returned None \(NoneType\) for sample 0"),
    ({"score": "1"}, r"returned '1' \(str\)"),
    ([1.0], r"returned \[1.0\] \(list\)"),
    (float("nan"), r"returned nan for sample 0 of the batch; rewards must be finite"),
])
def test_a_reward_that_is_not_a_number_stops_the_run(tiny_tokenizer, returned, expected):
    data = make_batch(tiny_tokenizer, ["What is 8*9?"], ["#### 72"], ["72"])
    manager = NaiveRewardManager(tiny_tokenizer, num_examine=0, compute_score=lambda **kw: returned)
    with pytest.raises((TypeError, ValueError), match=r"compute_score \(data_source='openai/gsm8k'\) " + expected):
        manager(data)


def test_numpy_and_bool_rewards_are_numbers(tiny_tokenizer):
    import numpy as np

    data = make_batch(tiny_tokenizer, ["a", "b"], ["x", "y"], ["1", "2"])
    for value, expected in ((np.float32(0.25), 0.25), (True, 1.0), (torch.tensor(0.5), 0.5), (np.bool_(True), 1.0),
                            (np.array(0.75), 0.75)):
        reward = NaiveRewardManager(tiny_tokenizer, num_examine=0, compute_score=lambda **kw: value)(data)
        assert reward.sum(-1).tolist() == [expected, expected]


def test_a_row_without_ground_truth_stops_the_run(tiny_tokenizer):
    data = make_batch(tiny_tokenizer, ["What is 8*9?", "b"], ["#### 72", "y"], ["72", None])
    with pytest.raises(ValueError, match=r"sample 1 of the batch \(dataset row index None\) has "
                                         r"reward_model.ground_truth None"):
        NaiveRewardManager(tiny_tokenizer, num_examine=0)(data)


def test_prime_scores_samples_side_by_side_and_a_late_one_scores_zero(tiny_tokenizer, caplog):
    import threading

    from verl.rewards.managers import PrimeRewardManager

    together = threading.Barrier(3, timeout=20)  # passes only if three scorings run at the same time
    release = threading.Event()

    def score(data_source, solution_str, ground_truth, extra_info=None):
        if ground_truth == "9":
            release.wait(60)  # still running when the manager gives up on it
        else:
            together.wait()
        return 1.0 if ground_truth in solution_str else 0.25

    responses = ["#### 72", "#### 5", "#### 7", "#### 9"]
    data = make_batch(tiny_tokenizer, ["a", "b", "c", "d"], responses, ["72", "4", "7", "9"])
    manager = PrimeRewardManager(tiny_tokenizer, num_examine=0, compute_score=score, timeout=1.0)
    try:
        out = manager(data, return_dict=True)
    finally:
        release.set()
    lengths = response_lengths(tiny_tokenizer, responses)
    last = [out["reward_tensor"][i, lengths[i] - 1].item() for i in range(4)]
    assert last == [1.0, 0.25, 1.0, 0.0]  # the last sample ran past the 1 s limit
    assert out["reward_extra_info"]["acc"] == [1.0, 0.25, 1.0, 0.0]
    assert "sample 3 (data_source='openai/gsm8k') was not scored within 1 s" in caplog.text


def test_prime_needs_the_same_keys_from_every_sample_like_naive(tiny_tokenizer):
    from verl.rewards.managers import PrimeRewardManager

    def mixed(data_source, solution_str, ground_truth, extra_info=None):
        return {"score": 1.0, "acc": True} if ground_truth == "1" else 0.5

    data = make_batch(tiny_tokenizer, ["a", "b"], ["#### 1", "#### 2"], ["1", "2"])
    with pytest.raises(ValueError, match="returned 'score' for 1 of 2 samples"):
        PrimeRewardManager(tiny_tokenizer, num_examine=0, compute_score=mixed)(data)


def test_prime_reports_a_failing_scorer_like_naive(tiny_tokenizer):
    from verl.rewards.managers import PrimeRewardManager

    def broken(data_source, solution_str, ground_truth, extra_info=None):
        raise KeyError("answer")

    data = make_batch(tiny_tokenizer, ["a"], ["#### 1"], ["1"])
    with pytest.raises(RuntimeError, match=r"compute_score raised KeyError: 'answer' \(data_source='openai/gsm8k', "
                                           r"sample 0 of the batch"):
        PrimeRewardManager(tiny_tokenizer, num_examine=0, compute_score=broken)(data)
