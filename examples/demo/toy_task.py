"""The demo's toy task: reverse a string of digits, taught by a sloppy teacher.

    python examples/demo/toy_task.py --local_dir demo_output/data --seed 0

writes four parquet files:

- ``train.parquet`` / ``test.parquet``: RL prompts in verl's schema (``data_source``, ``prompt``,
  ``ability``, ``reward_model``, ``extra_info``), e.g. ``Reverse 3814`` with ground truth ``4183``.
  No digit string of the test split appears in the train split.
- ``sft_train.parquet`` / ``sft_test.parquet``: the teacher's demonstrations for the supervised warm
  start, ``prompt`` (the user message) and ``response`` columns, on the same prompts.

The teacher makes one systematic mistake: it stops one digit early (``Reverse 3814`` -> ``418``).
It is careful with short strings (right with probability ``p_short``) and careless with long ones
(``p_long``). A model trained to imitate it learns the reversal itself from every demonstration and
the teacher's odds of stopping early, so its greedy answer is right on short strings and one digit
short on long ones: a middling start. The full answer is still sampled often enough on long strings
for RL with the verifiable reward to find it and move the policy there.
"""

from __future__ import annotations

import argparse
import random

from verl.data.local_files import save_splits
from verl.rewards.scorers.reverse_digits import DATA_SOURCE

INSTRUCTION = "Reverse"


def prompt_text(digits: str) -> str:
    return f"{INSTRUCTION} {digits}"


def teacher_answer(digits: str, rng: random.Random, long_from: int, p_short: float, p_long: float) -> str:
    """The reversed string, or -- the teacher's one mistake -- the reversed string without its last digit."""
    p_correct = p_long if len(digits) >= long_from else p_short
    return digits[::-1] if rng.random() < p_correct else digits[::-1][:-1]


def sample_digit_strings(count: int, min_len: int, max_len: int, rng: random.Random) -> list[str]:
    """``count`` distinct digit strings with lengths uniform in [min_len, max_len]."""
    space = sum(10 ** n for n in range(min_len, max_len + 1))
    if count > space // 2:
        raise ValueError(f"asked for {count} distinct strings of {min_len}-{max_len} digits; there are only "
                         f"{space}: raise --max_len or lower the split sizes")
    seen: set[str] = set()
    strings = []
    while len(strings) < count:
        n = rng.randint(min_len, max_len)
        s = "".join(rng.choice("0123456789") for _ in range(n))
        if s not in seen:
            seen.add(s)
            strings.append(s)
    return strings


def rl_row(digits: str, split: str, index: int) -> dict:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": prompt_text(digits)}],
        "ability": "reverse",
        "reward_model": {"style": "rule", "ground_truth": digits[::-1]},
        "extra_info": {"split": split, "index": index, "digits": digits},
    }


def sft_row(digits: str, response: str) -> dict:
    return {"prompt": prompt_text(digits), "response": response}


def make_task(seed: int = 0, n_train: int = 2000, n_test: int = 200, min_len: int = 3, max_len: int = 6,
              long_from: int = 5, p_short: float = 0.85, p_long: float = 0.3) -> dict[str, list[dict]]:
    """All four splits as lists of rows, determined by the arguments (``seed`` above all).

    Train and test strings are drawn together without repetition, so the test prompts are held out.
    """
    for name, p in (("p_short", p_short), ("p_long", p_long)):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{name} is a probability, got {p}")
    rng = random.Random(seed)
    strings = sample_digit_strings(n_train + n_test, min_len, max_len, rng)
    train, test = strings[:n_train], strings[n_train:]
    teacher = random.Random(seed + 1)
    return {
        "train": [rl_row(s, "train", i) for i, s in enumerate(train)],
        "test": [rl_row(s, "test", i) for i, s in enumerate(test)],
        "sft_train": [sft_row(s, teacher_answer(s, teacher, long_from, p_short, p_long)) for s in train],
        "sft_test": [sft_row(s, teacher_answer(s, teacher, long_from, p_short, p_long)) for s in test],
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_dir", default="demo_output/data", help="output folder for the parquet files")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n_train", type=int, default=2000, help="training prompts (RL and SFT)")
    parser.add_argument("--n_test", type=int, default=200, help="held-out validation prompts")
    parser.add_argument("--min_len", type=int, default=3)
    parser.add_argument("--max_len", type=int, default=6)
    parser.add_argument("--long_from", type=int, default=5, help="strings this long or longer are 'long'")
    parser.add_argument("--p_short", type=float, default=0.85, help="teacher accuracy on short strings")
    parser.add_argument("--p_long", type=float, default=0.3, help="teacher accuracy on long strings")
    args = parser.parse_args(argv)
    splits = make_task(args.seed, args.n_train, args.n_test, args.min_len, args.max_len, args.long_from,
                       args.p_short, args.p_long)
    paths = save_splits(splits, args.local_dir)
    correct = sum(r["response"] == r["prompt"].split()[-1][::-1] for r in splits["sft_train"])
    print(f"wrote {len(splits['train'])} train / {len(splits['test'])} held-out test prompts to {args.local_dir}; "
          f"the teacher's demonstrations are right {correct / len(splits['sft_train']):.0%} of the time")
    return paths


if __name__ == "__main__":
    main()
