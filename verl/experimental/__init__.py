"""The original verl's experimental recipes, under their entry points: one-step-off-policy and fully asynchronous
training, both run by the one trainer as ``trainer.v1.trainer_mode=separate_async`` (see :mod:`.recipes`)."""
