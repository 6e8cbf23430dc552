"""Prompt dataset for RL training: chat prompts from parquet files, left-padded to a fixed length.

Every row is validated and tokenized when the dataset is built, so a malformed row, a missing
chat template or an overlong prompt is reported (with its file and row) before training starts.
Token ids are kept in one flat int32 array, about 4 bytes per prompt token.
"""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from verl.protocol import object_array
from verl.trainer.config.config import DataConfig

logger = logging.getLogger("verl.dataset")

TRUNCATION_MODES = ("error", "left", "right", "middle")
_TOKENIZE_CHUNK = 4096


class DatasetError(ValueError):
    """A problem with the training data or its configuration, worded for the person fixing it."""


def _plain(value: Any) -> Any:
    """Turn OmegaConf/numpy/pyarrow containers into plain Python dicts, lists and scalars."""
    if isinstance(value, (str, bytes)) or value is None:
        return value
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "items"):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (Sequence, np.ndarray)):
        return [_plain(v) for v in value]
    return value


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _chat_messages(prompt: Any, prompt_key: str) -> list[dict]:
    """Check one row's prompt is a non-empty chat list and return it as plain dicts.

    Raises DatasetError without a location; the caller prefixes file, row and column.
    """
    fix = (f"Each row's '{prompt_key}' must be a chat list like [{{'role': 'user', 'content': '...'}}]; "
           "fix the preprocessing script, or point data.prompt_key at the chat column.")
    if not isinstance(prompt, (list, tuple, np.ndarray)):
        raise DatasetError(f"prompt is not a chat list, got {type(prompt).__name__}: {_short_repr(prompt)}. {fix}")
    if len(prompt) == 0:
        raise DatasetError(f"prompt is an empty list. {fix}")
    messages = []
    for turn, message in enumerate(prompt):
        if not hasattr(message, "items") or "role" not in message or "content" not in message:
            raise DatasetError(f"message {turn} is not a {{role, content}} dict, got "
                               f"{type(message).__name__}: {_short_repr(message)}. {fix}")
        if not isinstance(message["role"], str) or not message["role"]:
            raise DatasetError(f"message {turn} has an empty or non-string role. {fix}")
        if not isinstance(message["content"], str) or not message["content"]:
            raise DatasetError(f"message {turn} has empty or non-string content ({_short_repr(message['content'])}). "
                               f"{fix}")
        messages.append(_plain(message))
    return messages


def _read_parquet(path: str) -> pa.Table:
    try:
        return pq.read_table(path)
    except (OSError, pa.ArrowException) as err:
        raise DatasetError(f"could not read parquet file {path}: {type(err).__name__}: {err}. "
                           "Check that data.train_files / data.val_files name existing parquet files.") from err


