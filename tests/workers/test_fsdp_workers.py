"""The three FSDP workers, in-process (LocalWorkerGroup, world size 1), on tiny fp32 models (CPU)."""

import copy
import math
import os

import pytest
import torch
import torch.distributed as dist
from omegaconf import OmegaConf, open_dict

from verl.protocol import DataProto
from verl.rewards.model import sequence_scores
from verl.single_controller import ClassWithInitArgs
from verl.single_controller.local import LocalWorkerGroup
from verl.trainer.config_validation import compose_ppo_config
from verl.workers.fsdp_workers import (
    ActorRolloutRefWorker,
    CriticWorker,
    RewardModelWorker,
)

TEXTS = ["Natalia sold clips to her friends", "How many clips did"]
RESPONSE = 6
N = 2


@pytest.fixture(scope="module", autouse=True)
def leave_process_group():
    """The local workers share one process group; drop it so other modules start clean."""
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def base_config(tiny_qwen2_dir):
    config = compose_ppo_config([
        f"actor_rollout_ref.model.path={tiny_qwen2_dir}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.use_dynamic_bsz=false",  # micro batches by rows (the tests count them)
        "data.max_prompt_length=16", f"data.max_response_length={RESPONSE}",
        f"actor_rollout_ref.rollout.n={N}", "actor_rollout_ref.rollout.temperature=0.7",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "actor_rollout_ref.actor.optim.total_training_steps=10",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=3",
        "actor_rollout_ref.rollout.calculate_log_probs=true",  # the tests compare the engine's log-probs
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=3",
        "critic.model.enable_gradient_checkpointing=false", "critic.model.fsdp_config.dtype=float32",
        "critic.ppo_micro_batch_size_per_gpu=2", "critic.optim.lr=2e-3", "critic.cliprange_value=100.0",
        "reward_model.enable=true", f"reward_model.model.path={tiny_qwen2_dir}",
        "reward_model.micro_batch_size_per_gpu=3",
    ])
    OmegaConf.resolve(config)
    return config


def changed(config, **updates):
    """A copy of ``config`` with dotted keys (``__`` for ``.``) set; new keys are allowed."""
    config = copy.deepcopy(config)
    with open_dict(config):
        for key, value in updates.items():
            OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    return config


def actor_group(config, role="actor_rollout_ref"):
    group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, config=config.actor_rollout_ref, role=role))
    group.init_model()
    return group


def make_prompts(tokenizer, **meta_info):
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    position_ids = (enc.attention_mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict(
        {"input_ids": enc.input_ids, "attention_mask": enc.attention_mask, "position_ids": position_ids},
        {"raw_prompt": [[{"role": "user", "content": t}] for t in TEXTS]}, meta_info)


def handmade_batch(vocab, rows=4, prompt=5, seed=0, non_tensors=None):
    """Random non-special tokens, row 0 left-padded by 2, every response token valid (equal token counts)."""
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(3, vocab, (rows, prompt + RESPONSE), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, -RESPONSE:], "response_mask": torch.ones(rows, RESPONSE, dtype=torch.long),
    }, non_tensors, meta_info={"temperature": 0.7})


def masked_row_mean(values, mask):
    return (values * mask).sum(-1) / mask.sum(-1)


# ------------------------------------------------------------------------------------------------ actor
@pytest.fixture(scope="module")
def generated(base_config, tiny_tokenizer):
    torch.manual_seed(0)
    group = actor_group(base_config)
    out = group.generate_sequences(make_prompts(tiny_tokenizer, temperature=0.7, seed=1))
    old = group.compute_log_prob(out)
    ref = group.compute_ref_log_prob(out)
    return group, out, old, ref


