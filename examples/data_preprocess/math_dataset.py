"""Turn the MATH dataset (Hendrycks et al.) into verl's parquet format (train.parquet, test.parquet).

    huggingface-cli download DigitalLearningGmbH/MATH-lighteval --repo-type dataset --local-dir data/MATH-lighteval
    python3 examples/data_preprocess/math_dataset.py --local_dataset_path data/MATH-lighteval --local_dir data/processed/math

The download keeps the whole dataset in data/{train,test}-*.parquet (read) and a copy per subject in
algebra/, geometry/, ... (ignored). --local_dataset_path also takes a folder with train/test .parquet or
.jsonl files, or one or two such files; rows need the columns `problem` and `solution`.
Without it the dataset is fetched from the Hub, which needs the `datasets` package.
"""

import argparse
import sys

from verl.data.local_files import LocalDatasetError, load_hub_splits, load_local_splits, save_splits

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"  # the reward function is chosen by this name
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."


def last_boxed(solution: str):
    """What the last \\boxed{...} (or \\fbox{...}) of a solution holds, nested braces included.

    '$x = \\boxed{\\frac{1}{2}}$' -> '\\frac{1}{2}'. The brace-less form '\\boxed 5$' gives '5'.
    Returns None when there is no box or its braces do not close.
    """
    if not isinstance(solution, str):
        return None
    boxed, fbox = solution.rfind("\\boxed"), solution.rfind("\\fbox")
    if boxed < 0 and fbox < 0:
        return None
    i = boxed + len("\\boxed") if boxed > fbox else fbox + len("\\fbox")  # just past the command name
    if solution.startswith(" ", i):
        return solution[i:].split("$")[0].strip() or None
    if not solution.startswith("{", i):
        return None
    depth = 0
    for j in range(i, len(solution)):
        depth += {"{": 1, "}": -1}.get(solution[j], 0)
        if depth == 0:
            return solution[i + 1 : j]
    return None


def to_verl_row(example: dict, split: str, index: int) -> dict:
    ground_truth = last_boxed(example["solution"])
    if ground_truth is None:
        raise LocalDatasetError(
            f"Row {index} of the {split} split has no complete \\boxed{{...}} answer in its solution: "
            f"{example['solution']!r}"
        )
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": example["problem"] + " " + INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": example["solution"], "question": example["problem"]},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="local copy of the MATH dataset: a download folder, or one or two train/test files")
    parser.add_argument("--local_dir", "--local_save_dir", dest="local_dir", default="~/data/math",
                        help="output folder for train.parquet and test.parquet")
    args = parser.parse_args()

    if args.local_dataset_path:
        raw = load_local_splits(args.local_dataset_path, columns=("problem", "solution"))
    else:
        raw = load_hub_splits(DATA_SOURCE, "default", local_name="MATH-lighteval")
    # Convert every split before writing any, so a bad row leaves the output folder untouched.
    rows = {split: [to_verl_row(ex, split, i) for i, ex in enumerate(examples)] for split, examples in raw.items()}
    save_splits(rows, args.local_dir)


if __name__ == "__main__":
    try:
        main()
    except LocalDatasetError as e:
        sys.exit(f"error: {e}")
