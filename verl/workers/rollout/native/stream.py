"""Generation that outlives a call: the rollout of the asynchronous trainer modes (``trainer.v1.trainer_mode``).

A :class:`StreamRun` holds prompt groups (the ``n`` samples of a prompt) from their submission until all their
samples have finished, across any number of :meth:`StreamRun.run` calls. A call decodes, admitting new prompts
into free slots as the synchronous scheduler does, until enough groups have finished (and the groups it was told
to wait for); then the rows still running are *suspended*: their tokens and log-probs so far stay in the stream,
and the KV cache may be freed so that training gets the memory back.

When the stream runs again, usually with weights that an update changed, a suspended row is admitted by
prefilling its prompt and the tokens it generated (their keys/values recomputed with the current weights), and
it decodes on from where it stopped: *partial rollout*, as the original's V1 trainer does it. Its earlier tokens
keep the log-probs of the policy that sampled them, so ``rollout_log_probs`` is always the behaviour policy's,
and each sample records the first and the last policy version it generated tokens with. A vision-language
model's groups keep their image features (encoded once, when the group is added) and M-RoPE positions: a
resumed row's prompt is prefilled with them, its generated tokens at their text positions.

A call that finds no suspended row and asks for every group runs exactly the synchronous scheduler's steps, so
an asynchronous trainer allowed no staleness reproduces the synchronous one.
"""

from __future__ import annotations

import contextlib
import heapq
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verl.protocol import DataProto
from verl.workers.rollout.native.model import embed_with_images, prefill
from verl.workers.rollout.native.scheduler import PromptImages, Run, never_sampled

__all__ = ["StreamRun", "StreamServer"]


@dataclass
class _Group:
    uid: str
    seq: int  # submission order: older groups resume first
    prompt: DataProto  # the prompt's row as submitted (CPU), for the output
    done: int = 0  # samples finished


