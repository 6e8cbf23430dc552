"""``python -m verl.experimental.one_step_off_policy.async_main_ppo``: the name the original's documentation gives
the one-step-off-policy entry point; the same as ``.main_ppo``."""

import sys

from verl.experimental.one_step_off_policy.main_ppo import main

if __name__ == "__main__":
    sys.exit(main())
