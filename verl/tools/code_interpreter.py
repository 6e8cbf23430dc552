"""A Python tool: the model's code runs in the sandbox (:mod:`verl.sandbox.process`); it gets back what
the program printed, or why it failed."""

from __future__ import annotations

import asyncio

from verl.sandbox.process import SandboxLimits, run_python
from verl.tools.base import BaseTool

SCHEMA = {
    "type": "function",
    "function": {
        "name": "code_interpreter",
        "description": "Run a Python program and return what it prints.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string", "description": "Python code"}},
                       "required": ["code"]},
    },
}


class CodeInterpreterTool(BaseTool):
    """``config``: any :class:`~verl.sandbox.process.SandboxLimits` field (``cpu_seconds``, ``memory_mb``, ...)."""

    def __init__(self, config: dict | None = None, tool_schema: dict | None = None):
        super().__init__(config or {}, tool_schema or SCHEMA)
        fields = SandboxLimits.__dataclass_fields__
        unknown = sorted(set(self.config) - set(fields))
        if unknown:
            raise ValueError(f"CodeInterpreterTool config has unknown keys {unknown}; known: {sorted(fields)}")
        self.limits = SandboxLimits(**self.config)

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        code = parameters.get("code")
        if not isinstance(code, str) or not code.strip():
            return "error: the call needs a non-empty 'code' string", 0.0, {"error": 1.0}
        result = await asyncio.to_thread(run_python, code, "", self.limits)
        if result.ok:
            return result.stdout or "(no output)", 0.0, {"error": 0.0}
        tail = result.stderr.strip().splitlines()[-3:]
        return (result.stdout + "\n".join(tail) + f"\n[{result.reason}]").strip(), 0.0, {"error": 1.0}
