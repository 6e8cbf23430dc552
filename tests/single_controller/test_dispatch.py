"""Dispatch and collect of every mode, on an in-process fake group of several ranks (no Ray)."""

import pytest
import torch

from verl.protocol import DataProto
from verl.single_controller import (
    DataProtoFuture,
    Dispatch,
    Execute,
    Worker,
    WorkerFuture,
    WorkerGroup,
    register,
    register_dispatch_mode,
)


class RecordingWorker:
    def __init__(self, rank):
        self.rank, self.calls = rank, []

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data):
        self.calls.append(("double", len(data)))
        data.batch["x"] = data.batch["x"] * 2
        data.batch["rank"] = torch.full((len(data),), self.rank)
        return data

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def sample(self, data, n):
        return data.repeat(n, interleave=True)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def broken(self, data):
        return data.slice(0, 1)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def rows(self, data, tag):
        return {"rank": self.rank, "rows": len(data), "tag": tag}

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def shard(self, item, plus=0):
        return item * 10 + self.rank + plus

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def whoami(self):
        self.calls.append("whoami")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init(self, value):
        return (self.rank, value)

    @register()
    def describe(self, value):
        return (self.rank, value)

    @register(dispatch_mode=Dispatch.DP_COMPUTE, execute_mode=Execute.RANK_ZERO)
    def first_shard(self, item):
        return item

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_later(self, data):
        return self.double(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    def init_later(self, value):
        return self.init(value)


class FakeGroup(WorkerGroup):
    """Every rank's worker in this process; calls run at submit time."""

    def __init__(self, world_size, worker_cls=RecordingWorker, workers=None):
        super().__init__(worker_cls, "fake")
        self.workers = workers if workers is not None else [worker_cls(rank) for rank in range(world_size)]

    @property
    def world_size(self):
        return len(self.workers)

    def _submit(self, method, calls):
        return [getattr(self.workers[r], method)(*a, **k) for r, a, k in calls]

    def _wait(self, method, ranks, handles):
        return handles

    def shutdown(self):
        pass


def make_batch(n):
    return DataProto.from_dict({"x": torch.arange(n, dtype=torch.float32)},
                               {"uid": [f"u{i}" for i in range(n)]})


def test_dp_compute_proto_pads_chunks_and_unpads():
    group = FakeGroup(2)
    out = group.double(make_batch(5))
    assert [w.calls for w in group.workers] == [[("double", 3)], [("double", 3)]]
    assert out.batch["x"].tolist() == [0, 2, 4, 6, 8]
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1]
    assert out.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u3", "u4"]


def test_dp_compute_proto_unpads_methods_that_return_several_rows_per_input_row():
    # 5 prompts over 2 ranks: one padding row; with 3 samples per prompt its 3 outputs go.
    out = FakeGroup(2).sample(make_batch(5), n=3)
    assert out.non_tensor_batch["uid"].tolist() == [f"u{i}" for i in range(5) for _ in range(3)]
    with pytest.raises(ValueError, match="whole number of rows per input row"):
        FakeGroup(2).broken(make_batch(5))


def test_dp_compute_proto_three_ranks_no_padding_needed():
    out = FakeGroup(3).double(make_batch(6))
    assert out.batch["rank"].tolist() == [0, 0, 1, 1, 2, 2]


def test_dp_compute_metric_returns_per_rank_results():
    assert FakeGroup(2).rows(make_batch(5), tag="t") == [
        {"rank": 0, "rows": 3, "tag": "t"}, {"rank": 1, "rows": 3, "tag": "t"}]


def test_dp_compute_proto_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="same length"):
        FakeGroup(2).rows(make_batch(4), make_batch(3))


def test_dp_compute_splits_lists_by_rank():
    group = FakeGroup(2)
    assert group.shard([1, 2], plus=[100, 200]) == [110, 221]
    with pytest.raises(ValueError, match=r"one entry per rank \(2\); argument 0 is a list of length 3"):
        group.shard([1, 2, 3])
    with pytest.raises(ValueError, match="argument 0 is a int"):
        group.shard(5)


def test_rank_zero_runs_only_on_rank_zero():
    group = FakeGroup(3)
    assert group.whoami() == 0
    assert [w.calls for w in group.workers] == [["whoami"], [], []]
    assert group.first_shard(["a", "b", "c"]) == "a"


def test_one_to_all_and_all_to_all_replicate_and_list():
    group = FakeGroup(2)
    assert group.init("cfg") == [(0, "cfg"), (1, "cfg")]
    assert group.describe(value=7) == [(0, 7), (1, 7)]
    assert group.execute_all("describe", 3) == [(0, 3), (1, 3)]
    assert group.execute_rank_zero("describe", 4) == (0, 4)


def test_non_blocking_returns_futures_that_chain():
    group = FakeGroup(2)
    future = group.double_later(make_batch(5))
    assert isinstance(future, DataProtoFuture)
    assert future.get().batch["x"].tolist() == [0, 2, 4, 6, 8]
    again = group.double(future)  # a future argument is waited for first
    assert again.batch["x"].tolist() == [0, 4, 8, 12, 16]
    plain = group.init_later(1)
    assert type(plain) is WorkerFuture and plain.get() == [(0, 1), (1, 1)]


