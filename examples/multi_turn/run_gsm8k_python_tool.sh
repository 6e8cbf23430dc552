#!/usr/bin/env bash
# GRPO on GSM8K where the model may call a sandboxed Python tool between turns (multi-turn rollouts).
# One GPU, Qwen2.5-0.5B-Instruct (its chat template declares the tools and it writes hermes tool calls).
#
#   python3 examples/data_preprocess/gsm8k.py --tool --local_dir data/processed/gsm8k_tool
#   MODEL=models/Qwen2.5-0.5B-Instruct bash examples/multi_turn/run_gsm8k_python_tool.sh [more overrides]
#
# VALIDATE_ONLY=1 checks the configuration without training (what the tests do).
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
MODEL=${MODEL:-models/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-data/processed/gsm8k_tool}
N_GPUS=${N_GPUS:-1}

entry=verl.trainer.main_ppo
if [ "${VALIDATE_ONLY:-0}" = "1" ]; then entry=verl.trainer.config_validation; fi

python3 -m "$entry" \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
    data.train_batch_size=64 data.max_prompt_length=1024 data.max_response_length=1024 \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.tool_config_path="$HERE/tool_config.yaml" \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=4 \
    actor_rollout_ref.rollout.multi_turn.max_tool_response_length=512 \
    trainer.logger="['console','file']" trainer.project_name=verl_examples trainer.experiment_name=gsm8k_python_tool \
    trainer.n_gpus_per_node="$N_GPUS" trainer.save_freq=20 trainer.test_freq=10 trainer.total_epochs=1 \
    "$@"
