"""The OpenAI API's request and response shapes, as far as the rollout engine serves them.

Requests are pydantic models that refuse unknown fields (so a typo or an unsupported feature is a 400
naming it, not silently ignored). Known OpenAI fields that the engine cannot honour (penalties, logit bias,
top-k alternatives) are accepted only at their no-op values. Responses are plain dicts in the API's JSON shape;
the `openai` client parses them. A `stream` request gets the same response as server-sent events (the engine
answers whole, so each choice is one delta).

With `tools`, a chat response's Hermes `<tool_call>` blocks (envs/text/tool_calls.py) come back as `tool_calls`.
The server remembers the text each such message was made from: when the agent sends the message back, it is
rendered from that text, so the conversation's tokens stay the ones the engine sampled whatever the chat
template would make of `tool_calls` (`restore_produced`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from rlinf_like.envs.text.tool_calls import ToolCall, final_text, parse_tool_calls
from rlinf_like.workers.rollout.types import SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")


class InvalidRequest(Exception):
    """Answered as an OpenAI-style error: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.kind = message, param, status, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": None}}


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str  # any name: the one model serves it (agents written for another endpoint run unchanged)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)  # not OpenAI's; vLLM's extension (-1 or 0: off)
    n: int = Field(1, ge=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None  # include_usage: a last chunk with the usage
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    user: str | None = None

    # field -> (is its value served?, what is served); checked after parsing
    NO_OPS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        "presence_penalty": (lambda v: not v, "0"),
        "frequency_penalty": (lambda v: not v, "0"),
        "logit_bias": (lambda v: not v, "none"),
    }

    def check_no_ops(self) -> None:
        for name, (served, allowed) in self.NO_OPS.items():
            if not served(getattr(self, name)):
                raise InvalidRequest(f"{name}={getattr(self, name)!r} is not supported by this server; "
                                     f"it serves {name}={allowed}", param=name)

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if any(s == "" for s in stops):
            raise InvalidRequest("stop: an empty stop string would end every response at once", param="stop")
        return tuple(stops)


