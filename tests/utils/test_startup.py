"""Start-up: the phase recorder and its report, the compile cache folder, worker phases coming back to the
driver, and init calls of separate pools overlapping (colocated ones keeping their order)."""

import logging
import os
import stat
import subprocess
import sys
import threading
import time
import types

import pytest

from verl.single_controller import ClassWithInitArgs, Dispatch, Worker, WorkerError, register
from verl.single_controller.local import LocalWorkerGroup
from verl.utils import startup


def test_phases_sum_repeats_in_first_seen_order_and_mark_other_threads():
    clock = startup.PhaseRecorder(origin=100.0)
    clock.add("config", 2.0, start=101.0)
    clock.add("ray", 4.0, start=103.0)
    clock.add("config", 0.5, start=107.0)
    thread = threading.Thread(target=clock.add, args=("data", 1.5), kwargs={"start": 103.5})
    thread.start()
    thread.join()
    assert [(p.name, p.start, p.seconds, p.background) for p in clock.phases] == [
        ("config", 1.0, 2.0, False), ("ray", 3.0, 4.0, False), ("config", 7.0, 0.5, False), ("data", 3.5, 1.5, True)]
    assert clock.totals() == {"config": 2.5, "ray": 4.0, "data": 1.5}
    assert clock.totals(background=False) == {"config": 2.5, "ray": 4.0}
    assert clock.totals(background=True) == {"data": 1.5}


def test_a_phase_times_its_block_even_when_it_raises():
    clock = startup.PhaseRecorder(origin=time.time())
    with pytest.raises(KeyError), clock.phase("load"):
        time.sleep(0.05)
        raise KeyError("x")
    (phase,) = clock.phases
    assert phase.name == "load" and 0.05 <= phase.seconds < 5


def test_process_start_is_when_the_process_was_launched():
    script = "import time; from verl.utils import startup; print(startup.process_start_time(), time.time())"
    launched = time.time()
    started, now = map(float, subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                                             check=True).stdout.split())
    assert launched - 0.02 <= started <= now  # 0.02: the kernel counts in ticks of 10 ms
    assert startup.PhaseRecorder().origin == pytest.approx(startup.process_start_time(), abs=0.02)


def test_slowest_takes_the_largest_figure_of_each_name():
    ranks = [{"model load": 3.0, "fsdp": 1.0}, {"model load": 2.5, "fsdp": 1.5, "cuda graph capture": 0.2}]
    assert startup.slowest(ranks) == {"model load": 3.0, "fsdp": 1.5, "cuda graph capture": 0.2}


def test_report_by_hand(monkeypatch):
    clock = startup.PhaseRecorder(origin=1000.0)
    clock.add("config", 2.0, start=1001.2)
    clock.add("ray", 4.1, start=1003.2)
    thread = threading.Thread(target=lambda: (clock.add("data", 1.1, start=1003.3),
                                              clock.add("reward", 0.1, start=1004.4)))
    thread.start()
    thread.join()
    clock.add("workers", 6.0, start=1007.3)
    clock.add("init_model", 9.2, start=1013.3)
    monkeypatch.setattr(startup, "time", types.SimpleNamespace(time=lambda: 1050.0))
    monkeypatch.setattr(startup, "uncached_bytecode", lambda: [])
    workers = {"actor_rollout": {"actor model load": 3.2, "actor fsdp": 1.1, "torch.compile": 9.8,
                                 "fx graph cache hits": 1, "fx graph cache misses": 1, "aot autograd cache hits": 0,
                                 "aot autograd cache misses": 2, "triton compile": 3.4, "triton kernels built": 12,
                                 "triton kernels from cache": 3, "cuda graph capture": 1.2},
               "critic": {"critic model load": 2.0}}
    first_step = {"gen": 12.0, "ref": 2.0, "update_actor": 6.1, "step": 21.3}
    # 50.0 s in all: 1.2 before the first phase, 21.3 in driver phases, 21.3 in the step, 6.2 in none of them.
    assert startup.format_report(clock, workers, first_step) == (
        "start-up: 50.0 s from the process start to the end of the first step\n"
        "  driver: interpreter+imports 1.2, config 2.0, ray 4.1, workers 6.0, init_model 9.2, first step 21.3, "
        "other 6.2; on a second thread: data 1.1, reward 0.1\n"
        "  workers of actor_rollout (slowest rank): actor model load 3.2, actor fsdp 1.1\n"
        "    compiled: torch.compile 9.8 (cache hits: fx graph 1 of 2, aot autograd 0 of 2), triton 3.4 (12 kernels "
        "built, 3 from cache), cuda graph capture 1.2\n"
        "  workers of critic (slowest rank): critic model load 2.0\n"
        "  first step: gen 12.0, ref 2.0, update_actor 6.1")


