"""The profiler's config sections: ``global_profiler`` (which steps, which tool, where traces go) and each
role's ``profiler`` group (``actor_rollout_ref.{actor,rollout,ref}``, ``critic``, ``reward_model``: whether the
role is profiled, on which ranks, and the tool's settings). Defaults are the yaml's."""

from __future__ import annotations

from verl.base_config import BaseConfig, section

__all__ = ["GlobalProfilerConfig", "NPUToolConfig", "NsightToolConfig", "ProfilerConfig", "ProfilerToolConfig",
           "SCHEDULE_FIELDS", "SUPPORTED_TOOLS", "TOOLS", "TorchMemoryToolConfig", "TorchProfilerScheduleConfig",
           "TorchProfilerToolConfig", "unsupported_tool_reason"]

# Every tool name the original accepts; the first two run here.
SUPPORTED_TOOLS = ("torch", "torch_memory")
TOOLS = (*SUPPORTED_TOOLS, "nsys", "npu", "precision_debugger")
_UNSUPPORTED = {
    "nsys": "Nsight Systems captures need the nsys binary wrapped around each Ray worker (Ray's 'nsight' "
            "runtime_env), which this verl does not set up",
    "npu": "it drives the Ascend NPU profiler (torch_npu), and this verl runs on CUDA GPUs and CPUs only",
    "precision_debugger": "it drives Ascend's msprobe precision debugger, and this verl runs on CUDA GPUs and "
                          "CPUs only",
}
TORCH_CONTENTS = ("cpu", "cuda", "memory", "shapes", "stack")
SCHEDULE_FIELDS = ("skip_first", "wait", "warmup", "active", "repeat")


def unsupported_tool_reason(tool: str) -> str | None:
    """Why ``tool`` cannot produce a trace here (None for a tool that can, or an unknown name)."""
    return _UNSUPPORTED.get(tool)


@section("actor_rollout_ref.actor.profiler.tool_config.torch.schedule", shared=True)
class TorchProfilerScheduleConfig(BaseConfig):
    """``torch.profiler.schedule`` over the update loop's mini-batches (one optimizer step each, of the actor's or
    the critic's): after ``skip_first`` of them, cycles of ``wait`` (not recorded), ``warmup`` (recorded, dropped)
    and ``active`` (kept), ``repeat`` cycles (0: one, in one profiled run). Off while ``active`` is 0."""

    skip_first: int
    wait: int
    warmup: int
    active: int
    repeat: int

    def __post_init__(self, extra: dict | None = None) -> None:
        super().__post_init__(extra)
        negative = {name: getattr(self, name) for name in SCHEDULE_FIELDS if getattr(self, name) < 0}
        if negative:
            raise ValueError(f"profiler.tool_config.torch.schedule: {negative} must be >= 0 (mini-batches)")

    @property
    def enabled(self) -> bool:
        return self.active > 0

    def kwargs(self) -> dict[str, int]:
        """The arguments of ``torch.profiler.schedule`` (``repeat`` 0 becomes 1: a profiled run keeps one window
        unless more are asked for)."""
        return {"skip_first": self.skip_first, "wait": self.wait, "warmup": self.warmup, "active": self.active,
                "repeat": self.repeat or 1}


@section("actor_rollout_ref.actor.profiler.tool_config.torch", shared=True)
class TorchProfilerToolConfig(BaseConfig):
    """``torch.profiler``: ``contents`` picks what is recorded besides CPU operators (``cuda`` kernels,
    ``memory`` allocations, input ``shapes``, Python ``stack``s; empty: CPU, and CUDA when available);
    ``discrete`` writes one trace per stage instead of one per step; ``schedule`` keeps a window of the update's
    mini-batches (not discrete). ``profile_token_start``/``profile_token_end`` (the original's window of rollout
    decode steps) are accepted and have no effect: the rollout is recorded whole."""

    contents: list[str]
    discrete: bool
    profile_token_start: int | None
    profile_token_end: int | None
    schedule: TorchProfilerScheduleConfig

    def __post_init__(self, extra: dict | None = None) -> None:
        super().__post_init__(extra)
        unknown = [c for c in self.contents if c not in TORCH_CONTENTS]
        if unknown:
            raise ValueError(f"profiler.tool_config.torch.contents: {unknown} not among {list(TORCH_CONTENTS)}")


