"""Rewards: everything that turns a generated response into a score.

- :mod:`.scorers`: rule rewards, one per ``data_source`` (GSM8K, MATH, DAPO, code, ...), chosen by
  ``default_compute_score``; the ``numina_*`` grader runs them in the sandbox (:mod:`verl.sandbox`);
- :mod:`.managers`: reward managers (``reward_model.reward_manager``), run on the driver: they decode a
  batch, call the scorer per sample and place the scores on the last response token;
- :mod:`.model`: a sequence-classifier reward model's forward (``reward_model.enable``), run by the
  reward-model worker;
- :mod:`.loading`: the reward function the trainer calls, built from the config (manager + scorer or the
  user's ``custom_reward_function``), and the checks of the data's rows against it.

The original verl's import paths (``verl.utils.reward_score``, ``verl.workers.reward_manager``,
``verl.trainer.ppo.reward``) lead here.
"""
