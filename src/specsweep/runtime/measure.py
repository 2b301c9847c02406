"""Measuring one running server: warm up, snapshot /metrics, drive a level, snapshot, summarize."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

from specsweep.analysis.counters import CounterDelta, counter_delta, detect_prefix
from specsweep.analysis.levels import LevelSummary, summarize_level
from specsweep.errors import MetricsError, RequestError
from specsweep.runtime.client import StreamingClient
from specsweep.runtime.driver import PromptCycle, run_closed_loop, run_open_loop
from specsweep.runtime.scraper import scrape_metrics
from specsweep.types import MetricsSnapshot, RequestRecord
from specsweep.workload import Workload

EventCallback = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasureSettings:
    """What to measure and how."""

    endpoint: str
    model: str | None = None  # None: the first model /v1/models lists
    api: str = "chat"
    concurrency: tuple[int, ...] = (1, 4)
    requests: int = 32
    warmup: int | None = None  # requests per level before measuring; None: one per stream
    max_tokens: int = 600
    temperature: float = 0.0
    rate_per_s: float | None = None  # open loop instead of closed-loop levels
    api_key: str | None = None
    seed: int = 0
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelResult:
    """A level's summary with the raw data behind it."""

    summary: LevelSummary
    records: tuple[RequestRecord, ...]
    delta: CounterDelta | None
    metrics_note: str | None  # why acceptance is missing, if it is


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measurement of one server configuration on one workload."""

    endpoint: str
    model: str
    workload: str
    engine_prefix: str | None
    levels: tuple[LevelResult, ...]


async def discover_model(http: httpx.AsyncClient) -> str:
    """The first served model name from /v1/models."""
    try:
        response = await http.get("/v1/models", timeout=30.0)
        data = response.json()["data"]
        return str(data[0]["id"])
    except httpx.HTTPError as exc:
        raise RequestError(
            f"cannot reach {http.base_url}/v1/models ({type(exc).__name__}); is the server up?"
        ) from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise RequestError(f"{http.base_url}/v1/models did not list a model; pass --model NAME.") from None


async def _try_scrape(http: httpx.AsyncClient) -> tuple[MetricsSnapshot | None, str | None]:
    try:
        return await scrape_metrics(http), None
    except MetricsError as exc:
        return None, str(exc)


async def measure(
    settings: MeasureSettings,
    workload: Workload,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    on_event: EventCallback | None = None,
) -> Measurement:
    """Measure every level in turn; levels already measured are kept if a later one fails."""
    emit = on_event or (lambda kind, data: None)
    async with httpx.AsyncClient(base_url=settings.endpoint.rstrip("/"), transport=transport) as http:
        model = settings.model or await discover_model(http)
        client = StreamingClient(
            settings.endpoint,
            model=model,
            api=settings.api,
            api_key=settings.api_key,
            transport=transport,
            timeout_s=settings.timeout_s,
            extra_body=settings.extra_body,
        )
        prompts = PromptCycle(workload, seed=settings.seed)
        levels: list[LevelResult] = []
        prefix: str | None = None
        async with client:
            plan: list[int | None] = [None] if settings.rate_per_s else list(settings.concurrency)
            for concurrency in plan:
                streams = concurrency or 1
                warmup = settings.warmup if settings.warmup is not None else streams
                emit("warmup", {"concurrency": concurrency, "requests": warmup})
                if warmup:
                    await run_closed_loop(
                        client, prompts, concurrency=streams, requests=warmup,
                        max_tokens=min(64, settings.max_tokens), temperature=settings.temperature,
                    )  # fmt: skip
                before, note = await _try_scrape(http)
                emit("level", {"concurrency": concurrency, "requests": settings.requests})

                def done(record: RequestRecord, level: int | None = concurrency) -> None:
                    emit("request", {"concurrency": level, "record": record})

                if settings.rate_per_s:
                    run = await run_open_loop(
                        client, prompts, rate_per_s=settings.rate_per_s, requests=settings.requests,
                        max_tokens=settings.max_tokens, temperature=settings.temperature,
                        seed=settings.seed, on_done=done,
                    )  # fmt: skip
                else:
                    run = await run_closed_loop(
                        client, prompts, concurrency=streams, requests=settings.requests,
                        max_tokens=settings.max_tokens, temperature=settings.temperature, on_done=done,
                    )  # fmt: skip
                after, after_note = await _try_scrape(http)
                delta = None
                note = note or after_note
                if before is not None and after is not None:
                    prefix = detect_prefix(after)
                    if prefix is None:
                        note = "the server publishes no vLLM or llama.cpp metrics on /metrics"
                    else:
                        delta = counter_delta(before, after, prefix)
                        if delta.num_drafts is None:
                            note = (
                                "no spec-decode counters on /metrics: speculation is off "
                                "(or vLLM runs with --disable-log-stats)"
                            )
                summary = summarize_level(run.records, concurrency=run.concurrency, wall_s=run.wall_s, delta=delta)
                levels.append(LevelResult(summary=summary, records=run.records, delta=delta, metrics_note=note))
                emit("level_done", {"summary": summary})
    return Measurement(
        endpoint=settings.endpoint, model=model, workload=workload.name, engine_prefix=prefix, levels=tuple(levels)
    )


def run_measure(settings: MeasureSettings, workload: Workload, **kwargs: Any) -> Measurement:
    """Synchronous entry point for the layers above."""
    return asyncio.run(measure(settings, workload, **kwargs))
