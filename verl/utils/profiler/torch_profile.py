"""The tools that run here: ``torch`` (a Chrome/Perfetto trace of a profiled step) and ``torch_memory`` (a CUDA
allocator snapshot).

A process has one torch profiler at a time, and colocated roles (actor, critic, reward model in one worker
process) share the process: the first role that starts opens the recording, later ones join it, and the trace is
written when the last one stops, named after all of them: ``<save_path>/<roles>_step<N>_rank<R>.json.gz``
(``step<N>-<M>`` when one trace spans several steps). Files are written under a temporary name and renamed, so a
file with the final name is complete.

``tool_config.torch.schedule`` (when ``active`` > 0) keeps a window of the update loop: the recording follows
``torch.profiler.schedule``, advanced once per optimizer step (one per update mini-batch, as the original advances
it), and each window it keeps is a file, the second and later ones with ``_part<i>`` after the name.
"""

from __future__ import annotations

import logging
import os
import re
import warnings

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

from verl.utils.profiler.config import TorchMemoryToolConfig, TorchProfilerScheduleConfig, TorchProfilerToolConfig

logger = logging.getLogger(__name__)

__all__ = ["TorchMemoryProfiler", "TorchProfiler", "trace_name"]


def trace_name(roles: list[str], steps: tuple[int | None, int | None], rank: int) -> str:
    """``<roles joined by +>_step<first>[-<last>]_rank<R>`` (no step part when unknown)."""
    first, last = steps
    parts = ["+".join(re.sub(r"[^0-9A-Za-z._=-]+", "-", role) for role in roles)]
    if first is not None:
        parts.append(f"step{first}" + (f"-{last}" if last is not None and last != first else ""))
    parts.append(f"rank{rank}")
    return "_".join(parts)


def _write_atomically(path: str, write) -> None:
    """``write(tmp)`` then rename to ``path``: a reader never sees half a file under the final name. The
    temporary name keeps the suffix (torch gzips a chrome trace whose name ends in .gz)."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    head, tail = os.path.split(path)
    stem, dot, suffix = tail.partition(".")
    tmp = os.path.join(head, f".{stem}.tmp{os.getpid()}{dot}{suffix}")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def _activities(contents: list[str]) -> list:
    activities = [torch.profiler.ProfilerActivity.CPU]  # stage ranges are CPU-side events: always recorded
    if (not contents or "cuda" in contents) and torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    elif "cuda" in contents:
        logger.warning("profiler.tool_config.torch.contents lists cuda, but this process sees no CUDA device: the "
                       "trace has CPU events only")
    return activities


class _Recording:
    """The process's torch profiler recording, shared by the roles that joined it."""

    def __init__(self, config: TorchProfilerToolConfig, save_path: str, rank: int, step: int | None,
                 with_schedule: bool = False):
        contents = list(config.contents)
        self.save_path, self.rank, self.steps = save_path, rank, [step, step]
        self.roles: list[str] = []  # every role that joined (the file's name)
        self.active: set[str] = set()  # the roles still recording
        self.written: list[str] = []
        schedule = config.schedule if with_schedule and config.schedule.enabled else None
        # torch hands a window to on_trace_ready when it ends: at stop(), and with a schedule at the optimizer step
        # that closes an `active` window
        self.profile = torch.profiler.profile(
            activities=_activities(contents), record_shapes="shapes" in contents,
            profile_memory="memory" in contents, with_stack="stack" in contents, on_trace_ready=self._save,
            schedule=_torch_schedule(schedule) if schedule else None)
        self._hook = None
        if schedule:
            # A schedule's step is an update mini-batch here, not a training step: no "ProfilerStep#<n>" ranges.
            self.profile.record_steps = False
            self._hook = register_optimizer_step_post_hook(lambda *_: self.profile.step())
            logger.info("torch profiler (rank %d) keeps update mini-batches %s", rank, _window_text(schedule))
        self.profile.start()

    def _save(self, profile) -> None:
        name = trace_name(self.roles, tuple(self.steps), self.rank) + (f"_part{len(self.written)}" if self.written
                                                                        else "")
        path = os.path.join(self.save_path, name + ".json.gz")
        _write_atomically(path, profile.export_chrome_trace)
        self.written.append(path)
        logger.info("torch profiler trace of %s (steps %s, rank %d) written to %s; open it in "
                    "https://ui.perfetto.dev or chrome://tracing", "+".join(self.roles),
                    "-".join(str(s) for s in dict.fromkeys(self.steps)), self.rank, path)

    def finish(self) -> list[str]:
        """Stop recording, write the window still open, and return every trace file written."""
        if self._hook is not None:
            self._hook.remove()
        self.profile.stop()
        if not self.written:
            logger.warning("torch profiler (rank %d): %d update mini-batches ran while profiling, none of them in "
                           "profiler.tool_config.torch.schedule's active window, so no trace was written; lower "
                           "schedule.skip_first/wait/warmup", self.rank, self.profile.step_num)
        return self.written


