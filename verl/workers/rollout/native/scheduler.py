"""The scheduler of one native-engine generation: which rows run in which KV-cache slots, step by step.

A :class:`Run` admits waiting rows into free slots (one prefill per distinct prompt, copied into the
slots of its samples), decodes the running slots a few steps at a time, refills freed slots, packs
running rows into low slots when that shrinks the decode batch, and, for multi-turn episodes, pauses a
row's slot while its continuation is computed elsewhere (see :mod:`verl.workers.rollout.native.engine`
for the whole picture). :mod:`verl.workers.rollout.native.stream` keeps a run alive across calls.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from verl.models.vision import placeholder_token_ids
from verl.workers.rollout.base import wait_for_continuations
from verl.workers.rollout.native.model import (decode, decode_capturable, decode_shared_chunk, embed_with_images, extend,
                                               prefill)
from verl.workers.rollout.native.sampling import sample
from verl.workers.rollout.native.triton_ops import SHARED_TABLE_WIDTH

__all__ = ["BUCKETS", "PromptImages", "Run", "SlotState", "bucket"]

BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048)


def bucket(b: int, num_slots: int) -> int:
    return min(next((x for x in BUCKETS if x >= b), num_slots), num_slots)


def shared_prefix_table(groups: np.ndarray, chunk: int, width: int) -> np.ndarray:
    """The chunk table of the decode attention's shared prompts (``triton_ops.decode_attention``'s ``members``):
    slots with equal ``groups[slot]`` hold identical prompt keys and values; in slot order, each run of them is
    cut into chunks of at most ``chunk`` slots, and a chunk's first slot lists the chunk's slots (``width``
    columns, -1 after them). Every other slot's entry starts with -1."""
    count = len(groups)
    order = np.lexsort((np.arange(count), groups))
    ranked = groups[order]
    starts = np.ones(count, dtype=bool)
    starts[1:] = ranked[1:] != ranked[:-1]
    run_start = np.maximum.accumulate(np.where(starts, np.arange(count), 0))
    rank = np.arange(count) - run_start
    leaders = order[run_start + rank // chunk * chunk]
    table = np.full((count, width), -1, dtype=np.int32)
    table[leaders, rank % chunk] = order
    return table


class SlotState:
    """Per-slot device tensors the decode step reads and updates (fixed addresses for the graphs).
    ``rope_delta``: M-RoPE's offset of a generated token's position from its column (0 for text models).
    ``shared_end``: the column where a slot's prompt, shared with the other samples prefilled with it, ends;
    ``members``: the chunks of slots that read that prompt once (:func:`shared_prefix_table`)."""

    def __init__(self, num_slots: int, device: torch.device):
        self.tokens, self.write_pos, self.start, self.row, self.step, self.rope_delta, self.shared_end = torch.zeros(
            7, num_slots, dtype=torch.long, device=device)
        self.live = torch.zeros(num_slots, dtype=torch.bool, device=device)
        self.slot_ids = torch.arange(num_slots, device=device)
        self.members = torch.full((num_slots, SHARED_TABLE_WIDTH), -1, dtype=torch.int32, device=device)

    def tensors(self):
        return self.tokens, self.write_pos, self.start, self.row, self.step, self.rope_delta, self.shared_end, self.live


@dataclass
class PromptImages:
    """A vision-language model's prompts: per prompt, its image tokens' encoder outputs ``(tokens, hidden)`` in
    order (None without images), and the prompts' M-RoPE ``positions (B, 3, P)`` (the data's ``position_ids``)."""

    features: list[torch.Tensor | None]
    positions: torch.Tensor


def never_sampled(w, device: torch.device) -> torch.Tensor | None:
    """The tokens a generation never samples: a vision-language model's image/video placeholders (only the
    processor writes them), or None. Called after ``w.bind()``."""
    vocab = w.lm_head.shape[0]
    placeholders = [t for t in placeholder_token_ids(w.module.config) if t < vocab]  # ids past the head: never
    return torch.tensor(placeholders, dtype=torch.long, device=device) if placeholders else None


class Run:
    """The scheduler of one ``generate_sequences`` call, or of one ``generate_episodes`` call (``on_turn``)."""

    def __init__(self, engine, params, input_ids, valid, generator, on_turn=None, images: PromptImages | None = None):
        self.engine, self.params, self.on_turn = engine, params, on_turn
        self.w = engine.weights
        self.input_ids, self.valid = input_ids, valid
        self.images = images
        if images is not None:  # a generated token's M-RoPE position: its column's, moved by this much
            self.prompt_delta = images.positions.amax(dim=(1, 2)) + 1 - valid.sum(dim=1)
        self.never = never_sampled(self.w, input_ids.device)
        self.width = input_ids.shape[1]
        self.pads = (~valid).sum(dim=1).tolist()
        self.rows = input_ids.shape[0] * params.n
        self.device = device = input_ids.device
        # Row ``rows`` is a sink for the writes of slots that are not running.
        self.out_tokens = torch.full((self.rows + 1, params.response_length), params.pad_token_id,
                                     dtype=torch.long, device=device)
        self.out_log_probs = torch.zeros((self.rows + 1, params.response_length), dtype=torch.float32, device=device)
        self.eos = torch.tensor(params.eos_token_ids, dtype=torch.long, device=device)
        self.waiting = deque(range(self.rows))
        # Episodes: a slot whose row waits for its continuation is paused; pending[row] is that future.
        self.pending: dict[int, concurrent.futures.Future] = {}
        self.ready_since: dict[int, int] = {}  # row -> decode step at which its continuation was seen ready
        self.turn_start = np.zeros(self.rows, dtype=np.int64)  # response step where the row's turn began
        self.lengths = np.zeros(self.rows, dtype=np.int64)  # response tokens of a row once its turn ended
        self.generated = (torch.ones((self.rows + 1, params.response_length), dtype=torch.bool, device=device)
                          if on_turn is not None else None)  # episodes only: False on continuation tokens
        self.sync_every = 4 if device.type == "cuda" else 1
        self.resume_wait, self.resume_batch = 4 * self.sync_every, 16
        self.chunk_tokens = max(1, int(engine.config.max_num_batched_tokens))
        self._attach(generator)

    def _attach(self, generator: torch.Generator) -> None:
        """Take the engine's current cache and slot state (all slots free) and the call's sampling generator."""
        engine = self.engine
        self.generator, self.cache, self.state = generator, engine.cache, engine.state
        num_slots = self.cache.num_slots
        self.slot_row = np.full(num_slots, -1)  # host view: which row a slot runs (-1: free)
        self.slot_steps = np.zeros(num_slots, dtype=np.int64)
        self.paused = np.zeros(num_slots, dtype=bool)
        for t in self.state.tensors():
            t.zero_()
        self.state.row.fill_(self.rows)
        # Rows prefilled from one prompt together read its keys and values once per chunk of them in decode (the
        # fused attention only; 0: each row reads its own copy). Slots start in groups of their own.
        self.share_chunk = decode_shared_chunk(self.w, self.params.n)
        self.slot_group = -1 - np.arange(num_slots)
        self.next_group = 0
        self._share()
        # A mixture of experts whose grouped matmul syncs with the host (see decode_capturable) decodes eagerly.
        self.use_graphs = self.device.type == "cuda" and not engine.config.enforce_eager and decode_capturable(self.w)
        if self.use_graphs:
            # Graphs read the weights, the cache and the RoPE table by address: a new one of any means recapture.
            engine.graphs.validate((self.w.pointers(), self.cache.pointers(), self.w.rope_pointers(self.cache.max_len)))
        self.seed_base, self.draws = int(generator.initial_seed()) * 0x2545F4914F6CDD1D % (2**31 - 1), 0
        self.stats = {"slots": num_slots, "rows": self.rows, "decode_steps": 0, "prefill_s": 0.0, "decode_s": 0.0,
                      "graph_captures": 0, "turns": 0, "extend_s": 0.0, "idle_s": 0.0,
                      "shared_prompt_chunk": self.share_chunk}

    def generate(self) -> tuple[torch.Tensor, torch.Tensor]:
        captures = self.engine.graphs.captures
        self._admit()
        while (self.slot_row >= 0).any():
            running = np.flatnonzero((self.slot_row >= 0) & ~self.paused)
            if len(running):
                self._decode(running)
            elif self.pending:  # every occupied slot waits for its continuation
                self.stats["idle_s"] += wait_for_continuations(list(self.pending.values()))
            if self.pending:
                self._resume(force=not len(running))
            if self.waiting:
                self._admit()
            else:
                self._compact()
        self.stats["graph_captures"] = self.engine.graphs.captures - captures
        return self.out_tokens[: self.rows], self.out_log_probs[: self.rows]

    def _decode(self, running: np.ndarray) -> None:
        """Decode the running slots until the next time the host must look: a free slot to refill, a
        continuation that may be ready, or the shortest remaining budget."""
        steps = int((self.params.response_length - self.slot_steps[running]).min())
        if self._rows_waiting() or self.pending:
            steps = min(steps, self.sync_every)
        elif self.eos.numel():  # rows may stop early: look now and then, to pack the rest into fewer slots
            steps = min(steps, 4 * self.sync_every)
        b = bucket(int(running.max()) + 1, self.cache.num_slots)
        tic = self._tic()
        for _ in range(max(steps, 0)):
            self._decode_step(b)
        self.slot_steps[running] += max(steps, 0)
        self.stats["decode_steps"] += max(steps, 0)
        live = self.state.live[: int(running.max()) + 1].tolist()
        self.stats["decode_s"] += self._toc(tic)
        stopped = [int(slot) for slot in running if not live[slot]]
        if self.on_turn is None:
            self.slot_row[stopped] = -1
        elif stopped:
            self._end_turns(stopped)

    def _rows_waiting(self) -> bool:
        """Whether rows wait for a slot (the host then looks often, to refill freed slots)."""
        return bool(self.waiting)

    def _end_turns(self, slots: list[int]) -> None:
        """Hand each stopped row's turn to ``on_turn``; its slot (and cache) waits for the continuation."""
        rows = self.slot_row[slots]
        steps = self.state.step[torch.tensor(slots, device=self.device)].tolist()
        index = torch.tensor(rows, device=self.device)
        tokens, log_probs = self.out_tokens[index].tolist(), self.out_log_probs[index].tolist()
        for i, (slot, row, step) in enumerate(zip(slots, rows.tolist(), steps)):
            begin = int(self.turn_start[row])
            self.lengths[row] = step
            self.paused[slot] = True
            self.stats["turns"] += 1
            self.pending[row] = self.on_turn(row, tokens[i][begin:step], log_probs[i][begin:step], step)

    def _resume(self, force: bool) -> None:
        """Rows whose continuation is ready: extend their slots with it, or free them (episode over).

        Continuations are batched: they are taken once ``resume_batch`` are ready, once the first of them
        has waited ``resume_wait`` decode steps, or at once when nothing else runs (each extend call costs
        a pass over all layers, whatever its size)."""
        ready = {}
        for row in [row for row, future in self.pending.items() if future.done()]:
            more = list(self.pending[row].result() or [])
            if more and self.lengths[row] + len(more) < self.params.response_length:
                ready[row] = more
                continue
            # The episode is over: its slot is free at once (only real continuations are batched).
            del self.pending[row]
            self.ready_since.pop(row, None)
            slot = int(np.flatnonzero(self.slot_row == row)[0])
            self.slot_row[slot], self.paused[slot] = -1, False
        if not ready:
            return
        now = self.stats["decode_steps"]
        first = min(self.ready_since.setdefault(row, now) for row in ready)
        if not force and len(ready) < self.resume_batch and now - first < self.resume_wait:
            return
        extend_rows = []
        for row, more in ready.items():
            del self.pending[row]
            self.ready_since.pop(row)
            slot = int(np.flatnonzero(self.slot_row == row)[0])
            self.paused[slot] = False
            extend_rows.append((slot, row, more))
        # Chunks of at most max_num_batched_tokens fed tokens, and attention scores (fed tokens x heads x
        # cache columns) of at most 2**28 elements.
        width = max(len(more) for _, _, more in extend_rows) + 1
        per_chunk = max(1, min(self.chunk_tokens // width, 2**28 // (width * self.w.num_heads * self.cache.max_len)))
        for i in range(0, len(extend_rows), per_chunk):
            self._extend(extend_rows[i:i + per_chunk])

    def _extend(self, items: list[tuple[int, int, list[int]]]) -> None:
        tic = self._tic()
        s, device, pad = self.state, self.device, self.params.pad_token_id
        slots = torch.tensor([slot for slot, _, _ in items], device=device)
        rows = torch.tensor([row for _, row, _ in items], device=device)
        begin = torch.tensor([int(self.lengths[row]) for _, row, _ in items], device=device)
        counts = torch.tensor([len(more) for _, _, more in items], device=device)
        width = int(counts.max()) + 1
        # Each row feeds its last sampled token (its eos, as recorded: a paused slot's state and the cache
        # column after its turn are scratch for the decode steps that ran meanwhile), then the continuation;
        # the token sampled after it is the next turn's first.
        fed = torch.tensor([[pad] + more + [pad] * (width - 1 - len(more)) for _, _, more in items], device=device)
        fed[:, 0] = self.out_tokens[rows, begin - 1]
        # Host arithmetic, no device sync: a row's eos sits at cache column width + (its response length - 1).
        span = self.width + max(int(self.lengths[row]) + len(more) for _, row, more in items)
        logits = extend(self.w, self.cache, fed, counts + 1, s.write_pos[slots], s.start[slots], slots, span)
        tokens, log_probs = self._sample(logits)
        # The continuation goes into the response (not generated: log-prob 0, masked out of training).
        at = torch.arange(width - 1, device=device)
        inside = at[None] < counts[:, None]
        cont_rows = rows[:, None].expand(-1, width - 1)[inside]
        cont_steps = (begin[:, None] + at[None])[inside]
        self.out_tokens[cont_rows, cont_steps] = fed[:, 1:][inside]
        self.out_log_probs[cont_rows, cont_steps] = 0.0
        self.generated[cont_rows, cont_steps] = False
        step = begin + counts  # response step of the token just sampled
        self._record(rows, step, tokens, log_probs)
        s.tokens[slots] = tokens
        s.write_pos[slots] += counts + 1
        s.step[slots] = step + 1
        s.live[slots] = ~self._stops(tokens, step + 1)
        for slot, row, more in items:
            self.slot_steps[slot] = self.lengths[row] + len(more) + 1
            self.turn_start[row] = self.lengths[row] + len(more)
        self.stats["extend_s"] += self._toc(tic)

    def _tic(self) -> float:
        if self.engine.profile and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter()

    def _toc(self, tic: float) -> float:
        return self._tic() - tic

    def _seed(self) -> int:
        """A fresh 31-bit key per sampling call for the fused CUDA sampler (host-side: no device sync),
        derived from the call's seed."""
        self.draws += 1
        return (self.seed_base + self.draws * 0x9E3779B1) % (2**31 - 1)

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Tokens and their log-probs under the raw logits (as the trainer computes them); tokens of ``never``
        are not drawn. ``logits`` (a scratch output) is overwritten: the normaliser is taken first, then the
        ``never`` tokens are set to -inf for the draw; a drawn token's own logit is unchanged."""
        if self.never is None:
            return sample(logits, self.params, self.generator, self._seed())
        temperature = self.params.temperature
        total = (logits.float() if temperature == 1.0 else logits.float() / temperature).logsumexp(dim=-1)
        tokens, _ = sample(logits.index_fill_(1, self.never, float("-inf")), self.params, self.generator,
                           self._seed())
        return tokens, logits.gather(1, tokens[:, None]).squeeze(1).float() / temperature - total

    def _share(self, slots: list[int] | None = None, sources=None) -> None:
        """Slots ``slots`` now hold prompt ``sources[j]`` of one prefill (None: only refresh the table): equal
        sources form a group that shares its prompt in decode. Uploads the chunk table when sharing is on."""
        if slots is not None:
            sources = np.asarray(sources)
            self.slot_group[slots] = self.next_group + sources
            self.next_group += int(sources.max()) + 1
        if self.share_chunk:
            table = shared_prefix_table(self.slot_group, self.share_chunk, SHARED_TABLE_WIDTH)
            self.state.members.copy_(torch.from_numpy(table))

    def _decode_step(self, b: int) -> None:
        s, w, cache = self.state, self.w, self.cache

        # M-RoPE models always read the offsets (0 without images), so one captured graph serves every call.
        delta = None if self.w.mrope_section is None else s.rope_delta[:b]
        shared = (s.members, s.shared_end[:b], self.share_chunk) if self.share_chunk else None

        def step():
            return decode(w, cache, s.tokens[:b], s.write_pos[:b], s.start[:b], s.slot_ids[:b], delta, shared)

        logits = self.engine.graphs.run((b, self.share_chunk), step) if self.use_graphs else step()
        tokens, log_probs = self._sample(logits)
        active = s.live[:b]
        self._record(torch.where(active, s.row[:b], self.rows), s.step[:b], tokens, log_probs)
        done = self._stops(tokens, s.step[:b] + 1)
        s.step[:b] += active
        s.write_pos[:b] += active
        s.live[:b] = active & ~done
        s.tokens[:b] = tokens

    def _record(self, rows, steps, tokens, log_probs) -> None:
        steps = steps.clamp(max=self.params.response_length - 1)
        self.out_tokens[rows, steps] = tokens
        self.out_log_probs[rows, steps] = log_probs

    def _stops(self, tokens: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        done = generated >= self.params.response_length
        if self.eos.numel():
            done |= torch.isin(tokens, self.eos)
        return done

    def _admit(self) -> None:
        """Fill free slots with waiting rows; each chunk prefills its distinct prompts once."""
        tic = self._tic()
        n = self.params.n
        free = [int(x) for x in np.flatnonzero(self.slot_row < 0)]
        per_chunk = max(1, self.chunk_tokens // self.width)
        while free and self.waiting:
            chunk_rows, prompts = [], []
            while self.waiting and len(chunk_rows) < len(free):
                prompt = self.waiting[0] // n
                if prompt not in prompts:
                    if len(prompts) == per_chunk:
                        break
                    prompts.append(prompt)
                chunk_rows.append(self.waiting.popleft())
            slots, free = free[: len(chunk_rows)], free[len(chunk_rows):]
            self._prefill(prompts, chunk_rows, slots)
        self.stats["prefill_s"] += self._toc(tic)

    def _prefill(self, prompts: list[int], rows: list[int], slots: list[int]) -> None:
        n, device, s = self.params.n, self.device, self.state
        index = {p: i for i, p in enumerate(prompts)}
        source_list = [index[r // n] for r in rows]
        sources = torch.tensor(source_list, device=device)
        slots_t = torch.tensor(slots, device=device)
        rows_t = torch.tensor(rows, device=device)
        first_col = min(self.pads[p] for p in prompts)
        prompt_t = torch.tensor(prompts, device=device)
        ids = self.input_ids[prompt_t, first_col:]
        embeds = positions = None
        if self.images is not None:
            features = [self.images.features[p] for p in prompts if self.images.features[p] is not None]
            embeds = embed_with_images(self.w, ids, torch.cat(features) if features else None)
            positions = self.images.positions[prompt_t, :, first_col:].permute(1, 0, 2)
            s.rope_delta[slots_t] = self.prompt_delta[prompt_t[sources]]
        logits = prefill(self.w, self.cache, ids, self.valid[prompt_t, first_col:], first_col, slots_t, sources,
                         embeds, positions)
        tokens, log_probs = self._sample(logits[sources])
        zeros = torch.zeros_like(rows_t)
        self._record(rows_t, zeros, tokens, log_probs)
        s.tokens[slots_t] = tokens
        s.write_pos[slots_t] = s.shared_end[slots_t] = self.width
        s.start[slots_t] = torch.tensor([self.pads[r // n] for r in rows], device=device)
        s.row[slots_t] = rows_t
        s.step[slots_t] = 1
        s.live[slots_t] = ~self._stops(tokens, zeros + 1)
        self.slot_row[slots] = rows
        self.slot_steps[slots] = 1
        self._share(slots, source_list)

    def _compact(self) -> None:
        """Move running rows into the lowest slots when that lowers the decode batch bucket."""
        running = np.flatnonzero(self.slot_row >= 0)
        if not len(running):
            return
        count, num_slots = len(running), self.cache.num_slots
        if bucket(count, num_slots) >= bucket(int(running.max()) + 1, num_slots):
            return
        movers = [int(x) for x in running if x >= count]
        holes = [int(x) for x in np.flatnonzero(self.slot_row[:count] < 0)]
        src = torch.tensor(movers, device=self.device)
        dst = torch.tensor(holes, device=self.device)
        self.cache.move(dst, src)
        for t in self.state.tensors():
            t[dst] = t[src]
        self.state.live[src] = False
        self.state.row[src] = self.rows
        self.slot_row[holes] = self.slot_row[movers]
        self.slot_steps[holes] = self.slot_steps[movers]
        self.paused[holes] = self.paused[movers]
        self.slot_row[movers] = -1
        self.paused[movers] = False
        self.slot_group[holes] = self.slot_group[movers]
        self.slot_group[movers] = -1 - np.asarray(movers)  # its copy is stale: a group of its own
        self._share()
