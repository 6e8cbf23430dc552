"""`DistProfilerExtension`: the driver-callable ``start_profile``/``stop_profile`` of a worker that profiles
(its ``self.profiler`` is a :class:`verl.utils.profiler.DistProfiler`). The original's import path
``verl.utils.profiler.DistProfilerExtension`` gives this class."""

from __future__ import annotations

from verl.single_controller.decorator import Dispatch, register
from verl.utils.profiler.profile import DistProfiler

__all__ = ["DistProfilerExtension"]


class DistProfilerExtension:
    """Mix into a worker class and call ``DistProfilerExtension.__init__(self, DistProfiler(...))``."""

    def __init__(self, profiler: DistProfiler):
        self.profiler = profiler

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def start_profile(self, **kwargs) -> None:
        """Start profiling on this rank before a training step (``profile_step``: the step)."""
        self.profiler.start(**kwargs)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_profile(self, **kwargs) -> None:
        """Stop profiling on this rank after a training step and write its trace."""
        self.profiler.stop(**kwargs)
