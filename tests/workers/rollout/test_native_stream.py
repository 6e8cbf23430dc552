"""The native engine's stream (the asynchronous trainer's rollout) on a tiny random Qwen2, CPU fp32: a call asked
for every group is the synchronous call; suspended rows resume where they stopped, with their own log-probs and the
weights of the moment; groups can be cancelled, waited for, and outnumber the first allocation."""

import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM

from verl.protocol import DataProto
from verl.workers.rollout import NativeRollout

LENGTH = 10
WIDTH = 24
TEXTS = ["Natalia sold clips to her friends", "The answer", "How many clips did", "Betty is saving money"]


@pytest.fixture(scope="module")
def model(tiny_qwen2_dir):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir, dtype=torch.float32)
    with torch.no_grad():  # larger weights than the default init: next-token distributions with structure
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.1)
    return model.eval()


def prompts_of(tokenizer, texts=TEXTS, prefix="u"):
    enc = tokenizer(texts, return_tensors="pt", padding="max_length", max_length=WIDTH, truncation=True)
    position_ids = torch.clamp(enc.attention_mask.cumsum(dim=1) - 1, min=0)
    return DataProto.from_dict({"input_ids": enc.input_ids, "attention_mask": enc.attention_mask,
                                "position_ids": position_ids}, {"uid": [f"{prefix}{i}" for i in range(len(texts))]})


def engine(model, tokenizer, **overrides):
    config = {"name": "native", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "n": 2,
              "response_length": LENGTH, "prompt_length": WIDTH, "ignore_eos": False, "max_num_seqs": 1024,
              "free_cache_engine": True, "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1,
                                                        "do_sample": False}}
    config.update(overrides)
    return NativeRollout(OmegaConf.create(config), model, tokenizer)


def by_uid(batch: DataProto) -> dict:
    out = {}
    for i, uid in enumerate(batch.non_tensor_batch["uid"]):
        out.setdefault(uid, []).append(i)
    return out


def recompute(model, batch: DataProto, rows) -> torch.Tensor:
    """Log-probs of the recorded responses under ``model`` (a full forward over prompt + response)."""
    data = batch.batch
    with torch.no_grad():
        logits = model(input_ids=data["input_ids"][rows], attention_mask=data["attention_mask"][rows],
                       position_ids=data["position_ids"][rows]).logits[:, data["prompts"].shape[1] - 1:-1]
    return torch.log_softmax(logits, -1).gather(-1, data["responses"][rows][..., None]).squeeze(-1)


def test_a_call_asked_for_every_group_is_the_synchronous_call(model, tiny_tokenizer):
    prompts = prompts_of(tiny_tokenizer)
    for max_num_seqs in (1024, 3):  # everything at once, and rows waiting for slots
        torch.manual_seed(7)
        sync = engine(model, tiny_tokenizer, max_num_seqs=max_num_seqs).generate_sequences(prompts)
        torch.manual_seed(7)
        out, stats = engine(model, tiny_tokenizer, max_num_seqs=max_num_seqs).generate_stream(
            prompts, version=0, until_groups=len(prompts))
        assert list(out.non_tensor_batch["uid"]) != [] and stats["in_flight_groups"] == 0
        order = [i for uid in sync.non_tensor_batch["uid"][::2] for i in by_uid(out)[uid]]
        for key in ("responses", "rollout_log_probs", "input_ids", "attention_mask", "position_ids", "response_mask"):
            assert torch.equal(out.batch[key][order], sync.batch[key]), key
        assert (out.non_tensor_batch["rollout_min_version"] == 0).all()


def _eos_that_stops_one_row_early(model, tokenizer):
    """A token that greedy decoding emits early in one row and late or never in another, so rows stop at
    different steps."""
    full = engine(model, tokenizer, do_sample=False, ignore_eos=True).generate_sequences(prompts_of(tokenizer))
    rows = full.batch["responses"][::2].tolist()
    for token in rows[0][1:4]:
        firsts = [row.index(token) if token in row else LENGTH for row in rows]
        if firsts[0] <= 3 and max(firsts) >= 7:
            return token
    pytest.fail(f"no token of {rows[0][:4]} stops row 0 early and another row late: {rows}")


