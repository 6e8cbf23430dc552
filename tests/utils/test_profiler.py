"""verl.utils.profiler: traces of profiled steps (global_profiler.* and each role's profiler.*), the timers and the
memory logger under the original's names, and the checks of the profiler keys."""

import gzip
import json
import logging
import os
import types

import pytest
import torch

from verl.base_config import ConfigError
from verl.single_controller import Dispatch, Worker, register
from verl.single_controller.decorator import registered_methods
from verl.single_controller.worker_group import ClassWithInitArgs
from verl.utils.profiler import (
    DistProfiler, DistProfilerExtension, GPUMemoryLogger, ProfilerConfig, mark_annotate, mark_end_range,
    mark_start_range, marked_timer, simple_timer
)
from verl.utils.profiler.config import GlobalProfilerConfig


def profiler_config(save_path, **kwargs):
    return ProfilerConfig(tool="torch", enable=True, save_path=str(save_path), **kwargs)


class TinyWorker(Worker, DistProfilerExtension):
    """A role that multiplies matrices; its profiler is built from the config, as the real workers' are."""

    def __init__(self, role, config):
        super().__init__()
        DistProfilerExtension.__init__(self, DistProfiler(self.rank, config, save_file_prefix=role))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    @DistProfiler.annotate(role="tiny_update")
    def update(self, n):
        x = torch.ones(n, n)
        return float((x @ x).sum())


def trace_events(path):
    with gzip.open(path, "rt") as f:
        return json.load(f)["traceEvents"]


def names(path):
    return {event.get("name") for event in trace_events(path)}


@pytest.fixture
def local_env(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):  # the local backend sets them
        monkeypatch.setenv(key, "0" if "RANK" in key else "1")


def test_colocated_roles_write_one_trace_of_the_step_named_by_role_step_and_rank(tmp_path, local_env, caplog):
    from verl.single_controller.local import create_colocated_worker_groups

    roles = {"actor": ClassWithInitArgs(TinyWorker, "actor", profiler_config(tmp_path)),
             "critic": ClassWithInitArgs(TinyWorker, "critic", profiler_config(tmp_path))}
    groups = create_colocated_worker_groups(None, roles, device="cpu")
    for group in groups.values():
        group.start_profile(profile_step=1)
    with caplog.at_level(logging.INFO, logger="verl"):
        assert groups["actor"].update(8) == [512.0]
        assert groups["critic"].update(4) == [64.0]
        groups["actor"].stop_profile()
        assert os.listdir(tmp_path) == []  # the critic is still recording: nothing written yet
        groups["critic"].stop_profile()
    assert os.listdir(tmp_path) == ["actor+critic_step1_rank0.json.gz"]  # no temporary file left behind
    recorded = names(tmp_path / "actor+critic_step1_rank0.json.gz")
    assert {"tiny_update", "aten::mm"} <= recorded
    assert sum(e.get("name") == "tiny_update" for e in trace_events(tmp_path / os.listdir(tmp_path)[0])) == 2
    assert any("actor+critic_step1_rank0.json.gz" in r.getMessage() and "perfetto" in r.getMessage()
               for r in caplog.records)
    assert groups["actor"].update(2) == [8.0]  # after stop: no profiler, nothing written
    assert len(os.listdir(tmp_path)) == 1


def test_a_trace_over_consecutive_steps_names_the_first_and_last(tmp_path):
    worker = types.SimpleNamespace(profiler=DistProfiler(0, profiler_config(tmp_path), save_file_prefix="actor"))
    worker.profiler.start(profile_step=2)
    torch.ones(3) + 1
    worker.profiler.stop(profile_step=4)
    assert worker.profiler.written == [str(tmp_path / "actor_step2-4_rank0.json.gz")]


