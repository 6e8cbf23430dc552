"""Turn Geometry3K into verl's parquet format (train.parquet, test.parquet) for vision-language RL.

    huggingface-cli download hiyouga/geometry3k --repo-type dataset --local-dir data/geometry3k
    python3 examples/data_preprocess/geo3k.py --local_dataset_path data/geometry3k --local_dir data/processed/geo3k

Each row keeps its pictures in the column `images` (a list of {"bytes": ..., "path": ...} dicts) and its
prompt says where they go with `<image>` (the problems start with one). Train a vision-language model such as
Qwen2.5-VL on it with data.image_key=images (the default). Without --local_dataset_path the dataset is
fetched from the Hub, which needs the `datasets` package.
"""

import argparse
import sys

from verl.data.local_files import LocalDatasetError, load_hub_splits, load_local_splits, save_splits

DATA_SOURCE = "hiyouga/geometry3k"  # the reward function is chosen by this name, keep it as is
INSTRUCTION = (r"You FIRST think about the reasoning process as an internal monologue and then provide the final "
               r"answer. The reasoning process MUST BE enclosed within <think> </think> tags. The final answer MUST "
               r"BE put in \boxed{}.")


def _image(item, split: str, index: int) -> dict:
    if hasattr(item, "items") and (item.get("bytes") is not None or item.get("path")):
        return {"bytes": item.get("bytes"), "path": item.get("path")}
    raise LocalDatasetError(f"Row {index} of the {split} split has an image that is neither bytes nor a path: "
                            f"{str(item)[:80]!r}")


def to_verl_row(example: dict, split: str, index: int) -> dict:
    images = [_image(item, split, index) for item in example["images"]]
    problem = example["problem"]
    if problem.count("<image>") != len(images):
        raise LocalDatasetError(f"Row {index} of the {split} split has {len(images)} image(s) but its problem holds "
                                f"{problem.count('<image>')} '<image>' placeholder(s): {problem[:80]!r}")
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
        "images": images,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": example["answer"]},
        "extra_info": {"split": split, "index": index, "answer": example["answer"], "question": problem},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dataset_path", nargs="+", default=None,
                        help="local copy of hiyouga/geometry3k: a download folder, or one or two train/test files")
    parser.add_argument("--local_dir", "--local_save_dir", dest="local_dir", default="~/data/geo3k",
                        help="output folder for train.parquet and test.parquet")
    args = parser.parse_args()

    if args.local_dataset_path:
        raw = load_local_splits(args.local_dataset_path, columns=("images", "problem", "answer"))
    else:
        raw = load_hub_splits(DATA_SOURCE, None, local_name="geometry3k")
    rows = {split: [to_verl_row(ex, split, i) for i, ex in enumerate(examples)] for split, examples in raw.items()}
    save_splits(rows, args.local_dir)


if __name__ == "__main__":
    try:
        main()
    except LocalDatasetError as e:
        sys.exit(f"error: {e}")
