import logging
import math

import pytest
import torch
from omegaconf import OmegaConf

from verl.workers.engine import build_lr_scheduler, build_optimizer


def lrs(optim_config, steps, total=None):
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], optim_config)
    scheduler = build_lr_scheduler(optimizer, optim_config, total)
    values = []
    for _ in range(steps):
        values.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return values


def test_constant_with_linear_warmup_from_zero():
    # warmup 2 of 10 steps, lr 1: s/2 for s < 2, then 1.
    got = lrs({"lr": 1.0, "lr_warmup_steps": 2, "total_training_steps": 10}, 5)
    assert got == [0.0, 0.5, 1.0, 1.0, 1.0]


def test_warmup_from_ratio_and_no_warmup():
    # ratio 0.3 of 10 steps -> int(3.0) = 3 warmup steps: 0, 1/3, 2/3, 1.
    got = lrs({"lr": 1.0, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.3, "total_training_steps": 10}, 4)
    assert got == pytest.approx([0.0, 1 / 3, 2 / 3, 1.0])
    assert lrs({"lr": 2.0}, 3) == [2.0, 2.0, 2.0]


def test_cosine_hand_computed():
    cfg = OmegaConf.create({"lr": 1.0, "lr_warmup_steps": 2, "total_training_steps": 10,
                            "lr_scheduler_type": "cosine", "min_lr_ratio": 0.1, "num_cycles": 0.5})
    got = lrs(cfg, 11)
    # After warmup p = (s - 2) / 8 and lr = 0.1 + 0.9 * (1 + cos(pi p)) / 2.
    assert got[:3] == pytest.approx([0.0, 0.5, 1.0])
    assert got[4] == pytest.approx(0.1 + 0.45 * (1 + math.cos(math.pi / 4)))  # p = 1/4: 0.868198
    assert got[6] == pytest.approx(0.55)  # p = 1/2
    assert got[10] == pytest.approx(0.1)  # p = 1
    assert got[4] == pytest.approx(0.8681980515)


def test_deprecated_warmup_style_is_honoured_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING):
        got = lrs({"lr": 1.0, "warmup_style": "cosine", "lr_scheduler_type": "constant",
                   "total_training_steps": 4}, 5)
    assert "warmup_style is deprecated" in caplog.text
    assert got == pytest.approx([1.0, 0.5 + 0.5 * math.cos(math.pi / 4), 0.5, 0.5 - 0.5 * math.cos(math.pi / 4), 0.0])


def test_schedule_errors():
    with pytest.raises(ValueError, match="total_training_steps"):
        lrs({"lr": 1.0, "lr_scheduler_type": "cosine"}, 1)
    with pytest.raises(ValueError, match="lr_scheduler_type='linear'"):
        lrs({"lr": 1.0, "lr_scheduler_type": "linear"}, 1)
    with pytest.raises(ValueError, match="not supported"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], {"optimizer": "SGD"})


def test_adamw_takes_its_settings_from_the_config():
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(1))],
                                {"lr": 3e-4, "betas": [0.8, 0.95], "weight_decay": 0.1, "eps": 1e-6})
    group = optimizer.param_groups[0]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert (group["lr"], group["betas"], group["weight_decay"], group["eps"]) == (3e-4, (0.8, 0.95), 0.1, 1e-6)
