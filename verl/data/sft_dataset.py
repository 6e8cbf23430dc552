"""Supervised fine-tuning data: prompt/response pairs or whole chats from parquet files, right-padded.

Each item holds ``input_ids``, ``attention_mask``, ``position_ids`` and ``loss_mask``, all of length
``data.max_length``. ``loss_mask`` is 1 exactly on the tokens the model learns to produce and 0 on
the prompt and the padding.

- Single turn: the prompt (a string, sent as one user message, or a chat list) becomes
  ``chat_template(messages, add_generation_prompt=True)``; the response is ``tokenize(response)``
  followed by the tokenizer's eos id. The two are tokenized apart, so whatever the template ends an
  assistant turn with, the model learns to stop with eos.
- Multi-turn (``data.multiturn.enable``): the chat column is rendered one message at a time, and each
  assistant message is what the template adds for it after its generation prompt, learnt up to and
  including its last eos token (for ChatML, ``content<|im_end|>``; the newline after it is not learnt).

Every row is tokenized when the dataset is built, so a malformed row or an overlong sequence is
reported with its file, row and column before training starts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from verl.data.rl_dataset import DatasetError, _chat_messages, _data_files, _plain, _read_parquet, _short_repr
from verl.trainer.config.config import SFTDataConfig
from verl.utils.model import compute_position_id_with_mask

logger = logging.getLogger("verl.dataset")

TRUNCATION_MODES = ("error", "left", "right")


class SFTDataset(Dataset):
    """Tokenized SFT examples from one or more parquet files.

    ``config`` is the ``data`` section of sft_trainer.yaml (an `SFTDataConfig`, or a dict / OmegaConf node of
    its keys; the keys it lacks keep the yaml's defaults).
    """

    def __init__(self, parquet_files, tokenizer, config=None):
        self.files = _data_files([] if parquet_files is None else parquet_files)
        self.tokenizer = tokenizer
        config = SFTDataConfig.from_config(config)
        self.multiturn, self.messages_key = config.multiturn.enable, config.multiturn.messages_key
        self.prompt_key, self.response_key = str(config.prompt_key), str(config.response_key)
        self.prompt_dict_keys = [str(k) for k in config.prompt_dict_keys or []]
        self.response_dict_keys = [str(k) for k in config.response_dict_keys or []]
        self.max_length, self.truncation = int(config.max_length), str(config.truncation)
        self.template_kwargs = _plain(config.apply_chat_template_kwargs) or {}
        if self.truncation not in TRUNCATION_MODES:
            raise DatasetError(f"data.truncation={self.truncation!r} is not one of {', '.join(TRUNCATION_MODES)}.")
        if tokenizer.eos_token_id is None:
            raise DatasetError("the tokenizer has no eos token, so the model could not learn where a response "
                               "ends; use a tokenizer that defines eos_token.")
        if getattr(tokenizer, "chat_template", None) is None and "chat_template" not in self.template_kwargs:
            raise DatasetError(f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template; set "
                               "data.chat_template, or use an instruct/chat tokenizer.")
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._warned_no_eos = False

        self._ids: list[np.ndarray] = []
        self._masks: list[np.ndarray] = []
        self._where: list[tuple[str, int]] = []
        for path in self.files:
            self._load(path)
        if not self._ids:
            raise DatasetError(f"{self.files} contain no rows; check data.train_files / data.val_files.")
        self._apply_length_limit()

    # ---- reading rows -------------------------------------------------------------------------

    def _columns(self) -> list[str]:
        return [self.messages_key] if self.multiturn else list(dict.fromkeys([self.prompt_key, self.response_key]))

    def _load(self, path: str) -> None:
        table = _read_parquet(path)
        for column in self._columns():
            if column not in table.column_names:
                keys = "data.multiturn.messages_key" if self.multiturn else "data.prompt_key / data.response_key"
                raise DatasetError(f"{path}: column '{column}' is missing; columns present: {table.column_names}. "
                                   f"Set {keys} to existing columns.")
        if self.multiturn:
            for row, chat in enumerate(table.column(self.messages_key).to_pylist()):
                self._add(*self._tokenize_chat(chat, path, row), path, row)
            return
        prompts = table.column(self.prompt_key).to_pylist()
        responses = table.column(self.response_key).to_pylist()
        prompt_texts, response_texts = [], []
        for row, (prompt, response) in enumerate(zip(prompts, responses)):
            prompt_texts.append(self._render(self._prompt_messages(prompt, path, row), True, path, row,
                                             self.prompt_key))
            response_texts.append(self._response_text(response, path, row))
        if not prompt_texts:
            return
        prompt_ids = self.tokenizer(prompt_texts, add_special_tokens=False)["input_ids"]
        response_ids = self.tokenizer(response_texts, add_special_tokens=False)["input_ids"]
        for row, (p_ids, r_ids) in enumerate(zip(prompt_ids, response_ids)):
            r_ids = [*r_ids, self.tokenizer.eos_token_id]
            self._add(p_ids + r_ids, [0] * len(p_ids) + [1] * len(r_ids), path, row)

    def _add(self, ids: list[int], mask: list[int], path: str, row: int) -> None:
        self._ids.append(np.asarray(ids, dtype=np.int64))
        self._masks.append(np.asarray(mask, dtype=np.int64))
        self._where.append((path, row))

    @staticmethod
    def _dig(value: Any, keys: list[str], column: str, setting: str, where: str) -> Any:
        for key in keys:
            if not isinstance(value, Mapping) or key not in value:
                present = sorted(value) if isinstance(value, Mapping) else type(value).__name__
                raise DatasetError(f"{where}, column '{column}': no key {key!r} ({setting}={keys}); found "
                                   f"{present}. Fix {setting}, or the preprocessing.")
            value = value[key]
        return value

    def _prompt_messages(self, prompt: Any, path: str, row: int) -> list[dict]:
        where = f"{path}, row {row}"
        prompt = _plain(self._dig(prompt, self.prompt_dict_keys, self.prompt_key, "data.prompt_dict_keys", where))
        if isinstance(prompt, str):
            return [{"role": "user", "content": prompt}]
        try:
            return _chat_messages(prompt, self.prompt_key)
        except DatasetError as err:
            raise DatasetError(f"{where}, column '{self.prompt_key}': {err} A plain string works too.") from None

    def _response_text(self, response: Any, path: str, row: int) -> str:
        where = f"{path}, row {row}"
        response = self._dig(response, self.response_dict_keys, self.response_key, "data.response_dict_keys", where)
        if not isinstance(response, str):
            raise DatasetError(f"{where}, column '{self.response_key}': the response must be a string, got "
                               f"{type(response).__name__}: {_short_repr(response)}. Point data.response_key "
                               "(and data.response_dict_keys) at the answer text.")
        return response

    def _render(self, messages: list[dict], generation_prompt: bool, path: str, row: int, column: str) -> str:
        try:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt,
                                                      tokenize=False, **self.template_kwargs)
        except Exception as err:
            raise DatasetError(f"{path}, row {row}, column '{column}': applying the chat template failed: "
                               f"{type(err).__name__}: {err}") from err

    def _tokenize_chat(self, chat: Any, path: str, row: int) -> tuple[list[int], list[int]]:
        """Render the chat message by message; each piece is the text one message adds to the one before."""
        where = f"{path}, row {row}, column '{self.messages_key}'"
        try:
            messages = _chat_messages(_plain(chat), self.messages_key)
        except DatasetError as err:
            raise DatasetError(f"{where}: {err}") from None
        if not any(m["role"] == "assistant" for m in messages):
            raise DatasetError(f"{where}: the chat has no assistant message, so there is nothing to learn. "
                               "Drop the row or add the assistant's answer.")
        ids: list[int] = []
        mask: list[int] = []
        rendered = ""

        def add_piece(text: str, learn: bool, turn: int) -> None:
            nonlocal rendered
            if not text.startswith(rendered):
                raise DatasetError(f"{where}: the chat template rewrites earlier text when message {turn} is added, "
                                   "so the assistant turns cannot be located. Set data.chat_template to a template "
                                   "that renders a chat incrementally (e.g. ChatML).")
            piece = self.tokenizer(text[len(rendered):], add_special_tokens=False)["input_ids"]
            rendered = text
            ids.extend(piece)
            mask.extend(self._assistant_mask(piece) if learn else [0] * len(piece))

        for turn, message in enumerate(messages):
            if message["role"] == "assistant":
                add_piece(self._render(messages[:turn], True, path, row, self.messages_key), False, turn)
            add_piece(self._render(messages[: turn + 1], False, path, row, self.messages_key),
                      message["role"] == "assistant", turn)
        return ids, mask

    def _assistant_mask(self, piece: list[int]) -> list[int]:
        eos = self.tokenizer.eos_token_id
        if eos in piece:
            last = len(piece) - 1 - piece[::-1].index(eos)
            return [1] * (last + 1) + [0] * (len(piece) - last - 1)
        if not self._warned_no_eos:
            logger.warning("the chat template ends assistant turns without the tokenizer's eos token %r; the model "
                           "learns the template's own turn ending instead, so generation must stop on that.",
                           self.tokenizer.eos_token)
            self._warned_no_eos = True
        return [1] * len(piece)

    # ---- length -------------------------------------------------------------------------------

    def _apply_length_limit(self) -> None:
        lengths = np.asarray([len(ids) for ids in self._ids])
        overlong = np.flatnonzero(lengths > self.max_length)
        if overlong.size == 0:
            return
        if self.truncation == "error":
            first = int(overlong[0])
            path, row = self._where[first]
            column = self.messages_key if self.multiturn else f"{self.prompt_key}' + '{self.response_key}"
            raise DatasetError(
                f"{path}, row {row}, column '{column}': the sequence is {int(lengths[first])} tokens (prompt + "
                f"response after the chat template), longer than data.max_length={self.max_length} "
                f"({overlong.size} of {len(lengths)} rows are overlong). Raise data.max_length, or set "
                "data.truncation=left (drop the start) or data.truncation=right (drop the end)."
            )
        cut = slice(-self.max_length, None) if self.truncation == "left" else slice(0, self.max_length)
        for i in overlong.tolist():
            self._ids[i], self._masks[i] = self._ids[i][cut], self._masks[i][cut]
        logger.info("data.truncation=%s: cut %d of %d sequences to data.max_length=%d tokens", self.truncation,
                    overlong.size, len(lengths), self.max_length)

    # ---- access -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        ids, mask = self._ids[item], self._masks[item]
        pad = self.max_length - len(ids)
        input_ids = torch.cat([torch.from_numpy(ids), torch.full((pad,), self.pad_token_id, dtype=torch.long)])
        attention_mask = torch.cat([torch.ones(len(ids), dtype=torch.long), torch.zeros(pad, dtype=torch.long)])
        loss_mask = torch.cat([torch.from_numpy(mask), torch.zeros(pad, dtype=torch.long)])
        position_ids = compute_position_id_with_mask(attention_mask)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
                "loss_mask": loss_mask}