@section("actor_rollout_ref.actor.profiler.tool_config.torch_memory", shared=True)
class TorchMemoryToolConfig(BaseConfig):
    """CUDA allocator snapshots (``torch.cuda.memory._record_memory_history``): how many allocation events are
    kept, what is recorded (``context``: state | alloc | all) and which stacks (``stacks``: python | all)."""

    trace_alloc_max_entries: int
    stack_depth: int
    context: str
    stacks: str


@section("actor_rollout_ref.actor.profiler.tool_config.nsys", shared=True)
class NsightToolConfig(BaseConfig):
    """Nsight Systems (accepted; nsys does not run here)."""

    discrete: bool


@section("actor_rollout_ref.actor.profiler.tool_config.npu", shared=True)
class NPUToolConfig(BaseConfig):
    """Ascend NPU profiler (accepted; there is no NPU support here)."""

    contents: list[str]
    level: str
    analysis: bool
    discrete: bool


@section("actor_rollout_ref.actor.profiler.tool_config", shared=True)
class ProfilerToolConfig(BaseConfig):
    """Each tool's settings; the one ``tool`` names is used."""

    nsys: NsightToolConfig
    npu: NPUToolConfig
    torch: TorchProfilerToolConfig
    torch_memory: TorchMemoryToolConfig


@section("actor_rollout_ref.actor.profiler", shared=True)
class ProfilerConfig(BaseConfig):
    """One role's profiler: the role is profiled in ``global_profiler.steps`` when ``enable`` is true, on every
    rank (``all_ranks``), on ``ranks``, or on rank 0 when ``ranks`` is empty. ``tool`` and ``save_path`` follow
    ``global_profiler``'s."""

    tool: str | None
    enable: bool
    all_ranks: bool
    ranks: list[int]
    save_path: str | None
    tool_config: ProfilerToolConfig

    def union(self, other: ProfilerConfig) -> ProfilerConfig:
        """The profiler of a worker playing both roles (the actor, rollout and reference share a process):
        enabled when either is, on the ranks of either. Tool settings are this config's."""
        if not other.enable:
            return self
        if not self.enable:
            return other
        if self.tool != other.tool:
            raise ValueError(f"one worker cannot run two profiler tools: {self.tool!r} and {other.tool!r}; give the "
                             "actor, rollout and ref profilers the same tool (they follow global_profiler.tool)")
        return ProfilerConfig(tool=self.tool, enable=True, all_ranks=self.all_ranks or other.all_ranks,
                              ranks=sorted(set(self.ranks or [0]) | set(other.ranks or [0])),
                              save_path=self.save_path, tool_config=self.tool_config)


@section("global_profiler")
class GlobalProfilerConfig(BaseConfig):
    """Which training steps are profiled (``steps``; consecutive ones in one trace with
    ``profile_continuous_steps``), with which ``tool``, and where the traces go (``save_path``)."""

    tool: str | None
    steps: list[int] | None
    profile_continuous_steps: bool
    save_path: str | None
    relocate_results: bool
    finish_hook_cmd: str | None
    global_tool_config: dict

    def starts_at(self, step: int) -> bool:
        """Whether the profilers start before training step ``step``."""
        steps = self.steps or ()
        return step in steps and not (self.profile_continuous_steps and step - 1 in steps)

    def stops_at(self, step: int, last: bool = False) -> bool:
        """Whether the profilers stop after training step ``step`` (``last``: the run's final step)."""
        steps = self.steps or ()
        return step in steps and (last or not (self.profile_continuous_steps and step + 1 in steps))