def test_discrete_mode_writes_one_trace_per_stage(tmp_path):
    config = profiler_config(tmp_path, tool_config={"torch": {"discrete": True}})

    class Role:
        def __init__(self):
            self.profiler = DistProfiler(0, config, save_file_prefix="critic")

        @DistProfiler.annotate(role="critic_update")
        def update(self):
            return torch.ones(2, 2) @ torch.ones(2, 2)

        @DistProfiler.annotate(role="compute_values")
        def values(self):
            return torch.zeros(2).exp()

    assert config.tool_config.torch.discrete
    role = Role()
    role.profiler.start(profile_step=5)
    role.update()
    role.values()
    role.profiler.stop()
    assert sorted(os.listdir(tmp_path)) == ["critic-compute_values_step5_rank0.json.gz",
                                            "critic-critic_update_step5_rank0.json.gz"]
    assert "aten::mm" in names(tmp_path / "critic-critic_update_step5_rank0.json.gz")
    assert "aten::mm" not in names(tmp_path / "critic-compute_values_step5_rank0.json.gz")


class Updater:
    """A role whose update runs one optimizer step per mini-batch, the mini-batches named mb0, mb1, ..."""

    def __init__(self, config):
        self.profiler = DistProfiler(0, config, save_file_prefix="actor")
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    @DistProfiler.annotate(role="rollout_generate")
    def generate(self):
        return torch.ones(3, 3).exp()

    @DistProfiler.annotate(role="actor_update")
    def update(self, mini_batches):
        for i in range(mini_batches):
            with torch.profiler.record_function(f"mb{i}"):
                self.model(torch.ones(2, 4)).sum().backward()
            self.optimizer.step()
            self.optimizer.zero_grad()


def scheduled_step(tmp_path, schedule, discrete=False, mini_batches=4):
    role = Updater(profiler_config(tmp_path, tool_config={"torch": {"schedule": schedule, "discrete": discrete}}))
    role.profiler.start(profile_step=1)
    role.generate()
    role.update(mini_batches)
    role.profiler.stop(profile_step=1)
    role.update(2)  # after stop the optimizer steps advance nothing
    return role.profiler.written


STAGES = {"rollout_generate", "actor_update", "mb0", "mb1", "mb2", "mb3"}


# schedule (torch.profiler.schedule over the optimizer steps) -> the stages each written trace holds (a window that
# opens inside actor_update holds its mini-batches, not the range begun before it)
@pytest.mark.parametrize("schedule,kept", [
    ({}, [STAGES]),  # active 0: no schedule, the whole step
    ({"active": 2}, [{"rollout_generate", "actor_update", "mb0", "mb1"}]),  # from the start to the 2nd optimizer step
    ({"skip_first": 1, "active": 1}, [{"mb1"}]),
    ({"skip_first": 1, "warmup": 1, "active": 2}, [{"mb2", "mb3"}]),  # mb1 is warm-up: recorded, dropped
    ({"wait": 1, "active": 1, "repeat": 2}, [{"mb1"}, {"mb3"}]),  # two windows, two files
    ({"active": 10}, [STAGES]),  # the update ends inside the window: it is written at stop
])
def test_a_schedule_keeps_a_window_of_the_update_mini_batches(tmp_path, schedule, kept):
    written = scheduled_step(tmp_path, schedule)
    assert written == [str(tmp_path / f"actor_step1_rank0{part}.json.gz") for part in ["", "_part1"][:len(kept)]]
    assert sorted(os.listdir(tmp_path)) == sorted(os.path.basename(p) for p in written)
    for path, stages in zip(written, kept):
        recorded = names(path)
        assert recorded & STAGES == stages, path
        assert not any(str(n).startswith("ProfilerStep#") for n in recorded)  # a step here is a mini-batch


def test_a_schedule_that_keeps_no_mini_batch_says_so(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="verl"):
        assert scheduled_step(tmp_path, {"skip_first": 10, "active": 1}) == []
    assert any("4 update mini-batches ran while profiling, none of them in" in r.getMessage()
               and "schedule's active window" in r.getMessage() for r in caplog.records)


