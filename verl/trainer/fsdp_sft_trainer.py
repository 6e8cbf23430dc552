"""``python -m verl.trainer.fsdp_sft_trainer key=value ...``: supervised fine-tuning with FSDP2.

The command line is composed onto ``verl/trainer/config/sft_trainer.yaml`` and checked before anything
heavy starts. Run directly, it trains in one process (world size 1, on ``trainer.device``); under
``torchrun --standalone --nproc_per_node=N -m verl.trainer.fsdp_sft_trainer ...`` every process joins
torchrun's process group and the model is sharded over all of them.

Each step takes ``data.train_batch_size`` sequences (every rank reads the same seeded global batch and
keeps its own contiguous share), runs them in micro-batches of ``data.micro_batch_size_per_gpu`` and
takes one AdamW step on the mean negative log-likelihood over all response tokens of the global batch.
Metrics per step: ``train/loss``, ``train/lr``, ``train/grad_norm``, ``train/global_tokens``,
``train/tokens_per_s``, ``train/epoch``; ``val/loss`` every ``trainer.test_freq`` steps and after the last.

Checkpoints (every ``trainer.save_freq`` steps and after the last step)::

    <trainer.default_local_dir>/global_step_N/
        model_world_size_W_rank_R.pt, optim_..., extra_state_..., fsdp_config.json   FSDP shards
        huggingface/        config, tokenizer and (with hf_model) the full model: from_pretrained-ready
        data.pt             the sampler position, for exact resumption
    <trainer.default_local_dir>/latest_checkpointed_iteration.txt   "N", written last
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from verl.trainer.config import ConfigError
from verl.trainer.config.compose import compose_config, default_config_values
from verl.trainer.config.config import SFTDataConfig
from verl.trainer.ppo import checkpointing
from verl.utils.logging_utils import configure_logging
from verl.utils.seqlen_balancing import all_reduce_scalar

logger = logging.getLogger("verl.sft")

CONFIG_NAME = "sft_trainer"


def compose_sft_config(argv=()) -> DictConfig:
    """The SFT config from Hydra overrides; unknown keys -> ConfigError with the closest valid key."""
    return compose_config(list(argv), CONFIG_NAME)


@dataclasses.dataclass
class SFTSections:
    """The sections of sft_trainer.yaml with a typed class (the others are checked against their defaults)."""

    data: SFTDataConfig


def _problems(values: dict, world_size: int) -> tuple[list[str], list[str]]:
    """(errors, warnings) of a resolved SFT config, each ``<key>: <what is wrong>. <fix>``."""
    from verl.models import resolve_dtype
    from verl.models.loader import _check_model_path
    from verl.trainer.config.checks import Run, _not_in, check_types
    from verl.utils.tracking import BACKENDS
    from verl.workers.engine.checkpoint import CONTENTS

    run = Run(cfg=values, defaults=default_config_values(CONFIG_NAME))
    issues = list(check_types(run, SFTSections))
    errors = [str(issue) for issue in issues]
    run.bad_keys = {issue.key for issue in issues}  # a value of the wrong type is reported once, then read as unset
    get = run.get
    warnings: list[str] = []

    for key, allowed in (("data.truncation", ("error", "left", "right")), ("trainer.device", ("cuda", "cpu")),
                         ("optim.lr_scheduler_type", ("constant", "cosine")), ("model.strategy", ("fsdp", "fsdp2")),
                         ("trainer.resume_mode", ("auto", "disable", "resume_path"))):
        if get(key) is not None and get(key) not in allowed:
            errors.append(str(_not_in(key, get(key), allowed)))
    if get("trainer.device") == "cuda" and not torch.cuda.is_available():
        errors.append("trainer.device: cuda, but this machine has no CUDA device. Set trainer.device=cpu")
    for key in ("data.train_files", "model.partial_pretrain"):
        if not get(key):
            errors.append(f"{key}: not set. Give {'a parquet file' if key.startswith('data') else 'a model folder'}"
                          f", e.g. {key}=...")
    for key in ("data.train_files", "data.val_files"):
        files = get(key) or []
        for path in [files] if isinstance(files, str) else files:
            if not os.path.isfile(os.path.expanduser(str(path))):
                errors.append(f"{key}: {path!r} is not a file. Point it at an existing parquet file")
    if get("model.partial_pretrain"):
        try:  # a local folder must hold config.json; a hub id is left to the loader
            _check_model_path(str(get("model.partial_pretrain")), "model.partial_pretrain")
        except (OSError, ValueError) as err:
            errors.append(str(err).rstrip("."))

    batch, micro = get("data.train_batch_size"), get("data.micro_batch_size_per_gpu")
    for key in ("data.train_batch_size", "data.micro_batch_size_per_gpu", "data.max_length", "trainer.total_epochs"):
        if isinstance(get(key), int) and get(key) < 1:
            errors.append(f"{key}: must be at least 1, got {get(key)}")
    if isinstance(batch, int) and isinstance(micro, int) and micro > 0 and batch % (micro * world_size):
        errors.append(f"data.train_batch_size: {batch} is not divisible by data.micro_batch_size_per_gpu x world size "
                      f"= {micro} x {world_size}. Make it a multiple of {micro * world_size}")
    for key in ("trainer.total_training_steps", "trainer.max_ckpt_to_keep"):
        value = get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            errors.append(f"{key}: expected a positive integer or null, got {value!r}")
    for key in ("model.fsdp_config.model_dtype", "model.fsdp_config.dtype"):
        if get(key) is not None:
            try:
                resolve_dtype(get(key))
            except ValueError as err:
                errors.append(f"{key}: {err}")
    loggers = get("trainer.logger") or []
    for name in [loggers] if isinstance(loggers, str) else loggers:
        if name not in BACKENDS:
            errors.append(str(_not_in("trainer.logger", name, BACKENDS, "logger backend")))
    for key in ("trainer.checkpoint.save_contents", "trainer.checkpoint.load_contents"):
        unknown = sorted(set(get(key) or []) - set(CONTENTS))
        if unknown:
            errors.append(f"{key}: {unknown} unknown. Choose from {list(CONTENTS)}")
    if get("trainer.resume_mode") == "resume_path" and not get("trainer.resume_from_path"):
        errors.append("trainer.resume_from_path: not set, but trainer.resume_mode=resume_path needs a "
                      ".../global_step_N folder")

    unsupported = (("model.lora_rank", (get("model.lora_rank") or 0) > 0, "LoRA"),
                   ("model.use_liger", bool(get("model.use_liger")), "Liger kernels"),
                   ("ulysses_sequence_parallel_size", (get("ulysses_sequence_parallel_size") or 1) > 1,
                    "sequence parallelism"),
                   ("data.custom_cls.path", bool(get("data.custom_cls.path")), "a custom dataset class"))
    for key, is_set, what in unsupported:
        if is_set:
            errors.append(f"{key}: {what} is not supported by this SFT trainer. Remove {key} (full fine-tuning "
                          "with FSDP2 and the built-in SFTDataset)")
    if get("data.balance_dp_token") is False:
        errors.append("data.balance_dp_token: false (a per-device token mean) is not supported; the loss is the "
                      "token mean over the whole global batch. Remove the setting")
    if get("use_remove_padding"):
        warnings.append("use_remove_padding: batches are padded either way (trimmed to their longest sequence); "
                        "the setting changes nothing here")
    return errors, warnings


def validate_sft_config(config: DictConfig, world_size: int = 1) -> list[str]:
    """Raise `ConfigError` listing every problem of ``config`` at once; return the warnings (also logged)."""
    try:
        values = OmegaConf.to_container(config, resolve=True)
    except Exception as err:
        raise ConfigError("Invalid configuration:", [f"<config>: cannot be resolved ({err})"]) from err
    errors, warnings = _problems(values, world_size)
    for line in warnings:
        logger.warning("[validate_config] warning: %s", line)
    if errors:
        raise ConfigError(f"Invalid configuration ({len(errors)} problem{'s' if len(errors) > 1 else ''}):", errors)
    return warnings


def _token_nll(module, micro_batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of -log p over the loss-mask tokens, their count) of one right-padded micro-batch.

    Columns past the longest sequence are dropped first: with right padding they change nothing.
    The logits at position t score token t+1, so ``loss_mask[:, 1:]`` weighs them.
    """
    from verl.models import forward_logprobs

    width = max(int(micro_batch["attention_mask"].sum(-1).max()), 2)
    ids, attn, pos, mask = (micro_batch[k][:, :width] for k in ("input_ids", "attention_mask", "position_ids",
                                                                  "loss_mask"))
    log_probs, _ = forward_logprobs(module, ids, attn, pos, width - 1, compute_entropy=False)
    mask = mask[:, 1:].to(log_probs.dtype)
    return -(log_probs * mask).sum(), mask.sum()