class ChatCompletionRequest(_Request):
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto"] | None = None  # the template shows the tools; nothing forces a call
    parallel_tool_calls: bool | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = None
    response_format: dict[str, Any] | None = None

    NO_OPS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        **_Request.NO_OPS,
        "top_logprobs": (lambda v: not v, "0 (the sampled tokens' logprobs; the engine keeps no alternatives)"),
        "response_format": (lambda v: v is None or v == {"type": "text"}, '{"type": "text"}'),
    }

    def max_new_tokens(self) -> tuple[int | None, str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


class CompletionRequest(_Request):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    NO_OPS: ClassVar[dict[str, tuple[Callable[[Any], bool], str]]] = {
        **_Request.NO_OPS,
        "logprobs": (lambda v: v in (None, 0), "0 (the sampled tokens' logprobs; the engine keeps no alternatives)"),
        "echo": (lambda v: not v, "false"),
        "suffix": (lambda v: v is None, "none"),
        "best_of": (lambda v: v in (None, 1), "1"),
    }

    def max_new_tokens(self) -> tuple[int | None, str]:
        return self.max_tokens, "max_tokens"


def chat_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The messages as a chat template expects them: text content as one string."""
    out = []
    for i, message in enumerate(messages):
        if message.get("role") not in ROLES:
            raise InvalidRequest(f"messages[{i}].role must be one of {list(ROLES)}, got {message.get('role')!r}",
                                 param=f"messages[{i}].role")
        content = message.get("content")
        if isinstance(content, list):  # content parts: text only
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise InvalidRequest(f"messages[{i}].content: only text parts are supported",
                                     param=f"messages[{i}].content")
            content = "".join(p.get("text", "") for p in content)
        elif content is not None and not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content must be a string or a list of text parts",
                                 param=f"messages[{i}].content")
        out.append({**message, "content": content})
    return out


def sampling_params(request: ChatCompletionRequest | CompletionRequest, *, prompt_len: int, max_context: int,
                    prompt_param: str) -> SamplingParams:
    """The engine's sampling params for `request`, or a 400 naming the sizes when it does not fit the context."""
    request.check_no_ops()
    if prompt_len >= max_context:
        raise InvalidRequest(f"This model's maximum context length is {max_context} tokens, but the prompt has "
                             f"{prompt_len} tokens, which leaves no room for a completion", param=prompt_param)
    max_new, max_param = request.max_new_tokens()
    if max_new is None:
        max_new = max_context - prompt_len
    if prompt_len + max_new > max_context:
        raise InvalidRequest(f"This model's maximum context length is {max_context} tokens, but {prompt_len + max_new} "
                             f"were requested ({prompt_len} in the prompt, {max_new} for the completion); lower "
                             f"{max_param} to at most {max_context - prompt_len}", param=max_param)
    temperature = 1.0 if request.temperature is None else request.temperature
    return SamplingParams(max_new_tokens=max_new, temperature=temperature, top_k=max(request.top_k or 0, 0),
                          top_p=1.0 if request.top_p is None else request.top_p, stop_strings=request.stop_strings(),
                          seed=request.seed)


def response_text(tokenizer, ids: list[int], stops: tuple[str, ...]) -> str:
    """The sampled text as the API returns it: special tokens left out, cut before the first stop string."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    cuts = [i for i in (text.find(s) for s in stops) if i >= 0]
    return text[: min(cuts)] if cuts else text


def chat_logprobs(tokenizer, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """One entry per sampled token (the stop token too), with no alternatives."""
    content = []
    for token_id, logprob in zip(ids, logprobs):
        token = tokenizer.decode([token_id])
        content.append({"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8")), "top_logprobs": []})
    return {"content": content, "refusal": None}


def completion_logprobs(tokenizer, ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    tokens = [tokenizer.decode([t]) for t in ids]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    return {"tokens": tokens, "token_logprobs": list(logprobs), "top_logprobs": None, "text_offset": offsets}


def usage(prompt_len: int, responses: list[list[int]]) -> dict[str, int]:
    completion = sum(len(r) for r in responses)
    return {"prompt_tokens": prompt_len, "completion_tokens": completion, "total_tokens": prompt_len + completion}


def assistant_message(text: str, tools: list[dict[str, Any]] | None, call_prefix: str) -> dict[str, Any]:
    """The chat message for a sampled `text`: with `tools` offered, its well-formed calls of offered tools as
    `tool_calls` (ids `<call_prefix>-<k>`) and the rest as `content` (None when empty)."""
    offered = {(t.get("function") or t).get("name") for t in tools or []}
    calls = [c for c in parse_tool_calls(text) if isinstance(c, ToolCall) and c.name in offered] if tools else []
    if not calls:
        return {"role": "assistant", "content": text}
    return {"role": "assistant", "content": final_text(text) or None,
            "tool_calls": [{"id": f"{call_prefix}-{k}", "type": "function",
                            "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                           for k, c in enumerate(calls)]}


def restore_produced(messages: list[dict[str, Any]], produced: dict[str, str]) -> list[dict[str, Any]]:
    """Assistant messages whose tool calls this server made (`produced`: first call id -> the sampled text)
    become that text again, so they render to the tokens the engine sampled."""
    out = []
    for message in messages:
        calls = message.get("tool_calls") or []
        first = calls[0].get("id") if calls and isinstance(calls[0], dict) else None
        if message.get("role") == "assistant" and first in produced:
            message = {"role": "assistant", "content": produced[first]}
        out.append(message)
    return out


def stream_events(body: dict[str, Any], include_usage: bool) -> Iterator[str]:
    """A whole chat or completion response as server-sent events: per choice one delta and its finish, the
    usage when asked, then [DONE]."""
    chat = body["object"] == "chat.completion"
    head = {"id": body["id"], "object": "chat.completion.chunk" if chat else "text_completion",
            "created": body["created"], "model": body["model"]}
    for choice in body["choices"]:
        if chat:
            delta = dict(choice["message"])
            for k, call in enumerate(delta.get("tool_calls") or []):
                delta["tool_calls"][k] = {"index": k, **call}
            first = {"index": choice["index"], "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None}
            last = {"index": choice["index"], "delta": {}, "finish_reason": choice["finish_reason"]}
        else:
            first = {**choice, "finish_reason": None}
            last = {"index": choice["index"], "text": "", "finish_reason": choice["finish_reason"]}
        for part in (first, last):
            yield f"data: {json.dumps({**head, 'choices': [part]})}\n\n"
    if include_usage:
        yield f"data: {json.dumps({**head, 'choices': [], 'usage': body['usage']})}\n\n"
    yield "data: [DONE]\n\n"
