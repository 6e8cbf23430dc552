"""The Ray backend on CPU: two workers over gloo, colocated roles, failures, and the local backend
giving the same answers."""

import os
import sys
import time

import pytest
import torch
import torch.distributed as dist

from verl.protocol import DataProto
from verl.single_controller import (
    ClassWithInitArgs,
    DataProtoFuture,
    Dispatch,
    Worker,
    WorkerError,
    register,
    register_dispatch_mode,
)

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402

from tests.single_controller import sockets  # noqa: E402
from tests.single_controller.sockets import LOOPBACK, listening_addresses  # noqa: E402
from verl.single_controller.local import LocalWorkerGroup  # noqa: E402
from verl.single_controller.ray import (  # noqa: E402
    RayWorkerGroup,
    RayResourcePool,
    create_colocated_worker_groups,
)

# Ray workers cannot import test modules (pytest's importlib mode): ship the toy classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(sockets)


def dispatch_reversed(worker_group, items):
    return [list(reversed(items))], {}


def collect_sum(worker_group, outputs):
    return sum(outputs)


REVERSED_SUM = register_dispatch_mode("TOY_REVERSED_SUM", dispatch_reversed, collect_sum)


class ToyWorker(Worker):
    def __init__(self, scale=2.0):
        before = listening_addresses()  # rank 0's Worker.__init__ serves the rendezvous store
        super().__init__()
        if scale < 0:
            raise ValueError(f"scale must be >= 0, got {scale}")
        self.scale = scale
        self.init_process_group()
        self.new_listening = sorted(listening_addresses() - before)
        self.config = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init(self, config):
        self.config = config
        return self.rank

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data):
        data.batch["x"] = data.batch["x"] * self.scale
        data.batch["rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data):
        return self.double(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def metrics(self, data):
        return {"rank": self.rank, "rows": len(data), "sum": float(data.batch["x"].sum())}

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self):
        return (self.rank, os.getpid())

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def describe(self, tag):
        return (tag, self.rank, self.world_size, self.config)

    @register(dispatch_mode=REVERSED_SUM)
    def weighted(self, item):
        return item * (self.rank + 1)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, value):
        t = torch.tensor([float(value + self.rank)])
        dist.all_reduce(t)
        return t.item()

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sample(self, seed):
        torch.manual_seed(seed)
        return torch.randn(4)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def environment(self):
        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "VERL_DEVICE", "MASTER_ADDR", "MASTER_PORT",
                "TORCHELASTIC_USE_AGENT_STORE", "GLOO_SOCKET_IFNAME"]
        return {**{k: os.environ.get(k) for k in keys}, "listening": self.new_listening,
                "pid": os.getpid(), "backend": dist.get_backend(), "dist_world": dist.get_world_size(),
                "node_id": ray.get_runtime_context().get_node_id()}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, rank):
        if self.rank == rank:
            raise ValueError(f"boom from rank {self.rank}")
        return "fine"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def exit_or_barrier(self, rank):
        if self.rank == rank:
            os._exit(1)
        dist.barrier()


class StuckWorker(Worker):
    """A group whose collectives give up after 3 s (actor_rollout_ref.nccl_timeout in a real run)."""

    def __init__(self):
        super().__init__()
        self.init_process_group(timeout_s=3.0)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def skip_all_reduce(self, rank):
        """Every rank but ``rank`` joins an all-reduce: those wait for a peer that never comes."""
        if self.rank != rank:
            dist.all_reduce(torch.ones(1))
        return self.rank


class ToyCritic(Worker):
    def __init__(self, offset):
        super().__init__()
        self.offset = offset
        self.init_process_group()  # a no-op when colocated after ToyWorker

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def values(self, data):
        t = torch.ones(1)
        dist.all_reduce(t)  # the shared process group works for this role too
        data.batch["values"] = data.batch["x"] + self.offset + t
        return data


def make_batch(n):
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)},
                               {"uid": [f"u{i}" for i in range(n)]})


@pytest.fixture(scope="module")
def toy_pool(ray_session):
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1, name_prefix="toy_pool")
    yield pool
    pool.remove()