class FSDPSFTTrainer:
    """Supervised fine-tuning of one causal LM over every rank of the default process group."""

    def __init__(self, config: DictConfig, tokenizer, train_dataset, val_dataset=None):
        from torch.utils.data import DataLoader

        from verl.data.rl_dataset import DatasetError, collate_fn
        from verl.data.sampler import ResumableSampler, make_dataloader
        from verl.models import load_causal_lm
        from verl.workers.engine import FSDPEngine

        self.config, self.tokenizer = config, tokenizer
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.device = (torch.device("cuda", torch.cuda.current_device()) if config.trainer.device == "cuda"
                       else torch.device("cpu"))
        data, trainer = config.data, config.trainer
        self.micro = data.micro_batch_size_per_gpu
        self.per_rank = data.train_batch_size // self.world_size
        sampler = ResumableSampler(len(train_dataset), shuffle=True, seed=trainer.seed)
        self.train_loader = make_dataloader(train_dataset, data.train_batch_size, sampler, drop_last=True)
        if len(self.train_loader) == 0:
            raise DatasetError(f"data.train_batch_size={data.train_batch_size} is more than the {len(train_dataset)} "
                               f"rows of {data.train_files}; lower data.train_batch_size or add data.")
        self.val_loader = (DataLoader(val_dataset, batch_size=self.micro * self.world_size, shuffle=False,
                                      collate_fn=collate_fn) if val_dataset is not None else None)
        self.total_steps = trainer.total_training_steps or len(self.train_loader) * trainer.total_epochs
        self.checkpoint_root = trainer.default_local_dir
        self.global_step = 0

        model_config = config.model
        torch.manual_seed(trainer.seed)
        model = load_causal_lm(model_config.partial_pretrain, dtype=model_config.fsdp_config.model_dtype,
                               trust_remote_code=model_config.trust_remote_code, config_key="model.partial_pretrain")
        self.engine = FSDPEngine(model, fsdp_config=model_config.fsdp_config, optim_config=config.optim,
                                 grad_clip=config.optim.clip_grad, total_training_steps=self.total_steps,
                                 enable_gradient_checkpointing=model_config.enable_gradient_checkpointing,
                                 device=self.device)

    def training_step(self, batch: dict) -> dict:
        """One optimizer step on a global batch; returns the step's ``train/*`` metrics (same on every rank)."""
        start = time.perf_counter()
        loss_tokens = max(float(batch["loss_mask"][:, 1:].sum()), 1.0)
        rows = slice(self.rank * self.per_rank, (self.rank + 1) * self.per_rank)
        local = {key: value[rows].to(self.device) for key, value in batch.items()}
        micro_batches = [{key: value[i:i + self.micro] for key, value in local.items()}
                         for i in range(0, self.per_rank, self.micro)]

        def loss_fn(module, micro_batch):
            # FSDP averages gradients over ranks, hence x world size: the sum is this micro-batch's share
            # of the global token mean.
            nll, _ = _token_nll(module, micro_batch)
            return nll * (self.world_size / loss_tokens)

        with self.engine.on_device(optimizer=True):
            stats = self.engine.train_step(micro_batches, loss_fn)
        self.engine.lr_scheduler_step()
        loss = all_reduce_scalar(stats["loss"])
        tokens = int(batch["attention_mask"].sum())
        return {"train/loss": loss / self.world_size, "train/lr": stats["lr"], "train/grad_norm": stats["grad_norm"],
                "train/global_tokens": tokens, "train/tokens_per_s": tokens / (time.perf_counter() - start),
                "train/epoch": self.train_loader.state_dict()["epoch"]}

    def validate(self) -> float:
        """The token-mean NLL over the whole validation set."""
        rows_per_batch = self.micro * self.world_size
        nll_sum = token_sum = 0.0
        self.engine.module.eval()
        with torch.no_grad(), self.engine.on_device():
            for batch in self.val_loader:
                short = rows_per_batch - len(batch["input_ids"])
                if short:  # every rank runs the same forwards: fill the last batch with rows that count nothing
                    batch = {k: torch.cat([v, v[:1].expand(short, *v.shape[1:])]) for k, v in batch.items()}
                    batch["loss_mask"][-short:] = 0
                rows = slice(self.rank * self.micro, (self.rank + 1) * self.micro)
                nll, count = _token_nll(self.engine.module, {k: v[rows].to(self.device) for k, v in batch.items()})
                nll_sum, token_sum = nll_sum + float(nll), token_sum + float(count)
        nll_sum, token_sum = all_reduce_scalar(nll_sum), all_reduce_scalar(token_sum)
        return nll_sum / max(token_sum, 1.0)

    def save_checkpoint(self) -> str:
        path = checkpointing.step_dir(self.checkpoint_root, self.global_step)
        self.engine.save_checkpoint(path, save_contents=self.config.trainer.checkpoint.save_contents,
                                    tokenizer=self.tokenizer)
        if self.rank == 0:
            checkpointing.save_driver_state(path, {"global_step": self.global_step,
                                                   "dataloader": self.train_loader.state_dict()})
            checkpointing.mark_complete(self.checkpoint_root, self.global_step)
            checkpointing.rotate(self.checkpoint_root, None, self.config.trainer.max_ckpt_to_keep)
        return path

    def load_checkpoint(self) -> None:
        """Resume under ``trainer.resume_mode`` (auto: the newest finished checkpoint, if any)."""
        path = checkpointing.resume_checkpoint(self.config.trainer)
        if path is None:
            return
        self.engine.load_checkpoint(path, load_contents=self.config.trainer.checkpoint.load_contents)
        self.train_loader.load_state_dict(checkpointing.load_driver_state(path)["dataloader"])
        self.global_step = checkpointing.step_of(path)
        if self.rank == 0:
            print(f"[verl] resumed from {os.path.abspath(path)} at step {self.global_step}", flush=True)

    def fit(self) -> dict:
        """Train to ``total_steps``; returns the last step's metrics."""
        from verl.utils.tracking import Tracking

        trainer = self.config.trainer
        self.load_checkpoint()
        if self.global_step >= self.total_steps and self.rank == 0:
            print(f"[verl] nothing to train: the checkpoint is at step {self.global_step} of {self.total_steps}; "
                  "raise trainer.total_training_steps or set trainer.resume_mode=disable", flush=True)
        tracker = (Tracking(trainer.project_name, trainer.experiment_name, default_backend=trainer.logger,
                            config=OmegaConf.to_container(self.config, resolve=True), total_steps=self.total_steps)
                   if self.rank == 0 else None)
        metrics: dict = {}
        try:
            while self.global_step < self.total_steps:
                for batch in self.train_loader:
                    self.global_step += 1
                    metrics = self.training_step(batch)
                    last = self.global_step >= self.total_steps
                    if self.val_loader is not None and (last or (trainer.test_freq > 0
                                                                 and self.global_step % trainer.test_freq == 0)):
                        metrics["val/loss"] = self.validate()
                    if tracker is not None:
                        tracker.log(metrics, step=self.global_step)
                    if last or (trainer.save_freq > 0 and self.global_step % trainer.save_freq == 0):
                        self.save_checkpoint()
                    if last:
                        break
        finally:
            if tracker is not None:
                tracker.finish()
        return metrics