def test_generate_then_log_probs_match_the_rollout(generated):
    _, out, old, ref = generated
    assert len(out) == len(TEXTS) * N and out.meta_info["temperature"] == 0.7
    assert out.batch["responses"].device.type == "cpu"
    mask = out.batch["response_mask"].bool()
    assert set(old.batch.keys()) == {"old_log_probs", "entropys"}
    assert old.batch["old_log_probs"].shape == (len(out), RESPONSE) == old.batch["entropys"].shape
    # Same positions and the same temperature as the sampler: an off-by-one shows up as O(1) differences.
    diff = (old.batch["old_log_probs"] - out.batch["rollout_log_probs"]).abs()[mask]
    assert diff.max() < 1e-4
    assert (old.batch["entropys"][mask] > 0).all()
    torch.testing.assert_close(ref.batch["ref_log_prob"], old.batch["old_log_probs"], rtol=0, atol=1e-6)


def test_rollout_log_probs_only_when_asked_for(base_config, tiny_tokenizer):
    group = actor_group(changed(base_config, actor_rollout_ref__rollout__calculate_log_probs=False), role="rollout")
    out = group.generate_sequences(make_prompts(tiny_tokenizer, temperature=0.7, seed=1))
    assert "rollout_log_probs" not in out.batch and "responses" in out.batch