@pytest.fixture(scope="module")
def toy_group(toy_pool):
    group = RayWorkerGroup(toy_pool, ClassWithInitArgs(ToyWorker, scale=2.0), name_prefix="toy")
    yield group
    group.shutdown()


@pytest.fixture(scope="module")
def local_group():
    group = LocalWorkerGroup(ClassWithInitArgs(ToyWorker, scale=2.0), name_prefix="toy", device="cpu")
    yield group
    group.shutdown()


def test_dispatch_modes_over_two_ray_workers(toy_group):
    assert toy_group.world_size == 2
    assert toy_group.init({"lr": 1.0}) == [0, 1]
    out = toy_group.double(make_batch(5))
    assert out.batch["x"].tolist() == [0, 2, 4, 6, 8]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(5)]
    # 5 rows padded to 6 (row 0 repeated), 3 per rank
    assert toy_group.metrics(make_batch(5)) == [{"rank": 0, "rows": 3, "sum": 3.0},
                                                {"rank": 1, "rows": 3, "sum": 7.0}]
    assert toy_group.whoami()[0] == 0
    assert toy_group.describe("t") == [("t", 0, 2, {"lr": 1.0}), ("t", 1, 2, {"lr": 1.0})]
    assert toy_group.weighted([1, 10]) == 10 * 1 + 1 * 2
    assert toy_group.execute_rank_zero("describe", "z") == ("z", 0, 2, {"lr": 1.0})


def test_non_blocking_calls_return_futures(toy_group):
    future = toy_group.double_async(make_batch(3))
    assert isinstance(future, DataProtoFuture)
    chained = toy_group.double(future)
    assert future.get().batch["x"].tolist() == [0, 2, 4]
    assert chained.batch["x"].tolist() == [0, 4, 8]


def test_all_reduce_over_gloo_with_loopback_rendezvous(toy_group):
    assert toy_group.all_reduce(5) == [11.0, 11.0]  # (5 + 0) + (5 + 1)
    envs = toy_group.environment()
    assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [("0", "2", "0"), ("1", "2", "1")]
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    for env in envs:
        # one node: the group meets at a store rank 0 serves on loopback, which torch's env:// joins too
        assert (env["MASTER_ADDR"], env["TORCHELASTIC_USE_AGENT_STORE"]) == ("127.0.0.1", "True")
        assert (env["GLOO_SOCKET_IFNAME"], env["backend"], env["VERL_DEVICE"]) == ("lo", "gloo", "cpu")
        # every socket opened by starting the worker and joining the process group listens on loopback only
        assert env["listening"] and all(addr in LOOPBACK for addr in env["listening"]), env
    assert envs[0]["pid"] != envs[1]["pid"]


def test_raising_method_names_role_rank_method_and_remote_traceback(toy_group):
    with pytest.raises(WorkerError) as info:
        toy_group.fail_on(1)
    message = str(info.value)
    assert "'toy' rank 1" in message and "fail_on" in message
    assert "Traceback in the worker" in message and "ValueError: boom from rank 1" in message
    assert 'raise ValueError(f"boom from rank {self.rank}")' in message  # the remote source line
    assert (info.value.rank, info.value.died) == (1, False)
    assert toy_group.whoami()[0] == 0  # the other rank finished, so the group is still usable


def test_pool_refuses_more_groups_than_max_colocate_count(toy_group, toy_pool):
    with pytest.raises(RuntimeError, match="max_colocate_count=1"):
        RayWorkerGroup(toy_pool, ClassWithInitArgs(ToyWorker), name_prefix="extra")


