"""WeightSyncGroup over loopback (gloo on CPU, NCCL where two GPUs or more), and applying received weights to a module.

A sender and two receivers (on CUDA: one per spare GPU) run in spawned processes, once per device type; each first
sets up a default process group of its own (world size 1), as the trainer's FSDP ranks and the rollout workers do,
so the sync group must work beside it without touching it. The processes report plain values; the tests below
assert on them.
"""

import faulthandler
import multiprocessing
import os
import queue
import socket
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from verl.checkpoint_engine import WeightLoader, WeightSyncGroup, apply_weights, drain

BUCKET = 1024
DEADLINE = 60  # seconds for the whole spawned run; the group's own timeout is shorter, so a hang fails first


def make_weights(device="cpu"):
    """The same mix on every process: dtypes, specials, non-contiguous views, a tensor over a bucket, many small."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=g).to(device)

    return [
        ("bf16", randn(3, 5).bfloat16()),
        ("fp32_specials", torch.tensor([float("nan"), -0.0, float("inf"), 1e-45], device=device)),
        ("fp32_scalar", torch.tensor(1.5, device=device)),
        ("int64", torch.randint(-2**40, 2**40, (4, 4), generator=g).to(device)),
        ("int32", torch.randint(-100, 100, (9,), generator=g, dtype=torch.int32).to(device)),
        ("bool", randn(7) > 0.5),
        ("transposed", randn(8, 6).t()),
        ("strided", randn(4, 10)[:, ::3]),
        ("empty", torch.empty(0, 3, device=device)),
        ("bigger_than_bucket", randn(600)),
        *[(f"small.{i}", randn(3).half()) for i in range(40)],
    ]


class TinyModel(torch.nn.Module):
    """Parameters, persistent buffers (one of them int64) and a tied weight: all that apply_weights must fill."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.embed = torch.nn.Embedding(11, 4)
        self.norm = torch.nn.BatchNorm1d(4)
        self.head = torch.nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight
        self.norm(torch.randn(5, 4))  # moves the running statistics off their defaults


def bits(tensor):
    return tensor.contiguous().view(-1).view(torch.uint8)


def mismatches(expected, received):
    """Names whose name order, dtype, shape or bytes differ: an empty list means bit-identical."""
    if [name for name, _ in expected] != [name for name, _ in received]:
        return ["names or order differ"]
    return [name for (name, want), (_, got) in zip(expected, received)
            if want.dtype != got.dtype or want.shape != got.shape or not torch.equal(bits(want), bits(got.cpu()))]


def lazily(named_tensors, pause=0.0):
    """A generator, as the trainer's FSDP gather is; the pause stands in for the gather's time."""
    for item in named_tensors:
        time.sleep(pause)
        yield item


def failing_after(count):
    yield from make_weights()[:count]
    raise RuntimeError("gather failed")


def sender(group):
    weights = make_weights(group.device)
    report = {"weights": group.send(lazily(weights, pause=0.01), BUCKET)}
    group.send(TinyModel(seed=0).to(group.device).state_dict().items(), BUCKET)
    try:
        group.send(failing_after(3), BUCKET)
    except RuntimeError as error:
        report["failure"] = str(error)
    report["after_receiver_failure"] = group.send(weights, BUCKET)
    try:
        group.receive()
    except RuntimeError as error:
        report["wrong_call"] = str(error)
    return report


