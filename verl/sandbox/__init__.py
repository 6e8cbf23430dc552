"""Running untrusted code: model-written programs (code rewards, the code tool) and trusted functions fed
untrusted input (the ``numina_*`` grader), each isolated with Linux namespaces, seccomp and resource limits.

- :mod:`.process`: :func:`run_python`, one program in a fresh sandbox;
- :mod:`.worker`: :class:`SandboxWorker` and :class:`SandboxPool`, long-lived sandboxes serving calls;
- :mod:`.programs`: the code that runs inside (its root process, the worker's loop, the seccomp filter).
"""

from verl.sandbox.process import SandboxLimits, SandboxResult, SandboxUnavailable, isolation, run_python
from verl.sandbox.worker import CallResult, SandboxPool, SandboxWorker

__all__ = ["CallResult", "SandboxLimits", "SandboxPool", "SandboxResult", "SandboxUnavailable", "SandboxWorker",
           "isolation", "run_python"]
