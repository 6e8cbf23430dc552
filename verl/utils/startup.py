"""Where the time to the first training step goes, and the persistent compile cache that shortens it.

The driver times its own start-up in :data:`DRIVER` (config, data, reward, ray, workers, init_model);
every worker process times its own in :data:`WORKER` (model load, FSDP wrap, rollout engine, CUDA-graph
capture). :func:`worker_snapshot` adds what torch.compile and Triton spent compiling in the process and
how often their caches hit. After the first training step the driver logs one INFO block built from
both by :func:`format_report`. Times are wall seconds; a phase that runs more than once sums.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass

__all__ = ["PhaseRecorder", "DRIVER", "WORKER", "COMPILE_CACHE_ENV", "process_start_time", "prepare_worker_process",
           "use_compile_cache", "default_compile_cache_dir", "worker_snapshot", "slowest", "uncached_bytecode",
           "format_report"]

logger = logging.getLogger(__name__)  # importing configures no logging: workers import this module early

COMPILE_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def process_start_time() -> float:
    """When this process started (``time.time()`` scale), to the kernel's clock tick on Linux; elsewhere now.

    The age is the time since boot minus the start in ticks after boot (``/proc/self/stat`` field 22); the
    boot time of ``/proc/stat`` would do too, but it is rounded down to the second."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()  # the command name, in parentheses, may hold spaces
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - int(fields[19]) / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, AttributeError, IndexError, ValueError):
        return time.time()


@dataclass(frozen=True)
class Phase:
    name: str
    start: float  # seconds after the recorder's origin
    seconds: float
    background: bool  # ran on another thread, alongside the main thread's phases


class PhaseRecorder:
    """Named, timed phases of one process, measured from ``origin`` (default: the process start)."""

    def __init__(self, origin: float | None = None):
        self.origin = process_start_time() if origin is None else origin
        self.phases: list[Phase] = []
        self.reported = False
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def phase(self, name: str):
        start = time.time()
        try:
            yield
        finally:
            self.add(name, time.time() - start, start=start)

    def add(self, name: str, seconds: float, start: float | None = None) -> None:
        start = time.time() - seconds if start is None else start
        background = threading.current_thread() is not threading.main_thread()
        with self._lock:
            self.phases.append(Phase(name, start - self.origin, seconds, background))

    def totals(self, background: bool | None = None) -> dict[str, float]:
        """Seconds per name (repeats summed), in the order the names first appeared; ``background`` picks
        the phases of other threads (True), of the main thread (False) or all (None)."""
        out: dict[str, float] = {}
        with self._lock:
            for p in self.phases:
                if background is None or p.background == background:
                    out[p.name] = out.get(p.name, 0.0) + p.seconds
        return out

    def elapsed(self) -> float:
        return time.time() - self.origin


DRIVER = PhaseRecorder()  # the driver's own phases
WORKER = PhaseRecorder()  # this process's worker phases (with trainer.backend=local, the driver's process too)


# ------------------------------------------------------------------------------------------------ compile cache
def default_compile_cache_dir() -> str:
    """``$XDG_CACHE_HOME/verl/torch_compile`` (``~/.cache/verl/torch_compile`` when unset)."""
    return os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "verl", "torch_compile")


