"""Checks of ``global_profiler.*`` and each role's ``profiler.*`` before any worker starts: a tool that exists and
runs here, steps that are training steps, and a role that records them."""

from __future__ import annotations

from collections.abc import Iterator

from verl.trainer.config.checks import ACTOR, REF, ROLLOUT, Issue, Run, _format, _not_in, error, warn
from verl.utils.profiler.config import TOOLS, TORCH_CONTENTS, unsupported_tool_reason

GP = "global_profiler"


def _roles(run: Run) -> list[str]:
    """The profiler sections of the roles this run has."""
    roles = [f"{ACTOR}.profiler", f"{ROLLOUT}.profiler"]
    roles += [f"{REF}.profiler"] if run.uses_ref else []
    roles += ["critic.profiler"] if run.uses_critic else []
    roles += ["reward_model.profiler"] if run.uses_reward_model else []
    return roles


def check_profiler(run: Run) -> Iterator[Issue]:
    roles = _roles(run)
    tool, steps = run.get(f"{GP}.tool"), run.get(f"{GP}.steps")
    for key in [f"{GP}.tool", *(f"{role}.tool" for role in roles)]:
        value = run.get(key)
        if value is not None and value not in TOOLS and (key == f"{GP}.tool" or not run.follows(key)):
            yield _not_in(key, value, TOOLS, "profiler tool")
    for role in roles:
        for content in run.get(f"{role}.tool_config.torch.contents") or ():
            if content not in TORCH_CONTENTS:
                yield _not_in(f"{role}.tool_config.torch.contents", content, TORCH_CONTENTS, "torch profiler content")
    if steps is not None and any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in steps):
        yield error(f"{GP}.steps", f"is {_format(steps)}; list training steps, counted from 1, e.g. [1,3]")
    if run.get(f"{GP}.relocate_results"):
        yield warn(f"{GP}.relocate_results", "has no effect here: traces are written to global_profiler.save_path "
                                             "directly. Remove it to silence this warning")
    if run.get(f"{GP}.finish_hook_cmd"):
        yield warn(f"{GP}.finish_hook_cmd", "is not implemented in this verl, so it does not run; run the command "
                                            "after training. Remove it to silence this warning")
    if not steps:
        return
    enabled = [role for role in roles if run.get(f"{role}.enable")]
    if not enabled:
        yield warn(f"{GP}.steps", f"is {_format(steps)} but no role's profiler is enabled, so nothing is profiled. "
                                  f"Set e.g. {ACTOR}.profiler.enable=true")
        return
    tools = {run.get(f"{role}.tool") for role in enabled}
    if tools == {None}:
        yield error(f"{GP}.tool", f"is null but {GP}.steps={_format(steps)} asks for profiles; set {GP}.tool=torch")
    for name in sorted(t for t in tools if t in TOOLS):
        reason = unsupported_tool_reason(name)
        if reason is not None:
            key = f"{GP}.tool" if name == tool else next(f"{r}.tool" for r in enabled if run.get(f"{r}.tool") == name)
            yield error(key, f"{name} cannot profile here: {reason}. Use {GP}.tool=torch (a trace per profiled step "
                             "and rank, for https://ui.perfetto.dev or chrome://tracing)")
        if name == "torch_memory" and run.get("trainer.device") == "cpu":
            yield error(f"{GP}.tool", "torch_memory records CUDA allocator snapshots and trainer.device=cpu has no "
                                      f"CUDA allocator; use {GP}.tool=torch with "
                                      "<role>.profiler.tool_config.torch.contents=[memory] for allocations on CPU")
    if not run.get(f"{GP}.save_path"):
        yield error(f"{GP}.save_path", "is null; set the folder the traces go to, e.g. outputs/profile")
