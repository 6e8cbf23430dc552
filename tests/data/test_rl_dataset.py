import logging

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from verl.data import (
    DatasetError,
    ResumableSampler,
    RLHFDataset,
    collate_fn,
    create_rl_sampler,
    make_dataloader,
)
from verl.data.rl_dataset import _chat_messages

QUESTIONS = [
    "Natalia sold clips to 48 of her friends in April.",
    "How many clips did Natalia sell?",
    "The answer is 42.",
    "Let's think step by step.",
    "0 1 2 3 4 5 6 7 8 9",
]


def make_row(i, question, source="openai/gsm8k", with_extra_info=True):
    row = {
        "data_source": source,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(i)},
    }
    if with_extra_info:
        row["extra_info"] = {"split": "train", "index": 100 + i}
    return row


def write_parquet(path, rows):
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


@pytest.fixture
def gsm_file(tmp_path):
    return write_parquet(tmp_path / "train.parquet", [make_row(i, q) for i, q in enumerate(QUESTIONS)])


def data_config(**overrides):
    return OmegaConf.create({"max_prompt_length": 64, "truncation": "error", "return_raw_chat": True, **overrides})


def template_ids(tokenizer, question):
    messages = [{"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


# ---- items ---------------------------------------------------------------------------------------


def test_item_is_left_padded_with_positions(gsm_file, tiny_tokenizer):
    ds = RLHFDataset(gsm_file, tiny_tokenizer, data_config())
    item = ds[1]
    _, expected = template_ids(tiny_tokenizer, QUESTIONS[1])
    length, pad = len(expected), 64 - len(expected)

    assert item["input_ids"].shape == item["attention_mask"].shape == item["position_ids"].shape == (64,)
    assert item["input_ids"].dtype == torch.long
    assert (item["input_ids"][:pad] == tiny_tokenizer.pad_token_id).all()
    assert item["input_ids"][pad:].tolist() == expected
    assert item["input_ids"][-1].item() == expected[-1]
    assert item["attention_mask"].sum().item() == length
    assert item["attention_mask"][:pad].sum().item() == 0
    assert item["position_ids"].tolist() == [0] * pad + list(range(length))
    assert item["raw_prompt_ids"] == expected


def test_real_tokens_decode_to_templated_text(gsm_file, tiny_tokenizer):
    ds = RLHFDataset(gsm_file, tiny_tokenizer, data_config())
    item = ds[0]
    text, _ = template_ids(tiny_tokenizer, QUESTIONS[0])
    real = item["input_ids"][item["attention_mask"].bool()].tolist()
    assert tiny_tokenizer.decode(real) == text
    assert text.endswith("<|im_start|>assistant\n")


def test_columns_pass_through_as_plain_python(gsm_file, tiny_tokenizer):
    item = RLHFDataset(gsm_file, tiny_tokenizer, data_config())[2]
    assert item["data_source"] == "openai/gsm8k"
    assert item["ability"] == "math"
    assert item["reward_model"] == {"style": "rule", "ground_truth": "2"}
    assert item["extra_info"] == {"split": "train", "index": 102}
    assert type(item["reward_model"]) is dict and type(item["extra_info"]) is dict
    assert item["index"] == 102
    assert item["raw_prompt"] == [{"role": "user", "content": QUESTIONS[2]}]
    assert type(item["raw_prompt"]) is list and "prompt" not in item
    assert "full_prompts" not in item


def test_full_prompt_and_no_raw_chat(gsm_file, tiny_tokenizer):
    item = RLHFDataset(gsm_file, tiny_tokenizer, data_config(return_raw_chat=False, return_full_prompt=True))[0]
    assert "raw_prompt" not in item
    assert item["full_prompts"] == template_ids(tiny_tokenizer, QUESTIONS[0])[0]


def test_multiple_files_are_concatenated(tmp_path, tiny_tokenizer):
    first = write_parquet(tmp_path / "a.parquet", [make_row(i, q) for i, q in enumerate(QUESTIONS[:2])])
    second = write_parquet(
        tmp_path / "b.parquet",
        [make_row(i, q, source="math", with_extra_info=False) for i, q in enumerate(QUESTIONS[2:])],
    )
    ds = RLHFDataset([first, second], tiny_tokenizer, data_config())
    assert len(ds) == 5
    assert [ds[i]["data_source"] for i in range(5)] == ["openai/gsm8k"] * 2 + ["math"] * 3
    assert ds[3]["raw_prompt"][0]["content"] == QUESTIONS[3]
    assert ds[0]["index"] == 100
    assert ds[3]["index"] == 3  # no extra_info: the row number over all files


def test_max_samples(gsm_file, tiny_tokenizer):
    head = RLHFDataset(gsm_file, tiny_tokenizer, data_config(shuffle=False), max_samples=2)
    assert [head[i]["index"] for i in range(len(head))] == [100, 101]

    picks = [
        [d[i]["index"] for i in range(len(d))]
        for d in (RLHFDataset(gsm_file, tiny_tokenizer, data_config(seed=7), max_samples=3) for _ in range(2))
    ]
    assert picks[0] == picks[1] and len(set(picks[0])) == 3
    assert len(RLHFDataset(gsm_file, tiny_tokenizer, data_config(), max_samples=-1)) == 5
    assert len(RLHFDataset(gsm_file, tiny_tokenizer, data_config(), max_samples=50)) == 5


# ---- overlong prompts ----------------------------------------------------------------------------

LONG_QUESTION = " ".join(QUESTIONS * 3)


@pytest.fixture
def long_file(tmp_path):
    rows = [make_row(0, QUESTIONS[0]), make_row(1, LONG_QUESTION), make_row(2, QUESTIONS[2])]
    return write_parquet(tmp_path / "long.parquet", rows)


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes(long_file, tiny_tokenizer, mode):
    max_len = 25
    _, full = template_ids(tiny_tokenizer, LONG_QUESTION)
    assert len(full) > max_len
    expected = {
        "left": full[-max_len:],
        "right": full[:max_len],
        "middle": full[:12] + full[-13:],  # max_len // 2 from the head, the rest from the tail
    }[mode]
    item = RLHFDataset(long_file, tiny_tokenizer, data_config(max_prompt_length=max_len, truncation=mode))[1]
    assert item["input_ids"].tolist() == expected
    assert item["raw_prompt_ids"] == expected
    assert item["attention_mask"].sum().item() == max_len


def test_truncation_error_names_file_row_and_fixes(long_file, tiny_tokenizer):
    _, full = template_ids(tiny_tokenizer, LONG_QUESTION)
    with pytest.raises(DatasetError) as err:
        RLHFDataset(long_file, tiny_tokenizer, data_config(max_prompt_length=25))
    message = str(err.value)
    assert long_file in message and "row 1" in message and "'prompt'" in message
    assert f"{len(full)} tokens" in message and "data.max_prompt_length=25" in message
    assert "data.truncation=left|right|middle" in message and "data.filter_overlong_prompts=True" in message


def test_filter_overlong_prompts_drops_and_logs(long_file, tiny_tokenizer, caplog):
    with caplog.at_level(logging.INFO, logger="verl.dataset"):
        ds = RLHFDataset(long_file, tiny_tokenizer, data_config(max_prompt_length=25, filter_overlong_prompts=True))
    assert len(ds) == 2
    assert [ds[i]["index"] for i in range(2)] == [100, 102]
    assert "dropped 1 of 3 prompts" in caplog.text and "data.max_prompt_length=25" in caplog.text

    with pytest.raises(DatasetError, match="every one of the 3 prompts"):
        RLHFDataset(long_file, tiny_tokenizer, data_config(max_prompt_length=2, filter_overlong_prompts=True))


# ---- schema errors -------------------------------------------------------------------------------


def test_missing_prompt_column(tmp_path, tiny_tokenizer):
    path = write_parquet(tmp_path / "bad.parquet", [{"data_source": "x", "question": "hi"}])
    with pytest.raises(DatasetError) as err:
        RLHFDataset(path, tiny_tokenizer, data_config())
    message = str(err.value)
    assert path in message and "'prompt' is missing" in message
    assert "['data_source', 'question']" in message and "data.prompt_key" in message

    path = write_parquet(tmp_path / "no_source.parquet", [{"prompt": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DatasetError, match=r"column 'data_source' is missing; columns present: \['prompt'\]"):
        RLHFDataset(path, tiny_tokenizer, data_config())


def test_prompt_not_a_chat_list(tmp_path, tiny_tokenizer):
    rows = [{**make_row(i, "x"), "prompt": f"plain question {i}"} for i in range(2)]
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DatasetError) as err:
        RLHFDataset(path, tiny_tokenizer, data_config())
    message = str(err.value)
    assert path in message and "row 0" in message and "'prompt'" in message
    assert "got str: 'plain question 0'" in message and "[{'role': 'user'" in message

    rows = [make_row(0, "ok"), make_row(1, "ok"), {**make_row(2, "x"), "prompt": None}]
    path = write_parquet(tmp_path / "null.parquet", rows)
    with pytest.raises(DatasetError, match=r"null\.parquet, row 2, column 'prompt': .* got NoneType: None"):
        RLHFDataset(path, tiny_tokenizer, data_config())


def test_empty_prompt_and_empty_content(tmp_path, tiny_tokenizer):
    empty_list = write_parquet(tmp_path / "a.parquet", [make_row(0, "ok"), {**make_row(1, "x"), "prompt": []}])
    with pytest.raises(DatasetError, match=r"a\.parquet, row 1, column 'prompt': prompt is an empty list"):
        RLHFDataset(empty_list, tiny_tokenizer, data_config())

    empty_content = write_parquet(tmp_path / "b.parquet", [make_row(0, "ok"), make_row(1, "ok"), make_row(2, "")])
    with pytest.raises(DatasetError, match=r"b\.parquet, row 2, column 'prompt': message 0 has empty"):
        RLHFDataset(empty_content, tiny_tokenizer, data_config())


def test_numpy_chat_list_is_accepted():
    prompt = np.empty(1, dtype=object)
    prompt[0] = {"role": "user", "content": "hi"}
    assert _chat_messages(prompt, "prompt") == [{"role": "user", "content": "hi"}]


def test_missing_file(tmp_path, tiny_tokenizer):
    path = str(tmp_path / "nope.parquet")
    with pytest.raises(DatasetError) as err:
        RLHFDataset(path, tiny_tokenizer, data_config())
    assert path in str(err.value) and "FileNotFoundError" in str(err.value)


def test_tokenizer_without_chat_template(gsm_file, tiny_tokenizer_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    with pytest.raises(DatasetError) as err:
        RLHFDataset(gsm_file, tokenizer, data_config())
    message = str(err.value)
    assert "no chat template" in message
    assert "data.apply_chat_template_kwargs.chat_template" in message
    assert "actor_rollout_ref.model.custom_chat_template" in message

    ds = RLHFDataset(gsm_file, tokenizer, data_config(apply_chat_template_kwargs={"chat_template": template}))
    assert ds[0]["raw_prompt_ids"] == template_ids(AutoTokenizer.from_pretrained(tiny_tokenizer_dir), QUESTIONS[0])[1]


def test_tokenizer_without_pad_token_pads_with_eos(gsm_file, tiny_tokenizer_dir, caplog):
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    tokenizer.pad_token = None
    with caplog.at_level(logging.WARNING, logger="verl.dataset"):
        item = RLHFDataset(gsm_file, tokenizer, data_config())[0]
    assert item["input_ids"][0].item() == tokenizer.eos_token_id
    assert "no pad token" in caplog.text


# ---- batching ------------------------------------------------------------------------------------


def test_collate_fn_types(gsm_file, tiny_tokenizer):
    ds = RLHFDataset(gsm_file, tiny_tokenizer, data_config())
    batch = collate_fn([ds[i] for i in range(3)])
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert isinstance(batch[key], torch.Tensor) and batch[key].shape == (3, 64)
    for key in ("raw_prompt_ids", "raw_prompt", "reward_model", "extra_info", "data_source", "index"):
        assert isinstance(batch[key], np.ndarray) and batch[key].dtype == object and batch[key].shape == (3,)
    assert isinstance(batch["reward_model"][0], dict) and batch["reward_model"][1]["ground_truth"] == "1"
    assert isinstance(batch["raw_prompt_ids"][0], list)
    assert batch["raw_prompt"][2] == [{"role": "user", "content": QUESTIONS[2]}]


# ---- sampling and resume -------------------------------------------------------------------------


def test_sampler_is_seeded_per_epoch():
    def epochs(sampler, n):
        return [list(sampler) for _ in range(n)]

    a = epochs(ResumableSampler(10, shuffle=True, seed=3), 2)
    b = epochs(ResumableSampler(10, shuffle=True, seed=3), 2)
    assert a == b and a[0] != a[1] and sorted(a[0]) == list(range(10))
    assert a[1] == torch.randperm(10, generator=torch.Generator().manual_seed(4)).tolist()
    assert epochs(ResumableSampler(5, shuffle=False), 2) == [list(range(5))] * 2


def test_sampler_resumes_at_next_index():
    sampler = ResumableSampler(10, seed=5)
    reference = list(ResumableSampler(10, seed=5))
    it = iter(sampler)
    taken = [next(it) for _ in range(4)]
    state = sampler.state_dict()
    assert state == {"epoch": 0, "position": 4, "seed": 5}

    fresh = ResumableSampler(10, seed=999)
    fresh.load_state_dict(state)
    assert taken + list(fresh) == reference
    assert fresh.state_dict() == {"epoch": 1, "position": 0, "seed": 5}
    fresh.set_epoch(1)
    assert fresh.state_dict()["position"] == 0


def test_create_rl_sampler_reads_config(gsm_file, tiny_tokenizer):
    ds = RLHFDataset(gsm_file, tiny_tokenizer, data_config())
    assert list(create_rl_sampler(OmegaConf.create({"shuffle": False}), ds)) == list(range(5))
    shuffled = create_rl_sampler(OmegaConf.create({"shuffle": True}), ds)  # data.seed: the yaml's
    assert shuffled.seed == 1 and len(shuffled) == 5


@pytest.fixture
def ten_rows(tmp_path, tiny_tokenizer):
    rows = [make_row(i, QUESTIONS[i % 5]) for i in range(10)]
    return RLHFDataset(write_parquet(tmp_path / "ten.parquet", rows), tiny_tokenizer, data_config())


def loader_for(dataset, num_workers=0):
    sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": 11}), dataset)
    return make_dataloader(dataset, batch_size=3, sampler=sampler, num_workers=num_workers)


def trainer_batches(loader, epochs, stop_after=None):
    """Batch indices seen by a trainer-style `for epoch: for batch` loop, optionally stopping early."""
    seen = []
    for _ in range(epochs):
        for batch in loader:
            seen.append(batch["index"].tolist())
            if stop_after is not None and len(seen) == stop_after:
                return seen
    return seen


@pytest.mark.parametrize("stop_after", [2, 3, 4])  # mid-epoch, at the epoch's last full batch, in epoch 1
def test_dataloader_resumes_exactly(ten_rows, stop_after, tmp_path):
    reference = trainer_batches(loader_for(ten_rows), epochs=3)
    assert len(reference) == 9  # 10 rows, batch 3, drop_last: 3 batches per epoch

    first = loader_for(ten_rows)
    head = trainer_batches(first, epochs=3, stop_after=stop_after)
    torch.save(first.state_dict(), tmp_path / "data.pt")

    resumed = loader_for(ten_rows)
    resumed.load_state_dict(torch.load(tmp_path / "data.pt", weights_only=True))
    tail = trainer_batches(resumed, epochs=3)[: len(reference) - stop_after]
    assert head + tail == reference


def test_dataloader_state_counts_consumed_batches_with_workers(ten_rows):
    reference = trainer_batches(loader_for(ten_rows), epochs=2)
    loader = loader_for(ten_rows, num_workers=2)
    head = trainer_batches(loader, epochs=1, stop_after=1)
    assert loader.state_dict() == {"epoch": 0, "position": 3, "seed": 11}
    assert head + trainer_batches(loader, epochs=2)[:5] == reference
