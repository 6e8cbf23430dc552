"""`DistProfiler`: a worker role's profiler. The driver starts it before a profiled training step and stops it
after (``start_profile``/``stop_profile``, see ``verl.single_controller.profiling.DistProfilerExtension``); the
worker's methods marked ``@DistProfiler.annotate(role=...)`` are named ranges in the trace (or, with
``tool_config.torch.discrete``, traces of their own)."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable

from verl.utils.profiler.config import ProfilerConfig, unsupported_tool_reason

__all__ = ["DistProfiler"]


def _profiles_rank(config: ProfilerConfig, rank: int) -> bool:
    """Whether ``config`` selects ``rank``: every rank with ``all_ranks``, else those ``ranks`` lists ([]: rank 0)."""
    if config.all_ranks:
        return True
    return rank in config.ranks if config.ranks else rank == 0


class DistProfiler:
    """The profiler of one role on one rank, running the tool ``config.tool`` names.

    It profiles when ``config.enable`` is true and ``config`` selects this rank (``all_ranks``, ``ranks``, or rank
    0). ``save_file_prefix`` (the role, e.g. ``actor_rollout_ref`` or ``critic``) names its trace files. A tool this
    verl cannot run (nsys, npu, precision_debugger) is a ValueError saying what to use instead.
    """

    def __init__(self, rank: int, config: ProfilerConfig | None = None, tool_config=None,
                 save_file_prefix: str | None = None, **kwargs):
        self.rank, self.config = rank, config or ProfilerConfig()
        self.role = save_file_prefix or "worker"
        self._enable = bool(self.config.enable and self.config.tool)
        self._this_rank = self._enable and _profiles_rank(self.config, rank)
        self._this_step = False
        self._impl = None
        if not self._this_rank:
            return
        tool = self.config.tool
        reason = unsupported_tool_reason(tool)
        if reason is not None:
            raise ValueError(f"profiler tool {tool!r} cannot run here: {reason}. Use global_profiler.tool=torch "
                             "(a Chrome/Perfetto trace per profiled step and rank)")
        if not self.config.save_path:
            raise ValueError("global_profiler.save_path is null: set the folder the traces go to, e.g. "
                             "global_profiler.save_path=outputs/profile")
        from verl.utils.profiler.torch_profile import TorchMemoryProfiler, TorchProfiler

        save_path = os.path.abspath(self.config.save_path)
        if tool == "torch":
            self._impl = TorchProfiler(rank, self.role, save_path, tool_config or self.config.tool_config.torch)
        elif tool == "torch_memory":
            self._impl = TorchMemoryProfiler(rank, self.role, save_path,
                                             tool_config or self.config.tool_config.torch_memory)
        else:
            raise ValueError(f"unknown profiler tool {tool!r}; set global_profiler.tool to torch or torch_memory")

    def check_enable(self) -> bool:
        """Whether the config enables profiling for this role."""
        return self._enable

    def check_this_rank(self) -> bool:
        """Whether this rank is one the config selects."""
        return self._this_rank

    def check_this_step(self) -> bool:
        """Whether the current training step is being profiled (between :meth:`start` and :meth:`stop`)."""
        return self._this_step

    def is_discrete_mode(self) -> bool:
        return bool(self._impl is not None and getattr(self._impl.config, "discrete", False))

    @property
    def written(self) -> list[str]:
        """The trace files this rank wrote so far."""
        return list(self._impl.written) if self._impl is not None else []

    def start(self, **kwargs) -> None:
        """Start profiling before a training step (``profile_step``: its number, for the file name)."""
        if self._impl is None:
            return
        self._this_step = True
        self._impl.start(profile_step=kwargs.get("profile_step", kwargs.get("global_step")))

    def stop(self, **kwargs) -> None:
        """Stop after a training step and write the trace (``profile_step``: the last step it spans)."""
        if self._impl is None or not self._this_step:
            return
        self._this_step = False
        self._impl.stop(profile_step=kwargs.get("profile_step"))

    @classmethod
    def annotate(cls, message: str | None = None, color: str | None = None, domain: str | None = None,
                 category: str | None = None, **kwargs_outer) -> Callable:
        """Decorator of a worker method (the worker has a ``profiler`` attribute): while a step is profiled, each
        call is a range named ``role`` (or ``message``, or the method's name) in the trace; with
        ``tool_config.torch.discrete`` a trace of its own. Otherwise the method runs as it is."""
        name = kwargs_outer.get("role") or message

        def decorator(func):
            @functools.wraps(func)
            def wrapper(self_instance, *args, **kwargs):
                profiler = getattr(self_instance, "profiler", None)
                if not isinstance(profiler, DistProfiler) or profiler._impl is None or not profiler._this_step:
                    return func(self_instance, *args, **kwargs)
                with profiler._impl.annotate(name or func.__name__):
                    return func(self_instance, *args, **kwargs)

            return wrapper

        return decorator
