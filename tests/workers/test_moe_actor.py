"""A mixture-of-experts actor under FSDP2 on CPU: the 3-D expert weights shard and gather, a packed and
checkpointed backward with the router's auxiliary loss equals a plain padded one, and the update reports the
routers' figures (``actor/moe/*``)."""

import dataclasses
import math

import pytest
import torch

from tests.models.moe_models import ragged_batch, save_moe_model
from tests.workers.engine.helpers import run_ranks
from verl.models import load_causal_lm
from verl.models.logprob import forward_logprobs_and_routing
from verl.models.moe import ExpertLoad, load_balance_metrics, router_spec
from verl.protocol import DataProto
from verl.workers.actor import DataParallelPPOActor
from verl.workers.engine import FSDPEngine

ROUTER = {"output_router_logits": True, "router_aux_loss_coef": 0.1}
OPTIM = {"lr": 1e-2, "weight_decay": 0.01, "total_training_steps": 4}
FSDP_FP32 = {"dtype": "float32", "reshard_after_forward": True}


def _loss(module, batch, routing, remove_padding, scale, expert_load=None):
    """A log-prob loss over the valid response tokens plus the router's auxiliary loss, as the actor adds it."""
    input_ids, mask, positions, response = batch
    valid = mask[:, -response:].float()
    lp, _, aux, loads = forward_logprobs_and_routing(module, input_ids, mask, positions, response, routing,
                                                     compute_entropy=False, remove_padding=remove_padding)
    if expert_load is not None:
        expert_load.add(loads)
    return (-(lp * valid).sum() / valid.sum() + routing.aux_loss_coef * aux) * scale


def _rows(batch, rows):
    return tuple(t[rows] for t in batch[:3]) + (batch[3],)


def _sharded_step(rank, model_dir, out_file):
    engine = FSDPEngine(load_causal_lm(model_dir, remove_padding=True, override_config=ROUTER),
                        fsdp_config=FSDP_FP32, enable_gradient_checkpointing=True)
    experts = engine.module.model.layers[0].mlp.experts
    # Three experts over two ranks: dim 0 splits 2 + 1.
    assert experts.gate_up_proj.to_local().shape == ((2 if rank == 0 else 1), 32, 32)
    assert experts.down_proj.to_local().shape == ((2 if rank == 0 else 1), 32, 16)
    batch = ragged_batch(engine.module.config.vocab_size)
    with engine.gathered_params() as module, torch.no_grad():  # the rollout's view: whole experts
        logits = module(input_ids=batch[0], attention_mask=batch[1], position_ids=batch[2]).logits
    routing = router_spec(engine.module)
    engine.module.train()
    expert_load = ExpertLoad()
    _loss(engine.module, _rows(batch, [0, 2] if rank == 0 else [1]), routing, True, 1.0, expert_load).backward()
    # Gradients are averaged over the ranks; full_tensor gathers each (a collective, in the same order everywhere).
    grads = {name: p.grad.full_tensor() for name, p in engine.module.named_parameters()}
    metrics = expert_load.metrics()  # the loads of both ranks
    if rank == 0:
        torch.save({"logits": logits, "grads": grads, "metrics": metrics}, out_file)


def test_two_ranks_shard_the_experts_and_match_one_process(tmp_path):
    """Two ranks (packed, gradient checkpointing, aux loss in the loss) against the plain model (padded, no
    checkpointing) taking the mean of the two ranks' losses: same gathered logits, same gradients."""
    model_dir = save_moe_model(tmp_path / "model", "qwen3_moe", num_experts=3)
    run_ranks(_sharded_step, 2, tmp_path, model_dir, str(tmp_path / "rank0.pt"))
    got = torch.load(tmp_path / "rank0.pt")

    model = load_causal_lm(model_dir, override_config=ROUTER)
    batch = ragged_batch(model.config.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=batch[0], attention_mask=batch[1], position_ids=batch[2]).logits
    valid = batch[1].bool()
    torch.testing.assert_close(got["logits"][valid], logits[valid], atol=1e-5, rtol=0)
    routing = router_spec(model)
    expert_load = ExpertLoad()
    for rows in ([0, 2], [1]):
        _loss(model, _rows(batch, rows), routing, False, 0.5, expert_load).backward()
    assert got["metrics"] == pytest.approx(expert_load.metrics(), abs=1e-12)
    assert got["grads"].keys() == dict(model.named_parameters()).keys()
    for name, param in model.named_parameters():
        torch.testing.assert_close(got["grads"][name], param.grad, atol=1e-6, rtol=1e-5, msg=name)
    # The aux loss is in those gradients: without it the routers' would differ.
    router = "model.layers.1.mlp.gate.weight"
    model.zero_grad()
    for rows in ([0, 2], [1]):
        _loss(model, _rows(batch, rows), dataclasses.replace(routing, aux_loss_coef=0.0), False, 0.5).backward()
    assert (model.get_parameter(router).grad - got["grads"][router]).abs().max() > 1e-4


