"""Policy losses that aggregate per sequence whatever ``loss_agg_mode`` says (gspo, sapo, geo_mean): the
actor must weigh their micro-batches by sequences, so cutting a mini-batch into micro-batches changes
neither the gradient nor the logged pg_loss, while the KL and entropy terms stay token-mean."""

import pytest
import torch

from verl.models import load_causal_lm
from verl.protocol import DataProto
from verl.workers.actor import DataParallelPPOActor
from verl.workers.engine import FSDPEngine

# token-mean for the KL and entropy terms; the policy losses under test ignore it.
CONFIG = {"ppo_epochs": 1, "loss_agg_mode": "token-mean", "clip_ratio": 0.2, "use_kl_loss": True,
          "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl", "entropy_coeff": 0.01}
PROMPT, RESPONSE = 3, 6


def _batch(vocab):
    """Two rows: a 6-token response and a 1-token one (a 1-row micro-batch each)."""
    generator = torch.Generator().manual_seed(11)
    input_ids = torch.randint(0, vocab, (2, PROMPT + RESPONSE), generator=generator)
    response_mask = (torch.arange(RESPONSE) < torch.tensor([[6], [1]])).long()
    mask = torch.cat([torch.ones(2, PROMPT, dtype=torch.long), response_mask], dim=-1)
    return DataProto.from_dict({
        "input_ids": input_ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
        "responses": input_ids[:, -RESPONSE:], "response_mask": response_mask,
        "advantages": (torch.randn(2, RESPONSE, generator=generator) + 0.5) * response_mask,
        "ref_log_prob": -torch.rand(2, RESPONSE, generator=generator) * 3,
    }), generator


def _update(actor, data, micro_batch_size):
    """One update with micro-batches of ``micro_batch_size`` rows: its metrics and accumulated gradients."""
    engine, grads = actor.engine, {}
    clip = type(engine).clip_grad_norm

    def capture():
        grads.update({name: p.grad.full_tensor().clone() for name, p in engine.module.named_parameters()
                      if p.grad is not None})
        return clip(engine)

    engine.clip_grad_norm = capture
    actor.micro_batch_size = micro_batch_size
    metrics, _ = actor.update_policy(data, temperature=1.0)
    del engine.clip_grad_norm
    return metrics, grads


@pytest.mark.parametrize("loss_mode", ["gspo", "sapo", "geo_mean"])
def test_sequence_mean_losses_do_not_depend_on_the_micro_batches(single_rank, tiny_qwen2_dir, loss_mode):
    # lr 0: the weights stay, so both updates see the same model.
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), optim_config={"lr": 0.0, "total_training_steps": 2},
                        fsdp_config={"dtype": "float32"})
    actor = DataParallelPPOActor({**CONFIG, "policy_loss": {"loss_mode": loss_mode}}, engine, mini_batch_size=2)
    data, generator = _batch(engine.module.config.vocab_size)
    old, _ = actor.compute_log_prob(data, temperature=1.0, micro_batch_size=2)
    # Slightly off-policy, so that ratios (and clipping) differ from 1.
    old = old + 0.3 * torch.randn(old.shape, generator=generator) * data.batch["response_mask"]
    data = DataProto.from_dict({**data.batch, "old_log_probs": old})

    whole, whole_grads = _update(actor, data, micro_batch_size=2)
    split, split_grads = _update(actor, data, micro_batch_size=1)

    assert len(whole["actor/pg_clipfrac"]) == 1 and len(split["actor/pg_clipfrac"]) == 2
    # Token-weighting the two micro-batches would give 6/7 and 1/7 instead of 1/2 each.
    assert split["actor/pg_loss"] == [pytest.approx(whole["actor/pg_loss"][0], abs=1e-6)]
    assert split["actor/kl_loss"] == [pytest.approx(whole["actor/kl_loss"][0], abs=1e-6)]
    assert whole_grads.keys() == split_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(split_grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


def test_sequence_mean_loss_metric_is_the_mean_over_sequences(single_rank, tiny_qwen2_dir):
    """On policy (ratio 1) gspo's loss is -mean_i(mean_t A_it): (-mean(A_0) - A_1) / 2 with 1-row
    micro-batches of 6 and 1 tokens."""
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir), optim_config={"lr": 0.0, "total_training_steps": 2},
                        fsdp_config={"dtype": "float32"})
    actor = DataParallelPPOActor({**CONFIG, "policy_loss": {"loss_mode": "gspo"}}, engine, mini_batch_size=2)
    data, _ = _batch(engine.module.config.vocab_size)
    old, _ = actor.compute_log_prob(data, temperature=1.0, micro_batch_size=2)
    metrics, _ = _update(actor, DataProto.from_dict({**data.batch, "old_log_probs": old}), micro_batch_size=1)
    advantages = data.batch["advantages"]
    expected = -(float(advantages[0, :6].mean()) + float(advantages[1, 0])) / 2
    assert metrics["actor/pg_loss"] == [pytest.approx(expected, abs=1e-5)]
