"""Memory reports and stage timers for the driver and the workers (the only ones: ``verl.utils.debug`` re-exports
these).

``simple_timer``/``marked_timer`` fill the ``timing_raw`` dict whose entries become the
``timing_s/<stage>`` metrics; ``reduce_timing`` averages such a dict over the ranks of a process group.
``marked_timer`` and the ``mark_*`` functions also name a range in a running ``torch.profiler`` trace and, on
CUDA, an NVTX range (what Nsight Systems shows).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

_GIB = 1024**3


def _cpu_rss_bytes() -> int | None:
    """Resident set size of this process (psutil when installed, else /proc/self/status)."""
    try:
        import psutil

        return psutil.Process(os.getpid()).memory_info().rss
    except ImportError:
        pass
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024  # the kernel reports kB
    except OSError:
        pass
    return None


def _current_rank() -> int | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return None


def memory_usage() -> dict[str, float]:
    """Memory figures in GiB, flat: ``cpu_rss_gb`` (when readable) and, per CUDA device i,
    ``cuda:i/allocated_gb``, ``cuda:i/reserved_gb``, ``cuda:i/peak_allocated_gb``."""
    usage: dict[str, float] = {}
    rss = _cpu_rss_bytes()
    if rss is not None:
        usage["cpu_rss_gb"] = rss / _GIB
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            usage[f"cuda:{i}/allocated_gb"] = torch.cuda.memory_allocated(i) / _GIB
            usage[f"cuda:{i}/reserved_gb"] = torch.cuda.memory_reserved(i) / _GIB
            usage[f"cuda:{i}/peak_allocated_gb"] = torch.cuda.max_memory_allocated(i) / _GIB
    return usage


def _format_usage(head: str, usage: dict[str, float], rank: int | None) -> str:
    parts = [f"[{head or 'memory'}]" + (f" rank={rank}" if rank is not None else "")]
    if "cpu_rss_gb" in usage:
        parts.append(f"cpu_rss={usage['cpu_rss_gb']:.2f}GiB")
    devices = sorted({k.split("/")[0] for k in usage if k.startswith("cuda:")}, key=lambda d: int(d[5:]))
    for dev in devices:
        parts.append(f"{dev} allocated={usage[f'{dev}/allocated_gb']:.2f}GiB "
                     f"reserved={usage[f'{dev}/reserved_gb']:.2f}GiB peak={usage[f'{dev}/peak_allocated_gb']:.2f}GiB")
    return " | ".join(parts)


def print_memory_usage(head: str = "", logger: logging.Logger | None = None,
                       rank: int | None = None) -> dict[str, float]:
    """Print (or log at INFO on ``logger``) this process's memory, one line, and return the figures.

    The line reads ``[head] rank=R | cpu_rss=1.23GiB | cuda:0 allocated=.. reserved=.. peak=..``;
    CUDA parts appear only when CUDA is available. ``rank`` defaults to the torch.distributed rank
    when a process group exists. Returns :func:`memory_usage`'s dict.
    """
    return _report(head, logger, logging.INFO, rank if rank is not None else _current_rank())


def log_gpu_memory_usage(head: str, logger: logging.Logger | None = None, level: int = logging.DEBUG,
                         rank: int | None = 0) -> dict[str, float] | None:
    """Report memory like :func:`print_memory_usage`, only on process-group rank ``rank``
    (every rank when ``rank`` is None, or when no process group exists).

    With a logger the line is logged at ``level`` (and nothing is measured when that level is
    disabled); without one it is printed. Returns the figures, or None when skipped.
    """
    current = _current_rank()
    if rank is not None and current is not None and current != rank:
        return None
    if logger is not None and not logger.isEnabledFor(level):
        return None
    return _report(head, logger, level, current)


def _report(head: str, logger: logging.Logger | None, level: int, rank: int | None) -> dict[str, float]:
    usage = memory_usage()
    line = _format_usage(head, usage, rank)
    if logger is None:
        print(line, flush=True)
    else:
        logger.log(level, line)
    return usage


@contextmanager
def simple_timer(name: str, timing_raw: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in the block to ``timing_raw[name]`` (summing with what is there).

    The time is recorded even when the block raises.
    """
    start = time.perf_counter()
    try:
        yield
    finally:
        timing_raw[name] = timing_raw.get(name, 0.0) + time.perf_counter() - start