def receiver(group):
    """Rank 1 receives in a background thread and applies bucket by bucket; rank 2 takes whole lists."""
    report = {}
    if group.rank == 1:
        buckets, matmuls = [], 0
        x = torch.randn(64, 64, device=group.device)
        reference = x @ x
        with ThreadPoolExecutor(1) as pool:
            receiving = pool.submit(group.receive, on_bucket=buckets.append)
            while not receiving.done():
                matmuls += int(torch.equal(x @ x, reference))
            receiving.result()  # re-raises here whatever the thread raised
        report["weights"] = mismatches(make_weights(), [item for bucket in buckets for item in bucket])
        report["buckets"] = [([name for name, _ in bucket], sum(bits(t).numel() for _, t in bucket))
                             for bucket in buckets]
        report["matmuls_during_receive"] = matmuls
    else:
        report["weights"] = mismatches(make_weights(), group.receive())

    model = TinyModel(seed=1).to(group.device)
    if group.rank == 1:
        loader = WeightLoader(model)
        group.receive(on_bucket=loader)
        loader.finish()
    else:
        apply_weights(model, group.receive())
    report["model"] = mismatches(list(TinyModel(seed=0).state_dict().items()), list(model.state_dict().items()))

    try:
        group.receive()
    except RuntimeError as error:
        report["failure"] = str(error)

    def refuse(bucket):
        raise ValueError("on_bucket refused")

    try:
        received = group.receive(on_bucket=refuse if group.rank == 1 else None)
        report["after_failure"] = mismatches(make_weights(), received)
    except ValueError as error:
        report["after_failure"] = str(error)
    try:
        group.send(make_weights(), BUCKET)
    except RuntimeError as error:
        report["wrong_call"] = str(error)
    return report


def process(rank, world_size, device_type, port, folder, results):
    faulthandler.dump_traceback_later(DEADLINE - 5, exit=True)  # a hung process shows where it waits
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    try:
        device = torch.device(f"cuda:{rank}" if device_type == "cuda" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group("gloo", init_method=f"file://{folder}/default_group_{rank}", rank=0, world_size=1)
        with WeightSyncGroup(f"tcp://127.0.0.1:{port}", rank, world_size, device, timeout=20) as group:
            report = sender(group) if rank == 0 else receiver(group)
        total = torch.ones(1)
        dist.all_reduce(total)
        report["default_group"] = (dist.get_world_size(), total.item())
        dist.destroy_process_group()
        results.put((rank, report))
    except BaseException:
        results.put((rank, {"error": traceback.format_exc()}))


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def receivers_on(device_type):
    """Two receivers on CPU; on CUDA one per spare GPU, at most two (NCCL wants one GPU per process)."""
    return 2 if device_type == "cpu" else min(2, torch.cuda.device_count() - 1)


@pytest.fixture(scope="module", params=[
    "cpu",
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        torch.cuda.device_count() < 2, reason="NCCL needs a GPU for the sender and one per receiver")]),
])
def reports(request, tmp_path_factory):
    """Runs the sender and the receivers once per device type; {rank: report}.

    Spawned, not forked: forking a process that already ran torch code can deadlock the child.
    """
    world_size = 1 + receivers_on(request.param)
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    folder = tmp_path_factory.mktemp("weight_sync")
    root = str(Path(__file__).resolve().parents[2])  # the children import this module as tests.checkpoint_engine...
    sys.path.insert(0, root)
    port = free_port()
    try:
        processes = [context.Process(target=process, args=(rank, world_size, request.param, port, folder, results))
                     for rank in range(world_size)]
        for p in processes:
            p.start()
    finally:
        sys.path.remove(root)
    deadline = time.monotonic() + DEADLINE
    collected = {}
    try:
        while len(collected) < world_size:
            rank, report = results.get(timeout=max(deadline - time.monotonic(), 0.1))
            collected[rank] = report
    except queue.Empty:
        pytest.fail(f"weight-sync ranks {sorted(set(range(world_size)) - set(collected))} reported nothing within "
                    f"{DEADLINE} s (exit codes {[p.exitcode for p in processes]})")
    finally:
        for p in processes:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    errors = {rank: report["error"] for rank, report in collected.items() if "error" in report}
    assert not errors, "\n".join(f"rank {rank}:\n{error}" for rank, error in errors.items())
    return collected


def receiving(reports):
    return [reports[rank] for rank in reports if rank > 0]


