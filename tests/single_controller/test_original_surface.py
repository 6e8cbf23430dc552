"""A worker written the way the original verl's HybridFlow programming guide describes it, with the
original's import paths, run unchanged on two CPU Ray workers of the session's cluster."""

import os
import sys

import pytest
import torch
import torch.distributed as dist

from verl import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, Execute, register

ray = pytest.importorskip("ray")
from ray import cloudpickle  # noqa: E402

from tests.single_controller import sockets  # noqa: E402
from verl.single_controller.ray import (  # noqa: E402
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)

# Ray workers cannot import test modules (pytest's importlib mode): ship the classes by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(sockets)

ENV_KEYS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "GLOO_SOCKET_IFNAME")


class LinearWorker(Worker):
    """A data-parallel worker holding a tiny model: a bias-free Linear(2 -> 1) with weights of one."""

    def __init__(self, hidden):
        super().__init__()
        self.hidden = hidden
        self.model = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        dist.init_process_group(backend="gloo")  # env://, as the original's workers join
        self.model = torch.nn.Linear(self.hidden, 1, bias=False)
        torch.nn.init.ones_(self.model.weight)
        return {"rank": self.rank, "world_size": self.world_size, "dist": (dist.get_rank(), dist.get_world_size()),
                "master": self.get_master_addr_port(), "listening": sorted(sockets.listening_addresses()), **{k: os.environ.get(k) for k in ENV_KEYS}}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_scores(self, data: DataProto) -> DataProto:
        with torch.no_grad():
            scores = self.model(data.batch["obs"]).squeeze(-1)
        return DataProto.from_dict({"scores": scores, "rank": torch.full((len(data),), self.rank)},
                                   meta_info={"metrics": {"rows": len(data)}})

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def compute_scores_later(self, data: DataProto) -> DataProto:
        return self.compute_scores(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update(self, data: DataProto) -> DataProto:
        """One SGD step on loss = sum of the batch's scores: each rank's gradient of its chunk, summed."""
        self.model.zero_grad()
        self.model(data.batch["obs"]).sum().backward()
        dist.all_reduce(self.model.weight.grad)
        with torch.no_grad():
            self.model.weight -= data.meta_info["lr"] * self.model.weight.grad
        return DataProto(meta_info={"metrics": {"grad_norm": float(self.model.weight.grad.norm())}})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def weights(self):
        return self.model.weight.detach().flatten().tolist()

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def weight_sum(self):
        return float(self.model.weight.sum())

    @register(execute_mode=Execute.RANK_ZERO)
    def describe(self, tag):
        return (tag, self.rank)


class ValueWorker(Worker):
    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def pid(self):
        return os.getpid()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        return DataProto.from_dict({"values": data.batch["obs"].sum(-1) + self.offset})


def batch(rows):
    """``rows`` observations [2i, 2i + 1]; a Linear of ones scores row i as 4i + 1."""
    return DataProto.from_dict({"obs": torch.arange(2 * rows, dtype=torch.float32).reshape(rows, 2)})


@pytest.fixture(scope="module")
def linear_wg(ray_session):
    resource_pool = RayResourcePool([2], use_gpu=False, name_prefix="guide_pool")
    wg = RayWorkerGroup(resource_pool=resource_pool,
                        ray_cls_with_init=RayClassWithInitArgs(cls=ray.remote(LinearWorker), hidden=2))
    started = wg.init_model()
    yield wg, started
    wg.shutdown()
    resource_pool.remove()


def test_the_guides_worker_group_splits_by_dp_rank_and_concatenates(linear_wg):
    linear_wg, started = linear_wg
    assert linear_wg.world_size == 2
    for rank, info in enumerate(started):
        assert (info["rank"], info["world_size"], info["dist"]) == (rank, 2, (rank, 2))
        assert (info["RANK"], info["WORLD_SIZE"], info["LOCAL_RANK"]) == (str(rank), "2", str(rank))
        assert info["MASTER_ADDR"] == "127.0.0.1" and info["master"] == (info["MASTER_ADDR"], info["MASTER_PORT"])
        # one node: torch joins the store rank 0 serves on loopback (it opens none of its own on every
        # interface), and gloo's sockets listen on loopback too
        assert info["GLOO_SOCKET_IFNAME"] == "lo"
        assert info["listening"] and all(address in sockets.LOOPBACK for address in info["listening"]), info
    assert started[0]["MASTER_PORT"] == started[1]["MASTER_PORT"]

    out = linear_wg.compute_scores(batch(4))  # rows 0-1 to rank 0, rows 2-3 to rank 1
    assert out.batch["scores"].tolist() == [1.0, 5.0, 9.0, 13.0]
    assert out.batch["rank"].tolist() == [0, 0, 1, 1]
    assert out.meta_info["metrics"] == {"rows": [2, 2]}
    # 3 rows: padded with row 0 to 2 per rank, the padding's result dropped
    assert linear_wg.compute_scores(batch(3)).batch["scores"].tolist() == [1.0, 5.0, 9.0]
    assert linear_wg.describe("t") == ("t", 0)
    assert linear_wg.execute_func_rank_zero(lambda a, b: (a + b, os.environ["RANK"]), 2, b=3) == (5, "0")
    doubled = linear_wg.execute_with_func_generator(
        lambda worker, data: DataProto.from_dict({"x": data.batch["obs"][:, 0] * 2 + worker.rank}), batch(4))
    assert doubled.batch["x"].tolist() == [0.0, 4.0, 9.0, 13.0]


def test_non_blocking_calls_and_a_data_parallel_update(linear_wg):
    linear_wg, _ = linear_wg
    future = linear_wg.compute_scores_later(batch(2))
    assert not isinstance(future, DataProto)
    chained = linear_wg.execute_with_func_generator(  # a future as an argument: waited for, then split
        lambda worker, data: DataProto.from_dict({"next": data.batch["scores"] + 1}), future)
    assert chained.batch["next"].tolist() == [2.0, 6.0]
    assert future.get().batch["rank"].tolist() == [0, 1]

    data = batch(4)
    data.meta_info["lr"] = 0.1
    metrics = linear_wg.update(data).meta_info["metrics"]
    # d(sum of scores)/dw = sum of the rows = [0+2+4+6, 1+3+5+7] = [12, 16] on both ranks after the all-reduce
    assert metrics == {"grad_norm": [20.0, 20.0]}
    expected = [pytest.approx(1 - 0.1 * 12), pytest.approx(1 - 0.1 * 16)]
    assert ray.get(linear_wg.weights()) == [expected, expected]  # the original's ray.get on a non-blocking call
    assert linear_wg.weights().get() == [expected, expected]
    assert linear_wg.weight_sum() == pytest.approx(-0.8)


def test_colocated_roles_share_a_process_and_spawn_per_role_groups(ray_session):
    class_dict = {"actor": RayClassWithInitArgs(cls=ray.remote(LinearWorker), hidden=2),
                  "critic": RayClassWithInitArgs(cls=ray.remote(ValueWorker), offset=10.0)}
    resource_pool = RayResourcePool([2], use_gpu=False, name_prefix="colocated_guide_pool")
    wg_dict = RayWorkerGroup(resource_pool=resource_pool, ray_cls_with_init=create_colocated_worker_cls(class_dict))
    try:
        assert [info["dist"] for info in wg_dict.actor_init_model()] == [(0, 2), (1, 2)]  # prefixed on the fused group
        spawned = wg_dict.spawn(prefix_set=class_dict.keys())
        actor, critic = spawned["actor"], spawned["critic"]
        assert actor.compute_scores(batch(2)).batch["scores"].tolist() == [1.0, 5.0]
        assert critic.compute_values(batch(2)).batch["values"].tolist() == [11.0, 15.0]
        pids = critic.pid()
        assert len(set(pids)) == 2 and wg_dict.critic_pid() == pids
        assert ray.get([w.critic_pid.remote() for w in wg_dict.workers]) == pids
        with pytest.raises(ValueError, match=r"hosts the roles \['actor', 'critic'\], not \['rm'\]"):
            wg_dict.spawn({"rm"})
    finally:
        wg_dict.shutdown()
        resource_pool.remove()