def test_discrete_stages_are_written_whole_whatever_the_schedule(tmp_path):
    written = scheduled_step(tmp_path, {"skip_first": 1, "active": 1}, discrete=True)
    assert [os.path.basename(p) for p in written] == ["actor-rollout_generate_step1_rank0.json.gz",
                                                      "actor-actor_update_step1_rank0.json.gz"]
    assert names(written[1]) & STAGES == STAGES - {"rollout_generate"}


@pytest.mark.parametrize("kwargs,rank,profiled", [
    ({}, 0, True), ({}, 1, False),  # ranks [] = rank 0 only
    ({"ranks": [1, 3]}, 3, True), ({"ranks": [1, 3]}, 0, False),
    ({"all_ranks": True}, 7, True),
    ({"enable": False}, 0, False),
])
def test_rank_selection(tmp_path, kwargs, rank, profiled):
    config = ProfilerConfig(**{"tool": "torch", "enable": True, "save_path": str(tmp_path), **kwargs})
    profiler = DistProfiler(rank, config, save_file_prefix="actor")
    assert profiler.check_this_rank() is profiled
    profiler.start(profile_step=1)
    assert profiler.check_this_step() is profiled
    profiler.stop()
    assert len(os.listdir(tmp_path)) == int(profiled)


def test_union_of_colocated_roles():
    actor = ProfilerConfig(tool="torch", enable=True, ranks=[2])
    rollout = ProfilerConfig(tool="torch", enable=True)  # [] = rank 0
    off = ProfilerConfig(tool="torch", enable=False, ranks=[5])
    assert actor.union(rollout).ranks == [0, 2]
    assert actor.union(off) is actor and off.union(actor) is actor
    assert actor.union(ProfilerConfig(tool="torch", enable=True, all_ranks=True)).all_ranks


@pytest.mark.parametrize("steps,continuous,starts,stops", [
    ([1, 3], False, [1, 3], [1, 3]),
    ([1, 2, 3, 5], False, [1, 2, 3, 5], [1, 2, 3, 5]),
    ([1, 2, 3, 5], True, [1, 5], [3, 5]),  # 1-3 in one trace, 5 in another
    (None, False, [], []),
])
def test_which_steps_start_and_stop(steps, continuous, starts, stops):
    config = GlobalProfilerConfig(steps=steps, profile_continuous_steps=continuous)
    assert [s for s in range(1, 7) if config.starts_at(s)] == starts
    assert [s for s in range(1, 7) if config.stops_at(s)] == stops
    # a run that ends inside a continuous window still writes its trace
    assert config.stops_at(2, last=True) == (steps is not None and 2 in steps)


def test_the_trainer_starts_and_stops_every_group_once(tmp_path):
    from verl.trainer.ppo.ray_trainer import RayPPOTrainer

    calls = []

    class Group:
        def __init__(self, name):
            self.name = name

        def __getattr__(self, method):
            return lambda **kwargs: calls.append((self.name, method, kwargs))

    actor_rollout = Group("actor_rollout")
    trainer = types.SimpleNamespace(global_steps=3, workers=types.SimpleNamespace(
        actor_rollout=actor_rollout, rollout=actor_rollout, critic=Group("critic"), rm=None))
    RayPPOTrainer._profile(trainer, "start_profile", False)
    assert calls == []
    RayPPOTrainer._profile(trainer, "start_profile", True)
    assert calls == [("actor_rollout", "start_profile", {"profile_step": 3}),
                     ("critic", "start_profile", {"profile_step": 3})]


