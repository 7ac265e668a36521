"""OpenAI-compatible request parsing and SSE chunk rendering (vLLM's shapes).

Parsing is the HTTP boundary: :func:`parse_request` validates the body with pydantic and
raises :class:`RequestError` (→ HTTP 400) with the field path; rendering is the hot path
and only formats strings.
"""

from __future__ import annotations

import json
import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import LlmsloError

__all__ = [
    "ChatRequest",
    "CompletionRequest",
    "RequestError",
    "StreamRenderer",
    "count_prompt_tokens",
    "error_body",
    "parse_request",
]

#: Characters per simulated token (prompt length = ceil(chars / 4)).
CHARS_PER_TOKEN = 4
_WORDS = (" the", " model", " token", " is", " fast", " and", " of", " a", " stream", " to")


class RequestError(LlmsloError):
    """The request body is not a valid OpenAI request (HTTP 400)."""


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(default=None, ge=1, le=10_000_000)
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    n: int = Field(default=1, ge=1, le=1)


class CompletionRequest(_Common):
    prompt: str | list[str] = ""


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")
    role: str = Field(max_length=64)
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_Common):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=10_000_000)


def parse_request(body: bytes, *, chat: bool) -> CompletionRequest | ChatRequest:
    """Validate a request body; raises :class:`RequestError` naming the bad field."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise RequestError("body must be a JSON object")
    model = ChatRequest if chat else CompletionRequest
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        path = ".".join(str(p) for p in first["loc"]) or "<root>"
        raise RequestError(f"{path}: {first['msg']}") from exc


def count_prompt_tokens(req: CompletionRequest | ChatRequest) -> int:
    """Simulated tokenizer: ``ceil(characters / 4)``, at least 1."""
    if isinstance(req, ChatRequest):
        chars = 0
        for message in req.messages:
            if isinstance(message.content, str):
                chars += len(message.content)
            elif message.content:
                chars += sum(len(str(part.get("text", ""))) for part in message.content)
    else:
        chars = len(req.prompt) if isinstance(req.prompt, str) else sum(len(p) for p in req.prompt)
    return max(1, math.ceil(chars / CHARS_PER_TOKEN))


def error_body(message: str, kind: str, code: int) -> dict[str, Any]:
    """The OpenAI error object vLLM returns."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


class StreamRenderer:
    """Renders one response's SSE chunks (``data: {...}\\n\\n``) and final JSON body."""

    def __init__(self, request_id: str, model: str, created: int, *, chat: bool) -> None:
        self.chat = chat
        self.request_id = request_id
        obj = "chat.completion.chunk" if chat else "text_completion"
        head = json.dumps({"id": request_id, "object": obj, "created": created, "model": model})
        self._head = head[:-1] + ', "choices": [{"index": 0, '
        self._model = model
        self._created = created

    @staticmethod
    def word(i: int) -> str:
        return _WORDS[i % len(_WORDS)]

    def role_chunk(self) -> bytes:
        """Chat's first chunk: role only, empty content (not a token per DESIGN §3)."""
        return (
            f'data: {self._head}"delta": {{"role": "assistant", "content": ""}}, '
            f'"logprobs": null, "finish_reason": null}}]}}\n\n'
        ).encode()

    def token_chunk(self, index: int, finish_reason: str | None) -> bytes:
        """One token-bearing chunk; ``finish_reason`` on the last one."""
        finish = "null" if finish_reason is None else f'"{finish_reason}"'
        text = self.word(index)
        if self.chat:
            body = f'"delta": {{"content": "{text}"}}, "logprobs": null, "finish_reason": {finish}'
        else:
            body = (
                f'"text": "{text}", "logprobs": null, "finish_reason": {finish}, '
                '"stop_reason": null'
            )
        return f"data: {self._head}{body}}}]}}\n\n".encode()

    def finish_chunk(self, finish_reason: str) -> bytes:
        """A content-less chunk carrying only ``finish_reason`` (when no token came with it)."""
        if self.chat:
            body = f'"delta": {{}}, "logprobs": null, "finish_reason": "{finish_reason}"'
        else:
            body = (
                f'"text": "", "logprobs": null, "finish_reason": "{finish_reason}", '
                '"stop_reason": null'
            )
        return f"data: {self._head}{body}}}]}}\n\n".encode()

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> bytes:
        head = self._head[: -len('"choices": [{"index": 0, ')]
        usage = usage_dict(prompt_tokens, completion_tokens)
        return f'data: {head}"choices": [], "usage": {json.dumps(usage)}}}\n\n'.encode()

    def full_body(self, tokens: int, finish_reason: str, prompt_tokens: int) -> dict[str, Any]:
        """The non-streaming response."""
        text = "".join(self.word(i) for i in range(tokens))
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": finish_reason}
        if self.chat:
            choice["message"] = {"role": "assistant", "content": text}
        else:
            choice["text"] = text
        return {
            "id": self.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": [choice],
            "usage": usage_dict(prompt_tokens, tokens),
        }


def usage_dict(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


DONE = b"data: [DONE]\n\n"
Kind = Literal["chat", "completion"]
