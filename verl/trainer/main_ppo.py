"""``python3 -m verl.trainer.main_ppo key=value ...``: PPO, GRPO and friends from the command line.

The command line is composed onto ``verl/trainer/config/ppo_trainer.yaml`` (Hydra override syntax)
and the whole config is validated before anything heavy starts. Then this process becomes the
driver: it reads the data and builds the reward functions on a second thread while Ray starts (here,
if no cluster is running; no Ray with ``trainer.backend=local``), starts the workers and runs the PPO
loop. With ``VERL_LOGGING_LEVEL=INFO`` it logs where the time to the first step went
(:mod:`verl.utils.startup`).
"""

from __future__ import annotations

import errno
import os
import sys

from verl.data.sampler import create_rl_sampler
from verl.trainer.config_validation import checked_config
from verl.utils import startup
from verl.utils.logging_utils import configure_logging

__all__ = ["create_rl_dataset", "create_rl_sampler", "load_inputs", "main", "run_ppo"]


def create_rl_dataset(data_paths, data_config, tokenizer, processor, is_train: bool = True, max_samples: int = -1):
    """The prompt dataset of ``data_paths`` (a parquet path or a list of them): an ``RLHFDataset``.

    ``data_config`` is the ``data`` section (a ``DataConfig``, or a dict / OmegaConf node of its keys; the keys it
    lacks keep ppo_trainer.yaml's defaults); ``processor`` is None for a text-only model. ``max_samples`` >= 0
    keeps that many rows, drawn with ``data.seed`` when shuffled (``data.shuffle`` for training,
    ``data.validation_shuffle`` when ``is_train`` is false), else the first ones; -1 keeps all. The original's
    custom dataset classes (``data.custom_cls``) and generated training data (``data.datagen``) are not
    implemented: setting one raises NotImplementedError.
    """
    import dataclasses

    from verl.data import RLHFDataset
    from verl.trainer.config.config import DataConfig

    data = DataConfig.from_config(data_config)
    for key, feature, applies in (("custom_cls", "custom dataset classes", True),
                                  ("datagen", "dynamic data generation", is_train)):
        path = (data[key] or {}).get("path")
        if path and applies:
            raise NotImplementedError(f"data.{key}.path={path!r}: {feature} are not implemented in this verl; remove "
                                      f"data.{key}.path to read the parquet files with the built-in RLHFDataset")
    if not is_train:
        data = dataclasses.replace(data, shuffle=data.validation_shuffle)
    return RLHFDataset(data_paths, tokenizer, data, processor=processor, max_samples=max_samples)


def load_inputs(config) -> tuple:
    """The tokenizer, the training and validation datasets (None without ``data.val_files``) and the
    training and validation reward functions."""
    from verl.models import load_tokenizer
    from verl.models.vision import load_processor
    from verl.rewards.loading import check_rule_reward_rows, load_reward_manager
    from verl.trainer.config.config import DataConfig
    from verl.workers.config import ModelConfig

    model, data = ModelConfig.from_config(config.actor_rollout_ref.model), DataConfig.from_config(config.data)
    with startup.DRIVER.phase("data"):
        tokenizer = load_tokenizer(model.tokenizer_path or model.path, trust_remote_code=model.trust_remote_code,
                                   chat_template=model.custom_chat_template)
        processor = load_processor(model.path, trust_remote_code=model.trust_remote_code, tokenizer=tokenizer)
        if processor is not None:
            check_vision_language_run(config, processor)
        train_dataset = create_rl_dataset(data.train_files, data, tokenizer, processor,
                                          max_samples=data.train_max_samples)
        val_dataset = (create_rl_dataset(data.val_files, data, tokenizer, processor, is_train=False,
                                         max_samples=data.val_max_samples) if data.val_files else None)
        check_rule_reward_rows(train_dataset, config, "data.train_files")
        if val_dataset is not None:
            check_rule_reward_rows(val_dataset, config, "data.val_files")
    with startup.DRIVER.phase("reward"):
        reward_fn = load_reward_manager(config, tokenizer, num_examine=0)
        val_reward_fn = load_reward_manager(config, tokenizer, num_examine=1)
    return tokenizer, train_dataset, val_dataset, reward_fn, val_reward_fn