def test_weights_arrive_bit_identical_in_buckets(reports):
    assert all(report["weights"] == [] for report in receiving(reports))
    stats = reports[0]["weights"]
    assert stats["tensors"] == len(make_weights())
    assert stats["bytes"] >= sum(bits(t).numel() for _, t in make_weights())
    buckets = reports[1]["buckets"]
    assert stats["buckets"] == len(buckets) < len(make_weights())  # the small tensors share buckets
    assert (["bigger_than_bucket"], 2400) in buckets
    assert all(nbytes <= BUCKET for names, nbytes in buckets if len(names) > 1)


def test_receive_in_a_background_thread_while_the_main_thread_computes(reports):
    assert reports[1]["weights"] == []
    assert reports[1]["matmuls_during_receive"] > 0


def test_applied_weights_equal_the_senders_state_dict(reports):
    assert all(report["model"] == [] for report in receiving(reports))  # WeightLoader on rank 1, apply_weights on 2


def test_a_failing_sender_reaches_the_receivers_and_the_group_survives(reports):
    assert reports[0]["failure"] == "gather failed"
    assert all("sender (trainer rank 0) failed midway" in report["failure"] for report in receiving(reports))
    assert reports[0]["after_receiver_failure"]["tensors"] == len(make_weights())


def test_a_failing_on_bucket_still_drains_the_send(reports):
    assert reports[1]["after_failure"] == "on_bucket refused"
    assert all(reports[rank]["after_failure"] == [] for rank in reports if rank > 1)


def test_each_end_refuses_the_other_ends_call(reports):
    assert reports[0]["wrong_call"].startswith("WeightSyncGroup rank 0 called receive(): rank 0 (trainer rank 0) sends")
    assert reports[1]["wrong_call"].startswith("WeightSyncGroup rank 1 called send()")


def test_the_default_process_groups_are_untouched(reports):
    assert all(report["default_group"] == (1, 1.0) for report in reports.values())


def test_drain_steps_through_the_whole_iterator():
    gathered = []

    def gather():
        for name, tensor in make_weights():
            gathered.append(name)
            yield name, tensor

    drain(gather())
    assert gathered == [name for name, _ in make_weights()]


def test_apply_weights_names_the_unexpected_weight():
    weights = {**TinyModel(seed=0).state_dict(), "lm_head.weight": torch.zeros(11, 4)}
    with pytest.raises(ValueError, match=r"'lm_head.weight' is not a parameter.*model.path"):
        apply_weights(TinyModel(seed=1), weights.items())


def test_apply_weights_names_the_shape_mismatch():
    weights = {**TinyModel(seed=0).state_dict(), "embed.weight": torch.zeros(12, 4)}
    with pytest.raises(ValueError, match=r"'embed.weight' has shape \(12, 4\), .* has \(11, 4\).*model.path"):
        apply_weights(TinyModel(seed=1), weights.items())


def test_apply_weights_names_the_missing_weight():
    weights = TinyModel(seed=0).state_dict()
    del weights["norm.running_var"]
    with pytest.raises(ValueError, match=r"1 weight\(s\) .* not received, e.g. \['norm.running_var'\]"):
        apply_weights(TinyModel(seed=1), weights.items())


def test_a_tied_weight_is_filled_under_either_name():
    weights = TinyModel(seed=0).state_dict()
    del weights["head.weight"]
    model = TinyModel(seed=1)
    apply_weights(model, weights.items())
    assert torch.equal(model.head.weight, weights["embed.weight"])


def test_bad_addresses_say_what_to_give():
    with pytest.raises(ValueError, match="tcp://HOST:PORT"):
        WeightSyncGroup("127.0.0.1:29500", 0, 2)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        with pytest.raises(RuntimeError, match="cannot listen on 127.0.0.1"):
            WeightSyncGroup(f"tcp://127.0.0.1:{taken.getsockname()[1]}", 0, 2)
    with pytest.raises(RuntimeError, match="could not reach the weight-sync store"):
        WeightSyncGroup(f"tcp://127.0.0.1:{free_port()}", 1, 2, timeout=1)
