"""What a request to the emulator's completion endpoints asks, read and checked as vLLM does:
the JSON body, the prompt text of a chat or a completion, max_tokens, temperature and the stream
options. A body vLLM would refuse is an ``ApiError``, answered in vLLM's JSON error shape
(emulator/server.py answers it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from specsweep.emulator.content import count_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class ParsedRequest:
    """The parts of an OpenAI request the emulator acts on."""

    chat: bool
    prompt_text: str
    max_tokens: int
    temperature: float
    stream: bool
    include_usage: bool
    continuous_usage: bool


class ApiError(Exception):
    """An error answered in vLLM's JSON error shape."""

    def __init__(self, status: int, message: str, kind: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param = status, message, kind, param

    def response(self) -> web.Response:
        body = {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.status}}
        return web.json_response(body, status=self.status)


async def read_json(request: web.Request) -> Any:
    """The request body as JSON (UTF-8, as RFC 8259 has it, whatever charset the header names); an
    ApiError for a body that is not JSON, or is nested past what the parser's recursion reaches."""
    data = await request.read()
    try:
        return json.loads(data)
    except RecursionError:
        raise ApiError(400, "Request body is nested too deeply to parse.", "BadRequestError") from None
    except ValueError:  # not JSON, not UTF-8, or an integer too long to convert
        raise ApiError(400, "Request body is not valid JSON.", "BadRequestError") from None


def message_text(message: Any) -> str:
    """A chat message's text: its content string, or its text parts joined."""
    if not isinstance(message, dict) or "role" not in message:
        raise ApiError(400, "Each message needs a 'role' and 'content'.", "BadRequestError", "messages")
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [part.get("text", "") for part in content if isinstance(part, dict)]
        if all(isinstance(text, str) for text in texts):
            return "".join(texts)
    raise ApiError(400, "Message content must be a string or a list of parts.", "BadRequestError", "messages")


def parse_request(body: Any, *, chat: bool, model: str, max_model_len: int) -> ParsedRequest:
    """What a completion request asks, checked as vLLM checks it: an ApiError in vLLM's words for a
    body it would refuse. ``model``: the served name; ``max_model_len`` bounds a missing max_tokens."""
    if not isinstance(body, dict):
        raise ApiError(400, "Request body must be a JSON object.", "BadRequestError")
    asked = body.get("model", model)
    if asked != model:
        raise ApiError(404, f"The model `{asked}` does not exist.", "NotFoundError", "model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "'messages' must be a non-empty list.", "BadRequestError", "messages")
        prompt_text = "".join(message_text(m) for m in messages)
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise ApiError(400, "'prompt' must be a string.", "BadRequestError", "prompt")
        prompt_text = prompt
    if body.get("n", 1) != 1:
        raise ApiError(400, "The emulator supports n = 1 only.", "BadRequestError", "n")
    max_tokens = body.get("max_completion_tokens") if chat else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    if max_tokens is None:
        max_tokens = max(1, max_model_len - count_tokens(prompt_text))
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ApiError(400, "max_tokens must be at least 1.", "BadRequestError", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not 0 <= temperature <= 2:
        raise ApiError(400, "temperature must be a number in 0..2.", "BadRequestError", "temperature")
    stream = bool(body.get("stream", False))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "stream_options must be an object.", "BadRequestError", "stream_options")
    if options and not stream:
        raise ApiError(400, "Stream options can only be defined when `stream=True`.", "BadRequestError")
    include_usage = bool(options.get("include_usage", False))
    continuous = bool(options.get("continuous_usage_stats", False)) and include_usage
    return ParsedRequest(
        chat=chat,
        prompt_text=prompt_text,
        max_tokens=max_tokens,
        temperature=float(temperature),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
    )
