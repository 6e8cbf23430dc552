"""``actor_rollout_ref.rollout``: the generation engine and how it samples."""

from __future__ import annotations

from verl.base_config import BaseConfig, section
from verl.utils.profiler.config import ProfilerConfig

__all__ = ["CheckpointEngineConfig", "MultiTurnConfig", "RolloutConfig", "SamplingConfig"]


@section("actor_rollout_ref.rollout.val_kwargs")
class SamplingConfig(BaseConfig):
    """Sampling during validation (greedy by default)."""

    top_k: int | None  # <= 0 or null: no top-k
    top_p: float
    temperature: float
    n: int
    do_sample: bool


@section("actor_rollout_ref.rollout.multi_turn")
class MultiTurnConfig(BaseConfig):
    """Tool-calling and multi-turn rollouts (the agent loop)."""

    enable: bool
    max_assistant_turns: int | None
    max_user_turns: int | None
    tool_config_path: str | None
    interaction_config_path: str | None
    max_parallel_calls: int
    max_tool_response_length: int
    tool_response_truncate_side: str
    use_inference_chat_template: bool
    tokenization_sanity_check_mode: str
    format: str


@section("actor_rollout_ref.rollout.checkpoint_engine")
class CheckpointEngineConfig(BaseConfig):
    """How the trainer's weights reach the rollout: ``naive`` when the rollout reads the actor's own weights
    (colocated), ``nccl`` when they are sent to a separate rollout pool (gloo on CPU), in buckets."""

    backend: str
    update_weights_bucket_megabytes: int


@section("actor_rollout_ref.rollout")
class RolloutConfig(BaseConfig):
    """The rollout engine (``name``) and its training-time sampling; ``val_kwargs`` samples validation."""

    name: str
    mode: str
    micro_batch_size: int | None
    n: int
    temperature: float
    top_k: int | None  # <= 0 or null: no top-k
    top_p: float
    do_sample: bool
    ignore_eos: bool
    seed: int
    prompt_length: int
    response_length: int
    dtype: str
    gpu_memory_utilization: float
    free_cache_engine: bool
    enforce_eager: bool
    max_num_batched_tokens: int
    max_model_len: int | None
    max_num_seqs: int
    calculate_log_probs: bool
    nnodes: int
    n_gpus_per_node: int
    checkpoint_engine: CheckpointEngineConfig
    log_prob_micro_batch_size: int | None
    log_prob_micro_batch_size_per_gpu: int | None
    log_prob_use_dynamic_bsz: bool | None
    log_prob_max_token_len_per_gpu: int
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    expert_parallel_size: int
    enable_chunked_prefill: bool
    enable_prefix_caching: bool
    load_format: str
    layered_summon: bool
    disable_log_stats: bool
    engine_kwargs: dict
    # The original's keys that have no effect here (unused_keys.py warns when one is set):
    cudagraph_capture_sizes: list | None
    multi_stage_wake_up: bool
    over_sample_rate: float
    data_parallel_size: int
    trace: dict
    val_kwargs: SamplingConfig
    multi_turn: MultiTurnConfig
    profiler: ProfilerConfig
