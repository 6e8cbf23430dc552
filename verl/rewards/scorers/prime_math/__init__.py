"""``numina_*`` rewards: the original verl's ``prime_math`` grader, run in a sandbox.

The grader (:mod:`.grader`, see its docstring for what it accepts) evaluates text written by the model as
Python while comparing answers -- sympy's ``parse_expr`` and ``eval`` of ``\\pi`` expressions -- so in the
original a response like ``\\boxed{(exec(bytes([...]).decode()) or 1)*\\pi}`` runs any Python it likes on
the trainer. Here the answer is extracted on the trainer (string work only, :mod:`.extract`) and graded in
a :class:`~verl.sandbox.worker.SandboxWorker` (no network, none of the machine's files, CPU/memory limits,
each grading in a fresh fork of a process that imported sympy once): hostile text can only spoil its own
score. A grading costs a few milliseconds once a worker has started (about 0.5 s); a repeated (answer,
reference) pair is graded once (the grader sees nothing else).

Score: 1.0 when the answer is correct, else 0.0, as the original (which returns a float for these data
sources). A response whose grading runs past ``timeout`` seconds (30; or 30 s of CPU) scores 0.0 with a
warning, as the original's ``prime`` reward manager does for its timeouts; each sympy comparison inside has
10 s, as in the original.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
from collections import OrderedDict
from pathlib import Path

from verl.rewards.scorers.prime_math.extract import extract_answer
from verl.sandbox.process import SandboxLimits, SandboxUnavailable
from verl.sandbox.worker import SandboxPool

__all__ = ["DATA_SOURCES", "check_sandbox", "compute_score"]

logger = logging.getLogger(__name__)

DATA_SOURCES = ("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                "numina_cn_k12", "numina_olympiads")
# The grader imports these inside the sandbox (shown read-only there); sympy needs mpmath.
LIBRARIES = ("sympy", "mpmath", "pylatexenc")
# A worker holds ~6 processes (the sandbox's init, the worker, two call processes each with a parent) of
# ~55 MB; a grading needs no more.
LIMITS = SandboxLimits(cpu_seconds=30, wall_seconds=30.0, memory_mb=1024, max_processes=16)
_WARMUP = ({"answer": "\\frac{3}{4}", "ground_truth": "0.75"}, {"answer": "(x+1)^2", "ground_truth": "x^2 + 2x + 1"},
           {"answer": "2\\pi", "ground_truth": "6.28"})

_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def _library_folders() -> list[str]:
    folders = []
    for name in LIBRARIES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SandboxUnavailable(f"the numina_* grader needs the Python package {name!r}: pip install {name}")
        folders.append(list(spec.submodule_search_locations)[0])
    return folders


def grader_pool() -> SandboxPool:
    """The process-wide pool of grader workers (started on first use, one per concurrent caller, as many as
    CPUs up to 16)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            here = Path(__file__).resolve().parent
            modules = [("verl.rewards.scorers.math_reward", (here.parent / "math_reward.py").read_text()),
                       ("verl.rewards.scorers.prime_math.extract", (here / "extract.py").read_text()),
                       ("verl.rewards.scorers.prime_math.grader", (here / "grader.py").read_text())]
            _pool = SandboxPool(min(16, os.cpu_count() or 1), modules=modules,
                                entry="verl.rewards.scorers.prime_math.grader.handle",
                                libraries=_library_folders(), limits=LIMITS, warmup=_WARMUP)
            atexit.register(_pool.close)
        return _pool


def check_sandbox() -> None:
    """Start a grader worker and grade one pair, as the pre-flight check does for numina_* rows: raises
    :class:`SandboxUnavailable` saying what is missing (a package, a folder the sandbox user cannot read, an
    interpreter that cannot import them...)."""
    result = grader_pool().call({"answer": "1", "ground_truth": "1"}, 60.0)
    if not (result.ok and result.value == {"correct": True}):
        raise SandboxUnavailable(f"the numina_* grader does not work in the sandbox here: {result.status} "
                                 f"{result.error}".strip())


class _Verdicts:
    """Grades already given, by (extracted answer, reference): the grader is deterministic and sees only
    those two, so a repeated answer (common within a GRPO group) is not sent to the sandbox again."""

    def __init__(self, size: int = 1 << 16) -> None:
        self.size = size
        self._items: OrderedDict[tuple[str, str], bool] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str]) -> bool | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: tuple[str, str], correct: bool) -> None:
        with self._lock:
            self._items[key] = correct
            while len(self._items) > self.size:
                self._items.popitem(last=False)


_verdicts = _Verdicts()


def compute_score(solution_str: str, ground_truth, timeout: float = 30.0) -> float:
    """1.0 if the answer in ``solution_str`` equals ``ground_truth`` by the original's grader, else 0.0."""
    _, answer = extract_answer(str(solution_str))  # string work only: safe here
    key = (answer, str(ground_truth))
    correct = _verdicts.get(key)
    if correct is None:
        result = grader_pool().call({"answer": key[0], "ground_truth": key[1]}, timeout)
        correct = result.value.get("correct") if result.ok and isinstance(result.value, dict) else None
        if not isinstance(correct, bool):
            # The reply comes from where the model's text ran: whatever it says, this response scores 0.
            # Not kept: a timeout may come from a loaded machine.
            problem = result.status if result.ok is False else "a reply without a verdict"
            logger.warning("prime_math grading gave no verdict (%s%s) after %.1f s; scored 0.0. Answer %r",
                           problem, f": {result.error}" if result.error else "", result.seconds, answer[:120])
            return 0.0
        _verdicts.put(key, correct)
    return 1.0 if correct else 0.0
