"""Prompt groups of the asynchronous trainer modes (``trainer.v1.trainer_mode=colocate_async|separate_async``),
from the dataloader to a training batch.

A group (one prompt, ``rollout.n`` samples) is submitted to a rollout rank, runs there while other groups run and
while the policy is updated (its unfinished samples go on with the new weights: partial rollout), comes back
finished, is scored here, and waits until a training batch takes it. Batches take the oldest finished groups first.

**Versions and staleness.** The policy version is the number of actor updates so far; the rollout's version is the
version of the weights it generates with (the same when colocated; behind by the weight syncs still to come when
separate). A group is tagged with the rollout's version when it is submitted, and, once finished, with the oldest
version any of its tokens came from. A batch trained at version ``v`` takes only groups of age ``v - tag <=
trainer.v1.sampler.max_off_policy_threshold``:

- ``drop``: a group past the threshold, finished or not, is dropped (its rollout cancelled) and a new prompt
  takes its place;
- ``wait``: nothing is dropped; a batch takes the groups without which some group could no longer be trained in
  time (one batch per version, earliest deadline first, finished ones preferred among equals), waiting for the
  ones among them still in flight, and fills up with the oldest finished groups.

**How many groups are in the system** (in flight, or finished and not trained yet): ``1 + num_warmup_batches``
batches, but never more than a new group could still be trained within the threshold, so ``(1 +
min(num_warmup_batches, threshold)) x data.train_batch_size``. With a threshold of 0 that is one batch, generated
and trained at the same version: the synchronous trainer, step for step. A rollout of its own is handed the next
groups before the update (:meth:`AsyncRollout.submit_ahead`), a version earlier: one batch fewer then, ``min(1 +
num_warmup_batches, threshold)`` batches (at least one).

The rollout itself is reached through ``generate(requests)``: one request per rollout rank (new prompts, groups to
cancel, how many groups to finish, which groups to wait for), one ``(finished rows or None, statistics)`` back
from each (:meth:`verl.workers.fsdp_workers.ActorRolloutRefWorker.generate_stream`).
"""

from __future__ import annotations

import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np

from verl.protocol import DataProto

__all__ = ["AsyncRollout", "staleness_metrics"]


@dataclass
class _Group:
    uid: str
    seq: int  # submission order: batches take the oldest first
    version: int  # the rollout's weights at submission; once finished, the oldest its tokens came from
    rank: int  # the rollout rank it runs on
    prompt: DataProto  # its prompt's row, as the dataloader gave it (for a resumed run to submit again)
    rows: DataProto | None = None  # once finished: its n rows, scored
    sent: bool = False  # whether its rank has it (else it is submitted with the next request)


