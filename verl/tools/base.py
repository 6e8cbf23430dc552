"""Tools a model can call during a multi-turn rollout, declared as the original verl declares them.

A tool is a class with four coroutines, one *instance* per episode:

- ``create(instance_id, **tools_kwargs)``: set up the episode's state (``tools_kwargs`` is the row's
  ``extra_info["tools_kwargs"][<tool name>]["create_kwargs"]``), return the instance id;
- ``execute(instance_id, parameters)``: run one call; return ``(text for the model, step reward, metrics)``;
- ``calc_reward(instance_id)``: the episode's tool reward (reported as a metric);
- ``release(instance_id)``: free the state.

Tools are listed in the YAML file ``actor_rollout_ref.rollout.multi_turn.tool_config_path``::

    tools:
      - class_name: verl.tools.code_interpreter.CodeInterpreterTool
        config: {cpu_seconds: 5}
        tool_schema:                     # the OpenAI function schema the chat template shows the model
          type: function
          function:
            name: code_interpreter
            description: Run Python code and return what it prints.
            parameters: {type: object, properties: {code: {type: string}}, required: [code]}
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from typing import Any

from verl.utils.plugins import import_subclass, yaml_entries

__all__ = ["BaseTool", "load_tools"]


class BaseTool(ABC):
    """The tool interface (see the module docstring); subclass it and implement ``execute``."""

    def __init__(self, config: dict, tool_schema: dict):
        self.config = dict(config or {})
        self.tool_schema = tool_schema
        self.name = tool_schema["function"]["name"]
        self._instances: dict[str, dict] = {}

    def get_openai_tool_schema(self) -> dict:
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs) -> str:
        instance_id = instance_id or str(uuid.uuid4())
        self._instances[instance_id] = dict(kwargs)
        return instance_id

    @abstractmethod
    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs) -> tuple[str, float, dict]:
        """Run one call with the model's ``parameters``; return (text for the model, step reward, metrics).
        A ``metrics["error"]`` of 1 counts the call as a tool error."""

    async def calc_reward(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def release(self, instance_id: str, **kwargs) -> None:
        self._instances.pop(instance_id, None)


def load_tools(path: str, config_key: str = "actor_rollout_ref.rollout.multi_turn.tool_config_path") -> dict:
    """``{name: tool}`` from a tool config YAML; errors name the file, the entry and what to fix."""
    tools = {}
    for where, entry in yaml_entries(path, "tools", config_key, "verl/tools/base.py"):
        class_name = entry.get("class_name")
        schema = entry.get("tool_schema") or {}
        name = (schema.get("function") or {}).get("name")
        if not class_name or not name:
            raise ValueError(f"{where}: needs class_name and tool_schema.function.name")
        cls = import_subclass(class_name, BaseTool, where)
        if name in tools:
            raise ValueError(f"{where}: a second tool named {name!r}")
        tools[name] = cls(entry.get("config") or {}, schema)
    return tools