def use_compile_cache() -> str | None:
    """Point this process's compile caches at a persistent, private folder, unless the user chose one.

    torch.compile keeps its on-disk caches under ``TORCHINDUCTOR_CACHE_DIR``: the FX graph cache
    (``fxgraph/``, Inductor's compiled code), the AOTAutograd cache (``aotautograd/``, forward and backward
    graphs of a compiled region) and the autotuning results (``*.best_config`` beside each kernel); Triton
    keeps compiled kernels under ``TRITON_CACHE_DIR`` (by default ``~/.triton/cache``, but Inductor points
    the variable at ``<inductor dir>/triton/<device>`` when it is unset). Torch's default inductor folder is
    ``/tmp/torchinductor_$USER``: emptied at reboot and in every fresh container, so each run compiles
    cold, and it sits in a folder every user can write to while its entries are Python modules and pickles
    that are executed when loaded. We default to ``~/.cache/verl/torch_compile`` instead (``XDG_CACHE_HOME``
    respected; created with mode 0700) and put Triton's kernels, the native rollout's own among them, in its
    ``triton/`` folder, so one folder holds everything and deleting it starts cold.

    Sharing the folder between runs, versions and machines is safe: FX graph and AOTAutograd keys hash the
    graph, input shapes/strides/dtypes, the Inductor config, a hash of torch's own source, the Triton
    version, the GPU name and the CUDA version; Triton keys hash the kernel source, Triton's compiler,
    the target architecture and the compile options. A changed model or transformers version changes the
    traced graph, so it misses. Entries are written to a temporary name and renamed, so ranks and nodes
    (a shared home) may write at once. What is never cached: Dynamo's tracing and guards (paid in every
    process) and CUDA graphs. Nothing is ever evicted: the folder grows with every new torch or shape;
    delete it to reclaim space. Leave ``torch._inductor.config.unsafe_*`` options off: they let entries be
    reused when guards or non-torch functions differ.

    ``TORCHINDUCTOR_CACHE_DIR`` and ``TRITON_CACHE_DIR`` set by the user (in the environment, or in Ray's
    ``runtime_env``) are left as they are; with only the first set, Triton follows it into its ``triton/``.
    ``TORCHINDUCTOR_FORCE_DISABLE_CACHES=1`` turns all caching off. Returns the inductor folder in use
    (None: the default folder could not be created; torch's own default applies, with a warning).
    """
    inductor = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if inductor is None:
        folder = default_compile_cache_dir()
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as e:
            logger.warning("compile cache: cannot create %s (%s); torch.compile and Triton use their temporary "
                           "folders, so every run compiles cold. Set TORCHINDUCTOR_CACHE_DIR to a writable folder",
                           folder, e)
            return None
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = inductor = folder
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(inductor, "triton"))
    return inductor


# ------------------------------------------------------------------------------------------------ worker side
_TRITON = {"triton kernels built": 0, "triton kernels from cache": 0}
_prepared = False


def _count_triton_compiles(*, src, metadata, metadata_group, times, cache_hit) -> None:
    if cache_hit:
        _TRITON["triton kernels from cache"] += 1
    else:
        _TRITON["triton kernels built"] += 1
        WORKER.add("triton compile", times.total / 1e6)  # CompileTimes are in microseconds


def prepare_worker_process(device: str) -> None:
    """Once per worker process, before anything compiles: on CUDA, the persistent compile cache
    (:func:`use_compile_cache`) and a count of Triton's compiles (unless a Triton compile listener is set)."""
    global _prepared
    if _prepared or device != "cuda":
        return
    _prepared = True
    use_compile_cache()
    try:
        import triton
    except ImportError:
        return
    compilation = getattr(getattr(triton, "knobs", None), "compilation", None)
    if hasattr(compilation, "listener") and compilation.listener is None:  # Triton has the hook, unused so far
        compilation.listener = _count_triton_compiles


def worker_snapshot() -> dict[str, float]:
    """This process's worker phases (seconds) and compile figures so far: ``torch.compile`` seconds and the
    FX graph / AOTAutograd cache hits and misses (when torch.compile ran), Triton's compiles (CUDA)."""
    out = WORKER.totals()
    dynamo = sys.modules.get("torch._dynamo.utils")  # not imported: nothing was compiled
    compiling = dynamo.calculate_time_spent().get("total_wall_time", 0.0) if dynamo is not None else 0.0
    if compiling:
        out["torch.compile"] = compiling
        inductor, aot = dynamo.counters["inductor"], dynamo.counters["aot_autograd"]
        out.update({"fx graph cache hits": inductor["fxgraph_cache_hit"],
                    "fx graph cache misses": inductor["fxgraph_cache_miss"],
                    "aot autograd cache hits": aot["autograd_cache_hit"],
                    "aot autograd cache misses": aot["autograd_cache_miss"]})
    if _TRITON["triton kernels built"] or _TRITON["triton kernels from cache"]:
        out.update(_TRITON)
    return out


def slowest(snapshots: list[dict[str, float]]) -> dict[str, float]:
    """One figure per name over the ranks' snapshots: the largest (the slowest rank sets the pace)."""
    out: dict[str, float] = {}
    for snapshot in snapshots:
        for name, value in snapshot.items():
            out[name] = max(out.get(name, value), value)
    return out


