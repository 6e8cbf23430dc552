"""AsyncRollout (the asynchronous modes' groups in flight) against a scripted rollout: how many groups are in the
system, which groups a batch takes, what drop and wait do with groups past the staleness threshold, and what a
checkpoint keeps. Every expectation below is worked out by hand from the script."""

import random

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.async_rollout import AsyncRollout, staleness_metrics

N = 2  # samples per prompt


class ScriptedRollout:
    """Each prompt (named by its ``p`` column) needs ``lengths[p]`` rounds of decoding; one round advances every
    group in flight by one. A call decodes rounds until it has ``until_groups`` finished groups (or the groups of
    ``wait_uids``), as the engine does, and reports the versions each group generated with."""

    def __init__(self, lengths: dict[int, int], world_size: int = 1, eager: bool = False):
        self.lengths, self.world_size = lengths, world_size
        self.eager = eager  # a rollout of its own: a group starts generating when it is handed over
        self.running = [dict() for _ in range(world_size)]  # per rank: uid -> [prompt id, rounds left, first, last]
        self.calls, self.submitted, self.cancelled = [], [], []

    def __call__(self, requests: list[dict]) -> list:
        self.calls.append(requests)
        outputs = []
        for rank, request in enumerate(requests):
            running = self.running[rank]
            for uid in request["cancel_uids"]:
                self.cancelled.append(running.pop(uid)[0])
            if request["prompts"] is not None:
                for uid, p in zip(request["prompts"].non_tensor_batch["uid"], request["prompts"].non_tensor_batch["p"]):
                    start = request["version"] if self.eager else None
                    running[uid] = [int(p), self.lengths[int(p)], start, start]
                    self.submitted.append(int(p))
            finished, version = [], request["version"]
            wait = set(request["wait_uids"])
            while running and (len(finished) < request["until_groups"] or wait - set(finished)):
                for uid, state in list(running.items()):
                    state[1] -= 1
                    state[2] = version if state[2] is None else state[2]
                    state[3] = version
                    if state[1] == 0:
                        finished.append(uid)
            outputs.append((self._rows(finished, running) if finished else None, {"resumed": 0}))
            for uid in finished:
                running.pop(uid)
        return outputs

    @staticmethod
    def _rows(uids, running):
        rows = [(uid, running[uid]) for uid in uids for _ in range(N)]
        return DataProto.from_dict(
            {"responses": torch.zeros(len(rows), 3, dtype=torch.long)},
            {"uid": [u for u, _ in rows], "p": [s[0] for _, s in rows],
             "rollout_min_version": [s[2] for _, s in rows], "rollout_max_version": [s[3] for _, s in rows]})


def batches(count: int, batch_size: int):
    """The dataloader: prompts 0, 1, 2, ... in batches."""
    for start in range(0, count, batch_size):
        yield {"p": np.arange(start, min(start + batch_size, count)), "input_ids": torch.zeros(batch_size, 2)}


def scored(rows: DataProto) -> DataProto:
    rows.batch["token_level_scores"] = torch.ones(len(rows), 3)
    return rows


def make(lengths, *, threshold, strategy="drop", warmup=1, batch_size=2, count=40, world_size=1, keep_group=None,
         separate=False):
    rollout = ScriptedRollout(lengths, world_size, eager=separate)
    buffer = AsyncRollout(batch_size=batch_size, world_size=world_size, threshold=threshold, strategy=strategy,
                          warmup_batches=warmup, prompts=batches(count, batch_size), generate=rollout, score=scored,
                          keep_group=keep_group, ahead_of_update=separate)
    return buffer, rollout


def trained(batch: DataProto) -> list[int]:
    return [int(p) for p in batch.non_tensor_batch["p"][::N]]


@pytest.mark.parametrize("threshold,warmup,capacity", [(0, 1, 2), (0, 5, 2), (3, 1, 4), (2, 5, 6), (8, 0, 2)])
def test_the_system_holds_one_batch_plus_the_batches_ahead_that_the_threshold_allows(threshold, warmup, capacity):
    buffer, rollout = make(dict.fromkeys(range(40), 1), threshold=threshold, warmup=warmup)
    buffer.next_batch(0)
    assert rollout.submitted == list(range(capacity))


