"""Checks of training on samples another policy generated: ``algorithm.rollout_correction.*`` (importance
weights, rejection, bypass mode), before any worker starts."""

from __future__ import annotations

from collections.abc import Iterator

from verl.algorithms.rollout_correction import (IS_LEVELS, RS_KEY, RS_THRESHOLD_KEY, parse_rollout_rs,
                                                parse_rollout_rs_thresholds)
from verl.trainer.config.checks import ROLLOUT, Issue, Run, _format, _not_in, error

CORR = "algorithm.rollout_correction"
LOSS_TYPES = ("ppo_clip", "reinforce")


def check_rollout_correction(run: Run) -> Iterator[Issue]:
    rollout_is, rollout_rs = run.get(f"{CORR}.rollout_is"), run.get(f"{CORR}.rollout_rs")
    bypass = bool(run.get(f"{CORR}.bypass_mode"))
    if rollout_is is not None and rollout_is not in IS_LEVELS:
        yield _not_in(f"{CORR}.rollout_is", rollout_is, [*IS_LEVELS, "null"])
    threshold = run.get(f"{CORR}.rollout_is_threshold")
    if rollout_is is not None and not (isinstance(threshold, (int, float)) and threshold > 0):
        yield error(f"{CORR}.rollout_is_threshold", f"must be a number > 0 (the IS weights' upper truncation), got "
                                                    f"{_format(threshold)}. The usual value is 2.0")
    if rollout_rs is not None:
        try:
            parse_rollout_rs_thresholds(parse_rollout_rs(rollout_rs), run.get(f"{CORR}.rollout_rs_threshold"))
        except ValueError as err:  # the message starts with the key it is about
            key = RS_THRESHOLD_KEY if str(err).startswith(RS_THRESHOLD_KEY) else RS_KEY
            yield error(key, str(err).split(": ", 1)[-1])
    loss_type = run.get(f"{CORR}.loss_type")
    if loss_type not in LOSS_TYPES:
        yield _not_in(f"{CORR}.loss_type", loss_type, LOSS_TYPES)
    needed = [what for what, used in (("rollout_is", rollout_is is not None), ("rollout_rs", rollout_rs is not None),
                                      ("bypass_mode", bypass)) if used]
    if needed and not run.get(f"{ROLLOUT}.calculate_log_probs"):
        yield error(f"{ROLLOUT}.calculate_log_probs",
                    f"is false, but {CORR}.{needed[0]} needs the rollout's own log-probs (the behaviour policy). Set "
                    f"{ROLLOUT}.calculate_log_probs=true")
