"""global_profiler on a real run: main_ppo with the local backend on a tiny model writes the torch trace of the
profiled step, with the driver's and the workers' stages in it."""

import gzip
import json
import os

import pandas as pd
import pytest

from verl.trainer.main_ppo import main

pytestmark = pytest.mark.slow


@pytest.fixture
def tiny_prompts(tmp_path):
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"what is {i} plus {i}?"}],
             "ability": "math", "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
             "extra_info": {"index": i}} for i in range(4)]
    path = tmp_path / "train.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return str(path)


def test_a_profiled_step_writes_a_trace_with_the_steps_stages(tiny_qwen2_dir, tiny_prompts, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    save = tmp_path / "profile"
    assert main([
        f"data.train_files={tiny_prompts}", "data.train_batch_size=2", "data.max_prompt_length=32",
        "data.max_response_length=4", f"actor_rollout_ref.model.path={tiny_qwen2_dir}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.actor.fsdp_config.dtype=float32", "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.rollout.n=2", "trainer.device=cpu", "trainer.backend=local", "trainer.n_gpus_per_node=1",
        "trainer.total_training_steps=2", "trainer.val_before_train=False", "trainer.logger=['console']",
        f"trainer.default_local_dir={tmp_path}/ckpt",
        "global_profiler.tool=torch", "global_profiler.steps=[2]", f"global_profiler.save_path={save}",
        "actor_rollout_ref.actor.profiler.enable=true",
    ]) == 0
    assert os.listdir(save) == ["actor_rollout_step2_rank0.json.gz"]
    with gzip.open(save / "actor_rollout_step2_rank0.json.gz", "rt") as f:
        recorded = {event.get("name") for event in json.load(f)["traceEvents"]}
    # the workers' stages (annotated) and the driver's (marked_timer: same process with the local backend)
    assert {"rollout_generate", "actor_update", "aten::mm", "gen", "update_actor"} <= recorded
