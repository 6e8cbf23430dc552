#!/usr/bin/env bash
# DAPO (Yu et al., 2025) on GSM8K: clip-higher, token-mean loss, dynamic sampling, overlong shaping,
# no KL. The recipe's settings, scaled to one GPU and Qwen2.5-0.5B-Instruct.
#
#   python3 examples/data_preprocess/gsm8k.py --local_dir data/processed/gsm8k
#   MODEL=models/Qwen2.5-0.5B-Instruct bash examples/dapo/run_dapo_gsm8k.sh [more overrides]
#
# VALIDATE_ONLY=1 checks the configuration without training (what the tests do).
set -euo pipefail

MODEL=${MODEL:-models/Qwen2.5-0.5B-Instruct}
DATA=${DATA:-data/processed/gsm8k}
N_GPUS=${N_GPUS:-1}
train_prompts=64                       # prompts per step, each with n=8 samples
max_prompt=512
max_response=1024
overlong_buffer=256                    # the last 256 tokens before max_response are penalised linearly

entry=verl.trainer.main_ppo
if [ "${VALIDATE_ONLY:-0}" = "1" ]; then entry=verl.trainer.config_validation; fi

python3 -m "$entry" \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" data.val_files="$DATA/test.parquet" \
    data.train_batch_size=$train_prompts data.gen_batch_size=$((train_prompts * 3)) \
    data.max_prompt_length=$max_prompt data.max_response_length=$max_response \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.rollout.n=8 actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.use_kl_loss=False actor_rollout_ref.actor.entropy_coeff=0 \
    algorithm.use_kl_in_reward=False \
    algorithm.filter_groups.enable=True algorithm.filter_groups.metric=acc \
    algorithm.filter_groups.max_num_gen_batches=10 \
    reward_model.reward_manager=dapo reward_model.overlong_buffer.enable=True \
    reward_model.overlong_buffer.len=$overlong_buffer reward_model.overlong_buffer.penalty_factor=1.0 \
    trainer.n_gpus_per_node="$N_GPUS" trainer.nnodes=1 trainer.logger="['console']" \
    trainer.project_name=verl_examples trainer.experiment_name=dapo_gsm8k \
    trainer.test_freq=10 trainer.save_freq=20 trainer.total_epochs=10 \
    "$@"
