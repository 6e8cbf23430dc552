"""The preprocessing scripts in examples/data_preprocess/, run as a user runs them, on the fixtures."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl.data.local_files import (
    LocalDatasetError,
    find_split_files,
    write_parquet_atomic,
)

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "examples" / "data_preprocess"
GSM8K_FIXTURE = SCRIPTS / "fixtures" / "gsm8k"
MATH_FIXTURE = SCRIPTS / "fixtures" / "math"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def run_script(script, *args, check=True):
    result = subprocess.run([sys.executable, str(SCRIPTS / script), *map(str, args)],
                            cwd=REPO, capture_output=True, text=True)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def load_script(script):
    spec = importlib.util.spec_from_file_location(Path(script).stem, SCRIPTS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_output(out_dir):
    files = sorted(os.listdir(out_dir))
    assert not [f for f in files if f.endswith(".tmp")], files
    return {f.removesuffix(".parquet"): pd.read_parquet(out_dir / f) for f in files}


def ground_truths(df):
    return [rm["ground_truth"] for rm in df["reward_model"]]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def gsm8k_rows(split):
    return pd.read_parquet(GSM8K_FIXTURE / "main" / f"{split}-00000-of-00001.parquet").to_dict("records")


def test_gsm8k_from_hf_cli_download_folder(tmp_path):
    out = tmp_path / "processed" / "gsm8k"  # parent folders do not exist yet
    result = run_script("gsm8k.py", "--local_dataset_path", GSM8K_FIXTURE, "--local_dir", out)

    data = read_output(out)
    assert sorted(data) == ["test", "train"]
    train, test = data["train"], data["test"]
    assert (len(train), len(test)) == (12, 5)  # main/ only, socratic/ ignored
    assert f"train: 12 rows -> {out / 'train.parquet'}" in result.stdout
    assert f"test: 5 rows -> {out / 'test.parquet'}" in result.stdout
    assert "first train row:" in result.stdout

    question = "A library has 3 shelves with 24 books on each shelf. It lends out 17 books. How many books are left on the shelves?"
    assert list(train.iloc[0]["prompt"]) == [{"role": "user", "content": question + " " + GSM8K_INSTRUCTION}]
    assert ground_truths(train)[:5] == ["55", "1200", "-7", "7.5", "15000"]
    assert ground_truths(test) == ["3600", "45", "8.25", "7", "19"]
    assert set(train["data_source"]) == set(test["data_source"]) == {"openai/gsm8k"}
    assert set(train["ability"]) == {"math"}
    assert train.iloc[1]["reward_model"] == {"style": "rule", "ground_truth": "1200"}
    assert train.iloc[1]["extra_info"] == {
        "split": "train",
        "index": 1,
        "answer": "The school gets 40 * 30 = <<40*30=1200>>1200 pencils.\n#### 1,200",
        "question": "A school orders 40 boxes of pencils. Each box holds 30 pencils. How many pencils does the school get?",
    }
    assert list(test["extra_info"].map(lambda e: (e["split"], e["index"]))) == [("test", i) for i in range(5)]


@pytest.mark.parametrize("subdir", ["main", ".", "data"])
def test_split_files_found_in_config_folder_top_level_or_data(tmp_path, subdir):
    shutil.copytree(GSM8K_FIXTURE / "main", tmp_path / "gsm8k" / subdir)
    (tmp_path / "gsm8k" / "socratic").mkdir()
    (tmp_path / "gsm8k" / "socratic" / "train-00000-of-00001.parquet").write_bytes(b"never read")
    found = find_split_files(str(tmp_path / "gsm8k"), config_dirs=("main",))
    assert found == {split: [os.path.normpath(tmp_path / "gsm8k" / subdir / f"{split}-00000-of-00001.parquet")]
                     for split in ("train", "test")}


def test_gsm8k_from_jsonl_folder(tmp_path):
    write_jsonl(tmp_path / "raw" / "train.jsonl", gsm8k_rows("train"))
    write_jsonl(tmp_path / "raw" / "test.jsonl", gsm8k_rows("test"))
    run_script("gsm8k.py", "--local_dataset_path", tmp_path / "raw", "--local_dir", tmp_path / "out")
    data = read_output(tmp_path / "out")
    assert (len(data["train"]), len(data["test"])) == (12, 5)
    assert ground_truths(data["train"])[1] == "1200"
    assert data["test"].iloc[2]["extra_info"]["answer"].endswith("#### 8.25")


def test_gsm8k_from_single_parquet_file(tmp_path):
    result = run_script("gsm8k.py", "--local_dataset_path", GSM8K_FIXTURE / "main" / "test-00000-of-00001.parquet",
                        "--local_dir", tmp_path / "out")
    data = read_output(tmp_path / "out")
    assert list(data) == ["test"] and len(data["test"]) == 5
    assert "no train.parquet was written" in result.stdout


def test_gsm8k_from_pair_of_files(tmp_path):
    write_jsonl(tmp_path / "my_test.jsonl", gsm8k_rows("test"))
    run_script("gsm8k.py", "--local_dataset_path", tmp_path / "my_test.jsonl",
               GSM8K_FIXTURE / "main" / "train-00000-of-00001.parquet", "--local_dir", tmp_path / "out")
    data = read_output(tmp_path / "out")
    assert (len(data["train"]), len(data["test"])) == (12, 5)


def test_gsm8k_folder_without_split_files(tmp_path):
    (tmp_path / "downloads" / "main").mkdir(parents=True)
    (tmp_path / "downloads" / "README.md").write_text("nothing here")
    result = run_script("gsm8k.py", "--local_dataset_path", tmp_path / "downloads", "--local_dir", tmp_path / "out",
                        check=False)
    assert result.returncode != 0
    assert "No train/test split files found" in result.stderr
    assert "README.md" in result.stderr  # what was found
    assert "train-00000-of-00001.parquet" in result.stderr  # what is expected
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "out").exists()


def test_missing_path_and_unnamed_file(tmp_path):
    with pytest.raises(LocalDatasetError, match="does not exist"):
        find_split_files(str(tmp_path / "nope"))
    (tmp_path / "gsm8k.parquet").write_bytes(b"")
    with pytest.raises(LocalDatasetError, match="Cannot tell which split"):
        find_split_files([str(tmp_path / "gsm8k.parquet")])


def test_gsm8k_answer_without_final_line(tmp_path):
    bad_test = gsm8k_rows("test")
    bad_test[1]["answer"] = "Her friend has 36 stickers, so together they have 45."
    write_jsonl(tmp_path / "raw" / "train.jsonl", gsm8k_rows("train"))
    write_jsonl(tmp_path / "raw" / "test.jsonl", bad_test)
    result = run_script("gsm8k.py", "--local_dataset_path", tmp_path / "raw", "--local_dir", tmp_path / "out",
                        check=False)
    assert result.returncode != 0
    assert "Row 1 of the test split" in result.stderr and "####" in result.stderr
    assert not (tmp_path / "out").exists()  # nothing written, not even the good train split


def test_gsm8k_without_local_path_or_datasets_package(tmp_path):
    # Run the script with `datasets` made unimportable, whether or not it is installed here.
    code = ("import runpy, sys; sys.modules['datasets'] = None; "
            f"sys.argv = ['gsm8k.py', '--local_dir', {str(tmp_path / 'out')!r}]; "
            f"runpy.run_path({str(SCRIPTS / 'gsm8k.py')!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0
    assert "huggingface-cli download openai/gsm8k --repo-type dataset --local-dir data/gsm8k" in result.stderr
    assert "--local_dataset_path data/gsm8k" in result.stderr


def test_math_from_lighteval_download_folder(tmp_path):
    run_script("math_dataset.py", "--local_dataset_path", MATH_FIXTURE, "--local_dir", tmp_path / "out")
    data = read_output(tmp_path / "out")
    train, test = data["train"], data["test"]
    assert (len(train), len(test)) == (5, 3)
    assert set(train["data_source"]) == {"DigitalLearningGmbH/MATH-lighteval"}
    assert set(train["ability"]) == {"math"}
    assert train.iloc[1]["prompt"][0]["content"] == (
        "Solve for $x$: $2x + 7 = 19$. Let's think step by step and output the final answer within \\boxed{}."
    )
    assert ground_truths(train) == ["\\frac{1}{2}", "6", "[2,\\infty)", "3\\sqrt{2}", "6"]
    assert ground_truths(test) == ["\\frac{1}{2}", "4", "\\{-3, 3\\}"]
    assert test.iloc[0]["extra_info"]["split"] == "test" and test.iloc[0]["extra_info"]["index"] == 0


def test_math_solution_without_box():
    with pytest.raises(LocalDatasetError, match="Row 3 of the train split has no complete .*boxed"):
        load_script("math_dataset.py").to_verl_row({"problem": "What is 1 + 1?", "solution": "It is 2."}, "train", 3)


def test_last_boxed():
    last_boxed = load_script("math_dataset.py").last_boxed
    assert last_boxed("so $x = \\boxed{\\frac{1}{2}}$.") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}}") == "\\sqrt{\\frac{a}{b}}"
    assert last_boxed("\\boxed{3} or rather \\fbox{4}") == "4"
    assert last_boxed("the answer is $\\boxed 5$.") == "5"
    assert last_boxed("\\boxed{\\frac{1}{2}") is None  # braces never close
    assert last_boxed("no box") is None


def test_write_parquet_atomic_leaves_nothing_on_failure(tmp_path):
    with pytest.raises(Exception):
        write_parquet_atomic([{"a": object()}], str(tmp_path / "train.parquet"))
    assert os.listdir(tmp_path) == []
