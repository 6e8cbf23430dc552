"""Generative reward models (GenRM): a judge LLM, served by a rollout engine, scores each response.

As in the original verl's reward loop (``reward_model.use_reward_loop=true``): with ``reward_model.enable=true`` and
a ``custom_reward_function``, the model at ``reward_model.model.path`` is a causal LM that generates, and the user's
function (plain or ``async def``) is called per sample as

    compute_score(data_source, solution_str, ground_truth, extra_info,
                  reward_router_address=..., reward_model_tokenizer=...)

It writes the judge prompt itself, posts an OpenAI-style request to
``http://{reward_router_address}/v1/chat/completions`` (``messages``; optional ``temperature``, ``top_p``, ``top_k``,
``max_tokens``) or ``/v1/completions`` (``prompt``), and parses the judge's text (``choices[0].message.content``,
or ``choices[0].text``) into a score. ``reward_model_tokenizer`` is the judge's tokenizer.

Here the address is :class:`JudgeRouter`, a small HTTP server in the driver. It gathers the requests that arrive
together, renders chat messages with the judge's chat template (generation prompt added), and generates each group
of requests with the same sampling settings in one call of the reward-model workers' rollout engine
(``reward_model.rollout.name``, ``RewardModelWorker.generate_sequences``), split over their devices. The rows of a
batch are scored on driver threads, up to ``reward_model.rollout.max_num_seqs`` at once, so that their requests
meet in one generation; each row goes through the reward manager (``reward_model.reward_manager``) on its own.
Without a ``custom_reward_function`` the reward model is a sequence classifier (:mod:`verl.rewards.model`).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import json
import logging
import queue
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

import torch

from verl.protocol import DataProto, left_padded

__all__ = ["GENRM_KWARGS", "GenerativeReward", "JudgeRouter", "uses_generative_reward"]

logger = logging.getLogger(__name__)

# What a GenRM reward function receives besides the four usual arguments (the original's names).
GENRM_KWARGS = ("reward_router_address", "reward_model_tokenizer")
# How long the router waits for more requests after one arrives, before generating what it has.
_GATHER_S = 0.05


def uses_generative_reward(reward_model, custom_reward_function) -> bool:
    """Whether the reward model is a generative judge: ``reward_model.enable``, ``reward_model.use_reward_loop`` and a
    ``custom_reward_function.path`` (the typed sections `RewardModelConfig` and `CustomRewardFunctionConfig`)."""
    return bool(reward_model.enable and reward_model.use_reward_loop and custom_reward_function.path)


class RequestError(ValueError):
    """A judge request the router cannot serve (answered with HTTP 400 and this message)."""


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: tuple[float, float, int, int]  # temperature, top_p, top_k, max_tokens
    chat: bool
    model: str
    done: threading.Event = field(default_factory=threading.Event)
    text: str = ""
    completion_tokens: int = 0
    finish_reason: str = "stop"
    error: str | None = None


class JudgeRouter:
    """An OpenAI-style endpoint on ``127.0.0.1`` for the judge (``address``: ``host:port``); requests wait until
    :meth:`attach` gives it the function that generates (a worker group's ``generate_sequences``).

    ``rollout`` is ``reward_model.rollout``: ``prompt_length`` bounds a prompt (longer: HTTP 400 naming the key),
    ``response_length`` caps ``max_tokens`` (its default), ``max_num_seqs`` the requests generated together; the
    sampling defaults are its ``temperature``, ``top_p`` and ``top_k`` (temperature 0: greedy)."""

    def __init__(self, tokenizer, rollout, model_name: str):
        self.tokenizer, self.rollout, self.model_name = tokenizer, rollout, model_name
        self._generate: Callable[[DataProto], DataProto] | None = None
        self._attached = threading.Event()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.address = f"127.0.0.1:{self._server.server_address[1]}"
        self._threads = [threading.Thread(target=self._server.serve_forever, name="judge-http", daemon=True),
                         threading.Thread(target=self._batches, name="judge-batches", daemon=True)]
        for thread in self._threads:
            thread.start()

    def attach(self, generate: Callable[[DataProto], DataProto]) -> None:
        self._generate = generate
        self._attached.set()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._queue.put(None)

    # ------------------------------------------------------------------------------------------- requests
    def parse(self, path: str, body: dict) -> _Request:
        """The request of one HTTP call (RequestError when it cannot be served)."""
        rollout = self.rollout
        if int(body.get("n", 1)) != 1:
            raise RequestError("n must be 1: one judge answer per request")
        if path == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages:
                raise RequestError("'messages' must be a non-empty list of {role, content}")
            text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        elif path == "/v1/completions":
            if not isinstance(body.get("prompt"), str):
                raise RequestError("'prompt' must be a string")
            ids = self.tokenizer(body["prompt"])["input_ids"]
        else:
            raise RequestError(f"unknown endpoint {path}; the judge serves /v1/chat/completions and /v1/completions")
        if len(ids) > rollout.prompt_length:
            raise RequestError(f"the judge prompt has {len(ids)} tokens, more than reward_model.rollout.prompt_length="
                               f"{rollout.prompt_length}; raise it or shorten the prompt")
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens") or rollout.response_length
        get = lambda key, default: default if body.get(key) is None else body[key]  # noqa: E731
        sampling = (float(get("temperature", rollout.temperature)), float(get("top_p", rollout.top_p)),
                    int(get("top_k", rollout.top_k) or 0), min(int(max_tokens), rollout.response_length))
        return _Request(ids, sampling, path == "/v1/chat/completions", str(body.get("model") or self.model_name))

    def submit(self, request: _Request) -> None:
        self._queue.put(request)

    def _batches(self) -> None:
        """Generate what arrives: the requests that come within ``_GATHER_S`` of each other, together."""
        while True:
            first = self._queue.get()
            if first is None:
                return
            pending = [first]
            while len(pending) < self.rollout.max_num_seqs:
                try:
                    request = self._queue.get(timeout=_GATHER_S)
                except queue.Empty:
                    break
                if request is None:
                    self._queue.put(None)
                    break
                pending.append(request)
            groups: dict[tuple, list[_Request]] = {}
            for request in pending:
                groups.setdefault(request.sampling, []).append(request)
            for sampling, requests in groups.items():
                try:
                    self._run(sampling, requests)
                except Exception as exc:  # noqa: BLE001 -- reported to each waiting request, the router goes on
                    logger.exception("the judge failed to generate %d requests", len(requests))
                    for request in requests:
                        request.error = f"the judge failed to generate: {type(exc).__name__}: {exc}"
                finally:
                    for request in requests:
                        request.done.set()

    def _run(self, sampling: tuple[float, float, int, int], requests: list[_Request]) -> None:
        temperature, top_p, top_k, max_tokens = sampling
        self._attached.wait()
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id
        prompts = left_padded([r.prompt_ids for r in requests], pad, meta_info={
            "n": 1, "temperature": temperature, "do_sample": temperature > 0, "top_p": top_p, "top_k": top_k,
            "response_length": max_tokens})
        output = self._generate(prompts)
        responses, mask = output.batch["responses"], output.batch["response_mask"].bool()
        for request, ids, valid in zip(requests, responses, mask):
            tokens = ids[valid].tolist()
            request.text = self.tokenizer.decode(tokens, skip_special_tokens=True)
            request.completion_tokens = len(tokens)
            cut = len(tokens) >= max_tokens and tokens[-1] != self.tokenizer.eos_token_id
            request.finish_reason = "length" if cut else "stop"

    @staticmethod
    def reply(request: _Request) -> dict:
        """The OpenAI-style JSON answer to a served request."""
        choice = {"index": 0, "finish_reason": request.finish_reason, "logprobs": None}
        if request.chat:
            choice["message"] = {"role": "assistant", "content": request.text}
        else:
            choice["text"] = request.text
        prompt = len(request.prompt_ids)
        return {"id": f"judge-{uuid.uuid4().hex}", "object": "chat.completion" if request.chat else "text_completion",
                "created": int(time.time()), "model": request.model, "choices": [choice],
                "usage": {"prompt_tokens": prompt, "completion_tokens": request.completion_tokens,
                          "total_tokens": prompt + request.completion_tokens}}


def _handler(router: JudgeRouter) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 -- http.server's name
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                request = router.parse(self.path.split("?")[0], body)
            except (RequestError, ValueError, TypeError) as exc:
                return self._send(400, {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}})
            router.submit(request)
            request.done.wait()
            if request.error is not None:
                return self._send(500, {"error": {"message": request.error, "type": "InternalServerError",
                                                  "code": 500}})
            return self._send(200, router.reply(request))

        def _send(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format, *args):  # noqa: A002 -- one line per request is too much
            logger.debug("judge router: " + format, *args)

    return Handler


def _synchronous(fn: Callable) -> Callable:
    """``fn``, or for an ``async def`` function one that runs it to the end (on the calling thread's own loop)."""
    target = fn.func if isinstance(fn, functools.partial) else fn
    if not inspect.iscoroutinefunction(target):
        return fn

    @functools.wraps(target)
    def run(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return run


class GenerativeReward:
    """The reward function of a GenRM run, called as a reward manager is (``reward(data, return_dict=False)``).

    Each row is scored by ``manager_cls`` (built with ``manager_kwargs``, the custom ``compute_score`` and the GenRM
    keywords) on its own thread, up to ``reward_model.rollout.max_num_seqs`` at once; ``num_examine`` rows per data
    source are printed with their score. The trainer attaches the judge's workers (:meth:`JudgeRouter.attach`)."""

    def __init__(self, reward_model, judge_tokenizer, manager_cls, tokenizer, num_examine: int,
                 compute_score: Callable, manager_kwargs: dict):
        self.router = JudgeRouter(judge_tokenizer, reward_model.rollout, reward_model.model.path)
        self.max_concurrency = reward_model.rollout.max_num_seqs
        self.tokenizer, self.num_examine, self.reward_fn_key = tokenizer, num_examine, manager_kwargs["reward_fn_key"]
        self.manager = manager_cls(tokenizer=tokenizer, num_examine=0, compute_score=_synchronous(compute_score),
                                   reward_router_address=self.router.address, reward_model_tokenizer=judge_tokenizer,
                                   **manager_kwargs)

    def close(self) -> None:
        self.router.close()

    def __call__(self, data: DataProto, return_dict: bool = False):
        rows = [data[i:i + 1] for i in range(len(data))]
        with ThreadPoolExecutor(max(1, min(len(rows), self.max_concurrency)), thread_name_prefix="genrm") as pool:
            results = list(pool.map(lambda row: self.manager(row, return_dict=True), rows))
        reward_tensor = torch.cat([r["reward_tensor"] for r in results]) if results else torch.zeros(0)
        infos = [r.get("reward_extra_info", {}) for r in results]
        keys = set(infos[0]) if infos else set()
        if any(set(info) != keys for info in infos):
            raise ValueError("the custom reward function returned different keys for different samples of the batch "
                             f"({sorted(keys)} and {sorted(next(set(i) for i in infos if set(i) != keys))}); return "
                             "the same keys for every sample")
        extra = {key: [value for info in infos for value in info[key]] for key in sorted(keys)}
        self._print_examples(data, reward_tensor, extra)
        return {"reward_tensor": reward_tensor, "reward_extra_info": extra} if return_dict else reward_tensor

    def _print_examples(self, data: DataProto, reward_tensor: torch.Tensor, extra: dict) -> None:
        if self.num_examine <= 0:
            return
        from verl.rewards.managers.naive import decode_samples

        printed: dict = {}
        for i, sample in enumerate(decode_samples(data, self.tokenizer, self.reward_fn_key)):
            if printed.get(sample.data_source, 0) >= self.num_examine:
                continue
            printed[sample.data_source] = printed.get(sample.data_source, 0) + 1
            print("[prompt]", sample.prompt)
            print("[response]", sample.response)
            print("[ground_truth]", sample.ground_truth)
            print("[score]", float(reward_tensor[i].sum()))
            for key, values in extra.items():
                print(f"[{key}]", values[i])
