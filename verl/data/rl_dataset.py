"""Prompt dataset for RL training: chat prompts from parquet files, left-padded to a fixed length.

Every row is validated and tokenized when the dataset is built, so a malformed row, a missing
chat template or an overlong prompt is reported (with its file and row) before training starts.
Token ids are kept in one flat int32 array, about 4 bytes per prompt token.

With a vision-language model's processor (:mod:`verl.models.vision`) rows carry images in the column
``data.image_key`` (a list of ``{"bytes": ...}`` or ``{"path": ...}`` dicts, as the original's geo3k
preprocessing writes them), each placed where the prompt says ``<image>``. A sample then also holds
``multi_modal_data`` (``{"image": [PIL images]}``), ``multi_modal_inputs`` (``pixel_values``,
``image_grid_thw``) and M-RoPE ``position_ids`` (3, max_prompt_length), as the original's do. Videos are not
supported: a row whose ``data.video_key`` column holds any is refused, with any model.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.utils.data import Dataset

from verl.models.vision import IMAGE_PLACEHOLDER, as_vision_processor, rope_index
from verl.protocol import object_array
from verl.trainer.config.config import DataConfig
from verl.utils.model import compute_position_id_with_mask
from verl.utils.torch_functional import truncation_split

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
    """Cut ``ids`` to ``max_length`` tokens as ``data.truncation`` says (:func:`verl.utils.torch_functional.
    truncation_split`: ``left`` keeps the end, ``right`` the start, ``middle`` both halves). ``error`` is checked by
    the caller."""
    if len(ids) <= max_length:
        return ids
    try:
        head, tail = truncation_split(max_length, mode)
    except ValueError:
        raise DatasetError(f"data.truncation={mode!r} cannot cut a prompt; use one of left, right, middle.") from None
    return ids[:head] + ids[len(ids) - tail:]


class RLHFDataset(Dataset):
    """Chat prompts from one or more parquet files, ready for rollout.

    ``config`` is the ``data`` section (a `DataConfig`, or a dict / OmegaConf node of its keys; the keys it
    lacks keep ppo_trainer.yaml's defaults). ``max_samples`` >= 0 keeps that many rows (drawn with
    ``data.seed`` when ``data.shuffle``, else the first ones); -1 keeps all.
    """

    def __init__(self, data_files, tokenizer, config=None, processor=None, max_samples: int = -1):
        self.data_files = _data_files(data_files)
        self.tokenizer = tokenizer
        self.processor = None if processor is None else as_vision_processor(processor, tokenizer)
        config = DataConfig.from_config(config)
        self.prompt_key, self.reward_fn_key, self.image_key = config.prompt_key, config.reward_fn_key, config.image_key
        self.video_key = config.video_key
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
        if self.processor is not None and self.image_key not in table.column_names:
            raise DatasetError(f"{path}: actor_rollout_ref.model.path is a vision-language model "
                               f"({self.processor.config.model_type}) but the data has no image column "
                               f"data.image_key={self.image_key!r}; columns present: {table.column_names}. Point "
                               "data.image_key at the column of images, or train a text model.")
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
        return self._render(_with_image_items(messages) if self.processor is not None else messages, row)

    def _first_filled(self, file_idx: int, rows: list[int], start: int, column: str) -> int | None:
        """The first of ``rows`` (global numbers) whose ``column`` cell is not empty (None, [] or ""), as a row within
        its file; None when the file has no such column or every cell is empty."""
        table = self._tables[file_idx]
        if column not in table.column_names:
            return None
        cells = table.column(column).to_pylist()
        return next((row - start for row in rows if cells[row - start]), None)

    def _check_media(self, file_idx: int, rows: list[int], start: int) -> None:
        """Stop at the first row whose media the model would never see: videos (no model here reads them), and
        images for a text-only model."""
        path = self.data_files[file_idx]
        row = self._first_filled(file_idx, rows, start, self.video_key)
        if row is not None:
            raise DatasetError(f"{path}, row {row}, column '{self.video_key}' (data.video_key) holds videos, but this "
                               "verl does not support video inputs (only images, data.image_key). Drop the column or "
                               "empty its lists in preprocessing (or turn videos into frames in data.image_key); to "
                               "train on these prompts without their videos, set data.video_key to a name that no "
                               "column has (the prompts' '<video>' marks then stay plain text).")
        row = None if self.processor is not None else self._first_filled(file_idx, rows, start, self.image_key)
        if row is not None:
            raise DatasetError(f"{path}, row {row}, column '{self.image_key}' (data.image_key) holds images, but "
                               "actor_rollout_ref.model.path is a text-only model (no vision tower, no image "
                               "processor). Use a vision-language model such as Qwen2.5-VL, or drop the images in "
                               "preprocessing.")

    def _load_images(self, value: Any, file_idx: int, local: int) -> list:
        """The PIL images of one row's ``data.image_key`` cell, RGB."""
        from PIL import Image

        where = f"{self.data_files[file_idx]}, row {local}, column '{self.image_key}'"
        if value is None:
            return []
        if not isinstance(value, (list, tuple, np.ndarray)):
            raise DatasetError(f"{where}: expected a list of images ({{'bytes': ...}} or {{'path': ...}} dicts), got "
                               f"{type(value).__name__}: {_short_repr(value)}")
        images = []
        for i, item in enumerate(value):
            item = {"path": item} if isinstance(item, str) else item
            try:
                if isinstance(item, dict) and item.get("bytes") is not None:
                    image = Image.open(io.BytesIO(item["bytes"]))
                elif isinstance(item, dict) and item.get("path"):
                    path = os.path.expanduser(item["path"])
                    if not os.path.isabs(path) and not os.path.exists(path):  # relative to the parquet file
                        path = os.path.join(os.path.dirname(self.data_files[file_idx]), path)
                    image = Image.open(path)
                else:
                    raise ValueError(f"an image must be a {{'bytes': ...}} or {{'path': ...}} dict, got "
                                     f"{_short_repr(item)}")
                images.append(image.convert("RGB"))
            except (OSError, ValueError) as err:
                raise DatasetError(f"{where}: image {i} could not be read: {err}") from None
        return images

    def _process(self, text: str, images: list, file_idx: int, local: int) -> tuple[list[int], dict]:
        try:
            return self.processor(text, images)
        except ValueError as err:
            raise DatasetError(f"{self.data_files[file_idx]}, row {local}: {err}. Put one '{IMAGE_PLACEHOLDER}' in "
                               f"the prompt (data.prompt_key) for each image of data.image_key.") from None

    def _tokenize_all(self):
        """Validate, chat-template and tokenize every selected row into one flat id array."""
        chunks, lengths = [], []
        for file_idx, table in enumerate(self._tables):
            start, stop = self._file_starts[file_idx], self._file_starts[file_idx + 1]
            rows = self._rows[(self._rows >= start) & (self._rows < stop)].tolist()
            if not rows:
                continue
            prompts = table.column(self.prompt_key).to_pylist()
            self._check_media(file_idx, rows, start)
            if self.processor is not None:
                images = table.column(self.image_key).to_pylist()
            for begin in range(0, len(rows), _TOKENIZE_CHUNK):
                batch_rows = rows[begin : begin + _TOKENIZE_CHUNK]
                texts = [self._templated_prompt(prompts[row - start], row) for row in batch_rows]
                if self.processor is None:
                    ids = self.tokenizer(texts, add_special_tokens=False)["input_ids"]
                else:  # image tokens expanded to each image's length
                    ids = [self._process(text, self._load_images(images[row - start], file_idx, row - start),
                                         file_idx, row - start)[0] for text, row in zip(texts, batch_rows)]
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
        elif overlong.any() and self.processor is not None:
            first = int(np.argmax(overlong))
            raise DatasetError(f"{self._where(int(self._rows[first]))}: prompt is {int(self._token_len[first])} tokens "
                               f"with its image tokens, longer than data.max_prompt_length={self.max_prompt_length} "
                               f"({int(overlong.sum())} prompts are overlong); prompts with images are never cut (an "
                               "image's tokens must all be there). Raise data.max_prompt_length or set "
                               "data.filter_overlong_prompts=True.")
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
        multi_modal = None
        if self.processor is not None:
            images = self._load_images(record.pop(self.image_key), file_idx, local)
            _, inputs = self._process(self._templated_prompt(messages, row), images, file_idx, local)
            multi_modal = {"image": images} if images else {}, inputs
        ids = truncate_prompt(ids, self.max_prompt_length, self.truncation)
        pad = self.max_prompt_length - len(ids)
        input_ids = torch.tensor([self.pad_token_id] * pad + ids, dtype=torch.long)
        attention_mask = torch.cat([torch.zeros(pad, dtype=torch.long), torch.ones(len(ids), dtype=torch.long)])
        if multi_modal is None:
            position_ids = compute_position_id_with_mask(attention_mask)
        else:  # M-RoPE (3, P)
            position_ids = rope_index(self.processor.config, input_ids, attention_mask,
                                      multi_modal[1].get("image_grid_thw"))

        out = {k: _plain(v) for k, v in record.items()}
        if multi_modal is not None:
            out["multi_modal_data"], out["multi_modal_inputs"] = multi_modal
        extra_info = out.get("extra_info")
        index = extra_info.get("index") if isinstance(extra_info, dict) else None
        out.update(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, raw_prompt_ids=ids,
                   index=row if index is None else index)
        if self.return_raw_chat:
            out["raw_prompt"] = messages
        if self.return_full_prompt:
            out["full_prompts"] = self._render(messages, row)
        return out


def _with_image_items(messages: list[dict]) -> list[dict]:
    """Messages whose ``<image>`` placeholders become ``{"type": "image"}`` content items between the text
    pieces, the form a vision-language chat template renders as image tokens."""
    out = []
    for message in messages:
        pieces = [p for p in re.split(f"({re.escape(IMAGE_PLACEHOLDER)})", message["content"]) if p]
        content = [{"type": "image"} if p == IMAGE_PLACEHOLDER else {"type": "text", "text": p} for p in pieces]
        out.append({**message, "content": content})
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