class StreamRun(Run):
    """Rows of prompt groups that live across calls; see the module docstring.

    ``width`` is the prompt width every stream prompt is left-padded to (``rollout.prompt_length``). Rows are
    ``prompt slot * n + sample``; prompt slots are reused once their group is taken.
    """

    def __init__(self, engine, params, width: int):
        self.engine, self.params, self.on_turn = engine, params, None
        self.w = engine.weights
        self.device = device = engine.weights.device
        self.width, self.n = int(width), params.n
        self.eos = torch.tensor(params.eos_token_ids, dtype=torch.long, device=device)
        self.never = never_sampled(self.w, device)
        # M-RoPE models: each prompt slot's positions (capacity, 3, width), text offset and image features.
        self.mrope = self.w.mrope_section is not None
        self.images = PromptImages([], torch.zeros(0, 3, self.width, dtype=torch.long, device=device)) \
            if self.mrope else None
        self.pending, self.ready_since, self.generated = {}, {}, None
        self.sync_every = 4 if device.type == "cuda" else 1
        self.chunk_tokens = max(1, int(engine.config.max_num_batched_tokens))
        self.waiting: deque[int] = deque()  # rows never admitted
        self.resuming: deque[int] = deque()  # rows suspended with tokens, to prefill again
        self.groups: dict[int, _Group] = {}  # prompt slot -> its group
        self.finished: list[int] = []  # prompt slots whose samples all finished, in finishing order
        self.free_prompts: list[int] = []  # a heap: the lowest free prompt slot is taken first
        self.cache = self.state = None
        self.capacity, self.rows, self.next_seq, self.version = 0, 0, 0, 0
        self.pads: list[int] = []
        self._grow(8)

    def __len__(self) -> int:
        """Groups in the stream (running, waiting, suspended or finished and not yet taken)."""
        return len(self.groups)

    # ------------------------------------------------------------------ groups in and out
    def add(self, prompts: DataProto) -> None:
        """Queue left-padded prompts (one group of ``n`` rows each) behind those already waiting.

        ``prompts.non_tensor_batch['uid']`` names the groups; ``input_ids``/``attention_mask`` are re-padded to
        the stream's width."""
        uids = prompts.non_tensor_batch["uid"]
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
        images = self.engine._prompt_images(prompts, self.device)  # encoded once per group; None for text models
        lengths = mask.sum(dim=1).tolist()
        if max(lengths, default=0) > self.width:
            raise ValueError(f"a prompt of {max(lengths)} tokens is longer than actor_rollout_ref.rollout.prompt_length"
                             f"={self.width}, the width of the asynchronous rollout's prompts; raise "
                             "data.max_prompt_length (the rollout's prompt_length follows it)")
        if len(self.free_prompts) < len(uids):
            self._grow(max(2 * self.capacity, self.capacity + len(uids)))
        pad = self.params.pad_token_id
        for i, uid in enumerate(uids):
            p = heapq.heappop(self.free_prompts)
            tokens = ids[i][mask[i]].to(self.device)
            self.input_ids[p].fill_(pad)
            self.valid[p].zero_()
            self.input_ids[p, self.width - len(tokens):] = tokens
            self.valid[p, self.width - len(tokens):] = True
            self.pads[p] = self.width - len(tokens)
            if self.mrope:  # the prompt's M-RoPE positions, re-padded like its tokens (3 equal rows for text)
                given = prompts.batch["position_ids"][i]
                given = (given if given.dim() == 2 else given.expand(3, -1))[:, mask[i]].to(self.device)
                self.images.positions[p].zero_()
                self.images.positions[p, :, self.width - len(tokens):] = given
                self.images.features[p] = images.features[i] if images is not None else None
                self.prompt_delta[p] = given.max() + 1 - len(tokens)
            self.groups[p] = _Group(str(uid), self.next_seq, prompts[i:i + 1].to("cpu"))
            self.next_seq += 1
            rows = range(p * self.n, (p + 1) * self.n)
            self._reset_rows(list(rows))
            self.waiting.extend(rows)

    def cancel(self, uids) -> int:
        """Drop the groups named in ``uids`` wherever they are (a slot they run in is freed); returns how many."""
        wanted = set(map(str, uids))
        slots = [p for p, g in self.groups.items() if g.uid in wanted]
        if not slots:
            return 0
        dropped_rows = {r for p in slots for r in range(p * self.n, (p + 1) * self.n)}
        self.waiting = deque(r for r in self.waiting if r not in dropped_rows)
        self.resuming = deque(r for r in self.resuming if r not in dropped_rows)
        if self.state is not None:
            running = [int(s) for s in np.flatnonzero(self.slot_row >= 0) if int(self.slot_row[s]) in dropped_rows]
            if running:
                index = torch.tensor(running, device=self.device)
                self.state.live[index] = False
                self.state.row[index] = self.rows
                self.slot_row[running] = -1
        self.finished = [p for p in self.finished if p not in slots]
        self._release(slots)
        return len(slots)

    def take_finished(self) -> tuple[list[_Group], torch.Tensor, torch.Tensor, np.ndarray, np.ndarray]:
        """The finished groups in finishing order, and their rows ``(G*n, R)``: tokens, log-probs, and the first
        and last policy version each row generated with. Their prompt slots are free afterwards."""
        slots, self.finished = self.finished, []
        rows = [r for p in slots for r in range(p * self.n, (p + 1) * self.n)]
        index = torch.tensor(rows, dtype=torch.long, device=self.device)
        groups = [self.groups[p] for p in slots]
        out = (groups, self.out_tokens[index], self.out_log_probs[index], self.min_version[rows].copy(),
               self.max_version[rows].copy())
        self._release(slots)
        return out

    def uids(self) -> list[str]:
        return [g.uid for g in self.groups.values()]

    # ------------------------------------------------------------------ running
    def run(self, version: int, generator: torch.Generator, until_groups: int, wait_uids=()) -> dict:
        """Decode until at least ``until_groups`` groups have finished (counting those finished earlier and not
        yet taken) and every group named in ``wait_uids`` has, or until nothing is left to run; then suspend
        the rows still running. The engine has allocated the cache. Returns the call's statistics."""
        wait = set(map(str, wait_uids))

        def satisfied() -> bool:
            if len(self.finished) < until_groups:
                return False
            return not wait or not wait & {g.uid for p, g in self.groups.items() if g.done < self.n}

        self.begin(version, generator)
        if not satisfied():
            self._admit()
            # The synchronous scheduler's loop (Run.generate), stopping early once the call has what it needs.
            while self.running() and not satisfied():
                self.advance()
        self.suspend()
        return self.stats

    def begin(self, version: int, generator: torch.Generator) -> None:
        """Take the engine's cache (all slots free) to decode with the weights of policy ``version``."""
        self.version = int(version)
        self._attach(generator)
        self._captures = self.engine.graphs.captures
        self.stats.update(resumed=len(self.resuming), resume_prefill_s=0.0)

    def advance(self) -> None:
        """One round of the synchronous scheduler: decode the running slots a few steps, then refill the freed
        slots (or pack the running rows into fewer)."""
        if self.running():
            self._decode(np.flatnonzero(self.slot_row >= 0))
        if self.waiting or self.resuming:
            self._admit()
        else:
            self._compact()
        self.stats["graph_captures"] = self.engine.graphs.captures - self._captures

    def running(self) -> bool:
        return bool((self.slot_row >= 0).any())

    def busy(self) -> bool:
        """Whether any row is running or waits to (new, or suspended)."""
        return bool(self.waiting or self.resuming or (self.state is not None and self.running()))

    def active_rows(self) -> int:
        """Rows of the groups not finished yet (what a cache for this stream should hold)."""
        return sum(self.n - g.done for g in self.groups.values())

    def suspend(self) -> None:
        """Keep the tokens of every running row, free its slot, and let go of the cache: the next run prefills
        these rows again (with the weights it then has) before they decode on."""
        if self.state is None:
            return
        occupied = np.flatnonzero(self.slot_row >= 0)
        if len(occupied):
            index = torch.tensor(occupied, device=self.device)
            steps, live = self.state.step[index].tolist(), self.state.live[index].tolist()
            rows = self.slot_row[occupied].tolist()
            done = [row for row, alive in zip(rows, live) if not alive]  # stopped at the token just sampled
            if done:
                self._rows_done(done)
            suspended = []
            for row, step, alive in zip(rows, steps, live):
                if alive:
                    if step > self.epoch_start[row]:
                        self._used_version(row)
                    self.row_steps[row] = step
                    suspended.append(row)
            self.resuming.extend(suspended)
            self.resuming = deque(sorted(self.resuming, key=lambda r: (self.groups[r // self.n].seq, r)))
        self.slot_row[:] = -1
        self.cache = self.state = None

    # ------------------------------------------------------------------ the scheduler's hooks
    def _decode(self, running: np.ndarray) -> None:
        rows = self.slot_row[running].copy()
        super()._decode(running)
        stopped = rows[self.slot_row[running] < 0]
        if len(stopped):
            self._rows_done(stopped.tolist())

    def _rows_waiting(self) -> bool:
        return bool(self.waiting or self.resuming)

    def _admit(self) -> None:
        if self.resuming:
            self._admit_suspended()
        if self.waiting:
            super()._admit()

    def _admit_suspended(self) -> None:
        """Prefill prompt + generated tokens of suspended rows into free slots, shortest first, in chunks of at most
        ``max_num_batched_tokens`` tokens (at least one row)."""
        tic = self._tic()
        free = [int(x) for x in np.flatnonzero(self.slot_row < 0)]
        take = [self.resuming.popleft() for _ in range(min(len(free), len(self.resuming)))]
        if not take:  # every slot runs (this call's cache may hold fewer slots than the last one suspended)
            return
        take.sort(key=lambda r: self.row_steps[r])
        chunk: list[int] = []
        for row in take + [None]:
            if row is not None:
                grown = chunk + [row]
                first_col = min(self.pads[r // self.n] for r in grown)
                width = self.width - first_col + int(self.row_steps[row]) - 1
                if not chunk or len(grown) * width <= self.chunk_tokens:
                    chunk = grown
                    continue
            slots, free = free[: len(chunk)], free[len(chunk):]
            self._prefill_suspended(chunk, slots)
            chunk = [row] if row is not None else []
        self.stats["resume_prefill_s"] += self._toc(tic)

    def _prefill_suspended(self, rows: list[int], slots: list[int]) -> None:
        n, device, s, pad = self.n, self.device, self.state, self.params.pad_token_id
        rows_t = torch.tensor(rows, device=device)
        slots_t = torch.tensor(slots, device=device)
        prompts_t = torch.tensor([r // n for r in rows], device=device)
        steps = self.row_steps[rows]
        steps_t = torch.as_tensor(steps, device=device)
        first_col = min(self.pads[r // n] for r in rows)
        ids, valid = self.input_ids[prompts_t, first_col:], self.valid[prompts_t, first_col:]
        extra = int(steps.max()) - 1  # the last sampled token is fed by the next decode step, as always
        if extra > 0:
            inside = torch.arange(extra, device=device)[None] < (steps_t - 1)[:, None]
            ids = torch.cat([ids, self.out_tokens[rows_t, :extra].masked_fill(~inside, pad)], dim=1)
            valid = torch.cat([valid, inside], dim=1)
        embeds = positions = None
        if self.mrope:  # the prompt at its M-RoPE positions, then the generated tokens at their text positions
            features = [self.images.features[r // n] for r in rows if self.images.features[r // n] is not None]
            embeds = embed_with_images(self.w, ids, torch.cat(features) if features else None)
            delta = self.prompt_delta[prompts_t]
            positions = self.images.positions[prompts_t, :, first_col:]
            if extra > 0:
                length = self.width - torch.tensor([self.pads[r // n] for r in rows], device=device)
                after = length[:, None] + delta[:, None] + torch.arange(extra, device=device)[None]
                positions = torch.cat([positions, after[:, None].expand(-1, 3, -1)], dim=2)
            positions = positions.permute(1, 0, 2)
            s.rope_delta[slots_t] = delta
        prefill(self.w, self.cache, ids, valid, first_col, slots_t, torch.arange(len(rows), device=device), embeds,
                positions)
        s.tokens[slots_t] = self.out_tokens[rows_t, steps_t - 1]
        s.write_pos[slots_t] = self.width + steps_t - 1
        s.shared_end[slots_t] = self.width
        s.start[slots_t] = torch.tensor([self.pads[r // n] for r in rows], device=device)
        s.row[slots_t] = rows_t
        s.step[slots_t] = steps_t
        s.live[slots_t] = True
        self.slot_row[slots] = rows
        self.slot_steps[slots] = steps
        self.epoch_start[rows] = steps
        self._share(slots, np.arange(len(rows)))  # each prefilled alone: its prompt is shared with no other slot

    # ------------------------------------------------------------------ bookkeeping
    def _rows_done(self, rows: list[int]) -> None:
        for row in rows:
            self._used_version(row)
            group = self.groups[row // self.n]
            group.done += 1
            if group.done == self.n:
                self.finished.append(row // self.n)

    def _used_version(self, row: int) -> None:
        if self.min_version[row] < 0:
            self.min_version[row] = self.version
        self.max_version[row] = self.version

    def _reset_rows(self, rows: list[int]) -> None:
        self.out_tokens[rows] = self.params.pad_token_id
        self.out_log_probs[rows] = 0.0
        self.row_steps[rows] = 0
        self.epoch_start[rows] = 0
        self.min_version[rows] = -1
        self.max_version[rows] = -1

    def _release(self, slots: list[int]) -> None:
        for p in slots:
            del self.groups[p]
            heapq.heappush(self.free_prompts, p)

    def _grow(self, capacity: int) -> None:
        """Room for ``capacity`` prompt groups (buffers reallocated, contents kept)."""
        old, n, length, device = self.capacity, self.n, self.params.response_length, self.device
        old_sink, rows = self.rows, capacity * n

        def grown(t: torch.Tensor | None, shape, fill, dtype, keep: int) -> torch.Tensor:
            new = torch.full(shape, fill, dtype=dtype, device=device)
            if t is not None and keep:
                new[:keep] = t[:keep]
            return new

        pad = self.params.pad_token_id
        self.input_ids = grown(getattr(self, "input_ids", None), (capacity, self.width), pad, torch.long, old)
        self.valid = grown(getattr(self, "valid", None), (capacity, self.width), False, torch.bool, old)
        # Row ``rows`` is the sink for the writes of slots that run nothing.
        self.out_tokens = grown(getattr(self, "out_tokens", None), (rows + 1, length), pad, torch.long, old_sink)
        self.out_log_probs = grown(getattr(self, "out_log_probs", None), (rows + 1, length), 0.0, torch.float32,
                                   old_sink)
        for name, fill in (("row_steps", 0), ("epoch_start", 0), ("min_version", -1), ("max_version", -1)):
            new = np.full(rows, fill, dtype=np.int64)
            if old:
                new[: old * n] = getattr(self, name)
            setattr(self, name, new)
        self.pads += [self.width] * (capacity - old)
        if self.mrope:
            self.images.positions = grown(self.images.positions, (capacity, 3, self.width), 0, torch.long, old)
            self.images.features += [None] * (capacity - old)
            self.prompt_delta = grown(getattr(self, "prompt_delta", None), (capacity,), 0, torch.long, old)
        for p in range(old, capacity):
            heapq.heappush(self.free_prompts, p)
        self.capacity, self.rows = capacity, rows
        if self.state is not None:  # slots that run nothing write to the new sink
            self.state.row.masked_fill_(self.state.row == old_sink, rows)


class StreamServer:
    """A :class:`StreamRun` that never waits for the trainer: a thread of its own decodes whenever groups are in
    flight, from a copy of the weights of its own (``separate_async``'s rollout workers, or a colocated rollout with
    ``colocate_async.overlap_generation``).

    On CUDA the thread decodes on a stream of its own, of high priority, so that its small decode kernels run
    between the kernels a colocated trainer launches meanwhile on its stream instead of queueing behind them. The
    thread hands finished rows out on the CPU, and waits for its stream after it copied new weights in (the caller
    may then free them) and before it lends the engine out.

    Callers (the worker's methods, on another thread) hand over prompts and take finished groups with
    :meth:`exchange`, and hand over new weights with :meth:`stage_weights`; the thread applies them between two
    rounds of decoding, and the rows in flight resume with them (their keys/values prefilled again: partial
    rollout). :meth:`paused` lends the engine to a synchronous call (validation) meanwhile.
    """

    def __init__(self, engine, params, width: int):
        self.engine, self.stream = engine, StreamRun(engine, params, width)
        self.cond = threading.Condition()
        self.inbox: list[tuple[str, object]] = []  # ("add", prompts) or ("cancel", uids), in order
        self.ready: list[tuple] = []  # finished groups, as StreamRun.take_finished gives them
        self.in_flight: set[str] = set()  # uids handed over and not returned (nor cancelled)
        self.staged: tuple[int, Callable[[], None]] | None = None  # (version, apply) of the next weights
        self.version, self.pauses, self.paused_now = 0, 0, False
        self.error: BaseException | None = None
        self.closing = False
        self.stats = {"resumed": 0, "resume_prefill_s": 0.0, "weight_updates": 0}
        self.thread = threading.Thread(target=self._serve, name="verl-rollout-stream", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ the callers' side
    def exchange(self, prompts: DataProto | None, cancel_uids, until_groups: int, wait_uids=()) -> tuple[list, dict]:
        """Hand over ``prompts`` and cancellations, then wait until ``until_groups`` finished groups (and those of
        ``wait_uids``) can be returned, or until nothing is left in flight; returns every finished group so far
        (the chunks of :meth:`StreamRun.take_finished`) and the statistics since the last exchange."""
        wait = set(map(str, wait_uids))
        with self.cond:
            self._raise()
            if len(cancel_uids):
                self.inbox.append(("cancel", list(cancel_uids)))
                self.in_flight -= set(map(str, cancel_uids))
            if prompts is not None and len(prompts):
                self.inbox.append(("add", prompts))
                self.in_flight |= set(map(str, prompts.non_tensor_batch["uid"]))
            self.cond.notify_all()

            def done() -> bool:
                if self.error is not None or not (self.in_flight or self.inbox):
                    return True
                ready = {g.uid for chunk in self.ready for g in chunk[0]}
                return len(ready) >= until_groups and not wait & self.in_flight

            self.cond.wait_for(done)
            self._raise()
            ready, self.ready = self.ready, []
            stats, self.stats = self.stats, {"resumed": 0, "resume_prefill_s": 0.0, "weight_updates": 0}
        return ready, stats

    def stage_weights(self, version: int, apply: Callable[[], None]) -> None:
        """``apply()`` copies new weights into the module; the thread calls it between two rounds of decoding."""
        with self.cond:
            self._raise()
            self.staged = (int(version), apply)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.staged is None or self.error is not None)
            self._raise()

    @contextlib.contextmanager
    def paused(self):
        """Within the block the thread decodes nothing and holds no cache (rows in flight are suspended)."""
        with self.cond:
            self.pauses += 1
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.paused_now or self.error is not None)
            self._raise()
        try:
            yield
        finally:
            with self.cond:
                self.pauses -= 1
                self.cond.notify_all()

    def close(self) -> None:
        """Stop the thread; callers still waiting get an error."""
        with self.cond:
            self.closing = True
            self.error = self.error or RuntimeError("the rollout's generation thread was closed")
            self.cond.notify_all()
        self.thread.join(timeout=60)

    def _raise(self) -> None:
        if self.error is not None:
            raise RuntimeError(f"the rollout's generation thread failed: {self.error!r}") from self.error

    # ------------------------------------------------------------------ the thread
    def _serve(self) -> None:
        device = self.engine.weights.device
        cuda = torch.cuda.stream(torch.cuda.Stream(device, priority=-1)) if device.type == "cuda" else None
        with cuda or contextlib.nullcontext():
            self._serve_loop()

    def _settle(self) -> None:
        """Wait for the work this thread queued on its CUDA stream (nothing to wait for on CPU)."""
        if self.engine.weights.device.type == "cuda":
            torch.cuda.current_stream().synchronize()

    def _serve_loop(self) -> None:
        stream, attached = self.stream, False
        try:
            while True:
                with self.cond:
                    while True:
                        if self.closing:
                            return
                        grow = self._take_inbox() and attached and self._cache_too_small()
                        if attached and (self.staged is not None or self.pauses or grow):
                            self._detach()
                            attached = False
                        if self.staged is not None:
                            version, apply = self.staged
                            with torch.no_grad():
                                apply()
                            self._settle()
                            self.version, self.staged = version, None
                            self.stats["weight_updates"] += 1
                            self.cond.notify_all()
                        self.paused_now = bool(self.pauses)
                        if self.paused_now:
                            self._settle()
                            self.cond.notify_all()
                        elif stream.busy():
                            break
                        self.cond.wait()
                if not attached:
                    self.engine.weights.bind()
                    self.engine._ensure_cache(max(1, stream.active_rows()), self.engine._cache_length(
                        stream.width, stream.params.response_length))
                    # A generator of its own each time: the sampler's keys derive from its seed and restart with it.
                    stream.begin(self.version, self.engine._generator({}))
                    with self.cond:
                        self.stats["resumed"] += len(stream.resuming)
                    attached = True
                with torch.no_grad():
                    stream.advance()
                if stream.finished:
                    with self.cond:
                        self._hand_out()
        except BaseException as err:  # noqa: BLE001 -- reported to every caller
            with self.cond:
                self.error = err
                self.cond.notify_all()

    def _take_inbox(self) -> bool:
        """Apply queued additions and cancellations; whether new rows came."""
        added = False
        for kind, item in self.inbox:
            if kind == "add":
                self.stream.add(item)
                added = True
            else:
                self.stream.cancel(item)
        self.inbox = []
        return added

    def _cache_too_small(self) -> bool:
        wanted = min(self.stream.active_rows(), int(self.engine.config.max_num_seqs))
        return self.engine.cache is None or self.engine.cache.num_slots < wanted

    def _detach(self) -> None:
        self.stats["resume_prefill_s"] += self.stream.stats.get("resume_prefill_s", 0.0)
        self.stream.suspend()
        if self.stream.finished:
            self._hand_out()

    def _hand_out(self) -> None:
        groups, tokens, log_probs, first, last = self.stream.take_finished()
        # On the CPU before they leave this thread: a caller reading them on its own CUDA stream could otherwise
        # find their memory reused by this thread's stream meanwhile.
        chunk = (groups, tokens.cpu(), log_probs.cpu(), first, last)
        self.in_flight -= {g.uid for g in chunk[0]}
        self.ready.append(chunk)
        self.cond.notify_all()
