"""numina_* grading: the prime_math grader in this process (what the original does, with no protection
from the model text it evaluates) against this verl's (answers extracted here, graded in sandbox workers,
each distinct (answer, reference) pair once), on the same responses in the same run.

The batch is shaped like a GRPO step on a math set: ``--prompts`` prompts x ``--n`` responses. Each prompt
has a reference (an integer, a decimal, a fraction, a multiple of pi, a pair or an expression); each
response gives the right answer (half of them, written in one of its equivalent spellings) or a wrong one,
in "the answer is", ``\\boxed{}`` and "so we get" phrasings. Both sides grade the same list and must agree.

    python3 bench/prime_grading.py                  # 128 prompts x 8 = 1,024 responses, 1 and 4 threads

Prints per side: seconds (the faster of two passes, timed in the order baseline, ours, ours, baseline; before
2026-12-08 one pass each, the baseline always first), responses/s and ms per response; and how many distinct
pairs the batch had.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import random
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from sympy.core.cache import clear_cache

from verl.rewards.scorers import prime_math
from verl.rewards.scorers.prime_math.extract import extract_answer
from verl.rewards.scorers.prime_math.grader import grade

PHRASES = ["Step 1: ... Step 2: so the answer is {}.", "We compute carefully. Therefore \\boxed{{{}}}",
           "Adding both sides, we get {}", "After simplifying, the final answer is: {}"]


def make_problem(rng: random.Random) -> tuple[str, list[str], list[str]]:
    """A reference, spellings of it that the grader accepts, and wrong answers a model might give."""
    a, b = rng.randint(2, 99), rng.randint(2, 9)
    kind = rng.randrange(6)
    if kind == 0:
        return str(a), [str(a), f"{a}.0", f"{a}"], [str(a + 1), str(a - 1), str(2 * a)]
    if kind == 1:
        return f"{a / 4:g}", [f"{a / 4:g}", f"\\frac{{{a}}}{{4}}" if a % 2 else f"{a / 4:g}"], [f"{a / 5:g}", str(a)]
    if kind == 2:
        right = [f"\\frac{{1}}{{{b}}}", f"1/{b}", f"\\dfrac{{1}}{{{b}}}"]
        return right[0], right, [f"\\frac{{2}}{{{2 * b}}}", f"{1 / b:.2f}"]
    if kind == 3:
        return f"{b}\\pi", [f"{b}\\pi", f"{b * 3.14159:.4f}"], [f"{b + 1}\\pi", f"{b}"]
    if kind == 4:
        return f"({a}, {b})", [f"({a}, {b})", f"({a},{b})"], [f"({b}, {a})", f"({a}, {b + 1})"]
    return f"(x+{b})^2", [f"x^2+{2 * b}x+{b * b}", f"(x + {b})^2"], [f"x^2+{b * b}", f"(x-{b})^2"]


def make_batch(prompts: int, n: int, seed: int = 0) -> list[tuple[str, str]]:
    rng = random.Random(seed)
    batch = []
    for _ in range(prompts):
        reference, right, wrong = make_problem(rng)
        for _ in range(n):
            answer = rng.choice(right) if rng.random() < 0.5 else rng.choice(wrong)
            batch.append((rng.choice(PHRASES).format(answer), reference))
    return batch


def timed(fn, batch, threads: int) -> tuple[float, list[float]]:
    clear_cache()  # sympy's cache of this process: the in-process side starts each pass cold, like a fork
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        scores = list(pool.map(lambda pair: fn(*pair), batch))
    return time.perf_counter() - start, scores


def in_process(solution: str, reference: str) -> float:
    return 1.0 if grade(solution, reference)["correct"] else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=128)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 4])
    args = parser.parse_args()
    batch = make_batch(args.prompts, args.n)
    start = time.perf_counter()
    prime_math.compute_score("The answer is 1", "1")  # the first worker starts here
    print(f"sandbox worker start-up (first call): {time.perf_counter() - start:.2f} s")
    in_process("The answer is 1", "1")
    pairs = {(extract_answer(solution)[1], reference) for solution, reference in batch}
    print(f"{len(batch)} responses ({args.prompts} prompts x {args.n}), {len(pairs)} distinct (answer, reference) "
          f"pairs, {os.cpu_count()} CPUs")
    for threads in args.threads:
        def ours():
            prime_math._verdicts = prime_math._Verdicts()  # ours starts each pass with nothing graded
            return timed(prime_math.compute_score, batch, threads)

        # A-B-B-A, the faster of each side's two: drift on a shared machine lands on both sides alike.
        (base_a, base_scores), (ours_a, ours_scores) = timed(in_process, batch, threads), ours()
        (ours_b, _), (base_b, _) = ours(), timed(in_process, batch, threads)
        base_s, ours_s = min(base_a, base_b), min(ours_a, ours_b)
        assert base_scores == ours_scores, "the sandboxed grader disagrees with the in-process one"
        n = len(batch)
        print(f"threads={threads}: in-process (the original's way) {base_s:.2f} s, {n / base_s:.0f}/s, "
              f"{1000 * base_s / n:.2f} ms each | sandboxed (ours) {ours_s:.2f} s, {n / ours_s:.0f}/s, "
              f"{1000 * ours_s / n:.2f} ms each | ours/baseline time {ours_s / base_s:.2f}x | "
              f"mean score {sum(ours_scores) / n:.3f}")


if __name__ == "__main__":
    main()