def test_local_backend_gives_the_same_results(toy_group, local_group):
    assert local_group.world_size == 1
    local_group.init({"lr": 1.0})
    ray_out, local_out = toy_group.double(make_batch(5)), local_group.double(make_batch(5))
    assert torch.equal(ray_out.batch["x"], local_out.batch["x"])
    assert local_out.non_tensor_batch["uid"].tolist() == ray_out.non_tensor_batch["uid"].tolist()
    assert torch.equal(toy_group.sample(7)[0], local_group.sample(7)[0])
    assert local_group.describe("t") == [("t", 0, 1, {"lr": 1.0})]
    assert local_group.all_reduce(5) == [5.0]
    assert local_group.whoami() == (0, os.getpid())  # in the driver's own process
    assert local_group.environment()[0]["MASTER_ADDR"] is None  # a private rendezvous through a file
    with pytest.raises(WorkerError, match="'toy' rank 0 raised in fail_on"):
        local_group.fail_on(0)


def test_local_colocated_roles_live_in_the_driver(local_group):
    # local_group holds this process's process group; both roles join it (init is idempotent),
    # and its teardown ends it, so this test does not call shutdown().
    from verl.single_controller.local import (
        create_colocated_worker_groups as local_colocated,
    )

    groups = local_colocated(None, {"actor_rollout": ClassWithInitArgs(ToyWorker, scale=3.0),
                                    "critic": ClassWithInitArgs(ToyCritic, offset=10.0)}, device="cpu")
    actor, critic = groups["actor_rollout"], groups["critic"]
    assert critic.pid() == [os.getpid()] and actor.whoami() == (0, os.getpid())
    assert actor.double(make_batch(3)).batch["x"].tolist() == [0, 3, 6]
    assert critic.values(make_batch(2)).batch["values"].tolist() == [11, 12]
    assert isinstance(critic.worker, ToyCritic)  # the role's own object, for a debugger


def test_colocated_roles_share_one_actor_per_rank(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="colocated_pool")
    groups = create_colocated_worker_groups(pool, {
        "actor_rollout": ClassWithInitArgs(ToyWorker, scale=3.0),
        "critic": ClassWithInitArgs(ToyCritic, offset=10.0)})
    actor, critic = groups["actor_rollout"], groups["critic"]
    try:
        actor_pids = [env["pid"] for env in actor.environment()]
        assert critic.pid() == actor_pids and actor_pids[0] != actor_pids[1]
        assert actor.double(make_batch(4)).batch["x"].tolist() == [0, 3, 6, 9]
        assert critic.values(make_batch(4)).batch["values"].tolist() == [12, 13, 14, 15]
        assert [env["dist_world"] for env in actor.environment()] == [2, 2]
        assert not hasattr(critic, "double") and not hasattr(actor, "values")
    finally:
        actor.shutdown()
        pool.remove()


def test_dead_worker_is_reported_while_the_other_waits_in_a_barrier(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="crash_pool")
    group = RayWorkerGroup(pool, ClassWithInitArgs(ToyWorker), name_prefix="crashy")
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            group.exit_or_barrier(1)
        assert time.monotonic() - start < 30
        assert (info.value.role, info.value.rank, info.value.method, info.value.died) == (
            "crashy", 1, "exit_or_barrier", True)
        assert "'crashy' rank 1 died while running exit_or_barrier()" in str(info.value)
        with pytest.raises(WorkerError, match="stopped earlier"):
            group.whoami()
    finally:
        group.shutdown()
        pool.remove()


def test_failing_constructor_is_reported_by_rank(ray_session):
    pool = RayResourcePool([2], use_gpu=False, name_prefix="bad_init_pool")
    try:
        with pytest.raises(WorkerError, match=r"(?s)'bad' rank \d raised in __init__.*scale must be >= 0"):
            RayWorkerGroup(pool, ClassWithInitArgs(ToyWorker, scale=-1.0), name_prefix="bad")
        with pytest.raises(TypeError, match="unexpected keyword argument 'wrong_arg'"):
            RayWorkerGroup(pool, ClassWithInitArgs(ToyWorker, wrong_arg=1), name_prefix="bad")
        assert pool._groups == 0  # the failed attempts gave their share of the pool back
    finally:
        pool.remove()