def _data_files(files) -> list[str]:
    """One path or several, expanded; DatasetError when there are none."""
    paths = [os.path.expanduser(str(f)) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
    if not paths:
        raise DatasetError("no data files given; set data.train_files / data.val_files.")
    return paths


def truncate_prompt(ids: list[int], max_length: int, mode: str) -> list[int]:
    """Cut ``ids`` to ``max_length`` tokens.

    ``left`` keeps the last ``max_length`` tokens, ``right`` the first ``max_length``, and
    ``middle`` the first ``max_length // 2`` plus the last ``max_length - max_length // 2``
    (the removed tokens come from the middle). ``error`` is checked by the caller.
    """
    if len(ids) <= max_length:
        return ids
    if mode == "left":
        return ids[-max_length:]
    if mode == "right":
        return ids[:max_length]
    if mode == "middle":
        head = max_length // 2
        tail = max_length - head
        return ids[:head] + ids[-tail:]
    raise DatasetError(f"data.truncation={mode!r} cannot cut a prompt; use one of left, right, middle.")


class RLHFDataset(Dataset):
    """Chat prompts from one or more parquet files, ready for rollout.

    ``config`` is the ``data`` section (a `DataConfig`, or a dict / OmegaConf node of its keys; the keys it
    lacks keep ppo_trainer.yaml's defaults). ``max_samples`` >= 0 keeps that many rows (drawn with
    ``data.seed`` when ``data.shuffle``, else the first ones); -1 keeps all.
    """

    def __init__(self, data_files, tokenizer, config=None, processor=None, max_samples: int = -1):
        if processor is not None:
            raise ValueError("RLHFDataset reads text prompts only (no image or video inputs); "
                             "load the model without a multimodal processor (processor=None).")
        self.data_files = _data_files(data_files)
        self.tokenizer = tokenizer
        config = DataConfig.from_config(config)
        self.prompt_key, self.reward_fn_key = config.prompt_key, config.reward_fn_key
        self.max_prompt_length, self.truncation = int(config.max_prompt_length), config.truncation
        self.filter_overlong_prompts = config.filter_overlong_prompts
        self.return_raw_chat, self.return_full_prompt = config.return_raw_chat, config.return_full_prompt
        self.chat_template_kwargs = _plain(config.apply_chat_template_kwargs)
        if self.truncation not in TRUNCATION_MODES:
            raise DatasetError(f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}.")
        self.pad_token_id = self._pad_token_id(tokenizer)
        self._check_chat_template()

        self._tables = [self._load(path) for path in self.data_files]
        self._file_starts = np.cumsum([0] + [t.num_rows for t in self._tables])
        self._rows = self._select_rows(int(max_samples), config.shuffle, int(config.seed))
        self._tokenize_all()
        self._apply_length_limit()

    # ---- construction -------------------------------------------------------------------------

    @staticmethod
    def _pad_token_id(tokenizer) -> int:
        if tokenizer.pad_token_id is not None:
            return tokenizer.pad_token_id
        if tokenizer.eos_token_id is None:
            raise DatasetError("the tokenizer has neither a pad token nor an eos token; cannot left-pad prompts.")
        logger.warning("tokenizer has no pad token; padding prompts with eos id %d", tokenizer.eos_token_id)
        return tokenizer.eos_token_id

    def _check_chat_template(self):
        if getattr(self.tokenizer, "chat_template", None) is None and "chat_template" not in self.chat_template_kwargs:
            raise DatasetError(f"tokenizer {getattr(self.tokenizer, 'name_or_path', '')!r} has no chat template. Set "
                               "data.apply_chat_template_kwargs.chat_template or "
                               "actor_rollout_ref.model.custom_chat_template, or use an instruct/chat tokenizer.")

    def _load(self, path: str) -> pa.Table:
        table = _read_parquet(path)
        for column in (self.prompt_key, self.reward_fn_key):
            if column not in table.column_names:
                raise DatasetError(f"{path}: column '{column}' is missing; columns present: {table.column_names}. "
                                   "Add it in preprocessing, or set data.prompt_key / data.reward_fn_key to an "
                                   "existing column.")
        return table

    def _select_rows(self, max_samples: int, shuffle: bool, seed: int) -> np.ndarray:
        total = int(self._file_starts[-1])
        if total == 0:
            raise DatasetError(f"{self.data_files} contain no rows; check data.train_files / data.val_files.")
        if max_samples <= 0 or max_samples >= total:
            return np.arange(total, dtype=np.int64)
        if shuffle:
            chosen = np.random.default_rng(seed).choice(total, size=max_samples, replace=False)
            return np.sort(chosen).astype(np.int64)
        return np.arange(max_samples, dtype=np.int64)

    def _locate(self, row: int) -> tuple[int, int]:
        """Global row number -> (file number, row within that file)."""
        file_idx = int(np.searchsorted(self._file_starts, row, side="right")) - 1
        return file_idx, int(row - self._file_starts[file_idx])

    def column_values(self, column: str):
        """``(file, row within the file, value)`` of ``column`` for every row this dataset serves (after
        max_samples and the length filter), read column-wise without building the samples."""
        values = [t.column(column).to_pylist() if column in t.column_names else None for t in self._tables]
        for row in self._rows:
            file_idx, local = self._locate(int(row))
            column_values = values[file_idx]
            yield self.data_files[file_idx], local, None if column_values is None else column_values[local]

    def _where(self, row: int) -> str:
        file_idx, local = self._locate(row)
        return f"{self.data_files[file_idx]}, row {local}, column '{self.prompt_key}'"

    def _render(self, messages: list[dict], row: int) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
                                                      **self.chat_template_kwargs)
        except Exception as err:
            raise DatasetError(
                f"{self._where(row)}: applying the chat template failed: {type(err).__name__}: {err}") from err

    def _templated_prompt(self, prompt: Any, row: int) -> str:
        try:
            messages = _chat_messages(prompt, self.prompt_key)
        except DatasetError as err:
            raise DatasetError(f"{self._where(row)}: {err}") from None
        return self._render(messages, row)

    def _tokenize_all(self):
        """Validate, chat-template and tokenize every selected row into one flat id array."""
        chunks, lengths = [], []
        for file_idx, table in enumerate(self._tables):
            start, stop = self._file_starts[file_idx], self._file_starts[file_idx + 1]
            rows = self._rows[(self._rows >= start) & (self._rows < stop)].tolist()
            if not rows:
                continue
            prompts = table.column(self.prompt_key).to_pylist()
            for begin in range(0, len(rows), _TOKENIZE_CHUNK):
                batch_rows = rows[begin : begin + _TOKENIZE_CHUNK]
                texts = [self._templated_prompt(prompts[row - start], row) for row in batch_rows]
                ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
                chunk_lengths = [len(x) for x in ids]
                chunks.append(np.fromiter(itertools.chain.from_iterable(ids), np.int32, sum(chunk_lengths)))
                lengths.extend(chunk_lengths)
        self._token_ids = np.concatenate(chunks)
        self._token_len = np.asarray(lengths, dtype=np.int64)
        self._token_start = np.cumsum(self._token_len) - self._token_len

    def _apply_length_limit(self):
        overlong = self._token_len > self.max_prompt_length
        if self.filter_overlong_prompts:
            total = len(self._rows)
            keep = ~overlong
            self._rows = self._rows[keep]
            self._token_start = self._token_start[keep]
            self._token_len = self._token_len[keep]
            logger.info("filter_overlong_prompts: dropped %d of %d prompts longer than "
                        "data.max_prompt_length=%d tokens", int(overlong.sum()), total, self.max_prompt_length)
            if len(self._rows) == 0:
                raise DatasetError(f"every one of the {total} prompts in {self.data_files} is longer than "
                                   f"data.max_prompt_length={self.max_prompt_length}; raise data.max_prompt_length.")
        elif self.truncation == "error" and overlong.any():
            first = int(np.argmax(overlong))
            raise DatasetError(f"{self._where(int(self._rows[first]))}: prompt is {int(self._token_len[first])} tokens "
                               f"after the chat template, longer than data.max_prompt_length={self.max_prompt_length} "
                               f"({int(overlong.sum())} prompts are overlong). Raise data.max_prompt_length, set "
                               "data.truncation=left|right|middle, or set data.filter_overlong_prompts=True.")

    # ---- access -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows)

    def __getitem__(self, item: int) -> dict:
        row = int(self._rows[item])
        file_idx, local = self._locate(row)
        record = self._tables[file_idx].slice(local, 1).to_pylist()[0]
        messages = _plain(record.pop(self.prompt_key))

        start = self._token_start[item]
        ids = self._token_ids[start : start + self._token_len[item]].tolist()
        ids = truncate_prompt(ids, self.max_prompt_length, self.truncation)
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(len(ids), dtype=torch.long)])
        position_ids = torch.clamp(torch.cumsum(attention_mask, dim=0) - 1, min=0)

        out = {k: _plain(v) for k, v in record.items()}
        extra_info = out.get("extra_info")
        index = extra_info.get("index") if isinstance(extra_info, dict) else None
        out.update(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, raw_prompt_ids=ids,
                   index=row if index is None else index)
        if self.return_raw_chat:
            out["raw_prompt"] = messages
        if self.return_full_prompt:
            out["full_prompts"] = self._render(messages, row)
        return out


def collate_fn(items: list[dict]) -> dict:
    """Stack tensors into [B, ...]; gather every other field into a length-B numpy object array.

    The result is what ``DataProto.from_single_dict`` takes. Object arrays are filled element by
    element so that list values (e.g. ``raw_prompt_ids``) stay one object per sample.
    """
    batch = {}
    for key in items[0]:
        values = [item[key] for item in items]
        batch[key] = torch.stack(values) if isinstance(values[0], torch.Tensor) else object_array(values)
    return batch
