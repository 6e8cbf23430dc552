"""Checks of the machine and the files a run needs, after the config is valid and before anything
starts (no Ray, no worker, no model load): data files exist, a GPU is there when ``trainer.device=cuda``
and the run starts its own Ray cluster here, a ``resume_path`` checkpoint is a checkpoint.

:func:`validate_config` checks the config alone (it passes for a command written on another machine);
``main_ppo`` and ``python -m verl.trainer.config_validation`` run both.
"""

from __future__ import annotations

import os

from verl.trainer.config import ConfigError


def _local(path: str) -> bool:
    return "://" not in path  # hdfs://, s3://, ... are read by their own clients


def preflight_errors(config, cuda_available: bool | None = None) -> list[str]:
    """``<key>: <what is wrong>. <how to fix>`` for every problem found."""
    errors = []
    data = config.data
    for key in ("train_files", "val_files"):
        files = data.get(key)
        if not files:
            continue
        for path in [files] if isinstance(files, str) else list(files):
            path = str(path)
            if _local(path) and not os.path.exists(os.path.expanduser(path)):
                errors.append(f"data.{key}: {path!r} does not exist. Give the parquet file(s) the preprocessing "
                              "script wrote (e.g. python3 examples/data_preprocess/gsm8k.py --local_dir DIR)")
    trainer = config.trainer
    joins_cluster = bool(os.environ.get("RAY_ADDRESS")) or bool(config.get("ray_kwargs", {}).get("ray_init", {})
                                                                  .get("address"))
    if str(trainer.get("device", "cuda")) == "cuda" and not joins_cluster:
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        if not cuda_available:
            errors.append("trainer.device: is cuda, but this machine has no visible GPU (torch.cuda.is_available() "
                          "is False). Set trainer.device=cpu to train on the CPU, or check CUDA_VISIBLE_DEVICES and "
                          "the driver")
    if trainer.get("resume_mode") == "resume_path" and trainer.get("resume_from_path"):
        folder = os.path.expanduser(str(trainer.resume_from_path))
        if not os.path.isdir(folder):
            errors.append(f"trainer.resume_from_path: {folder!r} does not exist. Give a checkpoint folder "
                          "(.../global_step_N) or use trainer.resume_mode=auto")
        elif not os.path.isdir(os.path.join(folder, "actor")):
            errors.append(f"trainer.resume_from_path: {folder!r} holds no actor/ checkpoint: it is not a "
                          "global_step_N folder written by this trainer")
    return errors


def preflight(config, cuda_available: bool | None = None) -> None:
    """Raise :class:`ConfigError` listing every problem :func:`preflight_errors` finds."""
    errors = preflight_errors(config, cuda_available)
    if errors:
        raise ConfigError(f"Cannot start ({len(errors)} problem{'s' if len(errors) > 1 else ''}):", errors)
