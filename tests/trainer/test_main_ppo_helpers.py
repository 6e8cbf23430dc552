"""``verl.trainer.main_ppo.create_rl_dataset`` and ``create_rl_sampler``, as the original's user code calls them."""

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from verl.data import RLHFDataset
from verl.data.sampler import create_rl_sampler as sampler_in_data
from verl.trainer.main_ppo import create_rl_dataset, create_rl_sampler

QUESTIONS = ["What is 2+2?", "Name a prime.", "Spell cat.", "Count to 3.", "Say hi."]


@pytest.fixture
def parquet(tmp_path):
    rows = [{"data_source": "toy", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": str(i)}, "extra_info": {"index": 10 + i}}
            for i, q in enumerate(QUESTIONS)]
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def data_config(**overrides):
    return OmegaConf.create({"max_prompt_length": 32, **overrides})


def truths(dataset):
    return [dataset[i]["reward_model"]["ground_truth"] for i in range(len(dataset))]


def test_create_rl_dataset_reads_the_rows(parquet, tiny_tokenizer):
    dataset = create_rl_dataset([parquet], data_config(), tiny_tokenizer, None)
    assert isinstance(dataset, RLHFDataset) and len(dataset) == 5
    assert truths(dataset) == ["0", "1", "2", "3", "4"]
    item = dataset[1]
    assert item["data_source"] == "toy" and item["index"] == 11
    # The chat-templated prompt, left-padded to max_prompt_length.
    ids = tiny_tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[1]}], add_generation_prompt=True,
                                             tokenize=False)
    ids = tiny_tokenizer(ids, add_special_tokens=False)["input_ids"]
    assert item["input_ids"].shape == (32,) and item["input_ids"][32 - len(ids):].tolist() == ids
    assert item["attention_mask"].tolist() == [0] * (32 - len(ids)) + [1] * len(ids)


def test_max_samples_takes_the_first_rows_or_a_seeded_draw(parquet, tiny_tokenizer):
    first = create_rl_dataset(parquet, data_config(shuffle=False), tiny_tokenizer, None, max_samples=2)
    assert truths(first) == ["0", "1"]
    drawn = create_rl_dataset(parquet, data_config(shuffle=True, seed=3), tiny_tokenizer, None, max_samples=2)
    expected = sorted(np.random.default_rng(3).choice(5, size=2, replace=False))  # the dataset's documented draw
    assert truths(drawn) == [str(i) for i in expected]
    # A validation set draws with data.validation_shuffle (false here): its first rows.
    val = create_rl_dataset(parquet, data_config(shuffle=True, seed=3, validation_shuffle=False), tiny_tokenizer, None,
                            is_train=False, max_samples=2)
    assert truths(val) == ["0", "1"]


def test_custom_dataset_classes_and_datagen_are_refused_by_key(parquet, tiny_tokenizer):
    with pytest.raises(NotImplementedError, match=r"data.custom_cls.path='my_ds.py': custom dataset classes"):
        create_rl_dataset(parquet, data_config(custom_cls={"path": "my_ds.py", "name": "MyDataset"}),
                          tiny_tokenizer, None)
    datagen = data_config(datagen={"path": "gen.py", "name": "Gen"})
    with pytest.raises(NotImplementedError, match=r"data.datagen.path='gen.py'"):
        create_rl_dataset(parquet, datagen, tiny_tokenizer, None)
    # As in the original, data generation only replaces the training set.
    assert len(create_rl_dataset(parquet, datagen, tiny_tokenizer, None, is_train=False)) == 5


def test_create_rl_sampler_is_the_data_package_one():
    assert create_rl_sampler is sampler_in_data


def test_a_seeded_shuffle_is_reproducible_and_a_sequential_one_is_in_order():
    dataset = list(range(10))
    order = list(create_rl_sampler(data_config(shuffle=True, seed=7), dataset))
    # The first epoch is the original's RandomSampler over a generator seeded with data.seed: randperm(n).
    assert order == torch.randperm(10, generator=torch.Generator().manual_seed(7)).tolist()
    assert list(create_rl_sampler(data_config(shuffle=True, seed=7), dataset)) == order
    assert list(create_rl_sampler(data_config(shuffle=True, seed=8), dataset)) != order
    assert sorted(order) == dataset
    assert list(create_rl_sampler(data_config(shuffle=False), dataset)) == dataset


def test_custom_sampler_classes_are_refused_by_key():
    config = data_config(sampler={"class_path": "curriculum.py", "class_name": "Curriculum"})
    with pytest.raises(NotImplementedError, match=r"data.sampler.class_path='curriculum.py'"):
        create_rl_sampler(config, list(range(4)))