def test_update_actor_moves_log_probs_with_the_advantages(generated):
    group, out, old, ref = generated
    batch = out.union(old)
    batch.union(ref)
    advantages = torch.zeros(len(batch), RESPONSE)
    advantages[0], advantages[2] = 1.0, -1.0  # different prompts
    batch.batch["advantages"] = advantages * batch.batch["response_mask"]

    result = group.update_actor(batch)
    assert len(result) == 0
    metrics = result.meta_info["metrics"]
    for key in ("actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl", "actor/grad_norm",
                "actor/lr", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb", "perf/cpu_memory_used_gb"):
        assert key in metrics and all(math.isfinite(v) for v in metrics[key]), key
    assert metrics["actor/kl_loss"] == [0.0] and "actor/entropy" not in metrics  # kl_loss 0 without KL loss
    assert len(metrics["actor/pg_clipfrac"]) == 2 and len(metrics["actor/grad_norm"]) == 1  # 2 micro-batches, 1 step
    assert len(metrics["actor/pg_loss"]) == 1  # the losses: once per update
    assert metrics["actor/ppo_kl"][0] == pytest.approx(0.0, abs=1e-6) and metrics["actor/pg_clipfrac"][0] == 0.0
    assert metrics["actor/lr"] == [1e-3] and metrics["perf/max_memory_allocated_gb"] == [0.0]
    assert metrics["perf/cpu_memory_used_gb"][0] > 0

    new = group.compute_log_prob(batch).batch["old_log_probs"]
    mask = batch.batch["response_mask"].float()
    change = masked_row_mean(new - old.batch["old_log_probs"], mask)
    assert change[0] > 0 and change[2] < 0
    assert torch.equal(group.compute_ref_log_prob(batch).batch["ref_log_prob"], ref.batch["ref_log_prob"])


def test_gradient_accumulation_matches_one_micro_batch(base_config, tiny_tokenizer):
    """Micro-batches of any size give the update of the whole mini-batch. The rows have 6, 1, 3 and 6
    valid response tokens: token-mean must weight each micro-batch by its tokens, not its rows (a
    row-weighted sum would give the 1-token row six times the weight of a 6-token row's tokens)."""
    variants = {  # micro-batches of 1 row, of the whole mini-batch (4 rows), and by a token budget:
        "1 row": {"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 1},
        "4 rows": {"actor_rollout_ref__actor__ppo_micro_batch_size_per_gpu": 4},
        "19 tokens": {"actor_rollout_ref__actor__use_dynamic_bsz": True,  # rows hold 9, 6, 8, 11 tokens
                      "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 19},
        # the default with packed forwards: by tokens (balanced: rows of 11+6 and 9+8 tokens)
        "packed, default": {"actor_rollout_ref__actor__use_dynamic_bsz": None,
                            "actor_rollout_ref__model__use_remove_padding": True,
                            "actor_rollout_ref__actor__ppo_max_token_len_per_gpu": 19},
    }
    states = {}
    for name, variant in variants.items():
        # No clipping and Adam's eps far above the gradients: the update is ~ -lr * grad / eps, so the
        # parameters compare the accumulated gradients themselves (a wrong micro-batch scale shows).
        config = changed(base_config, actor_rollout_ref__actor__grad_clip=0.0, actor_rollout_ref__actor__optim__eps=1.0,
                         actor_rollout_ref__actor__optim__lr=1e-2, **variant)
        group = actor_group(config, role="actor")
        batch = handmade_batch(len(tiny_tokenizer))
        batch.batch["response_mask"] = (torch.arange(RESPONSE) < torch.tensor([[6], [1], [3], [6]])).long()
        batch.batch["attention_mask"][:, -RESPONSE:] = batch.batch["response_mask"]
        batch.union(group.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
        batch.batch["advantages"] = torch.randn(4, RESPONSE, generator=torch.Generator().manual_seed(3))
        metrics = group.update_actor(batch).meta_info["metrics"]
        micro_batches = {"1 row": 4, "4 rows": 1, "19 tokens": 2, "packed, default": 2}[name]
        assert len(metrics["actor/pg_clipfrac"]) == micro_batches
        # On-policy (ratio 1) the mini-batch's token-mean loss is -sum(A * mask) / sum(mask), whatever the split.
        mask = batch.batch["response_mask"].float()
        expected = -float((batch.batch["advantages"] * mask).sum() / mask.sum())
        assert metrics["actor/pg_loss"] == [pytest.approx(expected, abs=1e-5)], name
        states[name] = group.worker.actor_engine.full_state_dict()
    for name, state in states.items():
        for key, value in state.items():
            torch.testing.assert_close(value, states["4 rows"][key], rtol=0, atol=1e-5, msg=f"{name}: {key}")


def test_kl_loss_and_entropy_metrics_and_bad_data(base_config, tiny_tokenizer):
    config = changed(base_config, actor_rollout_ref__actor__use_kl_loss=True,
                     actor_rollout_ref__actor__entropy_coeff=0.01)
    group = actor_group(config, role="actor")
    batch = handmade_batch(len(tiny_tokenizer))
    batch.union(group.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
    batch.batch["advantages"] = torch.ones(4, RESPONSE)
    with pytest.raises(Exception, match="ref_log_prob"):
        group.update_actor(batch)
    batch.batch["ref_log_prob"] = batch.batch["old_log_probs"].clone()
    batch.batch["advantages"][1, 2] = float("nan")
    with pytest.raises(Exception, match=r"advantages.*NaN or inf in 1 of 4 rows.*\[1\]"):
        group.update_actor(batch)
    batch.batch["advantages"][1, 2] = 1.0
    metrics = group.update_actor(batch).meta_info["metrics"]
    assert metrics["actor/kl_loss"][0] == pytest.approx(0.0, abs=1e-7)  # ref == current policy before the step
    assert metrics["actor/kl_coef"][0] == 0.001 and all(v > 0 for v in metrics["actor/entropy"])
    with pytest.raises(Exception, match="needs the rollout"):
        group.generate_sequences(make_prompts(tiny_tokenizer))


def test_actor_checkpoint_round_trip(base_config, tiny_tokenizer, tmp_path):
    group = actor_group(base_config, role="actor_rollout")
    batch = handmade_batch(len(tiny_tokenizer))
    batch.union(group.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
    batch.batch["advantages"] = torch.randn(4, RESPONSE, generator=torch.Generator().manual_seed(5))
    group.update_actor(batch)
    folder = str(tmp_path / "global_step_1" / "actor")
    group.save_checkpoint(folder, 1)
    assert {"config.json", "tokenizer.json"} <= set(os.listdir(os.path.join(folder, "huggingface")))
    saved = group.worker.actor_engine.full_state_dict()

    fresh = actor_group(base_config, role="actor_rollout")
    fresh.load_checkpoint(folder)
    loaded = fresh.worker.actor_engine.full_state_dict()
    assert all(torch.equal(saved[name], loaded[name]) for name in saved)
    # The rollout reads the loaded weights: greedy generation agrees with the saved worker's.
    prompts = make_prompts(tiny_tokenizer, do_sample=False)
    assert torch.equal(group.generate_sequences(prompts).batch["responses"],
                       fresh.generate_sequences(prompts).batch["responses"])


# ------------------------------------------------------------------------------------------------ critic
def test_critic_values_and_update(base_config, tiny_tokenizer):
    group = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, config=base_config.critic, rollout_n=N))
    group.init_model()
    batch = handmade_batch(len(tiny_tokenizer))
    values = group.compute_values(batch).batch["values"]
    assert values.shape == (4, RESPONSE) and values.dtype == torch.float32

    # The value of response token t is read at position t-1: the plain token-classification forward agrees.
    module = group.worker.engine.module
    with torch.no_grad():
        logits = module(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                        position_ids=batch.batch["position_ids"]).logits[..., 0]
    torch.testing.assert_close(values, logits[:, -RESPONSE - 1:-1], rtol=0, atol=1e-5)

    batch.batch["values"] = values
    batch.batch["returns"] = torch.ones(4, RESPONSE)
    losses = []
    for _ in range(3):
        metrics = group.update_critic(batch).meta_info["metrics"]
        for key in ("critic/vf_loss", "critic/vf_clipfrac", "critic/vpred_mean", "critic/grad_norm", "critic/lr"):
            assert key in metrics and all(math.isfinite(v) for v in metrics[key]), key
        assert len(metrics["critic/vf_clipfrac"]) == 2 and len(metrics["critic/grad_norm"]) == 1
        assert len(metrics["critic/vf_loss"]) == 1  # the mini-batch's loss
        losses.append(metrics["critic/vf_loss"][0])
    assert losses[2] < losses[1] < losses[0]


# ------------------------------------------------------------------------------------------------ reward model
def rm_group(config):
    group = LocalWorkerGroup(ClassWithInitArgs(RewardModelWorker, config=config.reward_model))
    group.init_model()
    return group


def scored_batch(tokenizer):
    """Two rows: left-padded prompts, responses ending early (right padding) or filling R."""
    batch = handmade_batch(len(tokenizer), rows=2,
                           non_tensors={"raw_prompt": [[{"role": "user", "content": t}] for t in TEXTS]})
    response_mask = torch.ones(2, RESPONSE, dtype=torch.long)
    response_mask[1, 3:] = 0
    batch.batch["response_mask"] = response_mask
    batch.batch["attention_mask"][:, -RESPONSE:] = response_mask
    batch.batch["input_ids"][1, -RESPONSE + 3:] = tokenizer.pad_token_id
    batch.batch["responses"] = batch.batch["input_ids"][:, -RESPONSE:]
    return batch


def test_reward_model_scores_at_the_last_valid_token(base_config, tiny_tokenizer):
    group = rm_group(base_config)
    assert group.worker.input_tokenizer is None  # the policy's tokenizer: ids are scored as they are
    batch = scored_batch(tiny_tokenizer)
    scores = group.compute_rm_score(batch).batch["rm_scores"]
    assert scores.shape == (2, RESPONSE)
    last = [RESPONSE - 1, 2]
    module = group.worker.engine.module
    for row, column in enumerate(last):
        assert torch.count_nonzero(scores[row]) == 1 and scores[row, column] != 0
        valid = batch.batch["input_ids"][row][batch.batch["attention_mask"][row].bool()][None]
        with torch.no_grad():  # transformers' own pooling of an unpadded row (no pad token in it)
            expected = module(input_ids=valid).logits[0, 0]
        assert scores[row, column].item() == pytest.approx(expected.item(), abs=1e-5)


def test_reward_model_with_its_own_chat_template(base_config, tiny_tokenizer, tiny_qwen2_dir, tmp_path):
    rm_dir = tmp_path / "rm"
    rm_dir.mkdir()
    for name in os.listdir(tiny_qwen2_dir):
        os.symlink(os.path.join(tiny_qwen2_dir, name), rm_dir / name)
    rm_tokenizer = copy.deepcopy(tiny_tokenizer)
    rm_tokenizer.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (rm_dir / name).exists():
            (rm_dir / name).unlink()
    rm_tokenizer.save_pretrained(str(rm_dir))

    group = rm_group(changed(base_config, reward_model__model__path=str(rm_dir)))
    assert group.worker.input_tokenizer is not None
    batch = scored_batch(tiny_tokenizer)
    scores = group.compute_rm_score(batch).batch["rm_scores"]
    module = group.worker.engine.module
    for row, column in enumerate([RESPONSE - 1, 2]):
        response = tiny_tokenizer.decode(batch.batch["responses"][row][batch.batch["response_mask"][row].bool()])
        text = f"user: {TEXTS[row]}\nassistant: {response}\n"
        ids = torch.tensor([rm_tokenizer(text, add_special_tokens=False)["input_ids"]])
        expected = sequence_scores(module, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None])
        assert scores[row, column].item() == pytest.approx(expected.item(), abs=1e-5)
    with pytest.raises(Exception, match="return_raw_chat"):
        batch.non_tensor_batch.pop("raw_prompt")
        group.compute_rm_score(batch)


# ------------------------------------------------------------------------------------------------ LoRA
LORA = {"actor_rollout_ref__model__lora_rank": 4, "actor_rollout_ref__model__lora_alpha": 8,
        "actor_rollout_ref__actor__optim__lr": 5e-2}


def _trained_lora_actor(base_config, tokenizer, steps=3):
    pytest.importorskip("peft")
    group = actor_group(changed(base_config, **LORA))
    batch = handmade_batch(len(tokenizer))
    batch.union(group.compute_log_prob(batch).select(batch_keys=["old_log_probs"]))
    batch.batch["advantages"] = torch.randn(4, RESPONSE, generator=torch.Generator().manual_seed(5))
    for _ in range(steps):
        group.update_actor(batch)
    return group, batch


def test_lora_actor_trains_the_adapter_and_its_reference_is_the_base_model(base_config, tiny_tokenizer):
    base = actor_group(base_config, role="ref")  # the plain model, as a reference worker loads it
    group, batch = _trained_lora_actor(base_config, tiny_tokenizer)
    worker = group.worker
    assert worker.ref_engine is worker.actor_engine  # no second copy of the weights
    trained = [p for g in worker.actor_engine.optimizer.param_groups for p in g["params"]]
    lora_params = [p for n, p in worker.actor_engine.module.named_parameters() if "lora_" in n]
    assert len(trained) == len(lora_params) == 2 * 2 * 7  # A and B of 7 linears in 2 layers, nothing else

    base_lp = base.compute_ref_log_prob(batch).batch["ref_log_prob"]
    ref_lp = group.compute_ref_log_prob(batch).batch["ref_log_prob"]
    actor_lp = group.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(ref_lp, base_lp, rtol=0, atol=1e-6)
    assert (actor_lp - base_lp).abs().max() > 1e-2  # the adapter learned something

    # Generation uses base + adapter (merged into the gathered weights) and leaves the masters alone.
    before = worker.actor_engine.full_state_dict()
    out = group.generate_sequences(make_prompts(tiny_tokenizer, temperature=0.7, seed=1))
    after = worker.actor_engine.full_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    mask = out.batch["response_mask"].bool()
    old = group.compute_log_prob(out).batch["old_log_probs"]
    assert (old - out.batch["rollout_log_probs"]).abs()[mask].max() < 1e-4
    plain = base.compute_ref_log_prob(out).batch["ref_log_prob"]
    assert (plain - out.batch["rollout_log_probs"]).abs()[mask].max() > 1e-2


def test_lora_checkpoint_holds_the_adapter_resumes_and_exports(base_config, tiny_tokenizer, tiny_qwen2_dir,
                                                               tmp_path):
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.model_merger.fsdp import merge_fsdp_checkpoint

    group, batch = _trained_lora_actor(base_config, tiny_tokenizer, steps=2)
    config = changed(base_config, **LORA, actor_rollout_ref__actor__checkpoint__save_contents=[
        "model", "optimizer", "extra", "hf_model"])
    group.worker.config = config.actor_rollout_ref
    folder = str(tmp_path / "global_step_2" / "actor")
    group.save_checkpoint(folder, 2)
    shards = torch.load(os.path.join(folder, "model_world_size_1_rank_0.pt"), weights_only=True)["state_dict"]
    assert shards and all("lora_" in name for name in shards)  # the adapter only: the base is model.path
    optim = torch.load(os.path.join(folder, "optim_world_size_1_rank_0.pt"), weights_only=True)
    assert len(optim["state"]) == len(shards)
    with open(os.path.join(folder, "fsdp_config.json")) as f:
        assert json.load(f)["lora"]["r"] == 4
    assert {"adapter_config.json", "adapter_model.safetensors", "config.json"} <= set(
        os.listdir(os.path.join(folder, "huggingface")))

    # Resume: a fresh LoRA worker loads the adapter and continues exactly where this one was.
    fresh = actor_group(changed(base_config, **LORA))
    fresh.load_checkpoint(folder)
    expected = group.compute_log_prob(batch).batch["old_log_probs"]
    torch.testing.assert_close(fresh.compute_log_prob(batch).batch["old_log_probs"], expected, rtol=0, atol=0)
    batch.batch["advantages"] = torch.randn(4, RESPONSE, generator=torch.Generator().manual_seed(7))
    group.update_actor(batch)
    fresh.update_actor(batch)
    saved, loaded = group.worker.actor_engine.full_state_dict(), fresh.worker.actor_engine.full_state_dict()
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)

    # Export: the PEFT adapter folder, and the merged model; both give the checkpoint's policy.
    adapter = merge_fsdp_checkpoint(folder, str(tmp_path / "adapter"))
    merged = merge_fsdp_checkpoint(folder, str(tmp_path / "merged"), merge_lora=True)
    ids = batch.batch["input_ids"][:1]
    with torch.no_grad():
        via_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir), adapter)(ids).logits
        via_merge = AutoModelForCausalLM.from_pretrained(merged)(ids).logits
        via_base = AutoModelForCausalLM.from_pretrained(tiny_qwen2_dir)(ids).logits
    torch.testing.assert_close(via_merge, via_peft, rtol=1e-5, atol=1e-5)
    assert (via_merge - via_base).abs().max() > 1e-2
    with pytest.raises(ValueError, match="not a LoRA checkpoint"):
        plain = actor_group(base_config, role="actor")
        plain.save_checkpoint(str(tmp_path / "plain" / "actor"), 1)
        merge_fsdp_checkpoint(str(tmp_path / "plain" / "actor"), str(tmp_path / "x"), merge_lora=True)


def test_lora_critic_trains_adapter_and_value_head(base_config, tiny_tokenizer, tmp_path):
    pytest.importorskip("peft")
    config = changed(base_config, critic__model__lora_rank=4, critic__model__lora_alpha=8)
    group = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, config=config.critic, rollout_n=N))
    group.init_model()
    trained = {n for n, p in group.worker.engine.module.named_parameters() if p.requires_grad}
    assert "score.weight" in trained and all("lora_" in n or n.startswith("score.") for n in trained)
    batch = handmade_batch(len(tiny_tokenizer))
    batch.batch["values"] = group.compute_values(batch).batch["values"]
    batch.batch["returns"] = torch.ones(4, RESPONSE)
    losses = [sum(group.update_critic(batch).meta_info["metrics"]["critic/vf_loss"]) for _ in range(3)]
    assert losses[2] < losses[0]
    group.save_checkpoint(str(tmp_path / "critic"), 1)
    shards = torch.load(str(tmp_path / "critic" / "model_world_size_1_rank_0.pt"), weights_only=True)["state_dict"]
    assert "score.weight" in shards and all("lora_" in n or n.startswith("score.") for n in shards)
