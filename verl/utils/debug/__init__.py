"""Debugging helpers: memory reports and stage timers (see :mod:`verl.utils.debug.performance`)."""

from verl.utils.debug.performance import (
    log_gpu_memory_usage, marked_timer, memory_usage, print_memory_usage, reduce_timing, simple_timer
)

__all__ = ["log_gpu_memory_usage", "marked_timer", "memory_usage", "print_memory_usage", "reduce_timing",
           "simple_timer"]
