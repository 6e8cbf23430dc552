"""examples/demo/toy_task.py: the demo's data, in verl's schema, held out, reproducible by seed."""

import importlib.util
from pathlib import Path

import pandas as pd
import pytest

from verl.rewards.scorers import default_compute_score

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "demo" / "toy_task.py"


@pytest.fixture(scope="module")
def toy_task():
    spec = importlib.util.spec_from_file_location("toy_task", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_follow_verls_schema(toy_task):
    task = toy_task.make_task(seed=0, n_train=50, n_test=10)
    row = task["train"][0]
    assert set(row) == {"data_source", "prompt", "ability", "reward_model", "extra_info"}
    digits = row["extra_info"]["digits"]
    assert row["data_source"] == "reverse_digits"
    assert row["prompt"] == [{"role": "user", "content": f"Reverse {digits}"}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": digits[::-1]}
    assert row["extra_info"] == {"split": "train", "index": 0, "digits": digits}
    assert [r["extra_info"]["split"] for r in task["test"]] == ["test"] * 10
    assert [r["extra_info"]["index"] for r in task["test"]] == list(range(10))
    for r in task["train"] + task["test"]:
        assert 3 <= len(r["extra_info"]["digits"]) <= 6 and r["extra_info"]["digits"].isdigit()
    # the rule reward gives the ground truth full marks
    assert default_compute_score(row["data_source"], digits[::-1], row["reward_model"]["ground_truth"])["score"] == 1


def test_sft_rows_are_the_teachers_answers_to_the_same_prompts(toy_task):
    task = toy_task.make_task(seed=0, n_train=50, n_test=10)
    for rl_split, sft_split in (("train", "sft_train"), ("test", "sft_test")):
        assert len(task[sft_split]) == len(task[rl_split])
        for rl, sft in zip(task[rl_split], task[sft_split]):
            assert set(sft) == {"prompt", "response"}
            assert sft["prompt"] == rl["prompt"][0]["content"]
            digits = rl["extra_info"]["digits"]
            assert sft["response"] in (digits[::-1], digits[::-1][:-1])  # right, or the one mistake


def test_test_prompts_are_held_out(toy_task):
    task = toy_task.make_task(seed=3, n_train=3000, n_test=300)
    train = {r["extra_info"]["digits"] for r in task["train"]}
    test = {r["extra_info"]["digits"] for r in task["test"]}
    assert len(train) == 3000 and len(test) == 300
    assert not train & test


def test_same_seed_same_data_other_seed_other_data(toy_task):
    assert toy_task.make_task(seed=7, n_train=100, n_test=20) == toy_task.make_task(seed=7, n_train=100, n_test=20)
    assert toy_task.make_task(seed=7, n_train=100, n_test=20) != toy_task.make_task(seed=8, n_train=100, n_test=20)


def test_teacher_is_careful_with_short_strings_and_careless_with_long_ones(toy_task):
    # the two extremes are exact: short strings always reversed, long ones always one digit short
    task = toy_task.make_task(seed=0, n_train=200, n_test=10, long_from=5, p_short=1.0, p_long=0.0)
    for row in task["sft_train"]:
        digits = row["prompt"].split()[-1]
        assert row["response"] == (digits[::-1] if len(digits) < 5 else digits[::-1][:-1])
    # the default odds, measured on many demonstrations
    task = toy_task.make_task(seed=0, n_train=4000, n_test=10)
    right = {"short": [], "long": []}
    for row in task["sft_train"]:
        digits = row["prompt"].split()[-1]
        right["long" if len(digits) >= 5 else "short"].append(row["response"] == digits[::-1])
    assert sum(right["short"]) / len(right["short"]) == pytest.approx(0.85, abs=0.03)
    assert sum(right["long"]) / len(right["long"]) == pytest.approx(0.3, abs=0.03)


def test_bad_arguments_are_reported(toy_task):
    with pytest.raises(ValueError, match="p_long"):
        toy_task.make_task(p_long=1.5)
    with pytest.raises(ValueError, match="only 1100"):
        toy_task.make_task(n_train=1000, n_test=100, min_len=2, max_len=3)


def test_main_writes_four_parquet_files(toy_task, tmp_path):
    paths = toy_task.main(["--local_dir", str(tmp_path), "--seed", "1", "--n_train", "40", "--n_test", "8"])
    assert sorted(paths) == ["sft_test", "sft_train", "test", "train"]
    train = pd.read_parquet(tmp_path / "train.parquet")
    assert len(train) == 40 and list(train.columns) == ["data_source", "prompt", "ability", "reward_model",
                                                        "extra_info"]
    assert list(pd.read_parquet(tmp_path / "sft_test.parquet").columns) == ["prompt", "response"]
    assert len(pd.read_parquet(tmp_path / "test.parquet")) == 8
