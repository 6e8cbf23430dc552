"""The original's one-step-off-policy recipe: ``python -m verl.experimental.one_step_off_policy.main_ppo`` (or
``.async_main_ppo``), run as ``trainer.v1.trainer_mode=separate_async`` (:mod:`verl.experimental.recipes`)."""
