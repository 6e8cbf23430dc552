"""Sample responses for a parquet of prompts with a model, as the original's ``main_generation``.

    python3 -m verl.trainer.main_generation data.path=data/gsm8k/test.parquet \
        data.output_path=out/gen.parquet data.n_samples=4 model.path=models/Qwen2.5-0.5B-Instruct \
        trainer.n_gpus_per_node=1

Reads ``verl/trainer/config/generation.yaml`` (the original's keys). The prompts are tokenized the
way training tokenizes them (:class:`~verl.data.RLHFDataset`: chat template, left padding,
``rollout.prompt_length``); the rollout workers are the trainer's (``ActorRolloutRefWorker`` in the
``rollout`` role: the native engine or ``hf``), data-parallel over ``trainer.n_gpus_per_node x
trainer.nnodes`` Ray workers. The output parquet is the input's rows, in order, with a ``responses``
column of ``data.n_samples`` strings each; it is written to a temporary name and renamed, so a failed
run never leaves a partial file. ``python3 -m verl.trainer.main_eval`` scores it.
"""

from __future__ import annotations

import os
import sys

from omegaconf import OmegaConf

from verl.trainer.config_validation import ConfigError

GENERATION_CONFIG = "generation"

# generation.yaml key -> the ppo_trainer.yaml key the worker reads
_TO_PPO = {
    "model.path": "actor_rollout_ref.model.path",
    "model.external_lib": "actor_rollout_ref.model.external_lib",
    "model.trust_remote_code": "actor_rollout_ref.model.trust_remote_code",
    "data.n_samples": "actor_rollout_ref.rollout.n",
    "data.prompt_key": "data.prompt_key",
    "rollout.prompt_length": "data.max_prompt_length",
    "rollout.response_length": "data.max_response_length",
    "actor.fsdp_config.dtype": "actor_rollout_ref.actor.fsdp_config.dtype",
    **{f"rollout.{k}": f"actor_rollout_ref.rollout.{k}" for k in (
        "name", "temperature", "top_k", "top_p", "do_sample", "ignore_eos", "gpu_memory_utilization",
        "max_num_seqs", "dtype", "seed")},
    **{f"trainer.{k}": f"trainer.{k}" for k in ("nnodes", "n_gpus_per_node", "device", "backend")},
}


def check_generation_config(config) -> None:
    """What can be checked before any worker starts: files, columns, sampling settings."""
    path = os.path.expanduser(str(config.data.path))
    if not os.path.isfile(path):
        raise ConfigError("Invalid generation config:", [f"data.path: {path!r} is not a file; pass a parquet "
                                                         "of prompts (e.g. from examples/data_preprocess)"])
    import pyarrow.parquet as pq

    problems = []
    columns = pq.read_schema(path).names
    if config.data.prompt_key not in columns:
        problems.append(f"data.prompt_key: column {config.data.prompt_key!r} is not in {path} (columns: {columns})")
    n = config.data.n_samples
    if not isinstance(n, int) or n < 1:
        problems.append(f"data.n_samples: must be a positive number of responses per prompt, got {n!r}")
    elif n > 1 and not config.rollout.do_sample:
        problems.append(f"data.n_samples: {n} samples with rollout.do_sample=false would be {n} identical greedy "
                        "responses; set rollout.do_sample=true or data.n_samples=1")
    if not isinstance(config.data.batch_size, int) or config.data.batch_size < 1:
        problems.append(f"data.batch_size: must be a positive number of prompts, got {config.data.batch_size!r}")
    output = os.path.expanduser(str(config.data.output_path))
    if os.path.abspath(output) == os.path.abspath(path):
        problems.append("data.output_path: is data.path; write the generations to another file")
    if problems:
        raise ConfigError("Invalid generation config:", problems)


def ppo_config_for(config):
    """The ppo_trainer config the rollout worker reads, with the generation settings in it."""
    from verl.trainer.config_validation import compose_ppo_config

    ppo = compose_ppo_config([])
    for source, target in _TO_PPO.items():
        OmegaConf.update(ppo, target, OmegaConf.select(config, source), force_add=True)
    ppo.ray_kwargs = config.ray_kwargs
    OmegaConf.resolve(ppo)
    return ppo


def generate(config) -> str:
    """Run the generation; returns the output path."""
    import numpy as np
    import pandas as pd
    from torch.utils.data import DataLoader

    from verl.data import RLHFDataset, collate_fn
    from verl.models import load_tokenizer
    from verl.protocol import DataProto
    from verl.single_controller import ClassWithInitArgs
    from verl.trainer.config.spec import worker_backend
    from verl.trainer.ppo.roles import start_groups
    from verl.utils.fs import atomic_write
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    check_generation_config(config)
    ppo = ppo_config_for(config)
    model = ppo.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.path, config_key="model.path", trust_remote_code=model.trust_remote_code)
    path = os.path.expanduser(str(config.data.path))
    data_config = {**OmegaConf.to_container(ppo.data), "shuffle": False, "filter_overlong_prompts": False,
                   "truncation": "error"}
    dataset = RLHFDataset([path], tokenizer, config=data_config)
    loader = DataLoader(dataset, batch_size=config.data.batch_size, shuffle=False, collate_fn=collate_fn)

    roles = {"actor_rollout": ClassWithInitArgs(ActorRolloutRefWorker, config=ppo.actor_rollout_ref, role="rollout",
                                                nccl_timeout_s=ppo.actor_rollout_ref.nccl_timeout)}
    trainer = ppo.trainer
    trainer.backend = worker_backend(lambda key: OmegaConf.select(ppo, key))
    groups, _, pools = start_groups(trainer, ppo.ray_kwargs, {
        "generation_pool": ([trainer.n_gpus_per_node] * trainer.nnodes, roles)})
    group = groups["actor_rollout"]
    n = int(config.data.n_samples)
    responses: list[list[str]] = []
    try:
        group.init_model()
        for batch in loader:
            prompts = DataProto.from_single_dict(batch)
            out = group.generate_sequences(prompts)
            ids, mask = out.batch["responses"], out.batch["response_mask"].bool()
            texts = [tokenizer.decode(row[keep].tolist(), skip_special_tokens=True) for row, keep in zip(ids, mask)]
            responses += [texts[i:i + n] for i in range(0, len(texts), n)]  # rows are interleaved by prompt
            print(f"[main_generation] {len(responses)}/{len(dataset)} prompts", flush=True)
    finally:
        group.shutdown()
        for pool in pools:
            pool.remove()
    frame = pd.read_parquet(path)
    frame["responses"] = pd.Series([np.array(r, dtype=object) for r in responses], index=frame.index)
    output = os.path.expanduser(str(config.data.output_path))
    with atomic_write(output) as f:
        frame.to_parquet(f)
    return output


def main(argv: list[str] | None = None) -> int:
    from verl.single_controller import WorkerError
    from verl.trainer.config.compose import compose_config
    from verl.utils.logging_utils import configure_logging

    configure_logging()
    try:
        config = compose_config(sys.argv[1:] if argv is None else argv, default_config_name=GENERATION_CONFIG)
        output = generate(config)
    except (FileNotFoundError, ValueError, WorkerError) as err:  # a ConfigError is printed as it is
        print(err if isinstance(err, ConfigError) else f"main_generation stopped: {err}", file=sys.stderr)
        return 1
    print(f"[main_generation] wrote {output} ({config.data.n_samples} responses per prompt)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
