"""Layer 4 training engine: FSDP2 sharding, optimizer and LR schedule, offload, checkpoint I/O."""

from verl.workers.engine.checkpoint import load_full_model_state_dict
from verl.workers.engine.fsdp import FSDPEngine
from verl.workers.engine.optim import build_lr_scheduler, build_optimizer

__all__ = ["FSDPEngine", "build_lr_scheduler", "build_optimizer", "load_full_model_state_dict"]