def _torch_schedule(schedule: TorchProfilerScheduleConfig):
    with warnings.catch_warnings():
        # torch advises warmup > 0 against the first recorded step's start-up cost; with warmup 0 (the default) the
        # window starts with the profiled training step, whose first stages are not mini-batches anyway
        warnings.filterwarnings("ignore", message="Profiler won't be using warmup")
        return torch.profiler.schedule(**schedule.kwargs())


def _window_text(schedule: TorchProfilerScheduleConfig) -> str:
    skipped = schedule.skip_first + schedule.wait + schedule.warmup
    if not skipped:
        return f"1-{schedule.active} and every stage before them"
    return f"{skipped + 1}-{skipped + schedule.active} (the stages before them are not kept)"


class TorchProfiler:
    """``tool=torch`` for one role of this process. Not discrete: :meth:`start`/:meth:`stop` bracket the profiled
    steps (one trace, or the schedule's windows of it). Discrete: each annotated stage is a whole trace of its own
    (``<role>-<stage>_step<N>_rank<R>``), the schedule aside."""

    _recording: _Recording | None = None  # the process's recording (torch allows one profiler at a time)

    def __init__(self, rank: int, role: str, save_path: str, config: TorchProfilerToolConfig):
        self.rank, self.role, self.save_path, self.config = rank, role, save_path, config
        self.step: int | None = None
        self.written: list[str] = []  # trace files this role finished writing

    def start(self, profile_step: int | None = None) -> None:
        self.step = profile_step
        if self.config.discrete:
            return
        recording = TorchProfiler._recording
        if recording is None:
            if torch.autograd.profiler._is_profiler_enabled:
                logger.warning("%s rank %d: another torch profiler is already running in this process; step %s is "
                               "not profiled", self.role, self.rank, profile_step)
                return
            recording = TorchProfiler._recording = _Recording(self.config, self.save_path, self.rank, profile_step,
                                                              with_schedule=True)
        if self.role not in recording.roles:
            recording.roles.append(self.role)
        recording.active.add(self.role)

    def stop(self, profile_step: int | None = None) -> None:
        recording = TorchProfiler._recording
        if self.config.discrete or recording is None or self.role not in recording.active:
            return
        if profile_step is not None:
            recording.steps[1] = profile_step
        recording.active.discard(self.role)
        if not recording.active:  # the last colocated role to stop writes the trace
            TorchProfiler._recording = None
            self.written.extend(recording.finish())

    def annotate(self, stage: str):
        """The context a stage runs in: a named range in the step's trace, or (discrete) a trace of its own."""
        if not self.config.discrete or TorchProfiler._recording is not None:
            return torch.profiler.record_function(stage)
        return _DiscreteStage(self, stage)


class _DiscreteStage:
    def __init__(self, profiler: TorchProfiler, stage: str):
        self.profiler, self.stage = profiler, stage

    def __enter__(self):
        p = self.profiler
        self.recording = _Recording(p.config, p.save_path, p.rank, p.step)
        self.recording.roles.append(f"{p.role}-{self.stage}")
        self.span = torch.profiler.record_function(self.stage)
        self.span.__enter__()

    def __exit__(self, *exc):
        self.span.__exit__(*exc)
        self.profiler.written.extend(self.recording.finish())
        return False


class TorchMemoryProfiler:
    """``tool=torch_memory``: record CUDA allocator events from :meth:`start`; :meth:`stop` writes a snapshot
    (``<save_path>/<role>_step<N>_rank<R>.pickle``, viewed at https://pytorch.org/memory_viz) and stops recording."""

    def __init__(self, rank: int, role: str, save_path: str, config: TorchMemoryToolConfig):
        if not torch.cuda.is_available():
            raise RuntimeError(
                f"global_profiler.tool=torch_memory records CUDA allocator snapshots, but {role} rank {rank} sees no "
                "CUDA device. On CPU use global_profiler.tool=torch with "
                "<role>.profiler.tool_config.torch.contents=[memory] (allocations in the trace)")
        self.rank, self.role, self.save_path, self.config = rank, role, save_path, config
        self.steps: list[int | None] = [None, None]
        self.written: list[str] = []

    def start(self, profile_step: int | None = None) -> None:
        self.steps = [profile_step, profile_step]
        torch.cuda.memory._record_memory_history(enabled=self.config.context, stacks=self.config.stacks,
                                                 max_entries=self.config.trace_alloc_max_entries)

    def stop(self, profile_step: int | None = None) -> None:
        if profile_step is not None:
            self.steps[1] = profile_step
        path = os.path.join(self.save_path, trace_name([self.role], tuple(self.steps), self.rank) + ".pickle")
        _write_atomically(path, torch.cuda.memory._dump_snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
        self.written.append(path)
        logger.info("CUDA memory snapshot of %s (rank %d) written to %s; open it in https://pytorch.org/memory_viz",
                    self.role, self.rank, path)

    def annotate(self, stage: str):
        return torch.profiler.record_function(stage)
