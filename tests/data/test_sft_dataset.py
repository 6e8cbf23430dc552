"""SFTDataset on the tiny ChatML tokenizer: which tokens are learnt, padding, truncation, and error messages."""

import pandas as pd
import pytest
import torch

from verl.data.rl_dataset import DatasetError
from verl.data.sft_dataset import SFTDataset

QUESTIONS = ["What is 2 + 3?", "Name the number after 41."]
ANSWERS = ["The answer is 5.", "42"]
CHAT = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "Hello there"},
    {"role": "user", "content": "How many clips?"},
    {"role": "assistant", "content": "72"},
]


@pytest.fixture
def parquet(tmp_path):
    def write(**columns):
        path = tmp_path / "data.parquet"
        pd.DataFrame(columns).to_parquet(path)
        return str(path)
    return write


def learnt(tokenizer, item) -> str:
    return tokenizer.decode(item["input_ids"][item["loss_mask"].bool()])


def real_ids(item) -> list[int]:
    return item["input_ids"][item["attention_mask"].bool()].tolist()


def test_loss_mask_is_exactly_the_response_and_eos(tiny_tokenizer, parquet):
    dataset = SFTDataset(parquet(question=QUESTIONS, answer=ANSWERS), tiny_tokenizer, {"max_length": 48})
    assert len(dataset) == 2
    for item, question, answer in zip(dataset, QUESTIONS, ANSWERS):
        assert learnt(tiny_tokenizer, item) == answer + tiny_tokenizer.eos_token
        prompt = tiny_tokenizer.apply_chat_template([{"role": "user", "content": question}],
                                                    add_generation_prompt=True, tokenize=False)
        prompt_ids = tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"]
        n = int(item["attention_mask"].sum())
        assert real_ids(item)[:len(prompt_ids)] == prompt_ids
        # 0 on the prompt, 1 on the response through eos, 0 on the padding; right-padded to max_length.
        assert item["loss_mask"].tolist() == [0] * len(prompt_ids) + [1] * (n - len(prompt_ids)) + [0] * (48 - n)
        assert item["input_ids"][n - 1] == tiny_tokenizer.eos_token_id
        assert (item["input_ids"][n:] == tiny_tokenizer.pad_token_id).all()
        assert item["attention_mask"].tolist() == [1] * n + [0] * (48 - n)
        assert item["position_ids"][:n].tolist() == list(range(n))
        assert all(v.shape == (48,) and v.dtype == torch.long for v in item.values())


def test_string_prompt_is_one_user_message_and_chat_lists_work(tiny_tokenizer, parquet):
    as_string = SFTDataset(parquet(prompt=QUESTIONS, response=ANSWERS), tiny_tokenizer,
                           {"prompt_key": "prompt", "response_key": "response", "max_length": 48})
    chats = [[{"role": "user", "content": q}] for q in QUESTIONS]
    as_chat = SFTDataset(parquet(prompt=chats, response=ANSWERS), tiny_tokenizer,
                         {"prompt_key": "prompt", "response_key": "response", "max_length": 48})
    for a, b in zip(as_string, as_chat):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["loss_mask"], b["loss_mask"])

    with_system = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": q}] for q in QUESTIONS]
    item = SFTDataset(parquet(prompt=with_system, response=ANSWERS), tiny_tokenizer,
                      {"prompt_key": "prompt", "response_key": "response", "max_length": 64})[0]
    assert "Be brief." in tiny_tokenizer.decode(real_ids(item))
    assert learnt(tiny_tokenizer, item) == ANSWERS[0] + tiny_tokenizer.eos_token


def test_dict_keys_reach_into_a_dict_column(tiny_tokenizer, parquet):
    extra = [{"question": q, "answer": a, "split": "train"} for q, a in zip(QUESTIONS, ANSWERS)]
    config = {"prompt_key": "extra_info", "response_key": "extra_info", "prompt_dict_keys": ["question"],
              "response_dict_keys": ["answer"], "max_length": 48}
    dataset = SFTDataset(parquet(extra_info=extra), tiny_tokenizer, config)
    assert learnt(tiny_tokenizer, dataset[1]) == ANSWERS[1] + tiny_tokenizer.eos_token
    assert QUESTIONS[1] in tiny_tokenizer.decode(real_ids(dataset[1]))

    with pytest.raises(DatasetError) as info:
        SFTDataset(parquet(extra_info=extra), tiny_tokenizer, {**config, "response_dict_keys": ["solution"]})
    message = str(info.value)
    assert "data.parquet, row 0, column 'extra_info'" in message and "'solution'" in message
    assert "data.response_dict_keys" in message and "['answer', 'question', 'split']" in message


