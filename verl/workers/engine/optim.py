"""AdamW and the learning-rate schedule, built from an ``actor.optim`` / ``critic.optim`` config.

Schedule (``LambdaLR``; ``lr_scheduler.step()`` once per trainer step, so step s is the s-th update):
warmup of W steps, W = ``lr_warmup_steps`` if > 0 else ``int(lr_warmup_steps_ratio * total_training_steps)``,
is linear from 0: lr(s) = lr · s / W for s < W (so the first update runs at lr 0, as in the original
verl and transformers' schedules). Afterwards:

- ``constant``: lr(s) = lr.
- ``cosine``: with p = (s - W) / max(1, total - W) and m = ``min_lr_ratio``,
  lr(s) = lr · max(m, m + (1 - m) · ½ · (1 + cos(2π · num_cycles · p))); num_cycles 0.5 is a half
  wave from lr down to m·lr at the last step.
"""

from __future__ import annotations

import logging
import math

import torch

from verl.workers.config.optimizer import OptimConfig

logger = logging.getLogger(__name__)


def build_optimizer(params, optim_config: OptimConfig) -> torch.optim.Optimizer:
    """AdamW over ``params`` with ``lr``, ``betas``, ``weight_decay``, ``eps`` and ``override_optimizer_config``.

    On CUDA the fused implementation (one kernel for all parameters) is used unless
    ``override_optimizer_config`` names ``fused`` or ``foreach``; on the CPU, torch's default.
    """
    optim_config = OptimConfig.from_config(optim_config)
    if optim_config.optimizer.lower() != "adamw" or optim_config.optimizer_impl != "torch.optim":
        raise ValueError(f"optim.optimizer={optim_config.optimizer!r} with optim.optimizer_impl="
                         f"{optim_config.optimizer_impl!r} is not supported; use optimizer=AdamW, "
                         "optimizer_impl=torch.optim.")
    kwargs = {"lr": float(optim_config.lr), "betas": tuple(float(b) for b in optim_config.betas),
              "weight_decay": float(optim_config.weight_decay), "eps": float(optim_config.eps)}
    overrides = dict(optim_config.override_optimizer_config or {})
    params = list(params)
    on_cuda = bool(params) and all(isinstance(p, torch.Tensor) and p.is_cuda for p in params)
    if on_cuda and "fused" not in overrides and "foreach" not in overrides:
        kwargs["fused"] = True
    kwargs.update(overrides)
    return torch.optim.AdamW(params, **kwargs)


def lr_factor(step: int, *, warmup_steps: int, total_steps: int, scheduler_type: str = "constant",
              min_lr_ratio: float = 0.0, num_cycles: float = 0.5) -> float:
    """The multiplier of the base lr at update ``step`` (see the module docstring for the formula)."""
    if step < warmup_steps:
        return step / max(1, warmup_steps)
    if scheduler_type == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(2.0 * math.pi * num_cycles * progress))
    return max(min_lr_ratio, min_lr_ratio + (1.0 - min_lr_ratio) * cosine)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, optim_config: OptimConfig,
                       total_training_steps: int | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    """The warmup + constant/cosine schedule of ``optim_config``.

    ``total_training_steps`` overrides ``optim.total_training_steps`` (which the trainer fills in).
    """
    optim_config = OptimConfig.from_config(optim_config)
    total = int(total_training_steps if total_training_steps is not None else optim_config.total_training_steps)
    scheduler_type = optim_config.lr_scheduler_type
    if optim_config.warmup_style is not None:
        logger.warning("optim.warmup_style is deprecated; use optim.lr_scheduler_type=%s instead.",
                       optim_config.warmup_style)
        scheduler_type = optim_config.warmup_style
    if scheduler_type not in ("constant", "cosine"):
        raise ValueError(f"optim.lr_scheduler_type={scheduler_type!r} is not supported; use constant or cosine.")

    warmup = int(optim_config.lr_warmup_steps)
    if warmup <= 0:
        ratio = float(optim_config.lr_warmup_steps_ratio)
        if ratio > 0 and total <= 0:
            raise ValueError("optim.lr_warmup_steps_ratio > 0 needs optim.total_training_steps (set by the trainer).")
        warmup = int(ratio * total) if ratio > 0 else 0
    if scheduler_type == "cosine" and total <= 0:
        raise ValueError("optim.lr_scheduler_type=cosine needs optim.total_training_steps (set by the trainer).")
    min_lr_ratio = float(optim_config.min_lr_ratio)
    if not 0.0 <= min_lr_ratio <= 1.0:
        raise ValueError(f"optim.min_lr_ratio must be in [0, 1], got {min_lr_ratio}")
    num_cycles = float(optim_config.num_cycles)

    def factor(step: int) -> float:
        return lr_factor(step, warmup_steps=warmup, total_steps=total, scheduler_type=scheduler_type,
                         min_lr_ratio=min_lr_ratio, num_cycles=num_cycles)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
