"""How a training step's batch gets its ``token_level_scores``: the reward model's ``rm_scores`` (a sequence
classifier) first, then the reward function (:func:`verl.rewards.loading.compute_reward`), in the step or, with
``reward_model.launch_reward_fn_async``, on a driver thread while the workers compute the batch's old/reference
log-probs and values (joined before the advantages, as the original does with a Ray task)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from verl.protocol import DataProto, object_array
from verl.rewards.loading import compute_reward
from verl.trainer.config.spec import RunSpec
from verl.utils.profiler import marked_timer
from verl.workers.config.reward_model import uses_generative_reward

logger = logging.getLogger(__name__)

__all__ = ["StepScoring"]


class StepScoring:
    """Scores the step's batches with the reward function each call is given (the trainer's ``reward_fn``);
    ``rm`` (the reward-model worker group, set once the workers run) gives ``rm_scores`` when the run has a
    sequence-classifier reward model. ``filter_groups``: dynamic sampling, which needs each round's scores at once."""

    def __init__(self, spec: RunSpec, filter_groups: bool):
        self.spec = spec
        self.rm = None
        reward_model, custom = spec.reward_model, spec.custom_reward_function
        self.model_scores = spec.use_rm and not uses_generative_reward(reward_model.enable,
                                                                        reward_model.use_reward_loop, custom.path)
        self.thread = self._background_thread(filter_groups)

    def _background_thread(self, filter_groups: bool) -> ThreadPoolExecutor | None:
        """``reward_model.launch_reward_fn_async``: the thread that scores a step's batch while the workers compute.
        A driver thread, not the original's Ray task, so that both backends run it the same way. None when the key
        is off, or when the scores are needed at once (said once, at INFO)."""
        spec = self.spec
        if not spec.reward_model.launch_reward_fn_async:
            return None
        reason = None
        if spec.trainer.v1.asynchronous:
            reason = (f"trainer.v1.trainer_mode={spec.trainer.v1.trainer_mode} already scores each prompt group "
                      "as its generation ends, while the trainer works on earlier batches")
        elif filter_groups:
            reason = "algorithm.filter_groups needs each round's scores to choose the prompt groups it keeps"
        elif uses_generative_reward(spec.reward_model.enable, spec.reward_model.use_reward_loop,
                                    spec.custom_reward_function.path):
            reason = ("a generative judge generates on the reward-model workers, which may share devices (with "
                      "trainer.backend=local, the process) with the actor's: their calls are not overlapped")
        if reason is not None:
            logger.info("reward_model.launch_reward_fn_async=True has no effect in this run (no background "
                        "scoring): %s", reason)
            return None
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="verl-reward")

    def score(self, batch: DataProto, reward_fn) -> DataProto:
        """``token_level_scores`` of finished rows (model reward first, when used), and the reward's extra info."""
        batch = self._add_model_scores(batch)
        scores, extra_info = compute_reward(batch, reward_fn)  # a generative judge is asked from inside
        return _add_scores(batch, scores, extra_info)

    def _add_model_scores(self, batch: DataProto) -> DataProto:
        """The reward model's ``rm_scores`` (a sequence-classification model), which the reward function reads."""
        return batch.union(self.rm.compute_rm_score(batch)) if self.model_scores else batch

    def start(self, batch: DataProto, reward_fn, timing_raw: dict) -> tuple[DataProto, Future]:
        """Start scoring ``batch`` on the reward thread (the reward model's scores first, here); :meth:`join` adds
        the results. The reward reads its own copy of the rows as they are now: the step meanwhile reorders them
        and adds columns, which the synchronous reward would not have seen either."""
        with marked_timer("reward", timing_raw):
            batch = self._add_model_scores(batch)
        rows = DataProto(batch=batch.batch.clone(), non_tensor_batch=dict(batch.non_tensor_batch),
                         meta_info=dict(batch.meta_info))

        def score() -> tuple[torch.Tensor, dict, float]:
            tic = time.perf_counter()
            scores, extra_info = compute_reward(rows, reward_fn)
            return scores, extra_info, time.perf_counter() - tic

        return batch, self.thread.submit(score)

    @staticmethod
    def join(batch: DataProto, pending: Future, order: torch.Tensor | None, timing_raw: dict) -> DataProto:
        """Wait for the reward thread's scores (its error, if it raised, is raised here) and add them to the batch,
        in the batch's row ``order`` (the step's balancing). ``timing_s/reward`` counts the scoring, not the wait."""
        scores, extra_info, seconds = pending.result()
        timing_raw["reward"] = timing_raw.get("reward", 0.0) + seconds
        if order is not None:
            scores = scores[order]
            extra_info = {k: object_array(v)[order.numpy()] for k, v in extra_info.items()}
        return _add_scores(batch, scores, extra_info)

    def close(self) -> None:
        if self.thread is not None:  # a step stopped by an error may leave its batch being scored
            self.thread.shutdown(wait=False, cancel_futures=True)
            self.thread = None


def _add_scores(batch: DataProto, scores: torch.Tensor, extra_info: dict) -> DataProto:
    batch.non_tensor_batch.update({k: object_array(v) for k, v in extra_info.items()})
    batch.batch["token_level_scores"] = scores
    return batch
