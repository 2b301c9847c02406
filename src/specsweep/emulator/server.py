"""The emulator's HTTP API: vLLM's OpenAI-compatible endpoints on aiohttp."""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import replace
from typing import Any, TextIO

from aiohttp import web

from specsweep.emulator.api_requests import ApiError, ParsedRequest, parse_request, read_json
from specsweep.emulator.content import PromptReader
from specsweep.emulator.engine import Emission, Engine
from specsweep.emulator.metrics import EngineCollector, render_metrics
from specsweep.emulator.prefix_cache import PrefixCache
from specsweep.emulator.profile import Profile
from specsweep.emulator.self_load import SelfLoad

log = logging.getLogger("specsweep.emulator")


class EmulatorApi:
    """Request handlers bound to one engine."""

    def __init__(
        self,
        engine: Engine,
        profile: Profile,
        served_model_name: str,
        *,
        log_stats: bool,
        trace: TextIO | None = None,
        api_key: str | None = None,
    ) -> None:
        self.engine = engine
        self.trace = trace
        self.profile = profile
        self.model_name = served_model_name
        self.log_stats = log_stats
        self.created = int(time.time())
        self.requests_started = 0
        self.traffic: SelfLoad | None = None  # set when the emulator serves a traffic schedule itself
        self.collector = EngineCollector(
            engine, served_model_name, self.kv_usage, spec_counters=not profile.faults.metrics_without_spec
        )
        k = engine.spec.num_speculative_tokens if engine.spec else 0
        self.prefix_cache = PrefixCache(profile.kv_cache_tokens(k or 0))
        self.reader = PromptReader()
        # As vLLM: with --api-key (or VLLM_API_KEY) set, /v1 endpoints need "Authorization: Bearer <key>".
        self.api_key = api_key or os.environ.get("VLLM_API_KEY") or None

    def kv_usage(self) -> float:
        k = self.engine.spec.num_speculative_tokens if self.engine.spec else 0
        pool = self.profile.kv_cache_tokens(k or 0)
        used = self.engine.tokens_in_cache(k or 0)
        return min(1.0, used / pool) if pool else 0.0

    def app(self) -> web.Application:
        app = web.Application(client_max_size=32 * 1024 * 1024, middlewares=[self._authorize])
        app.router.add_post("/v1/chat/completions", self.chat_completions)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/version", self.version)
        app.router.add_get("/metrics", self.metrics)
        return app

    @web.middleware
    async def _authorize(self, request: web.Request, handler: Any) -> web.StreamResponse:
        """As vLLM with an API key: every /v1 route wants the bearer token; /health and /metrics do not."""
        wanted = f"Bearer {self.api_key}"
        if (
            self.api_key is not None
            and request.path.startswith("/v1")
            and request.headers.get("Authorization") != wanted
        ):
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    # -- simple endpoints ------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def version(self, request: web.Request) -> web.Response:
        # vLLM answers {"version"}; the emulator adds what it emulates, so a rig can tell it apart
        # and read rates in the modelled hardware's units, and what a study counts of its start:
        # the modelled boot, the most sequences it batches and the verified widths it has graphs for.
        emulated: dict[str, Any] = {
            "profile": self.profile.name,
            "time_scale": self.engine.time_scale,
            "startup_s": self.profile.boot_s,
            "max_num_seqs": self.profile.max_num_seqs,
            "captured_widths": list(self.profile.timing.captured_widths),
        }
        if self.traffic is not None:
            emulated["traffic"] = self.traffic.describe()
        return web.json_response({"version": self.profile.version, "emulator": emulated})

    async def models(self, request: web.Request) -> web.Response:
        card = {
            "id": self.model_name,
            "object": "model",
            "created": self.created,
            "owned_by": "vllm",
            "root": self.model_name,
            "parent": None,
            "max_model_len": self.profile.max_model_len,
        }
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(self, request: web.Request) -> web.Response:
        if self.profile.faults.metrics_404:
            return web.Response(status=404, text="Not Found")
        body = render_metrics(self.collector) if self.log_stats else b""
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    # -- completions -----------------------------------------------------------------------
    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._complete(request, chat=False)

    async def _complete(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        arrival = time.perf_counter()
        try:
            parsed = parse_request(
                await read_json(request), chat=chat, model=self.model_name, max_model_len=self.profile.max_model_len
            )
        except ApiError as exc:
            return _refused(request, exc)
        self.requests_started += 1
        number = self.requests_started
        faults = self.profile.faults
        crash = faults.crash_after_requests is not None and number > faults.crash_after_requests
        drop = number % faults.drop_stream_every == 0 if faults.drop_stream_every else False
        if faults.http_500_every and number % faults.http_500_every == 0:
            return ApiError(
                500, "EngineCore encountered an issue (fault injection: HTTP 500).", "InternalServerError"
            ).response()
        garble = number % faults.malformed_sse_every == 0 if faults.malformed_sse_every else False
        if faults.omit_usage:
            parsed = replace(parsed, include_usage=False, continuous_usage=False)
        tokens, content_class = self.reader.read(parsed.prompt_text)
        prompt_tokens = len(tokens)
        if prompt_tokens + parsed.max_tokens > self.profile.max_model_len:
            return _refused(
                request,
                ApiError(
                    400,
                    f"This model's maximum context length is {self.profile.max_model_len} tokens. However, you "
                    f"requested {prompt_tokens + parsed.max_tokens} tokens ({prompt_tokens} in the messages, "
                    f"{parsed.max_tokens} in the completion).",
                    "BadRequestError",
                ),
            )
        cached_tokens = self.prefix_cache.admit(tokens)
        # Reading the request is part of the modelled request overhead while it fits in it; a long
        # prompt's reading (the emulator's own wall clock) does not make the engine's schedule start
        # late, which would crowd its first steps together to catch up and fake a fast decode.
        arrival = max(arrival, time.perf_counter() - self.profile.timing.request_overhead_s / self.engine.time_scale)
        seq = self.engine.submit(
            content_class=content_class,
            prompt_tokens=prompt_tokens,
            max_tokens=parsed.max_tokens,
            temperature=parsed.temperature,
            arrival=arrival,
            cached_tokens=cached_tokens,
        )
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        try:
            if not parsed.stream:
                return await self._respond_whole(seq, parsed, request_id, prompt_tokens, crash)
            return await self._respond_stream(request, seq, parsed, request_id, prompt_tokens, crash, drop, garble)
        finally:
            self.engine.cancel(seq)

    async def _respond_whole(
        self, seq: Any, parsed: ParsedRequest, request_id: str, prompt_tokens: int, crash: bool
    ) -> web.Response:
        pieces: list[str] = []
        finish: str | None = None
        while finish is None:
            emission: Emission = await seq.outbox.get()
            if crash:
                _die_like_vllm()
            pieces.append(emission.text)
            finish = emission.finish_reason
        text = "".join(pieces)
        usage = _usage(prompt_tokens, seq.generated)
        if parsed.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text, "tool_calls": []},
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            kind = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": None}
            kind = "text_completion"
        body = {
            "id": request_id,
            "object": kind,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": [choice],
            "usage": usage,
        }
        return web.json_response(body)

    async def _respond_stream(
        self,
        request: web.Request,
        seq: Any,
        parsed: ParsedRequest,
        request_id: str,
        prompt_tokens: int,
        crash: bool,
        drop: bool,
        garble: bool = False,
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await response.prepare(request)
        head = _compact(
            {
                "id": request_id,
                "object": "chat.completion.chunk" if parsed.chat else "text_completion",
                "created": int(time.time()),
                "model": self.model_name,
            }
        )[:-1]  # the shared fields, as an unclosed JSON object
        emitted = 0
        first_write: float | None = None
        last_write = 0.0
        finish: str | None = None
        while finish is None:
            emission: Emission = await seq.outbox.get()
            if crash:
                _die_like_vllm()
            finish = emission.finish_reason
            if drop and emitted and seq.generated * 2 >= parsed.max_tokens:
                log.warning("Dropping the connection of request %s mid-stream (fault injection).", request_id)
                if request.transport is not None:
                    request.transport.abort()
                return response
            parts: list[str] = []
            if parsed.chat and emitted == 0:
                parts.append(self._chunk(head, parsed, {"role": "assistant", "content": ""}, None, prompt_tokens, 0))
            emitted += emission.num_tokens
            delta: Any = {"content": emission.text} if parsed.chat else emission.text
            parts.append(self._chunk(head, parsed, delta, finish, prompt_tokens, emitted))
            if garble and finish is None:
                # A chunk cut in the middle of its JSON, as a broken proxy might forward it.
                parts[-1] = parts[-1][: len(parts[-1]) // 2] + "\n\n"
                garble = False
            if first_write is None:
                first_write = time.perf_counter()
            last_write = time.perf_counter()
            await response.write("".join(parts).encode())
        tail = ""
        if parsed.include_usage:
            tail = f'data: {head},"choices":[],"usage":{_compact(_usage(prompt_tokens, emitted))}}}\n\n'
        await response.write((tail + "data: [DONE]\n\n").encode())
        await response.write_eof()
        if self.trace is not None:
            # When each stream's first and last content chunk went out (CLOCK_MONOTONIC, the
            # clock of time.perf_counter in every process on this machine).
            self.trace.write(f'{{"id":"{request_id}","first_write":{first_write!r},"last_write":{last_write!r}}}\n')
        return response

    @staticmethod
    def _chunk(head: str, parsed: ParsedRequest, delta: Any, finish: str | None, prompt: int, done: int) -> str:
        finish_json = "null" if finish is None else f'"{finish}"'
        if parsed.chat:
            choice = f'{{"index":0,"delta":{_compact(delta)},"logprobs":null,"finish_reason":{finish_json}}}'
        else:
            choice = (
                f'{{"index":0,"text":{_compact(delta)},"logprobs":null,'
                f'"finish_reason":{finish_json},"stop_reason":null}}'
            )
        usage = f',"usage":{_compact(_usage(prompt, done))}' if parsed.continuous_usage else ""
        return f'data: {head},"choices":[{choice}]{usage}}}\n\n'


def _refused(request: web.Request, error: ApiError) -> web.Response:
    """The error's answer, and one line in the log that says which request was refused and why."""
    log.warning("%s %s: HTTP %d: %s", request.method, request.path, error.status, " ".join(error.message.split()))
    return error.response()


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }


def _die_like_vllm() -> None:
    """The crash fault: the engine core dies and takes the API server with it."""
    log.error("EngineCore encountered a fatal error (fault injection: crash after N requests).")
    log.error("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace above.")
    logging.shutdown()
    os._exit(1)
