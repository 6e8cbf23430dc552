"""Checks of ``global_profiler.*`` and each role's ``profiler.*`` before any worker starts: a tool that exists and
runs here, steps that are training steps, a role that records them, and tool settings that take effect."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from verl.trainer.config.checks import ACTOR, REF, ROLLOUT, Issue, Run, _format, _not_in, _number, error, warn
from verl.utils.profiler.config import SCHEDULE_FIELDS, TOOLS, TORCH_CONTENTS, unsupported_tool_reason

GP = "global_profiler"


def _roles(run: Run) -> list[str]:
    """The profiler sections of the roles this run has."""
    roles = [f"{ACTOR}.profiler", f"{ROLLOUT}.profiler"]
    roles += [f"{REF}.profiler"] if run.uses_ref else []
    roles += ["critic.profiler"] if run.uses_critic else []
    roles += ["reward_model.profiler"] if run.uses_reward_model else []
    return roles


def _leaves(node, prefix: str) -> Iterator[tuple[str, object]]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield from _leaves(value, f"{prefix}.{key}")
    else:
        yield prefix, node


def _torch_settings(run: Run, role: str) -> Iterator[Issue]:
    """``tool_config.torch``'s schedule (a window of the update's mini-batches, continuous traces only) and the
    original's rollout token window, which has no counterpart here."""
    torch_key = f"{role}.tool_config.torch"
    schedule = f"{torch_key}.schedule"
    values = {name: run.get(f"{schedule}.{name}") for name in SCHEDULE_FIELDS}
    for name, value in values.items():
        if _number(value) and value < 0:
            yield error(f"{schedule}.{name}", f"must be >= 0 (update mini-batches), got {value}")
    active = values["active"]
    if _number(active) and active <= 0:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if _number(values[name]) and values[name] > 0:
                yield warn(f"{schedule}.{name}", f"is {values[name]}, but {schedule}.active is {active}, so no "
                                                 "schedule runs and it has no effect; set active to the number of "
                                                 "update mini-batches to keep")
    elif _number(active) and run.get(f"{torch_key}.discrete"):
        yield warn(schedule, f"sets active={active}, but {torch_key}.discrete=true writes each stage whole in a trace "
                             "of its own, so the schedule has no effect; set discrete=false to keep a window of the "
                             "update's mini-batches")
    for name in ("profile_token_start", "profile_token_end"):
        value = run.get(f"{torch_key}.{name}")
        if value is not None:
            yield warn(f"{torch_key}.{name}", f"is {_format(value)}, but the rollout runs in the worker's process "
                                              "here and is recorded whole (the range rollout_generate), so a window "
                                              "of decode steps has no effect. Remove it to silence this warning")


def _shared_tool_settings(run: Run, tool: str) -> Iterator[Issue]:
    """The actor, rollout and reference of one worker process share one profiler, with the tool settings of the
    first of them that is enabled (``ProfilerConfig.union``): another role's different settings are not read."""
    shared = [ACTOR, *([ROLLOUT] if run.get("trainer.v1.trainer_mode") != "separate_async" else []),
              *([REF] if run.uses_ref else [])]
    enabled = [role for role in shared if run.get(f"{role}.profiler.enable")]
    if len(enabled) < 2:
        return
    used = dict(_leaves(run.get(f"{enabled[0]}.profiler.tool_config.{tool}"), ""))
    for role in enabled[1:]:
        section = f"{role}.profiler.tool_config.{tool}"
        for leaf, value in _leaves(run.get(section), ""):
            if leaf in used and value != used[leaf] and value != run.default(f"{section}{leaf}"):
                yield warn(f"{section}{leaf}",
                           f"is {_format(value)}, but {role.rpartition('.')[2]} shares a worker process and its "
                           f"profiler with {enabled[0].rpartition('.')[2]}, whose settings it uses "
                           f"({enabled[0]}.profiler.tool_config.{tool}{leaf}={_format(used[leaf])}); set it there")


def _settings_without_effect(run: Run, roles: list[str]) -> Iterator[Issue]:
    """Settings of the tools that do not run here (nsys, npu), and torch_memory's stack_depth, set away from their
    defaults: reported at the key the user set (a role's key that follows global_profiler's is reported there)."""
    sections = {tool: [f"{GP}.global_tool_config.{tool}", *(f"{role}.tool_config.{tool}" for role in roles)]
                for tool in ("nsys", "npu")}
    for tool, keys in sections.items():
        for section in keys:
            for key, value in _leaves(run.get(section), section):
                if value != run.default(key) and not run.follows(key):
                    yield warn(key, f"is {_format(value)}, but the {tool} tool cannot run here ("
                                    f"{unsupported_tool_reason(tool)}), so it has no effect. Remove it to silence "
                                    "this warning")
    for key in [f"{GP}.global_tool_config.torch_memory.stack_depth",
                *(f"{role}.tool_config.torch_memory.stack_depth" for role in roles)]:
        value = run.get(key)
        if value is not None and value != run.default(key) and not run.follows(key):
            yield warn(key, f"is {_format(value)}, but the CUDA allocator's history (torch_memory) keeps whole stacks "
                            "and has no depth setting, so it has no effect (it is the Ascend NPU's setting); "
                            "<role>.profiler.tool_config.torch_memory.stacks=python leaves out the C++ frames")


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
        yield from _torch_settings(run, role)
        ranks = run.get(f"{role}.ranks")
        if isinstance(ranks, list) and any(not isinstance(r, int) or isinstance(r, bool) or r < 0 for r in ranks):
            yield error(f"{role}.ranks", f"is {_format(ranks)}; list the ranks to profile as numbers from 0, e.g. "
                                         "[0,1] (or set all_ranks=true)")
    yield from _settings_without_effect(run, roles)
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
    if tool in TOOLS:
        yield from _shared_tool_settings(run, tool)
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