def test_pool_checks_the_cluster_before_waiting(ray_session):
    with pytest.raises(RuntimeError, match=r"trainer.n_gpus_per_node=8 x trainer.nnodes=1 needs 8 GPUs "
                                           r"\(8 per node\) but the Ray cluster has 0 .*trainer.device=cpu"):
        RayResourcePool([8], use_gpu=True).bundles()
    # The session's nodes have 4 CPUs each: 6 on one node can never fit, said at once.
    with pytest.raises(RuntimeError, match=r"needs 6 CPUs \(3 per worker, 6 on one node\).*4 on its largest"):
        RayResourcePool([2], use_gpu=False, num_cpus_per_worker=3).bundles()
    # Fits the cluster, but the other pools hold the room: reported after the wait.
    held = [RayResourcePool([1], use_gpu=False, num_cpus_per_worker=3) for _ in range(2)]
    third = RayResourcePool([1], use_gpu=False, num_cpus_per_worker=3, ready_timeout_s=1)
    try:
        for pool in held:
            pool.bundles()
        with pytest.raises(RuntimeError, match="could not place"):
            third.bundles()
    finally:
        for pool in held:
            pool.remove()



def test_a_pool_over_two_nodes_spans_both_and_reports_a_dead_rank(ray_session):
    """process_on_nodes=[1, 1] (trainer.nnodes=2): one worker on each of the session's two Ray nodes,
    joined through a TCP store that rank 0 serves on its node's address (loopback here, as the nodes
    share this machine); a rank that dies mid-collective is reported across nodes."""
    pool = RayResourcePool([1, 1], use_gpu=False, name_prefix="two_node_pool")
    group = RayWorkerGroup(pool, ClassWithInitArgs(ToyWorker, scale=2.0), name_prefix="spread")
    try:
        envs = group.environment()
        assert len({e["node_id"] for e in envs}) == 2
        assert [(e["RANK"], e["WORLD_SIZE"], e["LOCAL_RANK"]) for e in envs] == [("0", "2", "0"), ("1", "2", "0")]
        assert all(e["MASTER_ADDR"] == "127.0.0.1" for e in envs) and len({e["MASTER_PORT"] for e in envs}) == 1
        assert all(e["GLOO_SOCKET_IFNAME"] == "lo" for e in envs)
        for env in envs:
            assert env["listening"] and all(addr in LOOPBACK for addr in env["listening"]), env
        assert group.all_reduce(5) == [11.0, 11.0]
        with pytest.raises(WorkerError) as info:
            group.exit_or_barrier(1)
        assert (info.value.rank, info.value.died) == (1, True)
    finally:
        group.shutdown()
        pool.remove()


def test_a_pool_wanting_more_nodes_than_the_cluster_has_says_so(ray_session):
    pool = RayResourcePool([1, 1, 1], use_gpu=False, name_prefix="three_node_pool")
    with pytest.raises(RuntimeError, match=r"over 3 nodes.*only 2 of the cluster's 2 nodes have room.*ray start"):
        pool.bundles()


def test_a_rank_stuck_in_a_collective_is_reported_after_the_timeout(ray_session):
    """Rank 1 (on the other node) skips an all-reduce: rank 0 waits, and after the collective timeout
    the group reports rank 0 with the hint to look for ranks that took different paths."""
    pool = RayResourcePool([1, 1], use_gpu=False, name_prefix="stuck_pool")
    group = RayWorkerGroup(pool, ClassWithInitArgs(StuckWorker), name_prefix="actor_rollout")
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError) as info:
            group.skip_all_reduce(1)
        assert time.monotonic() - start < 30
        assert (info.value.role, info.value.rank, info.value.died) == ("actor_rollout", 0, False)
        assert "waited longer than the collective timeout" in str(info.value)
        assert "actor_rollout_ref.nccl_timeout" in str(info.value)
    finally:
        group.shutdown()
        pool.remove()


def test_interface_of_finds_the_interface_holding_an_address():
    """Workers on different machines bind gloo to the interface of their node's cluster address."""
    from verl.single_controller.worker import interface_of

    assert interface_of("127.0.0.1") == "lo"
    assert interface_of("203.0.113.77") is None  # a documentation address no interface holds
