"""Multi-turn episodes on the native engine: each episode keeps its cache slot between turns (only the
continuation is prefilled), continuations are admitted as soon as they are ready (no round barrier),
and everything matches the round-based default and a full recomputation with transformers."""

import concurrent.futures
import threading

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from verl.interactions.base import BaseInteraction
from verl.protocol import DataProto
from verl.workers.rollout import NativeRollout
from verl.workers.rollout.agent_loop import ToolAgentLoop
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.native.cache import SlotCache
from verl.workers.rollout.native.model import DecoderWeights, extend, prefill

from .test_native_rollout import _from_config, make_config, make_prompts

LENGTH = 40
CONTINUATION = [7, 8, 9]


@pytest.fixture(scope="module")
def model(tiny_qwen2_dir):
    return _from_config(AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir).config)


def frequent_eos(tokenizer):
    """A fifth of the vocabulary ends a turn, so random-weight turns are a few tokens long."""
    return [i for i in range(len(tokenizer)) if i % 5 == 0]


def done(value):
    future = concurrent.futures.Future()
    future.set_result(value)
    return future


def recomputed(model, prompts, out, n):
    """Log-probs and argmax of every response token, from one transformers forward over the whole sequence."""
    width = prompts.batch["input_ids"].shape[1]
    ids = torch.cat([prompts.batch["input_ids"].repeat_interleave(n, 0), out.responses], 1)
    valid = (torch.arange(out.responses.shape[1])[None] < out.lengths[:, None]).long()
    mask = torch.cat([prompts.batch["attention_mask"].repeat_interleave(n, 0), valid], 1)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
    logits = logits[:, width - 1:-1].float()
    return torch.log_softmax(logits, -1).gather(-1, out.responses[..., None]).squeeze(-1), logits.argmax(-1)