def test_worker_snapshot_reads_torch_compile_time_and_cache_counters(monkeypatch):
    monkeypatch.setattr(startup, "WORKER", startup.PhaseRecorder(origin=0.0))
    startup.WORKER.add("actor model load", 3.0, start=1.0)
    counters = {"inductor": {"fxgraph_cache_hit": 4, "fxgraph_cache_miss": 1},
                "aot_autograd": {"autograd_cache_hit": 2, "autograd_cache_miss": 3}}
    dynamo = types.SimpleNamespace(calculate_time_spent=lambda: {"total_wall_time": 7.5}, counters=counters)
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", dynamo)
    monkeypatch.setitem(startup._TRITON, "triton kernels built", 0)
    monkeypatch.setitem(startup._TRITON, "triton kernels from cache", 0)
    assert startup.worker_snapshot() == {
        "actor model load": 3.0, "torch.compile": 7.5, "fx graph cache hits": 4, "fx graph cache misses": 1,
        "aot autograd cache hits": 2, "aot autograd cache misses": 3}
    monkeypatch.setitem(sys.modules, "torch._dynamo.utils", None)  # never imported: nothing compiled
    assert startup.worker_snapshot() == {"actor model load": 3.0}


# ------------------------------------------------------------------------------------------------ compile cache
@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    for key in (*startup.COMPILE_CACHE_ENV, "XDG_CACHE_HOME"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


def test_default_cache_is_a_private_folder_in_the_users_cache(clean_env):
    folder = str(clean_env / "home" / ".cache" / "verl" / "torch_compile")
    assert startup.use_compile_cache() == folder
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == folder
    assert os.environ["TRITON_CACHE_DIR"] == os.path.join(folder, "triton")
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700


def test_xdg_cache_home_is_respected(clean_env, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "xdg"))
    assert startup.use_compile_cache() == str(clean_env / "xdg" / "verl" / "torch_compile")


