"""The streaming client: one OpenAI-compatible request, timed on the client, counted from usage.

Token counts come from the server's ``usage`` (``stream_options.include_usage``), never from
counting chunks: under speculative decoding one chunk carries several tokens. With
``continuous_usage_stats`` the cumulative usage on every chunk also gives tokens per chunk.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import replace
from typing import Any

import httpx

from specsweep.errors import ConfigError
from specsweep.runtime.transport import ARRIVALS, Http1Transport
from specsweep.types import RequestRecord
from specsweep.workload import WorkloadPrompt, new_nonce


def api_key_from_env(variable: str | None) -> str | None:
    """The bearer token from the named environment variable (never from a file or a flag)."""
    if not variable:
        return None
    value = os.environ.get(variable)
    if not value:
        raise ConfigError(f"environment variable {variable} (named by --api-key-env) is not set or empty.")
    return value


AUTH_REFUSED = (401, 403)


def auth_refused_message(url: str, status: int, *, key_sent: bool) -> str:
    """What to do when the server answers 401 or 403: pass an API key, or check the one passed."""
    if key_sent:
        return (
            f"{url} answered HTTP {status}: the server refused the API key; check the key in the environment "
            "variable named by --api-key-env (server.api_key_env in a study file)."
        )
    return (
        f"{url} answered HTTP {status}: the server wants an API key; export it in an environment variable "
        'and pass its name with --api-key-env NAME (server.api_key_env = "NAME" in a study file).'
    )


class StreamingClient:
    """Streams completions from one OpenAI-compatible endpoint."""

    def __init__(
        self,
        base_url: str,
        *,
        model: str,
        api: str = "chat",
        api_key: str | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        timeout_s: float = 600.0,
        continuous_usage: bool = True,
        extra_body: dict[str, Any] | None = None,
    ) -> None:
        if api not in ("chat", "completions"):
            raise ConfigError(f"api must be 'chat' or 'completions', got {api!r}.")
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.api = api
        self._api_key = api_key
        self.continuous_usage = continuous_usage
        self.extra_body = dict(extra_body or {})
        self._http = httpx.AsyncClient(
            base_url=base_url.rstrip("/"),
            headers=headers,
            transport=transport or Http1Transport(timeout_s=timeout_s),
            timeout=httpx.Timeout(timeout_s, connect=10.0),
            # Keep-alive saves a connection setup per request (about 1.5 ms here); servers
            # that close after each stream (llama.cpp) are covered by the retry in stream().
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> StreamingClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def request_body(self, prompt: WorkloadPrompt, *, max_tokens: int, temperature: float) -> dict[str, Any]:
        """The JSON body for one request, with a fresh nonce at the start of the prompt."""
        nonce = new_nonce()
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": temperature,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": self.continuous_usage},
        }
        if self.api == "chat":
            body["messages"] = prompt.chat_messages(nonce)
        else:
            body["prompt"] = prompt.completion_prompt(nonce)
        body.update(self.extra_body)
        return body

    async def stream(
        self, prompt: WorkloadPrompt, *, max_tokens: int, temperature: float, cut: asyncio.Event | None = None
    ) -> RequestRecord:
        """Send one streaming request and time it; failures come back as a record with ``error``.

        A connection that drops before any byte of the response is retried once (llama.cpp
        closes keep-alive connections after each stream); the record says ``retried``. Once
        ``cut`` is set, the stream is closed at its next piece (the server aborts a request whose
        client went away) and the record says ``cut``, with the chunks that arrived before.
        """
        body = self.request_body(prompt, max_tokens=max_tokens, temperature=temperature)
        path = "/v1/chat/completions" if self.api == "chat" else "/v1/completions"
        record = await self._stream_once(path, body, prompt.id, max_tokens, cut)
        if record.error and record.error.startswith("connection:") and record.num_chunks == 0:
            record = replace(await self._stream_once(path, body, prompt.id, max_tokens, cut), retried=True)
        return record

    async def _stream_once(
        self, path: str, body: dict[str, Any], prompt_id: str, max_tokens: int, cut: asyncio.Event | None
    ) -> RequestRecord:
        started = time.perf_counter()
        tracker = _StreamTracker(started, secret=self._api_key)
        try:
            async with self._http.stream("POST", path, json=body) as response:
                if response.status_code in AUTH_REFUSED:
                    url = str(response.request.url)
                    key_sent = "Authorization" in self._http.headers
                    return tracker.record(
                        prompt_id, max_tokens, error=auth_refused_message(url, response.status_code, key_sent=key_sent)
                    )
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", "replace")
                    return tracker.record(
                        prompt_id,
                        max_tokens,
                        error=f"HTTP {response.status_code}: {server_error_line(text, secret=self._api_key)}",
                    )
                # Arrival times from the transport (the kernel's receive times) when it
                # has them, else the time each piece is read, before any parsing.
                arrivals = response.extensions.get(ARRIVALS)
                pending = b""
                async for data in response.aiter_bytes():
                    read_at = time.perf_counter()
                    buffer, base, start = pending + data, len(pending), 0
                    while (end := buffer.find(b"\n", start)) >= 0:
                        arrived = arrivals.at(end - base) if arrivals is not None else read_at
                        if tracker.feed(buffer[start:end], arrived):
                            break
                        start = end + 1
                    else:
                        pending = buffer[start:]
                        if cut is not None and cut.is_set():
                            return tracker.record(prompt_id, max_tokens, cut=True)
                        continue
                    break
        except httpx.TimeoutException as exc:
            return tracker.record(prompt_id, max_tokens, error=f"timeout: {type(exc).__name__}")
        except (httpx.TransportError, httpx.StreamError) as exc:
            return tracker.record(prompt_id, max_tokens, error=f"connection: {type(exc).__name__}: {exc}".rstrip(": "))
        return tracker.record(prompt_id, max_tokens)


class _StreamTracker:
    """Folds SSE lines into a RequestRecord; cheap per chunk (one json.loads)."""

    __slots__ = (
        "chunk_times",
        "chunk_tokens",
        "done",
        "draft_n",
        "draft_n_accepted",
        "error",
        "finish_reason",
        "first",
        "last",
        "num_chunks",
        "prompt_tokens",
        "response_id",
        "secret",
        "spec_verify_ct",
        "started",
        "usage_tokens",
    )

    def __init__(self, started: float, *, secret: str | None = None) -> None:
        self.started = started
        self.secret = secret  # the API key sent, masked in the error a stream carries
        self.first: float | None = None
        self.last: float | None = None
        self.num_chunks = 0
        self.chunk_tokens: list[int] | None = []
        self.chunk_times: list[float] = []
        self.usage_tokens: int | None = None
        self.prompt_tokens: int | None = None
        self.finish_reason: str | None = None
        self.draft_n: int | None = None
        self.draft_n_accepted: int | None = None
        self.error: str | None = None
        self.response_id: str | None = None
        self.spec_verify_ct: int | None = None
        self.done = False

    def feed(self, line: bytes, now: float) -> bool:
        """Take one line of the event stream; True once the stream is complete."""
        if not line.startswith(b"data:"):
            return False
        data = line[5:].strip()
        if data == b"[DONE]":
            self.done = True
            return True
        try:
            event = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.error = f"malformed SSE event: {data[:80]!r}"
            return True
        if not isinstance(event, dict):
            self.error = f"malformed SSE event: {data[:80]!r}"
            return True
        if "error" in event:
            self.error = f"server error in stream: {server_error_line(json.dumps(event), secret=self.secret)}"
            return True
        content = ""
        choices = event.get("choices")
        if choices is None:
            choices = []
        if not isinstance(choices, list):
            self.error = f"malformed SSE event (choices is not a list): {data[:80]!r}"
            return True
        for choice in choices:
            if not isinstance(choice, dict):
                self.error = f"malformed SSE event (a choice is not an object): {data[:80]!r}"
                return True
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str):
                content += piece
            if isinstance(choice.get("finish_reason"), str):
                self.finish_reason = choice["finish_reason"]
        usage = event.get("usage")
        previous = self.usage_tokens
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens < 0:
            self.error = self.error or f"usage gives a negative completion_tokens ({tokens})"
        elif isinstance(tokens, int) and not isinstance(tokens, bool) and isinstance(usage, dict):
            self.usage_tokens = tokens
            self.prompt_tokens = _int_or(usage.get("prompt_tokens"), self.prompt_tokens)
        if content:
            self.num_chunks += 1
            if self.first is None:
                self.first = now
            self.last = now
            self.chunk_times.append(now - self.started)
            if self.chunk_tokens is not None:
                if usage is not None and self.usage_tokens is not None:
                    self.chunk_tokens.append(self.usage_tokens - (previous or 0))
                else:
                    self.chunk_tokens = None  # no cumulative usage: tokens per chunk unknown
        if self.response_id is None and isinstance(event.get("id"), str):
            self.response_id = event["id"]
        timings = event.get("timings")
        if isinstance(timings, dict):
            self.draft_n = _int_or(timings.get("draft_n"), self.draft_n)
            self.draft_n_accepted = _int_or(timings.get("draft_n_accepted"), self.draft_n_accepted)
        extension = event.get("sglext")
        details = extension.get("spec_tokens_details") if isinstance(extension, dict) else None
        if isinstance(details, list) and details:  # one per choice when n > 1; specsweep asks for one
            details = details[0]
        if isinstance(details, dict):
            self.spec_verify_ct = _int_or(details.get("spec_verify_ct"), self.spec_verify_ct)
        return False

    def record(self, prompt_id: str, max_tokens: int, *, error: str | None = None, cut: bool = False) -> RequestRecord:
        error = error or self.error
        if error is None and not self.done and not cut:
            error = "stream ended before [DONE] (connection closed mid-response)"
        if error is None and self.usage_tokens is None and not cut:
            error = "no usage in the stream: the server ignored stream_options.include_usage"
        end = time.perf_counter()
        return RequestRecord(
            prompt_id=prompt_id,
            started_at=self.started,
            max_tokens=max_tokens,
            ttft_s=None if self.first is None else self.first - self.started,
            last_token_s=None if self.last is None else self.last - self.started,
            latency_s=end - self.started,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.usage_tokens if error is None and not cut else None,
            num_chunks=self.num_chunks,
            chunk_tokens=tuple(self.chunk_tokens) if self.chunk_tokens else None,
            chunk_times_s=tuple(self.chunk_times) if self.chunk_tokens else None,
            finish_reason=self.finish_reason,
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
            spec_verify_ct=self.spec_verify_ct,
            response_id=self.response_id,
            error=error,
            cut=cut,
        )


def _int_or(value: object, default: int | None) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


ERROR_CHARS = 200  # the most of a server's error message a record keeps
_BEARER = re.compile(r"(?i)(bearer\s+)\S+")


def server_error_line(text: str, *, secret: str | None = None) -> str:
    """What a server's error body says, as a record keeps and the console prints it: the message of
    an OpenAI/vLLM error body (or the body's text), its first line with spaces collapsed, at most
    ERROR_CHARS long, with the API key sent (and any bearer token) masked."""
    message = _error_text(text)
    if secret:
        message = message.replace(secret, "***")
    message = _BEARER.sub(r"\1***", message)
    first = next((line for line in message.splitlines() if line.strip()), "")
    line = " ".join(first.split())
    return (line[: ERROR_CHARS - 3] + "...") if len(line) > ERROR_CHARS else line or "(empty body)"


def _error_text(text: str) -> str:
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        title = re.search(r"<title>(.*?)</title>", text, re.IGNORECASE | re.DOTALL)
        if text.lstrip()[:1] == "<":  # a web page, not an API's error
            return "an HTML page" + (f" titled {' '.join(title.group(1).split())!r}" if title else "")
        return text
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict) and "message" in error:
            return str(error["message"])
        if "message" in body:
            return str(body["message"])
    return text