def test_custom_dispatch_mode():
    def dispatch_reversed(worker_group, items):
        return [list(reversed(items))], {}

    def collect_sum(worker_group, outputs):
        return sum(outputs)

    name = register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)
    assert Dispatch.TEST_REVERSED_SUM == name
    with pytest.raises(ValueError, match="already exists"):
        register_dispatch_mode("TEST_REVERSED_SUM", dispatch_reversed, collect_sum)

    class Custom:
        def __init__(self, rank):
            self.rank = rank

        @register(dispatch_mode=Dispatch.TEST_REVERSED_SUM)
        def scaled(self, item):
            return item * (self.rank + 1)

    assert FakeGroup(2, Custom).scaled([1, 10]) == 10 * 1 + 1 * 2


def test_register_fails_early_on_bad_declarations():
    with pytest.raises(ValueError, match="unknown dispatch mode 'DP_COMPUTE_PROTOO'"):
        register(dispatch_mode="DP_COMPUTE_PROTOO")
    with pytest.raises(TypeError, match="async"):
        class Async:
            @register()
            async def go(self):
                pass

    class Clash:
        @register()
        def execute_all(self):
            pass

    with pytest.raises(TypeError, match="clashes with WorkerGroup.execute_all"):
        FakeGroup(1, Clash)


def test_proto_collect_needs_dataprotos():
    class Bad:
        def __init__(self, rank):
            pass

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def go(self, data):
            return {"not": "a DataProto"}

    with pytest.raises(TypeError, match="use Dispatch.DP_COMPUTE_METRIC"):
        FakeGroup(2, Bad).go(make_batch(2))


def test_metrics_from_ranks_are_merged():
    class Metrics:
        def __init__(self, rank):
            self.rank = rank

        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def go(self, data):
            data.meta_info["metrics"] = {"loss": float(self.rank)}
            return data

    out = FakeGroup(2, Metrics).go(make_batch(4))
    assert out.meta_info["metrics"] == {"loss": [0.0, 1.0]}


def test_worker_defaults_without_a_group(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "VERL_DEVICE"):
        monkeypatch.delenv(key, raising=False)
    w = Worker()
    assert (w.rank, w.world_size, w.local_rank) == (0, 1, 0)
    monkeypatch.setenv("VERL_DEVICE", "tpu")
    with pytest.raises(ValueError, match="expected 'cpu' or 'cuda'"):
        Worker()


def test_a_mode_given_inline_as_a_dict_as_in_the_original():
    class Inline:
        def __init__(self, rank):
            self.rank = rank

        @register(dispatch_mode={"dispatch_fn": lambda wg, item: ([[item + r for r in range(wg.world_size)]], {}),
                                 "collect_fn": lambda wg, outputs: max(outputs)})
        def shifted(self, item):
            return item * 10 + self.rank

    assert FakeGroup(3, Inline).shifted(1) == 3 * 10 + 2  # rank r gets 1 + r
    with pytest.raises(ValueError, match="callable 'dispatch_fn' and 'collect_fn'"):
        register(dispatch_mode={"dispatch_fn": len})


def test_dp_compute_proto_with_func_sends_the_function_and_splits_the_rest():
    workers = [Worker(), Worker()]
    workers[1].rank = 1
    group = FakeGroup(2, Worker, workers)  # Worker.execute_with_func_generator, as the original's Worker has
    out = group.execute_with_func_generator(lambda worker, data, k: data.repeat(k), make_batch(3), k=2)
    assert out.batch["x"].tolist() == [0, 0, 1, 1, 2, 2]  # 3 rows padded to 4, 2 results per row, padding dropped
    assert group.execute_func_rank_zero(lambda a, b: a * b, 6, b=7) == 42
    with pytest.raises(TypeError, match="takes a function as its first argument.*got a DataProto"):
        group.execute_with_func_generator(make_batch(2))


def test_colocated_forwarders_keep_each_role_methods_registration():
    from verl.single_controller.worker_group import ClassWithInitArgs, colocated_worker_class

    roles = {"actor": ClassWithInitArgs(RecordingWorker, 0), "critic": ClassWithInitArgs(RecordingWorker, 1)}
    host = colocated_worker_class(roles)
    assert host.role_classes == {"actor": RecordingWorker, "critic": RecordingWorker}
    group = FakeGroup(1, host, [host(roles)])  # a group of the fused class has every role's methods, prefixed
    assert group.critic_whoami() == 1 and group.actor_double(make_batch(2)).batch["x"].tolist() == [0, 2]


def test_resource_pool_counts_workers_per_node():
    from verl.single_controller import ResourcePool

    pool = ResourcePool([2, 3])
    assert pool.world_size == 5
    assert pool.local_world_size_list() == [2, 2, 3, 3, 3]
    assert pool.local_rank_list() == [0, 1, 0, 1, 2]
    with pytest.raises(ValueError, match="positive worker counts per node"):
        ResourcePool([2, 0])


def test_a_multi_rank_worker_without_a_group_says_how_to_start_one(monkeypatch):
    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("VERL_RANK0_HOSTS_STORE", raising=False)
    with pytest.raises(RuntimeError, match="WORLD_SIZE=2 but no rendezvous.*through a WorkerGroup"):
        Worker().init_process_group()