def test_the_role_workers_build_their_profiler_from_their_sections(tmp_path, local_env):
    from verl.workers.config import ActorRolloutRefConfig
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    for cls in (ActorRolloutRefWorker, CriticWorker):
        assert {"start_profile", "stop_profile"} <= set(registered_methods(cls))
    config = ActorRolloutRefConfig.from_config({
        "model": {"path": "unused"}, "actor": {"profiler": {"enable": True, "tool": "torch", "ranks": [1]}},
        "rollout": {"profiler": {"tool": "torch"}},
        "ref": {"profiler": {"enable": True, "tool": "torch", "ranks": [0]}}})
    assert config.rollout.profiler.enable and config.rollout.profiler.ranks == [1]  # follows the actor's
    assert ActorRolloutRefWorker(config, role="actor_rollout").profiler.check_this_rank() is False  # rank 0
    assert ActorRolloutRefWorker(config, role="actor_rollout_ref").profiler.check_this_rank() is True  # ref: rank 0


def test_tools_that_cannot_run_here_say_what_to_use(tmp_path):
    for tool in ("nsys", "npu", "precision_debugger"):
        with pytest.raises(ValueError, match="Use global_profiler.tool=torch"):
            DistProfiler(0, ProfilerConfig(tool=tool, enable=True, save_path=str(tmp_path)))
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="sees no CUDA device.*tool=torch"):
            DistProfiler(0, ProfilerConfig(tool="torch_memory", enable=True, save_path=str(tmp_path)))


def problems(*overrides):
    from verl.trainer.config_validation import compose_ppo_config, validate_config

    config = compose_ppo_config(["actor_rollout_ref.model.path=/nowhere", "data.train_files=x", "trainer.device=cpu",
                                 *overrides])
    try:
        validate_config(config)
    except ConfigError as e:
        return [p for p in e.problems if "profil" in p]
    return []


def test_config_checks_name_the_key(caplog):
    assert problems("global_profiler.tool=torchh") == [
        "global_profiler.tool: 'torchh' is not a known profiler tool; did you mean torch? Choose one of: torch, "
        "torch_memory, nsys, npu, precision_debugger"]
    [nsys] = problems("global_profiler.tool=nsys", "global_profiler.steps=[1,2]",
                      "actor_rollout_ref.actor.profiler.enable=true")
    assert nsys.startswith("global_profiler.tool: nsys cannot profile here") and "global_profiler.tool=torch" in nsys
    [memory] = problems("global_profiler.tool=torch_memory", "global_profiler.steps=[1]",
                        "actor_rollout_ref.actor.profiler.enable=true")
    assert "trainer.device=cpu has no CUDA allocator" in memory
    assert problems("global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true") == [
        "global_profiler.tool: is null but global_profiler.steps=[1] asks for profiles; set global_profiler.tool=torch"]
    assert problems("global_profiler.tool=torch", "global_profiler.steps=[0]",
                    "actor_rollout_ref.actor.profiler.enable=true")[0].startswith("global_profiler.steps: is [0]")
    assert problems("actor_rollout_ref.actor.profiler.tool_config.torch.contents=[gpu]")[0].startswith(
        "actor_rollout_ref.actor.profiler.tool_config.torch.contents: 'gpu' is not a known torch profiler content")
    with caplog.at_level(logging.WARNING, logger="verl"):
        assert problems("global_profiler.tool=torch", "global_profiler.steps=[1,3]",
                        "actor_rollout_ref.actor.profiler.enable=true", "critic.profiler.all_ranks=true") == []
        assert problems("global_profiler.tool=torch", "global_profiler.steps=[1]") == []
    assert any("no role's profiler is enabled" in r.getMessage() for r in caplog.records)


def profiler_warnings(*overrides):
    from verl.trainer.config_validation import compose_ppo_config, validate_config

    logging.getLogger("verl.config").disabled = True
    try:
        warnings = validate_config(compose_ppo_config([
            "data.train_files=data/train.parquet", "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct",
            "trainer.n_gpus_per_node=1", *overrides]))
    finally:
        logging.getLogger("verl.config").disabled = False
    return [w for w in warnings if "profiler" in w]