def run_sft(config: DictConfig) -> dict:
    """Build the tokenizer, datasets and trainer of a validated config and train; the process group is up."""
    from verl.data.sft_dataset import SFTDataset
    from verl.models import load_tokenizer

    model = config.model
    if model.external_lib:
        importlib.import_module(model.external_lib)  # registers custom architectures with transformers
    tokenizer = load_tokenizer(model.partial_pretrain, config_key="model.partial_pretrain",
                               trust_remote_code=model.trust_remote_code, chat_template=config.data.chat_template)
    train_dataset = SFTDataset(config.data.train_files, tokenizer, config.data)
    val_dataset = SFTDataset(config.data.val_files, tokenizer, config.data) if config.data.val_files else None
    return FSDPSFTTrainer(config, tokenizer, train_dataset, val_dataset).fit()


def _started_by_torchrun() -> bool:
    # torchrun always sets TORCHELASTIC_RUN_ID; RANK/WORLD_SIZE alone may be left over from other code
    # running in this process (e.g. the local worker backend sets them).
    return "TORCHELASTIC_RUN_ID" in os.environ and "WORLD_SIZE" in os.environ


def _launched_world_size() -> int:
    if dist.is_initialized():
        return dist.get_world_size()
    return int(os.environ["WORLD_SIZE"]) if _started_by_torchrun() else 1


def _init_process_group(device: str) -> bool:
    """Join torchrun's process group, or make a one-process one; True when this call created it."""
    if dist.is_initialized():
        return False
    backend = "nccl" if device == "cuda" else "gloo"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if _started_by_torchrun():
        dist.init_process_group(backend)
    else:  # one process: a file rendezvous, so nothing listens on the network
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        rendezvous = os.path.join(tempfile.mkdtemp(prefix="verl_sft_"), "pg")
        dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=0, world_size=1)
    return True


def main(argv: list[str] | None = None) -> int:
    """Compose, validate, train; 0 on success, 1 for a configuration or data problem (printed)."""
    from verl.data.rl_dataset import DatasetError

    configure_logging()
    try:
        config = compose_sft_config(sys.argv[1:] if argv is None else argv)
        validate_sft_config(config, world_size=_launched_world_size())
    except ConfigError as err:
        print(err, file=sys.stderr)
        return 1
    created = _init_process_group(config.trainer.device)
    try:
        run_sft(config)
    except DatasetError as err:
        print(f"Data problem: {err}", file=sys.stderr)
        return 1
    finally:
        if created:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