def test_the_users_inductor_folder_is_kept_and_triton_follows_it(clean_env, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/data/my_inductor")
    assert startup.use_compile_cache() == "/data/my_inductor"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/data/my_inductor"
    assert os.environ["TRITON_CACHE_DIR"] == "/data/my_inductor/triton"
    assert not (clean_env / "home").exists()


def test_the_users_triton_folder_is_kept(clean_env, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "/data/my_triton")
    startup.use_compile_cache()
    assert os.environ["TRITON_CACHE_DIR"] == "/data/my_triton"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(clean_env / "home" / ".cache" / "verl" / "torch_compile")


def test_an_unwritable_cache_home_leaves_torchs_default_and_says_so(clean_env, monkeypatch, caplog):
    (clean_env / "file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(clean_env / "file"))
    with caplog.at_level(logging.WARNING, logger="verl"):
        assert startup.use_compile_cache() is None
    assert not any(key in os.environ for key in startup.COMPILE_CACHE_ENV)
    assert "Set TORCHINDUCTOR_CACHE_DIR to a writable folder" in caplog.text


def test_only_cuda_workers_touch_the_cache_folder(clean_env, monkeypatch):
    monkeypatch.setattr(startup, "_prepared", False)
    startup.prepare_worker_process("cpu")
    assert "TORCHINDUCTOR_CACHE_DIR" not in os.environ and not startup._prepared
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(triton.knobs.compilation, "listener", None)
    startup.prepare_worker_process("cuda")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(clean_env / "home" / ".cache" / "verl" / "torch_compile")
    assert triton.knobs.compilation.listener is startup._count_triton_compiles


def test_ray_workers_get_the_drivers_cache_folders(monkeypatch):
    ray = pytest.importorskip("ray")
    from verl.single_controller import ray as ray_backend

    seen = {}
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/data/my_inductor")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    ray_backend.init_ray({"ray_init": {"address": "ray://elsewhere:10001"}}, device="cuda")
    assert seen["runtime_env"]["env_vars"]["TORCHINDUCTOR_CACHE_DIR"] == "/data/my_inductor"
    assert "TRITON_CACHE_DIR" not in seen["runtime_env"]["env_vars"]


# ------------------------------------------------------------------------------------------------ worker phases
class Loader(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load(self, seconds, fail=False):
        start = time.time()
        with startup.WORKER.phase("model load"):
            time.sleep(seconds)
        if fail:
            raise RuntimeError("weights missing")
        return start, time.time(), os.getpid()


def test_worker_phases_come_back_through_the_group_and_are_logged_once(monkeypatch, caplog):
    from verl.trainer.ppo.roles import WorkerGroups

    monkeypatch.setattr(startup, "WORKER", startup.PhaseRecorder(origin=0.0))
    monkeypatch.setattr(startup, "DRIVER", startup.PhaseRecorder())
    group = LocalWorkerGroup(ClassWithInitArgs(Loader), name_prefix="actor_rollout", device="cpu")
    group.execute_all_async("load", 0.01).get()
    (snapshot,) = group.startup_phases()
    assert snapshot["model load"] >= 0.01
    workers = WorkerGroups(actor_rollout=group, hosts=[group])
    with caplog.at_level(logging.INFO, logger="verl"):
        workers.log_startup({"timing_s/gen": 1.0, "timing_s/step": 2.0, "actor/pg_loss": 0.1})
        workers.log_startup({"timing_s/gen": 1.0, "timing_s/step": 2.0})
    reports = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up:")]
    assert len(reports) == 1
    assert "  workers of actor_rollout (slowest rank): model load 0.0" in reports[0]
    assert reports[0].endswith("  first step: gen 1.0")


@pytest.fixture(scope="module")
def pools(ray_session):
    from ray import cloudpickle

    from verl.single_controller.ray import RayResourcePool

    cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import test modules
    made = [RayResourcePool([1], use_gpu=False, max_colocate_count=1, name_prefix=f"startup_{i}") for i in range(3)]
    yield made
    for pool in made:
        pool.remove()


def test_separate_pools_load_at_once_and_colocated_roles_in_order(pools):
    from verl.single_controller.ray import RayWorkerGroup, create_colocated_worker_groups

    critic = RayWorkerGroup(pools[0], ClassWithInitArgs(Loader), name_prefix="critic", device="cpu")
    shared = create_colocated_worker_groups(pools[1], {"rm": ClassWithInitArgs(Loader),
                                                       "actor_rollout": ClassWithInitArgs(Loader)}, device="cpu")
    try:
        loading = [critic.execute_all_async("load", 1.0), shared["rm"].execute_all_async("load", 1.0),
                   shared["actor_rollout"].execute_all_async("load", 0.1)]
        (c_start, c_end, c_pid), (r_start, r_end, r_pid), (a_start, a_end, a_pid) = [f.get()[0] for f in loading]
        assert c_start < r_end and r_start < c_end  # two processes: the loads overlap
        assert r_pid == a_pid and r_end <= a_start  # one process: in the order the calls were made
        assert c_pid != r_pid
    finally:
        critic.shutdown()
        shared["rm"].shutdown()


def test_a_failing_load_names_the_role_and_the_rank(pools):
    from verl.single_controller.ray import create_colocated_worker_groups

    shared = create_colocated_worker_groups(pools[2], {"critic": ClassWithInitArgs(Loader),
                                                       "actor_rollout": ClassWithInitArgs(Loader)}, device="cpu")
    try:
        loading = [shared["critic"].execute_all_async("load", 0.0, fail=True),
                   shared["actor_rollout"].execute_all_async("load", 0.0)]
        with pytest.raises(WorkerError, match=r"worker group 'critic' rank 0 raised in load\(\)") as error:
            for future in loading:
                future.get()
        assert "weights missing" in str(error.value)
    finally:
        shared["critic"].shutdown()


def test_bytecode_found_where_python_looks_for_it(monkeypatch, tmp_path):
    """A package counts as cached once its __init__ has bytecode where this Python looks (its __pycache__, or
    under PYTHONPYCACHEPREFIX); the report then says what every process pays and the fix."""
    import importlib
    import py_compile

    package = tmp_path / "pkg" / "verl_bytecode_probe"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "pkg"))
    importlib.invalidate_caches()
    assert startup.uncached_bytecode(("verl_bytecode_probe", "no_such_package_here")) == ["verl_bytecode_probe"]
    py_compile.compile(str(package / "__init__.py"))  # writes __pycache__/__init__.cpython-*.pyc
    assert startup.uncached_bytecode(("verl_bytecode_probe",)) == []
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path / "empty_prefix"))  # nothing cached there
    assert startup.uncached_bytecode(("verl_bytecode_probe", "torch")) == ["verl_bytecode_probe", "torch"]
    report = startup.format_report(startup.PhaseRecorder(), {}, {"step": 1.0})
    assert "  python: no cached bytecode for torch, transformers: every process compiles" in report
    assert "PYTHONPYCACHEPREFIX" in report