@contextmanager
def marked_timer(name: str, timing_raw: dict[str, float], color: str | None = None, domain: str | None = None,
                 category: str | None = None) -> Iterator[None]:
    """:func:`simple_timer` whose block is also a range named ``name`` (:func:`mark_start_range`): a
    ``record_function`` span in a running torch profiler's trace, and an NVTX range on CUDA. ``color``,
    ``domain`` and ``category`` are the original's NVTX options; torch's NVTX ranges have a name only."""
    mark = mark_start_range(name, color=color, domain=domain, category=category)
    try:
        with simple_timer(name, timing_raw):
            yield
    finally:
        mark_end_range(mark)


class _Range:
    """An open range: the torch profiler span and, on CUDA, the NVTX range id."""

    def __init__(self, message: str):
        self.span = torch.profiler.record_function(message)
        self.span.__enter__()
        self.nvtx_id = torch.cuda.nvtx.range_start(message) if torch.cuda.is_available() else None

    def end(self) -> None:
        if self.nvtx_id is not None:
            torch.cuda.nvtx.range_end(self.nvtx_id)
        self.span.__exit__(None, None, None)


def mark_start_range(message: str | None = None, color: str | None = None, domain: str | None = None,
                     category: str | None = None) -> _Range:
    """Open a range named ``message``; close it with :func:`mark_end_range`. Outside a torch profiler and without
    CUDA it costs a few microseconds and records nothing (there is nothing to record into)."""
    return _Range(message or "range")


def mark_end_range(range_id: _Range) -> None:
    """Close a range :func:`mark_start_range` opened."""
    range_id.end()


def mark_annotate(message: str | None = None, color: str | None = None, domain: str | None = None,
                  category: str | None = None) -> Callable:
    """Decorator: each call of the function is a range named ``message`` (default: the function's name)."""

    def decorator(func):
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            mark = mark_start_range(message or func.__name__, color=color, domain=domain, category=category)
            try:
                return func(*args, **kwargs)
            finally:
                mark_end_range(mark)

        return wrapper

    return decorator


class GPUMemoryLogger:
    """Decorator: log memory (:func:`log_gpu_memory_usage`) before and after each call, headed
    ``Before <function>`` / ``After <function>`` and tagged with ``role``; only on rank 0 unless
    ``log_only_rank_0`` is false.

        @GPUMemoryLogger(role="actor", logger=logger)
        def update_policy(self, data): ...
    """

    def __init__(self, role: str, logger: logging.Logger | None = None, level: int = logging.DEBUG,
                 log_only_rank_0: bool = True):
        self.role, self.logger, self.level = role, logger, level
        self.rank = 0 if log_only_rank_0 else None

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def wrapper(*args, **kwargs):
            log_gpu_memory_usage(f"{self.role}: Before {func.__name__}", self.logger, self.level, self.rank)
            output = func(*args, **kwargs)
            log_gpu_memory_usage(f"{self.role}: After {func.__name__}", self.logger, self.level, self.rank)
            return output

        return wrapper


def reduce_timing(timing_raw: dict[str, float], group=None) -> dict[str, float]:
    """The mean of each timing over the ranks of ``group`` (the default group when None).

    A collective: every rank must call it with the same keys. Without an initialised process group
    (the driver, single-process runs) it returns a copy of ``timing_raw`` unchanged.
    """
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return dict(timing_raw)
    keys = sorted(timing_raw)
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else "cpu"
    values = torch.tensor([float(timing_raw[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(values, op=dist.ReduceOp.SUM, group=group)
    values /= dist.get_world_size(group)
    return dict(zip(keys, values.tolist()))
