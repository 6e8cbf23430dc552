"""``actor_rollout_ref.model``, ``critic.model`` and ``reward_model.model``: a Hugging Face model and how to
load it (packed forwards, LoRA, kernels)."""

from __future__ import annotations

from verl.base_config import BaseConfig, section
from verl.workers.config.engine import FSDPConfig

__all__ = ["HFModelConfig", "ModelConfig"]


@section("actor_rollout_ref.model", "critic.model", "reward_model.model", shared=True)
class ModelConfig(BaseConfig):
    """The three groups share most keys; `input_tokenizer` exists only for the reward model and `fsdp_config`
    only for the critic and reward models (the actor's is ``ActorConfig.fsdp_config``). A field the group
    lacks is reported as an unknown key when the config is built."""

    path: str | None
    hf_config_path: str | None
    tokenizer_path: str | None
    custom_chat_template: str | None
    use_shm: bool
    external_lib: str | None
    override_config: dict
    trust_remote_code: bool
    enable_gradient_checkpointing: bool | None
    enable_activation_offload: bool
    use_remove_padding: bool
    use_liger: bool
    use_fused_kernels: bool
    fused_kernel_options: dict
    lora_rank: int
    lora_alpha: int
    target_modules: str | list[str]
    exclude_modules: str | list[str] | None
    lora_adapter_path: str | None
    input_tokenizer: str | None
    fsdp_config: FSDPConfig


HFModelConfig = ModelConfig  # the original's name
