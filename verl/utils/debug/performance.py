"""The original's path of the timers and memory reports, which live in :mod:`verl.utils.profiler.performance`."""

from verl.utils.profiler.performance import (  # noqa: F401
    GPUMemoryLogger, log_gpu_memory_usage, marked_timer, memory_usage, print_memory_usage, reduce_timing, simple_timer
)