CONFIG = {"ppo_epochs": 1, "loss_agg_mode": "token-mean", "clip_ratio": 0.2}


def _batch(vocab):
    input_ids, mask, positions, response = ragged_batch(vocab)
    response_mask = mask[:, -response:]
    advantages = torch.tensor([[0.5], [-1.0], [2.0]]) * response_mask
    return DataProto.from_dict({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions,
                                "responses": input_ids[:, -response:], "response_mask": response_mask,
                                "advantages": advantages})


def test_actor_adds_the_aux_loss_and_reports_the_routers(single_rank, tmp_path):
    model_dir = save_moe_model(tmp_path / "model", "qwen2_moe")
    engine = FSDPEngine(load_causal_lm(model_dir, remove_padding=True, override_config=ROUTER),
                        fsdp_config=FSDP_FP32, optim_config=OPTIM, enable_gradient_checkpointing=True)
    actor = DataParallelPPOActor(CONFIG, engine, mini_batch_size=3, micro_batch_size=2, remove_padding=True)
    data = _batch(engine.module.config.vocab_size)
    routing = actor.routing
    assert routing.add_aux_loss and routing.aux_loss_coef == 0.1

    # The micro-batch loss is (policy loss + coef x aux) x its share of the mini-batch.
    micro = DataProto.from_dict({**{k: v[:2] for k, v in data.batch.items()}, "old_log_probs": torch.zeros(2, 5)})
    micro.meta_info["loss_scale"] = 0.25
    with torch.no_grad():
        loss, metrics = actor._make_loss_fn(1.0, expert_load=ExpertLoad())(engine.module, micro)
        actor.routing = dataclasses.replace(routing, add_aux_loss=False)
        loss_without, metrics_without = actor._make_loss_fn(1.0, expert_load=ExpertLoad())(engine.module, micro)
        actor.routing = routing
    aux = metrics["actor/moe/aux_loss"]
    assert metrics_without["actor/moe/aux_loss"] == aux and 1.0 < float(aux) < 2.5  # k = 2 at an even split
    assert float(loss - loss_without) == pytest.approx(0.1 * float(aux) * 0.25, rel=1e-5)

    # The update: aux per micro-batch, and the loads of every valid token of the batch (one optimizer step,
    # so every forward saw the initial weights).
    with torch.no_grad():
        _, _, _, loads = forward_logprobs_and_routing(engine.module, data.batch["input_ids"],
                                                      data.batch["attention_mask"], data.batch["position_ids"], 5,
                                                      routing, remove_padding=True)
    metrics, recorded = actor.update_policy(data, temperature=1.0)
    assert recorded is not None and len(metrics["actor/moe/aux_loss"]) == 2
    expected = load_balance_metrics(loads)
    assert sorted(expected) == [f"actor/moe/{a}_vio/{b}" for a in ("avg", "max", "min") for b in ("avg", "max")]
    for key, value in expected.items():
        assert metrics[key] == [pytest.approx(value, abs=1e-9)]
    assert metrics["actor/moe/max_vio/max"][0] > 0 > metrics["actor/moe/min_vio/avg"][0]
    assert all(math.isfinite(v) for values in metrics.values() for v in values)


def test_a_dense_actor_does_no_router_work(single_rank, tiny_qwen2_dir):
    engine = FSDPEngine(load_causal_lm(tiny_qwen2_dir, remove_padding=True), fsdp_config=FSDP_FP32,
                        optim_config=OPTIM)
    actor = DataParallelPPOActor(CONFIG, engine, mini_batch_size=3, micro_batch_size=3, remove_padding=True)
    assert actor.routing is None
    metrics, _ = actor.update_policy(_batch(engine.module.config.vocab_size), temperature=1.0)
    assert not any(key.startswith("actor/moe/") for key in metrics)