class AsyncRollout:
    """See the module docstring.

    Args:
        batch_size: groups per training batch (``data.train_batch_size``).
        world_size: rollout ranks.
        threshold / strategy: ``trainer.v1.sampler.max_off_policy_threshold`` / ``max_off_policy_strategy``.
        warmup_batches: the mode's ``num_warmup_batches``.
        prompts: batches of prompts (the dataloader's dicts), epoch after epoch.
        generate: sends one request per rank to the rollout; returns one ``(DataProto | None, stats)`` per rank.
        score: adds ``token_level_scores`` (and the reward's extra info) to finished rows.
        keep_group: DAPO's dynamic sampling: whether a finished, scored group may be trained (else it is
            replaced by a new prompt); None keeps every group.
        ahead_of_update: the rollout runs on devices of its own and :meth:`submit_ahead` hands it the next groups
            before each update (``separate_async``).
    """

    def __init__(self, *, batch_size: int, world_size: int, threshold: int, strategy: str, warmup_batches: int,
                 prompts: Iterator[dict], generate: Callable[[list[dict]], list],
                 score: Callable[[DataProto], DataProto], keep_group: Callable[[DataProto], bool] | None = None,
                 ahead_of_update: bool = False):
        self.batch_size, self.world_size = batch_size, world_size
        self.threshold, self.strategy = threshold, strategy
        self.ahead_of_update = ahead_of_update and threshold > 0
        batches = max(1, min(1 + warmup_batches, threshold)) if self.ahead_of_update else \
            1 + min(warmup_batches, threshold)
        self.capacity = batches * batch_size
        self.prompts, self.generate, self.score, self.keep_group = prompts, generate, score, keep_group
        self.groups: dict[str, _Group] = {}  # untrained groups, in submission order
        self.queue: deque[DataProto] = deque()  # prompts taken from the dataloader, not submitted yet
        self.cancel: list[list[str]] = [[] for _ in range(world_size)]  # per rank: dropped groups still running
        self.seq = 0
        self.version = 0  # the policy's
        self.rollout_version = 0  # the weights the rollout generates with
        self.exhausted = False

    # ------------------------------------------------------------------ one training batch
    def next_batch(self, version: int, rollout_version: int | None = None) -> tuple[DataProto, dict, float]:
        """The oldest ``batch_size`` finished groups of age ``<= threshold`` at policy ``version``, their rows in
        submission order; the step's metrics; the seconds spent waiting for the rollout. Raises StopIteration when
        the data is used up and too few groups are left."""
        self.version = version
        self.rollout_version = version if rollout_version is None else rollout_version
        counts = dict.fromkeys(("dropped", "filtered", "waits", "calls", "resumed_rows"), 0)
        waited = generation = resume_prefill = 0.0
        while True:
            counts["dropped"] += self._drop_stale()
            self._refill()
            ready = [g for g in self.groups.values() if g.rows is not None]
            overdue = []
            if len(ready) >= self.batch_size:
                if self.strategy != "wait":
                    break
                overdue = [g for g in self._due() if g.rows is None]
                if not overdue:
                    break
            elif len(ready) == len(self.groups):
                raise StopIteration(f"the data is used up: {len(ready)} finished groups left, fewer than "
                                    f"data.train_batch_size={self.batch_size}")
            tic = time.perf_counter()
            outputs = self.generate(self._requests(self.batch_size - len(ready), overdue))
            seconds = time.perf_counter() - tic
            generation += seconds
            counts["calls"] += 1
            if overdue:  # a call that also had to finish the groups at the threshold
                counts["waits"] += 1
                waited += seconds
            finished = [out for out, _ in outputs if out is not None]
            for _, stats in outputs:
                counts["resumed_rows"] += int(stats.get("resumed", 0))
                resume_prefill = max(resume_prefill, float(stats.get("resume_prefill_s", 0.0)))
            if finished:
                counts["filtered"] += self._finish(DataProto.concat(finished))
        due = self._due() if self.strategy == "wait" else []
        taken = {g.uid for g in due}
        rest = [g for g in sorted(ready, key=lambda g: g.seq) if g.uid not in taken]
        chosen = sorted(due + rest[: self.batch_size - len(due)], key=lambda g: g.seq)
        for g in chosen:
            del self.groups[g.uid]
        batch = DataProto.concat([g.rows for g in chosen])
        n = len(batch) // len(chosen)
        metrics = staleness_metrics(batch, version)
        metrics.update({
            "async/dropped_samples": counts["dropped"] * n, "training/off_policy/evicted_samples": counts["dropped"],
            "async/filtered_groups": counts["filtered"], "async/waits": counts["waits"], "async/wait_s": waited,
            "async/generate_calls": counts["calls"], "async/resumed_rows": counts["resumed_rows"],
            "async/resume_prefill_s": resume_prefill,
            "async/in_flight_groups": sum(g.rows is None for g in self.groups.values()),
            "async/buffered_groups": sum(g.rows is not None for g in self.groups.values()),
        })
        return batch, metrics, generation

    def submit_ahead(self) -> None:
        """Hand the rollout the prompts that refill the system now, without waiting for any group (a rollout on
        devices of its own then decodes them while the trainer trains); what has finished meanwhile is kept.
        With a threshold of 0 nothing is: a group generated before the coming update could not be trained after it."""
        if not self.ahead_of_update:
            return
        self._refill()
        finished = [out for out, _ in self.generate(self._requests(0, [])) if out is not None]
        if finished:
            self._finish(DataProto.concat(finished))

    def _due(self) -> list[_Group]:
        """The groups this batch must take so that every group can still be trained by its deadline (its version
        plus the threshold) at one batch per version: earliest deadline first, finished ones first among equals."""
        groups = sorted(self.groups.values(), key=lambda g: (g.version, g.rows is None, g.seq))
        # The first i + 1 groups must all be trained by the batch of version groups[i].version + threshold; what
        # the later batches cannot take must be taken now, and taking the earliest keeps that true for every i.
        need = max((i + 1 - (g.version + self.threshold - self.version) * self.batch_size
                    for i, g in enumerate(groups)), default=0)
        return groups[:max(0, min(self.batch_size, need))]

    def _drop_stale(self) -> int:
        if self.strategy != "drop":
            return 0
        stale = [g for g in self.groups.values() if self.version - g.version > self.threshold]
        for g in stale:
            del self.groups[g.uid]
            if g.rows is None and g.sent:
                self.cancel[g.rank].append(g.uid)
        return len(stale)

    def _refill(self) -> None:
        """Submit new prompts until the system holds ``capacity`` groups; each goes to the rank with the fewest
        (the lowest such rank first, so a fresh batch is cut into contiguous chunks as the synchronous split)."""
        per_rank = [0] * self.world_size
        for g in self.groups.values():
            per_rank[g.rank] += 1
        target = math.ceil(self.capacity / self.world_size)
        while len(self.groups) < self.capacity and self._has_prompt():
            rank = next((r for r in range(self.world_size) if per_rank[r] < target), int(np.argmin(per_rank)))
            per_rank[rank] += 1
            self._add(self.queue.popleft(), rank, self.rollout_version)

    def _has_prompt(self) -> bool:
        while not self.queue and not self.exhausted:
            try:
                batch = DataProto.from_single_dict(next(self.prompts))
            except StopIteration:
                self.exhausted = True
                break
            self.queue.extend(batch[i:i + 1] for i in range(len(batch)))
        return bool(self.queue)

    def _add(self, prompt: DataProto, rank: int, version: int, seq: int | None = None) -> None:
        uid = uuid.uuid4().hex
        if seq is None:
            seq, self.seq = self.seq, self.seq + 1
        self.groups[uid] = _Group(uid, seq, version, rank, prompt)

    def _requests(self, needed: int, overdue: list[_Group]) -> list[dict]:
        requests = []
        for rank in range(self.world_size):
            new = [g for g in self.groups.values() if g.rank == rank and not g.sent]
            prompts = None
            if new:
                prompts = DataProto.concat([g.prompt for g in new])
                prompts.non_tensor_batch["uid"] = np.array([g.uid for g in new], dtype=object)
                prompts.meta_info = {}
                for g in new:
                    g.sent = True
            requests.append({"prompts": prompts, "version": self.rollout_version,
                             "until_groups": max(0, math.ceil(needed / self.world_size)),
                             "wait_uids": [g.uid for g in overdue if g.rank == rank],
                             "cancel_uids": self.cancel[rank]})
            self.cancel[rank] = []
        return requests

    def _finish(self, rows: DataProto) -> int:
        """Score finished rows and file them under their groups; returns how many groups DAPO's filter dropped."""
        rows = self.score(rows)
        uids = rows.non_tensor_batch["uid"]
        filtered = 0
        for uid in dict.fromkeys(uids):
            group = self.groups.get(uid)
            if group is None:  # dropped while its last call ran
                continue
            mine = rows.select_idxs(uids == uid)
            if self.keep_group is not None and not self.keep_group(mine):
                del self.groups[uid]
                filtered += 1
                continue
            group.rows = mine
            group.version = int(np.min(mine.non_tensor_batch["rollout_min_version"]))
        return filtered

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict:
        """Finished groups as they are; groups in flight and queued prompts as prompts (their partial rollouts
        are not kept: a resumed run submits them again)."""
        return {"seq": self.seq, "queue": list(self.queue),
                "groups": [{"seq": g.seq, "version": g.version, "rank": g.rank, "prompt": g.prompt, "rows": g.rows}
                           for g in self.groups.values()]}

    def load_state_dict(self, state: dict, version: int) -> None:
        self.seq, self.queue = int(state["seq"]), deque(state["queue"])
        self.groups.clear()
        for g in sorted(state["groups"], key=lambda g: g["seq"]):
            rank = g["rank"] % self.world_size
            if g["rows"] is None:  # submitted again, from scratch, with the weights of now
                self._add(g["prompt"], rank, version, seq=g["seq"])
            else:
                uid = str(g["rows"].non_tensor_batch["uid"][0])
                self.groups[uid] = _Group(uid, g["seq"], g["version"], rank, g["prompt"], g["rows"], sent=True)


def staleness_metrics(batch: DataProto, version: int) -> dict:
    """Ages of a batch's samples at policy ``version``, from the versions their tokens came from: ``async/staleness``
    (worst case: the oldest token; what the threshold bounds) and the original's ``training/off_policy/*``."""
    first = batch.non_tensor_batch["rollout_min_version"].astype(np.int64)
    last = batch.non_tensor_batch["rollout_max_version"].astype(np.int64)
    worst, newest, spans = version - first, version - last, last - first + 1
    metrics = {"async/staleness/mean": float(worst.mean()), "async/staleness/max": float(worst.max())}
    for name, values in (("trajectory_spans", spans), ("trajectory_staleness", newest),
                         ("trajectory_staleness_worst", worst)):
        for stat in ("mean", "max", "min"):
            metrics[f"training/off_policy/{name}/{stat}"] = float(getattr(values, stat)())
    return metrics