@pytest.mark.parametrize("shared_prompts", [False, True])
def test_suspended_rows_resume_where_they_stopped(model, tiny_tokenizer, monkeypatch, shared_prompts):
    """With ``shared_prompts``, also the chunk table of the shared-prompt decode attention through suspension and
    resumption (``shared_prompt_checks``: a resumed row is prefilled alone and shares with no slot)."""
    eos = _eos_that_stops_one_row_early(model, tiny_tokenizer)
    prompts = prompts_of(tiny_tokenizer)
    prompts.meta_info["eos_token_id"] = [eos]
    whole = engine(model, tiny_tokenizer, do_sample=False).generate_sequences(prompts)

    if shared_prompts:
        from tests.workers.rollout.shared_prompt_checks import watch_shared_prompts

        seen = watch_shared_prompts(monkeypatch, chunk=2)
    rollout = engine(model, tiny_tokenizer, do_sample=False)
    rollout.default_eos_token_ids = [eos]
    first, stats = rollout.generate_stream(prompts, version=0, until_groups=1)
    assert 1 <= len(by_uid(first)) < len(prompts) and stats["in_flight_groups"] == len(prompts) - len(by_uid(first))
    suspended = [r for r in rollout.stream.resuming]
    assert suspended and all(0 < rollout.stream.row_steps[r] < LENGTH for r in suspended)
    rest, stats = rollout.generate_stream(None, version=0, until_groups=len(prompts))
    assert stats["resumed"] == len(suspended) and stats["in_flight_groups"] == 0
    got = DataProto.concat([first, rest])
    for uid, rows in by_uid(got).items():
        expected = [i for i, u in enumerate(whole.non_tensor_batch["uid"]) if u == uid]
        assert torch.equal(got.batch["responses"][rows], whole.batch["responses"][expected])
        torch.testing.assert_close(got.batch["rollout_log_probs"][rows], whole.batch["rollout_log_probs"][expected],
                                   atol=1e-5, rtol=0)
    if shared_prompts:
        assert seen["shared_rows"] > 0 and seen["steps"] > 0, seen