def test_multiturn_learns_every_assistant_turn_and_nothing_else(tiny_tokenizer, parquet):
    dataset = SFTDataset(parquet(messages=[CHAT]), tiny_tokenizer, {"multiturn": {"enable": True}, "max_length": 96})
    item = dataset[0]
    eos = tiny_tokenizer.eos_token
    assert learnt(tiny_tokenizer, item) == f"Hello there{eos}72{eos}"
    # The whole chat is there, exactly as the template renders it.
    full = tiny_tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert tiny_tokenizer.decode(real_ids(item)) == full
    # Each learnt run starts right after the assistant generation prompt.
    mask = item["loss_mask"].tolist()
    starts = [i for i in range(1, len(mask)) if mask[i] and not mask[i - 1]]
    assert len(starts) == 2
    for start in starts:
        assert tiny_tokenizer.decode(item["input_ids"][:start]).endswith("<|im_start|>assistant\n")


def test_multiturn_errors_name_the_row(tiny_tokenizer, parquet):
    no_answer = [{"role": "user", "content": "hi"}]
    with pytest.raises(DatasetError, match=r"row 1, column 'messages'.*no assistant message"):
        SFTDataset(parquet(messages=[CHAT, no_answer]), tiny_tokenizer, {"multiturn": {"enable": True}})
    with pytest.raises(DatasetError, match=r"column 'messages' is missing.*data.multiturn.messages_key"):
        SFTDataset(parquet(chat=[CHAT]), tiny_tokenizer, {"multiturn": {"enable": True}})


def test_overlong_error_names_file_row_length_and_fixes(tiny_tokenizer, parquet):
    path = parquet(question=["hi", QUESTIONS[0] * 4], answer=["ok", ANSWERS[0] * 4])
    lengths = [int(item["attention_mask"].sum()) for item in SFTDataset(path, tiny_tokenizer, {"max_length": 512})]
    with pytest.raises(DatasetError) as info:
        SFTDataset(path, tiny_tokenizer, {"max_length": 20})
    message = str(info.value)
    assert f"{path}, row 1" in message and f"{lengths[1]} tokens" in message
    assert "data.max_length=20" in message and "data.truncation=left" in message and "data.truncation=right" in message


@pytest.mark.parametrize("mode", ["left", "right"])
def test_truncation_cuts_the_start_or_the_end(tiny_tokenizer, parquet, mode):
    path = parquet(question=[QUESTIONS[0]], answer=[ANSWERS[0] * 3])
    whole = SFTDataset(path, tiny_tokenizer, {"max_length": 128})[0]
    ids, mask = real_ids(whole), whole["loss_mask"][whole["attention_mask"].bool()].tolist()
    cut = SFTDataset(path, tiny_tokenizer, {"max_length": 12, "truncation": mode})[0]
    assert int(cut["attention_mask"].sum()) == 12
    keep = slice(-12, None) if mode == "left" else slice(0, 12)
    assert real_ids(cut) == ids[keep] and cut["loss_mask"].tolist() == mask[keep]


def test_bad_rows_and_columns_are_reported_with_their_place(tiny_tokenizer, parquet):
    with pytest.raises(DatasetError, match=r"column 'answer' is missing.*columns present: \['question', 'response'\]"):
        SFTDataset(parquet(question=QUESTIONS, response=ANSWERS), tiny_tokenizer, {})
    with pytest.raises(DatasetError, match=r"row 0, column 'answer': the response must be a string, got int"):
        SFTDataset(parquet(question=QUESTIONS, answer=[5, 7]), tiny_tokenizer, {})
    with pytest.raises(DatasetError, match=r"row 0, column 'question'.*not a chat list"):
        SFTDataset(parquet(question=[3, 4], answer=ANSWERS), tiny_tokenizer, {})
    with pytest.raises(DatasetError, match="data.truncation='middle'"):
        SFTDataset(parquet(question=QUESTIONS, answer=ANSWERS), tiny_tokenizer, {"truncation": "middle"})