def test_extend_appends_to_cached_sequences_like_a_full_forward(model, tiny_tokenizer):
    prompts = make_prompts(tiny_tokenizer)
    ids, valid = prompts.batch["input_ids"], prompts.batch["attention_mask"].bool()
    rows, width = ids.shape
    w = DecoderWeights(model)
    w.bind()
    cache = SlotCache(w.num_layers, rows, w.num_kv_heads, 64, w.head_dim, torch.float32, torch.device("cpu"))
    new = torch.tensor([[5, 6, 7], [8, 9, 0], [11, 0, 0], [14, 15, 16]])  # right-padded, lengths 3, 2, 1, 3
    lengths = torch.tensor([3, 2, 1, 3])
    slots = torch.tensor([2, 0, 3, 1])  # any slot order
    with torch.no_grad():
        prefill(w, cache, ids, valid, 0, slots, torch.arange(rows))
        logits = extend(w, cache, new, lengths, torch.full((rows,), width), (~valid).sum(1), slots)
        for r in range(rows):
            full = torch.cat([ids[r, valid[r]], new[r, :lengths[r]]])[None]
            want = model(input_ids=full).logits[0, -1]
            torch.testing.assert_close(logits[r], want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_episodes_match_rounds_and_a_full_recomputation(model, tiny_tokenizer, greedy):
    prompts = make_prompts(tiny_tokenizer, do_sample=not greedy, eos_token_id=frequent_eos(tiny_tokenizer),
                           response_length=LENGTH, seed=3, n=2)
    engine = NativeRollout(make_config(response_length=LENGTH), model, tiny_tokenizer)
    turns = {}

    def on_turn(row, ids, log_probs, used):
        turns.setdefault(row, []).append((list(ids), used))
        return done(CONTINUATION if used < 30 else None)

    out = engine.generate_episodes(prompts, on_turn)
    assert engine.last_stats["turns"] == sum(map(len, turns.values())) and engine.last_stats["extend_s"] > 0
    log_probs, argmax = recomputed(model, prompts, out, 2)
    generated = out.generated.bool()
    torch.testing.assert_close(out.log_probs[generated], log_probs[generated], atol=1e-4, rtol=0)
    assert torch.all(out.log_probs[~generated] == 0)
    for row in range(8):
        length = int(out.lengths[row])
        response = out.responses[row, :length].tolist()
        # The response is the turns the callback saw, each followed by the continuation it returned.
        expected, mask = [], []
        for ids, used in turns[row]:
            expected += ids
            mask += [1] * len(ids)
            assert used == len(expected)
            if used < 30 and used + len(CONTINUATION) < LENGTH:
                expected += CONTINUATION
                mask += [0] * len(CONTINUATION)
        assert response == expected and out.generated[row, :length].tolist() == mask
        assert torch.all(out.responses[row, length:] == tiny_tokenizer.pad_token_id)
        assert out.generated[row, length:].sum() == 0
    assert len(turns[0]) > 1  # episodes did continue
    if greedy:
        assert torch.all((argmax == out.responses)[generated])
        rounds = BaseRollout.generate_episodes(engine, prompts, lambda r, i, lp, used: done(
            CONTINUATION if used < 30 else None))
        assert torch.equal(rounds.responses, out.responses) and torch.equal(rounds.generated, out.generated)


def test_a_slow_continuation_does_not_hold_back_the_other_episodes(model, tiny_tokenizer):
    """Row 0's first tool call returns only once row 1 has finished three turns: no round barrier."""
    prompts = make_prompts(tiny_tokenizer, do_sample=False, eos_token_id=frequent_eos(tiny_tokenizer),
                           response_length=LENGTH)
    engine = NativeRollout(make_config(response_length=LENGTH), model, tiny_tokenizer)
    events, slow = [], concurrent.futures.Future()
    fallback = threading.Timer(20.0, lambda: slow.done() or slow.set_result(CONTINUATION))
    fallback.start()

    def on_turn(row, ids, log_probs, used):
        turn = sum(1 for r, _ in events if r == row) + 1
        events.append((row, turn))
        if row == 1 and turn == 3 and not slow.done():
            slow.set_result(CONTINUATION)
        if row == 0 and turn == 1:
            return slow
        return done(CONTINUATION if turn < 4 and used + 4 < LENGTH else None)

    try:
        out = engine.generate_episodes(prompts, on_turn)
    finally:
        fallback.cancel()
    assert events.index((1, 3)) < events.index((0, 2))
    assert out.generated[0].tolist().count(0) >= len(CONTINUATION)  # row 0 did get its continuation


class TryAgain(BaseInteraction):
    """Asks for another answer twice, with a turn score of 0.25 each time, then ends the episode."""

    async def generate_response(self, instance_id, messages, **kwargs):
        state = self._instances[instance_id]
        state["asked"] = state.get("asked", 0) + 1
        assert messages[-1]["role"] == "assistant"
        return state["asked"] > 2, f"Try again, {state['who']}.", 0.25, {}


def test_agent_loop_with_a_simulated_user_on_the_native_engine(model, tiny_tokenizer):
    im_end = tiny_tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages = [[{"role": "user", "content": f"Question {i}"}] for i in range(2)]
    rendered = [tiny_tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=True, return_dict=False)
                for m in messages]
    width = max(map(len, rendered)) + 2
    input_ids = torch.tensor([[0] * (width - len(r)) + r for r in rendered])
    mask = (torch.arange(width)[None] >= torch.tensor([width - len(r) for r in rendered])[:, None]).long()
    prompts = DataProto.from_dict(
        {"input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"raw_prompt": np.array([None, None], dtype=object),
                     "extra_info": np.array([{"interaction_kwargs": {"who": "Ann"}},
                                             {"interaction_kwargs": {"who": "Bob"}}], dtype=object)},
        meta_info={"response_length": 200, "eos_token_id": [im_end] + frequent_eos(tiny_tokenizer),
                   "do_sample": True, "seed": 1, "n": 2})
    prompts.non_tensor_batch["raw_prompt"][:] = messages
    engine = NativeRollout(make_config(response_length=200), model, tiny_tokenizer)
    agent = ToolAgentLoop(engine, tiny_tokenizer, {"tokenization_sanity_check_mode": "disable"}, {},
                          {"retry": TryAgain({})})
    out = agent.generate_sequences(prompts)
    assert out.non_tensor_batch["__num_turns__"].tolist() == [5] * 4  # 3 assistant turns, 2 user turns
    assert [info["turn_scores"] for info in out.non_tensor_batch["extra_info"]] == [[0.25] * 3] * 4
    assert out.non_tensor_batch["__turn_score__"].tolist() == [0.75] * 4
    for row, who in enumerate(["Ann", "Ann", "Bob", "Bob"]):
        length = int(out.batch["attention_mask"][row, width:].sum())
        ids = out.batch["responses"][row, :length]
        gen = out.batch["response_mask"][row, :length].bool()
        context = tiny_tokenizer.decode(ids[~gen].tolist())
        assert context.count(f"<|im_start|>user\nTry again, {who}.<|im_end|>") == 2
        assert gen[-1]  # the episode ends on the model's own turn
    log_probs, _ = recomputed(model, DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask}),
                              type("Out", (), {"responses": out.batch["responses"],
                                               "lengths": out.batch["attention_mask"][:, width:].sum(-1)}), 2)
    gen = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][gen], log_probs[gen], atol=1e-4, rtol=0)
