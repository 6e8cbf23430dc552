"""The original's fully asynchronous recipe: ``python -m verl.experimental.fully_async_policy.fully_async_main``,
run as ``trainer.v1.trainer_mode=separate_async`` (:mod:`verl.experimental.recipes`)."""
