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

__all__ = ["GENRM_KWARGS", "GenerativeReward", "JudgeFailed", "JudgeRouter"]

logger = logging.getLogger(__name__)

# What a GenRM reward function receives besides the four usual arguments (the original's names).
GENRM_KWARGS = ("reward_router_address", "reward_model_tokenizer")
# How long the router waits for more requests after one arrives, before generating what it has.
_GATHER_S = 0.05
# How long the router waits for the trainer to attach the reward-model workers, and a request for its answer
# (queued behind earlier generations, then generated): generous, they only end a run whose judge is stuck.
_ATTACH_TIMEOUT_S = 600.0
_ANSWER_TIMEOUT_S = 1800.0


class RequestError(ValueError):
    """A judge request the router cannot serve (answered with HTTP 400 and this message)."""


class JudgeFailed(RuntimeError):
    """The judge cannot answer any more: its generation failed or hung (every request gets HTTP 500 or 503)."""


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
    status: int = 200  # HTTP status of the answer; ``error`` says what went wrong when it is not 200
    error: str | None = None

    def fail(self, status: int, error: str) -> None:
        self.status, self.error = status, error
        self.done.set()


class _Server(ThreadingHTTPServer):
    """An HTTP server whose listen backlog holds every client that may connect at once (socketserver's default of
    5 makes the kernel reset connections when hundreds of reward threads post together)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type, backlog: int):
        self.request_queue_size = backlog  # read by server_activate() during __init__
        super().__init__(address, handler)


class JudgeRouter:
    """An OpenAI-style endpoint on ``127.0.0.1`` for the judge (``address``: ``host:port``); requests wait until
    :meth:`attach` gives it the function that generates (a worker group's ``generate_sequences``).

    ``rollout`` is ``reward_model.rollout``: ``prompt_length`` bounds a prompt (longer: HTTP 400 naming the key),
    ``response_length`` caps ``max_tokens`` (its default), ``max_num_seqs`` the requests generated together (and
    the clients that may connect at once); the sampling defaults are its ``temperature``, ``top_p`` and ``top_k``
    (temperature 0: greedy).

    A bad request is answered with HTTP 400 naming what is wrong, an unexpected failure with 500 and its text. When
    a generation fails, the router fails: every waiting and later request gets 500 naming the error, and
    :meth:`raise_if_failed` raises it. A request not answered within ``_ANSWER_TIMEOUT_S`` gets 503 (and fails the
    router the same way), as do the waiting ones when the workers are not attached within ``_ATTACH_TIMEOUT_S``."""

    def __init__(self, tokenizer, rollout, model_name: str):
        self.tokenizer, self.rollout, self.model_name = tokenizer, rollout, model_name
        self._generate: Callable[[DataProto], DataProto] | None = None
        self._attached = threading.Event()
        self._queue: queue.SimpleQueue[_Request | None] = queue.SimpleQueue()
        self._failure: tuple[int, str] | None = None  # (HTTP status, message) once the judge cannot answer
        self._server = _Server(("127.0.0.1", 0), _handler(self), backlog=max(128, rollout.max_num_seqs))
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

    def fail(self, status: int, message: str) -> None:
        """From now on answer every request with ``status`` and ``message`` (the first failure is kept)."""
        if self._failure is None:
            self._failure = (status, message)
            logger.error("the generative reward model's judge stops answering: %s", message)

    def raise_if_failed(self, cause: BaseException | None = None) -> None:
        """Raise :class:`JudgeFailed` with the judge's error, when it failed."""
        if self._failure is not None:
            raise JudgeFailed(f"the generative reward model (reward_model.model.path={self.model_name}) failed: "
                              f"{self._failure[1]}") from cause

    # ------------------------------------------------------------------------------------------- requests
    def parse(self, path: str, body) -> _Request:
        """The request of one HTTP call (RequestError when it cannot be served)."""
        rollout = self.rollout
        if not isinstance(body, dict):
            raise RequestError(f"the request body must be a JSON object, got a JSON {_json_type(body)}")
        if body.get("n", 1) != 1:
            raise RequestError(f"'n' must be 1 (one judge answer per request), got {body['n']!r}")
        if path == "/v1/chat/completions":
            messages = body.get("messages")
            if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
                raise RequestError("'messages' must be a non-empty list of {role, content} objects")
            from jinja2 import TemplateError

            try:
                text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            except (TemplateError, KeyError, TypeError, ValueError) as exc:
                raise RequestError(f"the judge's chat template cannot render 'messages': {type(exc).__name__}: "
                                   f"{exc}") from exc
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
        key = next((k for k in ("max_tokens", "max_completion_tokens") if body.get(k) is not None), None)
        max_tokens = rollout.response_length if key is None else body[key]
        if not _is_int(max_tokens) or max_tokens <= 0:
            raise RequestError(f"'{key}' must be a positive integer, got {max_tokens!r}")
        temperature, top_p, top_k = (_number(body, "temperature", rollout.temperature),
                                     _number(body, "top_p", rollout.top_p), _number(body, "top_k", rollout.top_k))
        if temperature < 0 or not 0 < top_p <= 1 or not _is_int(top_k):
            raise RequestError(f"need temperature >= 0, 0 < top_p <= 1 and an integer top_k (-1 or 0: off), got "
                               f"temperature={temperature!r}, top_p={top_p!r}, top_k={top_k!r}")
        sampling = (float(temperature), float(top_p), int(top_k), min(max_tokens, rollout.response_length))
        return _Request(ids, sampling, path == "/v1/chat/completions", str(body.get("model") or self.model_name))

    def submit(self, request: _Request) -> None:
        """Queue ``request`` for generation; :meth:`answer` waits for it."""
        if self._failure is not None:
            request.fail(*self._failure)
        else:
            self._queue.put(request)

    def answer(self, request: _Request) -> None:
        """Wait for ``request`` to be generated, at most ``_ANSWER_TIMEOUT_S``: then the judge counts as stuck."""
        if not request.done.wait(_ANSWER_TIMEOUT_S):
            self.fail(503, f"the judge gave no answer within {_ANSWER_TIMEOUT_S:.0f} s: the reward-model workers' "
                           "generation is stuck or they died")
            request.fail(*self._failure)

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
                if self._failure is None:
                    try:
                        self._run(sampling, requests)
                    except Exception as exc:  # noqa: BLE001 -- every waiting request is answered with it
                        logger.exception("the judge failed to generate %d requests", len(requests))
                        self.fail(500, f"the judge failed to generate: {type(exc).__name__}: {exc}")
                for request in requests:
                    if self._failure is not None:
                        request.fail(*self._failure)
                    request.done.set()

    def _run(self, sampling: tuple[float, float, int, int], requests: list[_Request]) -> None:
        temperature, top_p, top_k, max_tokens = sampling
        if not self._attached.wait(_ATTACH_TIMEOUT_S):
            self.fail(503, f"the reward-model workers were not attached to the judge within {_ATTACH_TIMEOUT_S:.0f} "
                           "s (JudgeRouter.attach); they failed to start")
            return
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


def _json_type(value) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(body: dict, key: str, default):
    value = default if body.get(key) is None else body[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"'{key}' must be a number, got {value!r}")
    return value


_ERROR_TYPES = {400: "BadRequestError", 500: "InternalServerError", 503: "ServiceUnavailableError"}


def _handler(router: JudgeRouter) -> type:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 -- http.server's name
            try:
                self._serve()
            except Exception as exc:  # noqa: BLE001 -- the client gets the error instead of a dropped connection
                logger.exception("the judge router failed to serve %s", self.path)
                try:
                    self._error(500, f"the judge router failed: {type(exc).__name__}: {exc}")
                except OSError:
                    pass  # the client is gone

        def _serve(self) -> None:
            length = self.headers.get("Content-Length") or "0"
            if not length.isdigit():
                return self._error(400, f"Content-Length must be a byte count, got {length!r}")
            try:
                body = json.loads(self.rfile.read(int(length)) or b"{}")
            except ValueError as exc:  # json.JSONDecodeError, or bytes that are not UTF-8
                return self._error(400, f"the request body is not JSON: {exc}")
            try:
                request = router.parse(self.path.split("?")[0], body)
            except RequestError as exc:
                return self._error(400, str(exc))
            router.submit(request)
            router.answer(request)
            if request.error is not None:
                return self._error(request.status, request.error)
            return self._send(200, router.reply(request))

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": _ERROR_TYPES.get(status, "Error"),
                                          "code": status}})

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
            try:
                results = list(pool.map(lambda row: self.manager(row, return_dict=True), rows))
            except Exception as exc:
                self.router.raise_if_failed(exc)  # the judge's own error, rather than the HTTP error it caused
                raise
        self.router.raise_if_failed()  # also when the reward function caught the judge's HTTP errors
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