def test_zero_staleness_generates_and_trains_each_batch_at_one_version():
    buffer, rollout = make({p: 1 + p % 3 for p in range(40)}, threshold=0)
    for version in range(4):
        batch, metrics, _ = buffer.next_batch(version)
        assert trained(batch) == [2 * version, 2 * version + 1]  # the dataloader's batches, in order
        assert metrics["async/staleness/max"] == 0 and metrics["async/in_flight_groups"] == 0
    assert rollout.submitted == list(range(8))


def test_a_batch_takes_the_oldest_finished_groups_in_submission_order():
    # prompt 0 needs 3 rounds, prompts 1-3 need 1: the first call (until 2 groups) finishes 1, 2 and 3.
    buffer, _ = make({0: 3, 1: 1, 2: 1, 3: 1, 4: 1, 5: 1}, threshold=4)
    batch, metrics, _ = buffer.next_batch(0)
    assert trained(batch) == [1, 2]
    assert metrics["async/buffered_groups"] == 1 and metrics["async/in_flight_groups"] == 1  # 3 done, 0 running


def test_drop_replaces_a_group_past_the_threshold_and_never_trains_it():
    # Prompt 0 needs 10 rounds. Threshold 1: at version 2 it is 2 versions old and is dropped (cancelled), never
    # trained; a new prompt takes its place. The others need 1 round.
    lengths = {p: 1 for p in range(40)}
    lengths[0] = 10
    buffer, rollout = make(lengths, threshold=1)
    seen, dropped = [], 0
    for version in range(4):
        batch, metrics, _ = buffer.next_batch(version)
        seen += trained(batch)
        dropped += metrics["async/dropped_samples"]
        assert metrics["async/staleness/max"] <= 1
    assert 0 not in seen and rollout.cancelled == [0]
    assert dropped == N and sorted(seen) == seen and len(set(seen)) == len(seen)


def test_wait_trains_a_slow_group_in_time_instead_of_dropping_it():
    lengths = {p: 1 for p in range(40)}
    lengths[0] = 10
    buffer, rollout = make(lengths, threshold=1, strategy="wait")
    batch, metrics, _ = buffer.next_batch(0)
    assert trained(batch) == [1, 2] and metrics["async/waits"] == 0
    # At version 1 prompt 0 (submitted at 0) has reached the threshold: the batch waits for it, takes it first.
    batch, metrics, _ = buffer.next_batch(1)
    assert trained(batch) == [0, 3]
    assert metrics["async/waits"] == 1 and metrics["async/staleness/max"] == 1 and metrics["async/dropped_samples"] == 0
    assert rollout.calls[-1][0]["wait_uids"] and not rollout.cancelled


def test_a_rollout_of_its_own_gets_the_next_batch_before_the_update_and_one_batch_fewer_in_flight():
    # Threshold 1, one batch ahead, as the one-step-off recipe: the next groups are handed over before each update
    # (tagged with the version they are generated with), so one batch in flight is enough and trains at age 1.
    buffer, rollout = make(dict.fromkeys(range(40), 3), threshold=1, strategy="wait", separate=True)
    ages = []
    for version in range(6):
        batch, metrics, _ = buffer.next_batch(version)
        buffer.submit_ahead()
        ages.append(metrics["async/staleness/max"])
        assert metrics["async/dropped_samples"] == 0
    assert buffer.capacity == 2 and ages == [0, 1, 1, 1, 1, 1]