ACTOR_TORCH = "actor_rollout_ref.actor.profiler.tool_config.torch"
PROFILED = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "actor_rollout_ref.actor.profiler.enable=true"]


def test_profiler_settings_without_effect_here_are_named_with_the_reason():
    assert profiler_warnings(*PROFILED, f"{ACTOR_TORCH}.schedule.active=2") == []
    [wait] = profiler_warnings(f"{ACTOR_TORCH}.schedule.wait=1")
    assert wait.startswith(f"{ACTOR_TORCH}.schedule.wait: is 1, but {ACTOR_TORCH}.schedule.active is 0, so no "
                           "schedule runs")
    [discrete] = profiler_warnings(f"{ACTOR_TORCH}.schedule.active=2", f"{ACTOR_TORCH}.discrete=true")
    assert discrete.startswith(f"{ACTOR_TORCH}.schedule: sets active=2, but {ACTOR_TORCH}.discrete=true writes each "
                               "stage whole")
    rollout = "actor_rollout_ref.rollout.profiler.tool_config.torch"
    [start, end] = profiler_warnings(f"{rollout}.profile_token_start=1", f"{rollout}.profile_token_end=64")
    assert start.startswith(f"{rollout}.profile_token_start: is 1, but the rollout runs in the worker's process")
    assert end.startswith(f"{rollout}.profile_token_end: is 64,") and "has no effect" in end
    # the actor's worker plays the rollout too, with the actor's tool settings
    assert profiler_warnings(*PROFILED, f"{rollout}.discrete=true") == [
        f"{rollout}.discrete: is true, but rollout shares a worker process and its profiler with actor, whose settings "
        f"it uses ({ACTOR_TORCH}.discrete=false); set it there"]
    [npu] = profiler_warnings("actor_rollout_ref.actor.profiler.tool_config.npu.level=level1")
    assert npu.startswith("actor_rollout_ref.actor.profiler.tool_config.npu.level: is level1, but the npu tool cannot "
                          "run here (it drives the Ascend NPU profiler")
    [depth] = profiler_warnings("global_profiler.global_tool_config.torch_memory.stack_depth=33")
    assert depth.startswith("global_profiler.global_tool_config.torch_memory.stack_depth: is 33, but the CUDA "
                            "allocator's history (torch_memory) keeps whole stacks")
    assert problems(f"{ACTOR_TORCH}.schedule.skip_first=-1", "actor_rollout_ref.actor.profiler.ranks=[a]") == [
        f"{ACTOR_TORCH}.schedule.skip_first: must be >= 0 (update mini-batches), got -1",
        "actor_rollout_ref.actor.profiler.ranks: is [a]; list the ranks to profile as numbers from 0, e.g. [0,1] (or "
        "set all_ranks=true)"]


def test_timers_fill_timing_raw_and_mark_ranges_in_a_trace(tmp_path):
    timing = {}

    @mark_annotate()
    def scored():
        return torch.ones(4).sum()

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with marked_timer("gen", timing, color="red"):
            scored()
        with simple_timer("gen", timing):
            pass
        mark = mark_start_range("reshard")
        torch.zeros(2).add_(1)
        mark_end_range(mark)
    recorded = {event.name for event in prof.events()}
    assert {"gen", "scored", "reshard"} <= recorded
    assert set(timing) == {"gen"} and timing["gen"] > 0


def test_gpu_memory_logger_logs_before_and_after(caplog):
    log = logging.getLogger("verl.test_profiler")

    class Actor:
        @GPUMemoryLogger(role="actor", logger=log, level=logging.INFO)
        def update_policy(self, x):
            return x + 1

    with caplog.at_level(logging.INFO, logger="verl"):
        assert Actor().update_policy(1) == 2
    heads = [r.getMessage().split(" |")[0] for r in caplog.records]
    assert heads == ["[actor: Before update_policy]", "[actor: After update_policy]"]
