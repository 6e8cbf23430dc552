"""Turn GSM8K into verl's parquet format (train.parquet, test.parquet).

    huggingface-cli download openai/gsm8k --repo-type dataset --local-dir data/gsm8k
    python3 examples/data_preprocess/gsm8k.py --local_dataset_path data/gsm8k --local_dir data/processed/gsm8k

--local_dataset_path also takes a folder with train/test .parquet or .jsonl files, or one or two such
files. Without it the dataset is fetched from the Hub, which needs the `datasets` package.
Then train with data.train_files=data/processed/gsm8k/train.parquet data.val_files=data/processed/gsm8k/test.parquet

--tool adds a system message offering the Python tool of examples/multi_turn (multi-turn rollouts);
--interaction adds extra_info.interaction_kwargs for the GSM8K simulated user of
examples/multi_turn/interaction_config.yaml (it checks each answer and asks again when it is wrong).
"""

import argparse
import re
import sys

from verl.data.local_files import LocalDatasetError, load_hub_splits, load_local_splits, save_splits

DATA_SOURCE = "openai/gsm8k"  # the reward function is chosen by this name, keep it as is
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
TOOL_SYSTEM = ("You can run Python with the code_interpreter tool to check your arithmetic: call it with the "
               "program, read what it prints, then give the final answer after \"####\".")
FINAL_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)")


def extract_answer(answer: str):
    """The number after the last '####' with thousands separators removed ('#### 1,200' -> '1200')."""
    found = FINAL_ANSWER.findall(answer) if isinstance(answer, str) else []
    return found[-1].replace(",", "") if found else None


def to_verl_row(example: dict, split: str, index: int, tool: bool = False, interaction: bool = False) -> dict:
    ground_truth = extract_answer(example["answer"])
    if ground_truth is None:
        raise LocalDatasetError(
            f"Row {index} of the {split} split has no final '#### <number>' line in its answer: {example['answer']!r}"
        )
    extra_info = {"split": split, "index": index, "answer": example["answer"], "question": example["question"]}
    if interaction:
        extra_info["interaction_kwargs"] = {"name": "gsm8k", "query": example["question"], "ground_truth": ground_truth}
    return {
        "data_source": DATA_SOURCE,
        "prompt": ([{"role": "system", "content": TOOL_SYSTEM}] if tool else [])
        + [{"role": "user", "content": example["question"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": extra_info,
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="local copy of openai/gsm8k: a download folder, or one or two train/test files")
    parser.add_argument("--local_dir", "--local_save_dir", dest="local_dir", default="~/data/gsm8k",
                        help="output folder for train.parquet and test.parquet")
    parser.add_argument("--tool", action="store_true", help="offer the Python tool in a system message")
    parser.add_argument("--interaction", action="store_true",
                        help="add interaction_kwargs for the GSM8K simulated user (multi-turn rollouts)")
    args = parser.parse_args()

    if args.local_dataset_path:
        raw = load_local_splits(args.local_dataset_path, columns=("question", "answer"), config_dirs=("main",))
    else:
        raw = load_hub_splits(DATA_SOURCE, "main", local_name="gsm8k")
    # Convert every split before writing any, so a bad row leaves the output folder untouched.
    rows = {split: [to_verl_row(ex, split, i, args.tool, args.interaction) for i, ex in enumerate(examples)]
            for split, examples in raw.items()}
    save_splits(rows, args.local_dir)


if __name__ == "__main__":
    try:
        main()
    except LocalDatasetError as e:
        sys.exit(f"error: {e}")
