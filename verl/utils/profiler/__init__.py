"""Profiling, stage timers and memory reports, under the original verl's names.

- timers that fill ``timing_raw`` (the ``timing_s/<stage>`` metrics): ``simple_timer``, ``marked_timer`` (also a
  named range in a trace), ``reduce_timing``;
- memory: ``log_gpu_memory_usage``, the ``GPUMemoryLogger`` decorator, ``print_memory_usage``;
- ranges: ``mark_start_range``/``mark_end_range``, the ``mark_annotate`` decorator (``torch.profiler``
  ``record_function`` spans, and NVTX ranges on CUDA);
- profiling a training step (``global_profiler.*``, each role's ``profiler.*``): ``DistProfiler``, its config
  ``ProfilerConfig``, and ``DistProfilerExtension`` (the ``start_profile``/``stop_profile`` worker methods; it lives
  with the single controller, whose ``@register`` it uses).

Names are imported on first use, so importing the config classes does not import torch.
"""

from verl.utils.lazy import lazy_exports

_EXPORTS = {name: "verl.utils.profiler.performance" for name in (
    "GPUMemoryLogger", "log_gpu_memory_usage", "mark_annotate", "mark_end_range", "mark_start_range", "marked_timer",
    "memory_usage", "print_memory_usage", "reduce_timing", "simple_timer")}
_EXPORTS.update({name: "verl.utils.profiler.config" for name in (
    "GlobalProfilerConfig", "NPUToolConfig", "NsightToolConfig", "ProfilerConfig", "ProfilerToolConfig",
    "TorchMemoryToolConfig", "TorchProfilerScheduleConfig", "TorchProfilerToolConfig")})
_EXPORTS["DistProfiler"] = "verl.utils.profiler.profile"
_EXPORTS["DistProfilerExtension"] = "verl.single_controller.profiling"
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
