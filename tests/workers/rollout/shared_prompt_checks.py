"""What the fused decode attention's shared prompts rely on, checked on a CPU through the scheduler's real
bookkeeping. The torch path that runs on a CPU reads every row's own copy of its prompt and ignores the chunk
table; the CUDA kernel reads a chunk's prompt from its first slot only, so the table must be right."""

import torch

from verl.workers.rollout.native import scheduler, stream


def watch_shared_prompts(monkeypatch, chunk: int) -> dict:
    """Turn shared prompts on with chunks of at most ``chunk`` rows (the CPU's decode would say 0) and check, before
    every decode step of a batch of ``b`` rows:

    - the table on the device is the one of the slots' groups; each chunk is listed by its first (lowest) slot and
      holds at most ``chunk`` slots; every row of the step is in exactly one chunk (so the kernel covers it);
    - slots of one group hold the same keys and values over their prompt columns ``[start, shared_end)``, and
      their starts and prompt ends are equal (so reading the first slot's copy is right);
    - running rows of one prompt prefilled by one call are in one group (so nothing that could be shared is not,
      after slots were packed).

    Returns counts: decode steps, rows that read their prompt from another slot, steps after a packing."""
    seen = {"steps": 0, "shared_rows": 0, "steps_after_moves": 0}
    real_step, real_prefill, real_compact = scheduler.Run._decode_step, scheduler.Run._prefill, scheduler.Run._compact
    real_prefill_suspended = stream.StreamRun._prefill_suspended
    prefilled_by: dict[int, int] = {}  # row -> the prefill call that admitted it
    calls = [0]
    moved = [False]

    def prefill(run, prompts, rows, slots):
        calls[0] += 1
        prefilled_by.update({row: calls[0] for row in rows})
        real_prefill(run, prompts, rows, slots)

    def prefill_suspended(run, rows, slots):  # each row alone: prompt and its own generated tokens
        for row in rows:
            calls[0] += 1
            prefilled_by[row] = calls[0]
        real_prefill_suspended(run, rows, slots)

    def compact(run):
        before = run.slot_row.copy()
        real_compact(run)
        moved[0] |= bool((before != run.slot_row).any())

    def step(run, b):
        s, cache = run.state, run.cache
        assert run.share_chunk == chunk
        table = s.members.cpu()
        assert torch.equal(table, torch.from_numpy(scheduler.shared_prefix_table(
            run.slot_group, chunk, scheduler.SHARED_TABLE_WIDTH)))
        leader_of = {}
        for leader, entry in enumerate(table.tolist()):
            if entry[0] < 0:
                continue
            rows = [r for r in entry if r >= 0]
            assert rows[0] == leader and rows == entry[:len(rows)] and rows == sorted(rows) and len(rows) <= chunk
            leader_of.update({r: leader for r in rows})
        assert all(r in leader_of for r in range(b)) and len(leader_of) == len(run.slot_group)
        start, end = s.start.tolist(), s.shared_end.tolist()
        for r in range(b):
            leader = leader_of[r]
            if run.slot_group[r] < 0:  # never prefilled in this call, or a stale copy: a group of its own
                assert leader == r
                continue
            assert start[r] == start[leader] and end[r] == end[leader] == run.width, r
            cols = slice(start[r], end[r])
            for part in (cache.k, cache.v):
                assert torch.equal(part[:, r, :, cols], part[:, leader, :, cols]), (r, leader)
            seen["shared_rows"] += leader != r
        running = [slot for slot in range(b) if run.slot_row[slot] >= 0]
        for a in running:
            for c in running:
                row_a, row_c = int(run.slot_row[a]), int(run.slot_row[c])
                same = row_a // run.params.n == row_c // run.params.n and prefilled_by[row_a] == prefilled_by[row_c]
                assert same == (run.slot_group[a] == run.slot_group[c]), (a, c, run.slot_group)
        seen["steps"] += 1
        seen["steps_after_moves"] += moved[0]
        real_step(run, b)

    monkeypatch.setattr(scheduler, "decode_shared_chunk", lambda w, n: min(n, chunk) if n > 1 else 0)
    monkeypatch.setattr(scheduler.Run, "_prefill", prefill)
    monkeypatch.setattr(stream.StreamRun, "_prefill_suspended", prefill_suspended)
    monkeypatch.setattr(scheduler.Run, "_compact", compact)
    monkeypatch.setattr(scheduler.Run, "_decode_step", step)
    return seen