def test_resumed_rows_continue_with_the_new_weights_and_keep_their_log_probs(model, tiny_tokenizer):
    eos = _eos_that_stops_one_row_early(model, tiny_tokenizer)
    prompts = prompts_of(tiny_tokenizer)
    rollout = engine(model, tiny_tokenizer, do_sample=False)
    rollout.default_eos_token_ids = [eos]
    first, _ = rollout.generate_stream(prompts, version=0, until_groups=1)
    stream = rollout.stream
    steps = {stream.groups[r // 2].uid + f"/{r % 2}": int(stream.row_steps[r]) for r in stream.resuming}
    old = {k: v.clone() for k, v in model.state_dict().items()}
    try:
        with torch.no_grad():  # an "update": the module's own tensors change in place
            for name, p in model.named_parameters():
                if "mlp" in name:
                    p.mul_(1.5)
        new_model_copy = AutoModelForCausalLM.from_config(model.config, dtype=torch.float32).eval()
        new_model_copy.load_state_dict(model.state_dict())
        rest, _ = rollout.generate_stream(None, version=1, until_groups=len(prompts))
    finally:
        model.load_state_dict(old)
    assert (first.non_tensor_batch["rollout_max_version"] == 0).all()
    old_lp, new_lp = recompute(model, rest, slice(None)), recompute(new_model_copy, rest, slice(None))
    seen = 0
    for i, uid in enumerate(rest.non_tensor_batch["uid"]):
        sample = sum(1 for j in range(i) if rest.non_tensor_batch["uid"][j] == uid)
        k = steps.get(f"{uid}/{sample}")
        mask = rest.batch["response_mask"][i].bool()
        recorded = rest.batch["rollout_log_probs"][i]
        if k is None:  # a row that had finished before the update: all from the old weights
            continue
        seen += 1
        versions = rest.non_tensor_batch["rollout_min_version"][i], rest.non_tensor_batch["rollout_max_version"][i]
        assert versions == (0, 1)
        before, after = torch.arange(LENGTH) < k, torch.arange(LENGTH) >= k
        torch.testing.assert_close(recorded[before & mask], old_lp[i][before & mask], atol=1e-4, rtol=0)
        torch.testing.assert_close(recorded[after & mask], new_lp[i][after & mask], atol=1e-4, rtol=0)
        assert not torch.allclose(old_lp[i][after & mask], new_lp[i][after & mask], atol=1e-3)
    assert seen


def test_groups_can_be_cancelled_waited_for_and_outnumber_the_first_allocation(model, tiny_tokenizer):
    rollout = engine(model, tiny_tokenizer, max_num_seqs=4)
    texts = TEXTS * 3  # 12 groups: more than the stream's first 8 prompt slots
    first, stats = rollout.generate_stream(prompts_of(tiny_tokenizer, texts), version=0, until_groups=1,
                                           wait_uids=["u3"])
    done = set(by_uid(first))
    assert "u3" in done and len(rollout.stream.groups) == 12 - len(done)
    cancel = sorted(set(f"u{i}" for i in range(12)) - done)[:3]
    more = prompts_of(tiny_tokenizer, TEXTS[:2], prefix="v")
    rest, stats = rollout.generate_stream(more, version=0, until_groups=100, cancel_uids=cancel)
    assert stats["cancelled_groups"] == 3 and stats["in_flight_groups"] == 0
    returned = set(by_uid(rest))
    assert returned == set(f"u{i}" for i in range(12)) - done - set(cancel) | {"v0", "v1"}
    assert all(len(rows) == 2 for rows in by_uid(rest).values())


def test_a_serving_rollout_decodes_on_its_own_thread_takes_new_weights_and_pauses_for_validation(model, tiny_tokenizer):
    """separate_async's rollout: groups handed over come back finished; weights staged while it decodes are in
    effect for what it generates next (checked against a fresh engine on those weights, greedy); a synchronous call
    in between (validation) runs on the paused engine."""
    import copy

    own = copy.deepcopy(model)  # the rollout's own copy: the test changes it
    rollout = engine(own, tiny_tokenizer, do_sample=False)
    server = rollout.serve()
    try:
        out, _ = rollout.generate_stream(prompts_of(tiny_tokenizer), version=0, until_groups=len(TEXTS))
        assert sorted(by_uid(out)) == [f"u{i}" for i in range(len(TEXTS))]
        assert (out.non_tensor_batch["rollout_max_version"] == 0).all()

        new = {name: p.detach() * 1.3 for name, p in own.named_parameters()}
        rollout.generate_stream(prompts_of(tiny_tokenizer, prefix="a"), version=0, until_groups=0)  # in flight
        server.stage_weights(1, lambda: [p.copy_(new[name]) for name, p in own.named_parameters()])
        val = rollout.generate_sequences(prompts_of(tiny_tokenizer))  # while groups are in flight
        assert val.batch["responses"].shape == (len(TEXTS) * 2, LENGTH)
        late, _ = rollout.generate_stream(prompts_of(tiny_tokenizer, prefix="b"), version=0, until_groups=2 * len(TEXTS))
        assert set(by_uid(late)) == {f"{p}{i}" for p in "ab" for i in range(len(TEXTS))}
        rows = [i for i, uid in enumerate(late.non_tensor_batch["uid"]) if uid.startswith("b")]
        assert (late.non_tensor_batch["rollout_min_version"][rows] == 1).all()
        updated = copy.deepcopy(model)
        with torch.no_grad():
            for name, p in updated.named_parameters():
                p.copy_(new[name])
        fresh = engine(updated, tiny_tokenizer, do_sample=False).generate_sequences(
            prompts_of(tiny_tokenizer, prefix="b"))
        for uid, got in by_uid(late).items():
            if uid.startswith("b"):
                want = [i for i, u in enumerate(fresh.non_tensor_batch["uid"]) if u == uid]
                assert torch.equal(late.batch["responses"][got], fresh.batch["responses"][want])
    finally:
        server.close()


def test_a_call_with_fewer_slots_than_rows_suspended_resumes_them_as_slots_free(model, tiny_tokenizer):
    """On a GPU each call sizes the cache from the memory free at that moment, which can be less than the last
    call had: suspended rows wait for slots like new ones (with greedy decoding, the outcome is the same)."""
    import dataclasses

    prompts = prompts_of(tiny_tokenizer, TEXTS * 2)
    whole = engine(model, tiny_tokenizer, do_sample=False, ignore_eos=True).generate_sequences(prompts)
    rollout = engine(model, tiny_tokenizer, do_sample=False, ignore_eos=True, max_num_seqs=8)
    first, _ = rollout.generate_stream(prompts, version=0, until_groups=1)
    assert len(rollout.stream.resuming) > 2  # rows admitted after the first groups finished, then suspended
    rollout.config = dataclasses.replace(rollout.config, max_num_seqs=2)  # the next call gets 2 slots
    rest, _ = rollout.generate_stream(None, version=0, until_groups=len(prompts))
    got = DataProto.concat([first, rest])
    for uid, rows in by_uid(got).items():
        expected = [i for i, u in enumerate(whole.non_tensor_batch["uid"]) if u == uid]
        assert torch.equal(got.batch["responses"][rows], whole.batch["responses"][expected])
