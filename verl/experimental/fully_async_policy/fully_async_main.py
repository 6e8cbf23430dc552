"""``python -m verl.experimental.fully_async_policy.fully_async_main key=value ...``: the fully asynchronous
recipe's command line (``async_training.*``, ``rollout.*``), run by the one trainer
(:func:`verl.experimental.recipes.fully_async`)."""

import sys

from verl.experimental.recipes import fully_async
from verl.trainer.main_ppo import main as run_main


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, "fully_async_ppo_trainer", fully_async)


if __name__ == "__main__":
    sys.exit(main())