def check_vision_language_run(config, processor) -> None:
    """What a vision-language policy cannot run with, refused before any worker starts (DatasetError: main prints it
    as "Cannot start"). Its generation engine is chosen with the run's (:mod:`verl.trainer.rollout_engine`)."""
    from verl.data import DatasetError
    from verl.models.loader import load_hf_config
    from verl.models.vision import is_vision_language
    from verl.trainer.config.spec import need_critic

    if not need_critic(config.critic.get("enable"), config.algorithm.adv_estimator):
        return
    critic = config.critic.model
    critic_config = load_hf_config(critic.path, trust_remote_code=critic.get("trust_remote_code", False),
                                   config_key="critic.model.path")
    if not is_vision_language(critic_config):
        raise DatasetError(f"actor_rollout_ref.model.path={config.actor_rollout_ref.model.path!r} is a vision-language "
                           f"model ({processor.config.model_type}), but critic.model.path={critic.path!r} is a text "
                           f"model ({critic_config.model_type}), which cannot read the prompts' images. Give the critic "
                           "a vision-language model too (e.g. the policy's own path), or use an estimator without a "
                           f"critic, e.g. algorithm.adv_estimator=grpo (now {config.algorithm.adv_estimator!r}).")


def run_ppo(config) -> dict:
    """Run a validated config to the end; returns the last step's metrics."""
    from concurrent.futures import ThreadPoolExecutor

    from omegaconf import OmegaConf

    from verl.trainer.config.spec import worker_backend
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    configure_logging()
    if worker_backend(lambda key: OmegaConf.select(config, key)) == "local":
        inputs = load_inputs(config)
    else:  # Ray's start is mostly waiting for its processes: read the data meanwhile
        from verl.single_controller.ray import init_ray

        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-inputs") as pool:
            loading = pool.submit(load_inputs, config)
            with startup.DRIVER.phase("ray"):
                init_ray(config.get("ray_kwargs"), device=config.trainer.device)
            inputs = loading.result()
    trainer = RayPPOTrainer(config, *inputs)
    try:
        trainer.init_workers()
        return trainer.fit()
    finally:
        trainer.shutdown()


def main(argv: list[str] | None = None, config_name: str = "ppo_trainer", translate=None) -> int:
    """The command line's run; 1 after printing why it cannot run or stopped. The original's asynchronous recipes
    (:mod:`verl.experimental.recipes`) come here with their own config and its translation."""
    configure_logging()
    with startup.DRIVER.phase("config"):
        config = checked_config(argv, config_name, translate)
    if config is None:
        return 1
    from verl.data import DatasetError
    from verl.single_controller import WorkerError
    from verl.trainer.ppo.ray_trainer import DynamicSamplingError
    from verl.trainer.rollout_engine import EngineChoiceError

    try:
        run_ppo(config)
    except (DatasetError, EngineChoiceError) as e:  # found from the data and the model, before any worker started
        print(f"Cannot start: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nTraining interrupted. {_resume_hint(config)}", file=sys.stderr)
        return 130
    except (WorkerError, DynamicSamplingError, OSError) as e:
        message = f"\nTraining stopped: {e}"
        if "No space left on device" in str(e) or getattr(e, "errno", None) == errno.ENOSPC:
            message += ("\nThe disk is full. Checkpoints are written under a temporary name and renamed when "
                        "complete, so the previous one is intact; free space (or set trainer.max_actor_ckpt_to_keep) "
                        "and run the same command again.")
        print(message + f"\n{_resume_hint(config)}", file=sys.stderr)
        return 1
    return 0


def _resume_hint(config) -> str:
    from verl.trainer.ppo import checkpointing

    root = str(config.trainer.default_local_dir)
    try:
        latest = checkpointing.latest_checkpoint(root) if os.path.isdir(root) else None
    except (OSError, ValueError):
        latest = None
    if latest is None:
        return "No complete checkpoint was written yet (trainer.save_freq); running the command again starts over."
    return (f"The last complete checkpoint is {latest}: run the same command again to resume from it "
            "(trainer.resume_mode=auto).")


if __name__ == "__main__":
    sys.exit(main())
