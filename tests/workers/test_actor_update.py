"""The actor update on one CPU rank: old log-probs taken from the update's own forward when it is on-policy."""

import pytest
import torch

from verl.models import load_causal_lm
from verl.protocol import DataProto
from verl.workers.actor import DataParallelPPOActor
from verl.workers.engine import FSDPEngine

CONFIG = {"ppo_epochs": 1, "loss_agg_mode": "token-mean", "clip_ratio": 0.2, "use_kl_loss": True,
          "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl"}
OPTIM = {"lr": 1e-3, "total_training_steps": 4}


def _batch(vocab, rows=6, prompt=5, response=4):
    generator = torch.Generator().manual_seed(7)
    input_ids = torch.randint(0, vocab, (rows, prompt + response), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[0, :2] = 0          # a left-padded prompt
    mask[1, -2:] = 0         # a response that ended early
    response_mask = mask[:, -response:].clone()
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, -response:], "response_mask": response_mask,
        "advantages": torch.randn(rows, response, generator=generator) * response_mask,
        "ref_log_prob": -torch.rand(rows, response, generator=generator) * 3,
    })


def _actor(model_dir, remove_padding):
    engine = FSDPEngine(load_causal_lm(model_dir, remove_padding=remove_padding), optim_config=OPTIM,
                        fsdp_config={"dtype": "float32"})
    return DataParallelPPOActor(CONFIG, engine, mini_batch_size=6, micro_batch_size=2, remove_padding=remove_padding)


@pytest.mark.parametrize("remove_padding", [False, True])
def test_on_policy_update_reads_old_log_probs_from_its_own_forward_bit_exactly(single_rank, tiny_qwen2_dir,
                                                                              remove_padding):
    """Two actors from the same weights: one computes old log-probs in a separate no-grad pass (same
    micro-batches), the other takes them from the update's forward. Same log-probs, same update, bit for bit."""
    separate, fused = _actor(tiny_qwen2_dir, remove_padding), _actor(tiny_qwen2_dir, remove_padding)
    data = _batch(separate.engine.module.config.vocab_size)

    old, entropy = separate.compute_log_prob(data, temperature=0.8, micro_batch_size=2)
    with_old = DataProto.from_dict({**data.batch, "old_log_probs": old})
    metrics_separate, none = separate.update_policy(with_old, temperature=0.8)
    metrics_fused, recorded = fused.update_policy(data, temperature=0.8)

    assert none is None
    assert torch.equal(recorded.batch["old_log_probs"], old)
    assert torch.equal(recorded.batch["entropys"], entropy)
    assert metrics_fused == metrics_separate  # pg_loss, kl_loss, clipfrac, ppo_kl (0: on-policy), grad_norm
    assert metrics_fused["actor/ppo_kl"] == [0.0, 0.0, 0.0]
    for (name, a), b in zip(separate.engine.module.state_dict().items(), fused.engine.module.state_dict().values()):
        assert torch.equal(a.full_tensor(), b.full_tensor()), name
    untrained = _actor(tiny_qwen2_dir, False).engine.module.state_dict().values()
    assert any(not torch.equal(a.full_tensor(), b.full_tensor())  # the update did change the weights
               for a, b in zip(separate.engine.module.state_dict().values(), untrained))


def test_off_policy_update_without_old_log_probs_is_refused(single_rank, tiny_qwen2_dir):
    actor = _actor(tiny_qwen2_dir, False)
    actor.mini_batch_size = 3  # two optimizer steps per batch: the second is off-policy
    with pytest.raises(ValueError, match="only allowed for an on-policy update.*call compute_log_prob first"):
        actor.update_policy(_batch(actor.engine.module.config.vocab_size), temperature=1.0)


def test_loss_metrics_sum_the_mini_batch_losses_of_the_update(single_rank, tiny_qwen2_dir):
    """As the original reports them: pg_loss is the sum over mini-batches (and epochs) of each mini-batch's
    token-mean loss. With lr 0 every ratio is 1, so each mini-batch's loss is -sum(A * mask) / sum(mask)."""
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), optim_config={**OPTIM, "lr": 0.0},
                        fsdp_config={"dtype": "float32"})
    config = {**CONFIG, "ppo_epochs": 2, "use_kl_loss": False}
    actor = DataParallelPPOActor(config, engine, mini_batch_size=3, micro_batch_size=2)
    data = _batch(engine.module.config.vocab_size)
    old, _ = actor.compute_log_prob(data, temperature=1.0, micro_batch_size=2)
    metrics, _ = actor.update_policy(DataProto.from_dict({**data.batch, "old_log_probs": old}), temperature=1.0)
    advantages, mask = data.batch["advantages"], data.batch["response_mask"].float()
    per_mini_batch = [-float((advantages[rows] * mask[rows]).sum() / mask[rows].sum()) for rows in (slice(0, 3),
                                                                                                     slice(3, 6))]
    assert metrics["actor/pg_loss"] == [pytest.approx(2 * sum(per_mini_batch), abs=1e-5)]  # 2 epochs x 2
    assert metrics["actor/kl_loss"] == [0.0] and len(metrics["actor/grad_norm"]) == 4
    assert len(metrics["actor/pg_clipfrac"]) == 8  # per micro-batch: 2 epochs x 2 mini-batches x 2
