"""Model-based reward: a sequence classifier (one label) scores prompt + response.

The score of a row is the classifier head's output at the row's last valid token (the last 1 of
``attention_mask``); it is placed in ``rm_scores`` (B, R) at the last valid response token, 0
elsewhere, like a rule reward. The pooling is done here rather than by transformers (which looks for
the pad token in ``input_ids``), because prompts are left-padded and responses right-padded.

When the reward model has its own tokenizer and chat template, each row is rebuilt as text: the
prompt's chat messages (``raw_prompt``) plus the decoded response as the assistant turn, formatted
with the reward model's chat template and encoded with its tokenizer.
"""

from __future__ import annotations

import numpy as np
import torch

from verl.models.loader import load_pretrained
from verl.models.logprob import backbone_hidden, call_as_forward
from verl.protocol import DataProto, left_padded
from verl.utils.seqlen_balancing import map_micro_batches

__all__ = ["compute_rm_scores", "load_reward_model", "place_scores", "retokenize_for_reward_model", "same_tokenizer",
           "sequence_scores"]


def load_reward_model(path: str, *, dtype: torch.dtype | str = torch.float32, trust_remote_code: bool = False,
                      override_config=None, config_key: str = "reward_model.model.path", remove_padding: bool = False):
    """An ``AutoModelForSequenceClassification`` with one label (dropout off) from ``path``; ``remove_padding``
    as in :func:`~verl.models.loader.load_causal_lm`."""
    return load_pretrained("AutoModelForSequenceClassification", path, dtype=dtype, trust_remote_code=trust_remote_code,
                           override_config=override_config, remove_padding=remove_padding, config_key=config_key,
                           one_label=True)


def sequence_scores(model, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    position_ids: torch.Tensor, remove_padding: bool = False) -> torch.Tensor:
    """(B,) float32: the head's output at each row's last valid token; ``remove_padding`` runs the
    backbone on the valid tokens only (:mod:`verl.models.packed`)."""
    last = (attention_mask.long() * torch.arange(attention_mask.shape[1], device=attention_mask.device)).argmax(-1)

    def scored_forward(input_ids, attention_mask, position_ids):
        hidden, batch = backbone_hidden(model, input_ids, attention_mask, position_ids, remove_padding)
        rows = torch.arange(len(last), device=last.device)
        pooled = hidden[rows, last] if batch is None else hidden[batch.index[rows, last]]
        head = model.score if hasattr(model, "score") else model.classifier
        return head(pooled).squeeze(-1).float().clone()

    return call_as_forward(model, scored_forward, input_ids, attention_mask, position_ids)


def place_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) float32 with ``scores[i]`` at row i's last valid response token (column 0 if none)."""
    out = torch.zeros(response_mask.shape, dtype=torch.float32, device=scores.device)
    last = (response_mask.sum(-1).long() - 1).clamp(min=0)
    out[torch.arange(len(scores), device=scores.device), last] = scores.float()
    return out


def same_tokenizer(a, b) -> bool:
    """Same vocabulary and chat template: token ids can be passed from one to the other as they are."""
    return a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)


def retokenize_for_reward_model(data: DataProto, src_tokenizer, rm_tokenizer, max_length: int | None = None):
    """A batch of ``input_ids``, ``attention_mask``, ``position_ids`` (left-padded) of each row rebuilt as
    ``raw_prompt`` messages + the decoded valid response as the assistant turn, in the reward model's
    chat template. Rows longer than ``max_length`` keep their last ``max_length`` tokens (the response)."""
    if "raw_prompt" not in data.non_tensor_batch:
        raise KeyError("the reward model has its own tokenizer (reward_model.model.input_tokenizer differs from "
                       "reward_model.model.path's), so each row is re-encoded from its chat messages, but the batch "
                       "has no 'raw_prompt' column: set data.return_raw_chat=true")
    responses, mask = data.batch["responses"].cpu(), data.batch["response_mask"].cpu().bool()
    rows = []
    for i in range(len(data)):
        messages = [dict(m) for m in np.asarray(data.non_tensor_batch["raw_prompt"][i], dtype=object).tolist()]
        response = src_tokenizer.decode(responses[i][mask[i]].tolist(), skip_special_tokens=True)
        chat = messages + [{"role": "assistant", "content": response}]
        text = rm_tokenizer.apply_chat_template(chat, tokenize=False)
        ids = rm_tokenizer(text, add_special_tokens=False)["input_ids"]
        rows.append(ids[-max_length:] if max_length else ids)
    pad = rm_tokenizer.pad_token_id if rm_tokenizer.pad_token_id is not None else 0
    return left_padded(rows, pad).to(data.batch["responses"].device)


@torch.no_grad()
def compute_rm_scores(module, data: DataProto, *, micro_batch_size: int | None, max_token_len: int | None = None,
                      src_tokenizer=None, rm_tokenizer=None, max_length: int | None = None,
                      remove_padding: bool = False) -> torch.Tensor:
    """``rm_scores`` (B, R) for ``data`` (re-encoded first when both tokenizers are given); ``remove_padding``
    packs each micro-batch (see :func:`sequence_scores`)."""
    module.eval()
    response_mask = data.batch.get("response_mask")
    if response_mask is None:
        response_mask = data.batch["attention_mask"][:, -data.batch["responses"].shape[-1]:]
        data.batch["response_mask"] = response_mask
    if src_tokenizer is not None and rm_tokenizer is not None:
        inputs = retokenize_for_reward_model(data, src_tokenizer, rm_tokenizer, max_length)
    else:
        inputs = data.select(batch_keys=["input_ids", "attention_mask", "position_ids"], non_tensor_batch_keys=[])
    scores = map_micro_batches(inputs, micro_batch_size, max_token_len, lambda m: sequence_scores(
        module, m.batch["input_ids"], m.batch["attention_mask"], m.batch["position_ids"],
        remove_padding=remove_padding))
    return place_scores(scores, response_mask)
