"""GRPO through ``python3 -m verl.trainer.main_ppo`` with a tiny Qwen3-MoE actor on CPU: packed forwards,
gradient checkpointing, the router's auxiliary loss switched on through the Hugging Face keys, and the
``actor/moe/*`` figures in the logged metrics."""

import json
import math

import pandas as pd
import pytest

from tests.models.moe_models import save_moe_model
from verl.trainer.main_ppo import main
from verl.utils.tiny_model import build_tiny_tokenizer

pytestmark = pytest.mark.slow

QUESTIONS = ["Natalia sold 48 clips in April and half as many in May. How many clips did she sell?",
             "What is 6 times 7?", "Add 15 and 27.", "How many minutes are in 2 hours?"]
# Random weights never write a GSM8K answer: a reward that varies per response gives GRPO non-zero advantages.
VARIED_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return len(set(solution_str)) / 10.0
"""
MOE_METRICS = ["actor/moe/aux_loss"] + [f"actor/moe/{a}_vio/{b}" for a in ("max", "min", "avg") for b in ("max", "avg")]


def test_grpo_trains_a_moe_actor_with_the_router_aux_loss(tmp_path, monkeypatch):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": q}], "ability": "math",
             "reward_model": {"style": "rule", "ground_truth": "42"}, "extra_info": {"index": i}}
            for i, q in enumerate(QUESTIONS)]
    data = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(data)
    tokenizer = build_tiny_tokenizer(str(tmp_path / "tokenizer"), corpus=QUESTIONS)
    model = save_moe_model(tmp_path / "model", "qwen3_moe", tokenizer)
    reward = tmp_path / "reward.py"
    reward.write_text(VARIED_REWARD)
    metrics_file = tmp_path / "metrics.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(metrics_file))
    assert main([
        f"data.train_files={data}", "data.train_batch_size=2", "data.max_prompt_length=48",
        "data.max_response_length=8", f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.enable_gradient_checkpointing=true",
        "+actor_rollout_ref.model.override_config.output_router_logits=true",
        "+actor_rollout_ref.model.override_config.router_aux_loss_coef=0.01",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "actor_rollout_ref.actor.fsdp_config.dtype=float32",
        "algorithm.adv_estimator=grpo", f"custom_reward_function.path={reward}",
        "trainer.backend=local", "trainer.device=cpu", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.total_training_steps=1", "trainer.val_before_train=false", "trainer.logger=['console','file']",
        f"trainer.default_local_dir={tmp_path}/checkpoints", "trainer.project_name=moe",
        "trainer.experiment_name=grpo",
    ]) == 0
    records = [json.loads(line) for line in metrics_file.read_text().splitlines()]
    assert [r["step"] for r in records] == [1]
    logged = records[0]["data"]
    for key in MOE_METRICS + ["actor/pg_loss", "actor/grad_norm", "critic/advantages/max"]:
        assert key in logged and math.isfinite(logged[key]), key
    assert logged["critic/advantages/max"] > 0  # the policy gradient is not trivially 0
    assert 1.0 < logged["actor/moe/aux_loss"] < 2.5  # top-2: 2 at an even split