@pytest.mark.parametrize("separate", [False, True])
@pytest.mark.parametrize("strategy", ["drop", "wait"])
def test_no_batch_trains_a_group_older_than_the_threshold(strategy, separate):
    """Random lengths (most groups fast, some 15 rounds): younger groups overtake older ones, and wait must still
    take the older ones in time (earliest deadline first) while drop removes them."""
    for seed in range(12):
        rnd = random.Random(seed)
        lengths = {p: rnd.choice([1, 1, 2, 3, 8, 15]) for p in range(400)}
        for threshold, warmup in ((1, 1), (2, 2), (2, 5), (3, 3)):
            buffer, _ = make(lengths, threshold=threshold, strategy=strategy, warmup=warmup, batch_size=3, count=400,
                             separate=separate)
            for version in range(12):
                batch, metrics, _ = buffer.next_batch(version)
                buffer.submit_ahead()
                assert metrics["async/staleness/max"] <= threshold, (seed, threshold, warmup, version)
                assert len(batch) == 3 * N


def test_groups_are_spread_over_ranks_in_contiguous_chunks():
    buffer, rollout = make(dict.fromkeys(range(40), 1), threshold=0, batch_size=4, world_size=2)
    buffer.next_batch(0)
    first = rollout.calls[0]
    assert [list(r["prompts"].non_tensor_batch["p"]) for r in first] == [[0, 1], [2, 3]]  # as the synchronous split
    assert [r["until_groups"] for r in first] == [2, 2]


def test_dynamic_sampling_replaces_groups_the_filter_refuses():
    buffer, rollout = make(dict.fromkeys(range(40), 1), threshold=0,
                           keep_group=lambda rows: int(rows.non_tensor_batch["p"][0]) % 2 == 0)
    batch, metrics, _ = buffer.next_batch(0)
    assert trained(batch) == [0, 2] and metrics["async/filtered_groups"] == 1
    assert rollout.submitted == [0, 1, 2]


def test_a_checkpoint_keeps_finished_groups_and_resubmits_the_rest_so_no_prompt_is_lost_or_repeated():
    lengths = {p: 1 + (p % 4 == 1) * 2 for p in range(40)}  # prompts 1, 5, 9, ... take 3 rounds
    buffer, _ = make(lengths, threshold=3, warmup=2)
    seen = []
    for version in range(3):
        seen += trained(buffer.next_batch(version)[0])
    state = buffer.state_dict()
    held = sorted(int(g["prompt"].non_tensor_batch["p"][0]) for g in state["groups"])
    queued = [int(q.non_tensor_batch["p"][0]) for q in state["queue"]]

    # The resumed run: a fresh rollout, the dataloader past the prompts already taken.
    taken = len(seen) + len(held) + len(queued)
    resumed, rollout = make(lengths, threshold=3, warmup=2)
    resumed.prompts = batches(40, 2)
    for _ in range(taken // 2):
        next(resumed.prompts)
    resumed.load_state_dict(state, version=3)
    finished_before = {int(g["prompt"].non_tensor_batch["p"][0]) for g in state["groups"] if g["rows"] is not None}
    later = []
    for version in range(3, 8):
        later += trained(resumed.next_batch(version)[0])
    everything = seen + later
    assert len(everything) == len(set(everything))  # nothing trained twice
    assert set(held) <= set(everything)  # everything held at the checkpoint was trained after it
    assert not finished_before & set(rollout.submitted)  # finished groups were not generated again
    assert set(range(taken)) <= set(everything)  # every prompt taken before the checkpoint was trained


def test_staleness_metrics_are_the_ages_of_the_oldest_and_newest_tokens():
    batch = DataProto.from_dict({"responses": torch.zeros(4, 1)}, {"rollout_min_version": [3, 3, 5, 1],
                                                                  "rollout_max_version": [3, 4, 5, 5]})
    m = staleness_metrics(batch, version=5)
    # worst ages 2, 2, 0, 4; newest ages 2, 1, 0, 0; spans 1, 2, 1, 5
    assert m["async/staleness/mean"] == 2.0 and m["async/staleness/max"] == 4.0
    assert m["training/off_policy/trajectory_staleness_worst/min"] == 0.0
    assert m["training/off_policy/trajectory_staleness/mean"] == 0.75
    assert m["training/off_policy/trajectory_spans/mean"] == 2.25 and m["training/off_policy/trajectory_spans/max"] == 5