# ------------------------------------------------------------------------------------------------ the report
def uncached_bytecode(names: tuple[str, ...] = ("torch", "transformers")) -> list[str]:
    """The packages among ``names`` whose ``__init__`` has no compiled bytecode where this Python looks for it
    (``__pycache__``, or under ``PYTHONPYCACHEPREFIX``). Without it (``PYTHONDONTWRITEBYTECODE=1`` and an install
    that holds none, or a read-only one) every process compiles thousands of modules from source: 11-14 s of a
    warm start on the H100 machine, which ``pip install`` (writing the bytecode) never costs."""
    import importlib.util

    missing = []
    for name in names:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        if spec is not None and spec.origin and spec.origin.endswith(".py") \
                and not os.path.exists(importlib.util.cache_from_source(spec.origin)):
            missing.append(name)
    return missing


_COUNTS = ("fx graph cache hits", "fx graph cache misses", "aot autograd cache hits", "aot autograd cache misses",
           "triton kernels built", "triton kernels from cache")
_COMPILE = ("torch.compile", "triton compile", "cuda graph capture")


def _seconds(items) -> str:
    return ", ".join(f"{name} {value:.1f}" for name, value in items)


def _compiled(s: dict[str, float]) -> str:
    """The compile figures of a snapshot, with the cache hits out of all lookups."""
    parts = []
    if "torch.compile" in s:
        fx, aot = s["fx graph cache hits"], s["aot autograd cache hits"]
        parts.append(f"torch.compile {s['torch.compile']:.1f} (cache hits: fx graph {fx:.0f} of "
                     f"{fx + s['fx graph cache misses']:.0f}, aot autograd {aot:.0f} of "
                     f"{aot + s['aot autograd cache misses']:.0f})")
    if "triton kernels built" in s:
        parts.append(f"triton {s.get('triton compile', 0.0):.1f} ({s['triton kernels built']:.0f} kernels built, "
                     f"{s['triton kernels from cache']:.0f} from cache)")
    if "cuda graph capture" in s:
        parts.append(f"cuda graph capture {s['cuda graph capture']:.1f}")
    return ", ".join(parts)


def format_report(driver: PhaseRecorder, workers: dict[str, dict[str, float]], first_step: dict[str, float]) -> str:
    """Where the time from the driver's process start to now (the end of the first step) went, in seconds:

        start-up: 52.3 s from the process start to the end of the first step
          driver: interpreter+imports 1.2, config 2.0, ray 4.1, workers 6.0, init_model 9.2, first step 21.3,
            other 0.4; on a second thread: data 1.1, reward 0.1
          workers of actor_rollout (slowest rank): actor model load 3.2, actor fsdp 1.1, ...
            compiled: torch.compile 9.8 (cache hits: fx graph 0 of 2, aot autograd 0 of 2), cuda graph capture 1.2
          first step: gen 12.0, ref 2.0, update_actor 6.1

    ``workers``: a snapshot per worker process group (:func:`slowest` of its ranks' :func:`worker_snapshot`);
    ``first_step``: the step's stage seconds (the ``timing_s/<stage>`` metrics; ``step`` is the whole step).
    """
    total = driver.elapsed()
    main, background = driver.totals(background=False), driver.totals(background=True)
    started = min((p.start for p in driver.phases), default=total)
    step = first_step.get("step", 0.0)
    other = total - started - sum(main.values()) - step
    timeline = _seconds([("interpreter+imports", started), *main.items(), ("first step", step), ("other", other)])
    lines = [f"start-up: {total:.1f} s from the process start to the end of the first step",
             f"  driver: {timeline}" + (f"; on a second thread: {_seconds(background.items())}" if background else "")]
    uncached = uncached_bytecode()
    if uncached:
        fix = ("unset PYTHONDONTWRITEBYTECODE (and where site-packages is read-only, export PYTHONPYCACHEPREFIX=<a "
               "writable folder>)" if sys.flags.dont_write_bytecode else
               "site-packages is read-only: export PYTHONPYCACHEPREFIX=<a writable folder>")
        lines.append(f"  python: no cached bytecode for {', '.join(uncached)}: every process compiles their modules "
                     f"from source (11-14 s of the benchmark's start on the H100 host); to keep it between runs, {fix}")
    for name, snapshot in workers.items():
        phases = [(k, v) for k, v in snapshot.items() if k not in _COUNTS + _COMPILE]
        lines.append(f"  workers of {name} (slowest rank): {_seconds(phases) or 'no phases recorded'}")
        compiled = _compiled(snapshot)
        if compiled:
            lines.append(f"    compiled: {compiled}")
    lines.append(f"  first step: {_seconds((k, v) for k, v in first_step.items() if k != 'step')}")
    return "\n".join(lines)
