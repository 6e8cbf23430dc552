"""``python -m verl.experimental.one_step_off_policy.main_ppo key=value ...``: the one-step-off-policy recipe's
command line (``rollout.nnodes``/``rollout.n_gpus_per_node`` for the rollout's own devices), run by the one trainer
(:func:`verl.experimental.recipes.one_step_off`)."""

import sys

from verl.experimental.recipes import one_step_off
from verl.trainer.main_ppo import main as run_main


def main(argv: list[str] | None = None) -> int:
    return run_main(argv, "one_step_off_ppo_trainer", one_step_off)


if __name__ == "__main__":
    sys.exit(main())
