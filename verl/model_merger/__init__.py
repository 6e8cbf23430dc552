"""Turn a training checkpoint into a Hugging Face model folder.

    python -m verl.model_merger merge --backend fsdp \\
        --local_dir checkpoints/<project>/<experiment>/global_step_N/actor --target_dir ./my_model

The result loads with ``AutoModelForCausalLM.from_pretrained("./my_model")`` (or
``AutoModelForTokenClassification`` for a critic) and gives the same outputs as the trained model. A
vision-language model's folder also holds its processor files (``AutoProcessor.from_pretrained("./my_model")``).
"""

from verl.model_merger.fsdp import compare_with_hf, merge_fsdp_checkpoint

__all__ = ["compare_with_hf", "merge_fsdp_checkpoint"]
