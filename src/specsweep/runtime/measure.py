"""Measuring one running server: warm up, snapshot /metrics, drive a level, snapshot, summarize."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx

from specsweep.engines import sglang
from specsweep.engines.registry import EngineInfo, engine_from_metric_names, engine_info
from specsweep.errors import MetricsError, RequestError
from specsweep.measurement.counters import CounterDelta, counter_delta
from specsweep.measurement.levels import LevelSummary, summarize_level
from specsweep.measurement.stopping import LevelTarget, stop_reason
from specsweep.runtime.client import AUTH_REFUSED, StreamingClient, auth_refused_message
from specsweep.runtime.driver import PromptCycle, run_closed_loop, run_open_loop
from specsweep.runtime.modelled_time import ServerClock, read_clock
from specsweep.runtime.scraper import scrape_metrics
from specsweep.secrets import mask_text, mask_url
from specsweep.types import ClockName, EventCallback, MetricsSnapshot, RequestRecord
from specsweep.workload import Workload

WARMUP_MAX_TOKENS = 64


@dataclass(frozen=True, slots=True, kw_only=True)
class WarmingUp:
    """A level's warm-up began (concurrency None: the open loop)."""

    concurrency: int | None
    requests: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelStarted:
    """Warm-up done, counters read: the measured requests of a level begin."""

    concurrency: int | None
    requests: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestDone:
    """One measured request finished."""

    concurrency: int | None
    record: RequestRecord


# What a measurement reports while it runs.
MeasureEvent = WarmingUp | LevelStarted | RequestDone


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasureSettings:
    """What to measure and how."""

    endpoint: str
    model: str | None = None  # None: the first model /v1/models lists
    engine: str | None = None  # None: detected from /metrics
    api: str = "chat"
    concurrency: tuple[int, ...] = (1, 4)
    requests: int = 32
    warmup: int | None = None  # requests per level before measuring; None: one per stream
    max_tokens: int = 600
    temperature: float = 0.0
    rate_per_s: float | None = None  # open loop instead of closed-loop levels
    api_key: str | None = field(default=None, repr=False)
    seed: int = 0
    timeout_s: float = 600.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    # Adaptive measurement (measurement/stopping.py): per concurrency, what the level must settle;
    # ``requests`` is then the most a level measures. None: every level measures ``requests``.
    targets: Mapping[int, LevelTarget] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelResult:
    """A level's summary with the raw data behind it."""

    summary: LevelSummary
    records: tuple[RequestRecord, ...]
    delta: CounterDelta | None
    notes: tuple[str, ...]  # what the reader must know: missing metrics, foreign traffic, ...
    stopped_by: str | None = None  # adaptive: "precise", "cannot win", "clearly ahead" or "budget"
    warmup_s: float = 0.0  # wall clock of the level's warm-up
    cut: tuple[RequestRecord, ...] = ()  # in flight when the level stopped, closed mid-stream

    @property
    def measuring_s(self) -> float:
        """Wall clock spent sending requests at this level: its warm-up and its measured window."""
        return self.warmup_s + self.summary.wall_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """One measurement of one server configuration on one workload."""

    endpoint: str  # as shown: its userinfo masked (settings.endpoint is the one requests go to)
    model: str
    engine: str | None
    workload: str
    settings: MeasureSettings
    levels: tuple[LevelResult, ...]
    error: str | None = None  # why the measurement stopped early, if it did
    # "modelled": the server is the emulator, and every time and rate here (request records
    # included) is in its modelled hardware's units (runtime/modelled_time.py); else "wall clock"
    clock: ClockName = "wall clock"
    notes: tuple[str, ...] = ()  # what the reader must know of the whole measurement

    @property
    def unmeasured(self) -> tuple[int, ...]:
        """The closed-loop levels asked for that the measurement did not reach (it stopped before)."""
        if self.settings.rate_per_s:
            return ()
        return self.settings.concurrency[len(self.levels) :]

    def stop_line(self) -> str | None:
        """Why the measurement stopped early and what it left unmeasured, as one line (None: it did not)."""
        if self.error is None:
            return None
        left = self.unmeasured
        return self.error.rstrip(".") + (f"; concurrency {', '.join(map(str, left))} not measured" if left else "")


def thin_levels(concurrency: tuple[int, ...], requests: int) -> str | None:
    """A warning when a closed-loop level has fewer than two measured requests per stream: each
    stream's one request starts together and ends in a ramp-down, so the level measures little
    of the server at that concurrency."""
    thin = [b for b in concurrency if requests < 2 * b]
    if not thin:
        return None
    return (
        f"{requests} request{'s' if requests > 1 else ''} per level is fewer than two per stream at concurrency "
        f"{', '.join(map(str, thin))}: "
        f"those levels measure mostly start-up and ramp-down; use at least {2 * max(thin)} requests"
    )


async def discover_model(http: httpx.AsyncClient) -> str:
    """The first served model name from /v1/models."""
    try:
        response = await http.get("/v1/models", timeout=30.0)
    except httpx.HTTPError as exc:
        raise RequestError(
            f"cannot reach {http.base_url} ({type(exc).__name__}); is the server up and the URL right?"
        ) from None
    if response.status_code in AUTH_REFUSED:
        key_sent = "Authorization" in http.headers
        raise RequestError(auth_refused_message(str(response.url), response.status_code, key_sent=key_sent))
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200 or not isinstance(body, dict):
        raise RequestError(not_an_llm_server(str(http.base_url), "/v1/models", response.status_code))
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise RequestError(f"{http.base_url}/v1/models lists no model; pass --model NAME.") from None


def not_an_llm_server(base_url: str, path: str, status: int | str) -> str:
    """What to do when ``path``, which every OpenAI-compatible server serves, is not served."""
    return (
        f"{base_url.rstrip('/')}{path} answered HTTP {status}, not an OpenAI-compatible answer: the server at "
        "--endpoint is not vLLM, SGLang or llama-server (check the host and port)."
    )


async def _try_scrape(http: httpx.AsyncClient) -> tuple[MetricsSnapshot | None, str | None]:
    try:
        return await scrape_metrics(http), None
    except MetricsError as exc:
        return None, str(exc)


def _level_notes(
    before: MetricsSnapshot | None,
    after: MetricsSnapshot | None,
    scrape_note: str | None,
    engine: EngineInfo | None,
    summary_delta: CounterDelta | None,
) -> list[str]:
    notes = [scrape_note] if scrape_note else []
    if before is None or after is None:
        return notes
    if engine is None:
        notes.append("the server publishes no vLLM, llama.cpp or SGLang metrics on /metrics: no acceptance data")
    elif engine.name == "vllm" and summary_delta is not None and summary_delta.generation_tokens is None:
        notes.append("vLLM publishes no engine metrics: it runs with --disable-log-stats; acceptance is unknown")
    elif engine.name != "sglang" and summary_delta is not None and summary_delta.num_drafts is None:
        notes.append(
            "no spec-decode counters on /metrics: speculation is off on this server (or it does not publish "
            "them); acceptance is unknown"
        )
    return notes


async def measure(
    settings: MeasureSettings,
    workload: Workload,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    on_event: EventCallback[MeasureEvent] | None = None,
) -> Measurement:
    """Measure every level in turn. A failure mid-way keeps the levels already measured."""
    emit = on_event or (lambda event: None)
    headers = {"Authorization": f"Bearer {settings.api_key}"} if settings.api_key else {}
    async with httpx.AsyncClient(base_url=settings.endpoint.rstrip("/"), transport=transport, headers=headers) as http:
        model = settings.model or await discover_model(http)
        clock = await read_clock(http)
        first, _ = await _try_scrape(http)
        if settings.engine:
            engine: EngineInfo | None = engine_info(settings.engine)
        else:
            engine = engine_from_metric_names(set(first.samples)) if first else None
        shared = engine.shared_prefix_body if engine and any(p.shared_prefix for p in workload.prompts) else {}
        extra = {**(engine.extra_body if engine else {}), **shared, **settings.extra_body}
        client = StreamingClient(
            settings.endpoint,
            model=model,
            api=settings.api,
            api_key=settings.api_key,
            transport=transport,
            timeout_s=settings.timeout_s,
            extra_body=extra,
        )
        prompts = PromptCycle(workload, seed=settings.seed)
        levels: list[LevelResult] = []
        error: str | None = None
        async with client:
            plan: list[int | None] = [None] if settings.rate_per_s else list(settings.concurrency)
            for concurrency in plan:
                try:
                    level = await _measure_level(settings, http, client, prompts, engine, concurrency, emit, clock)
                except (RequestError, MetricsError) as exc:
                    error = str(exc)
                    break
                levels.append(level)
                error = measured_nothing(level)
                if error is not None:  # the next level would fail alike: the cause is the server's answer
                    break
    return Measurement(
        endpoint=mask_url(settings.endpoint),
        model=model,
        engine=engine.name if engine else None,
        workload=workload.name,
        settings=settings,
        levels=tuple(levels),
        error=None if error is None else mask_text(error),
        clock=clock.name,
        notes=clock.notes(),
    )


async def _measure_level(
    settings: MeasureSettings,
    http: httpx.AsyncClient,
    client: StreamingClient,
    prompts: PromptCycle,
    engine: EngineInfo | None,
    concurrency: int | None,
    emit: EventCallback[MeasureEvent],
    clock: ServerClock,
) -> LevelResult:
    streams = concurrency or 1
    warmup = settings.warmup if settings.warmup is not None else streams
    emit(WarmingUp(concurrency=concurrency, requests=warmup))
    warmup_s = 0.0
    if warmup:
        warm = await run_closed_loop(
            client, prompts, concurrency=streams, requests=warmup,
            max_tokens=min(WARMUP_MAX_TOKENS, settings.max_tokens), temperature=settings.temperature,
        )  # fmt: skip
        if warm.records and all(not r.ok for r in warm.records):
            error = warm.records[0].error or ""
            if error.startswith(("HTTP 404:", "HTTP 405:", "HTTP 501:")):
                path = "/v1/chat/completions" if settings.api == "chat" else "/v1/completions"
                raise RequestError(
                    not_an_llm_server(settings.endpoint, path, error[5:8])
                    + (" A server with /v1/completions only wants --api completions." if settings.api == "chat" else "")
                )
            raise RequestError(f"every warm-up request failed: {error}")
        warmup_s = clock.seconds(warm.wall_s)
    before, note = await _try_scrape(http)
    before = clock.snapshot(before)
    emit(LevelStarted(concurrency=concurrency, requests=settings.requests))

    def done(record: RequestRecord) -> None:
        emit(RequestDone(concurrency=concurrency, record=clock.record(record)))

    if settings.rate_per_s:
        run = await run_open_loop(
            client, prompts, rate_per_s=settings.rate_per_s, requests=settings.requests,
            max_tokens=settings.max_tokens, temperature=settings.temperature, seed=settings.seed, on_done=done,
        )  # fmt: skip
    else:
        target = (settings.targets or {}).get(streams)
        run = await run_closed_loop(
            client, prompts, concurrency=streams,
            requests=target.max_requests if target is not None else settings.requests,
            max_tokens=settings.max_tokens, temperature=settings.temperature, on_done=done,
            stop=None if target is None else partial(_stop_reason, target, clock),
        )  # fmt: skip
    run = clock.run(run)
    after, after_note = await _try_scrape(http)
    after = clock.snapshot(after)
    delta = None
    gauge = None
    if before is not None and after is not None and engine is not None:
        try:
            delta = counter_delta(before, after, engine.counters)
        except MetricsError as exc:  # unusable counters lose the acceptance data, not the level
            after_note = after_note or str(exc)
        if engine.name == "sglang":
            gauge = after.total(sglang.ACCEPT_LENGTH_GAUGE)
    start = run.saturated_from or run.started_at
    window = (start, run.saturated_until) if run.saturated_until and run.saturated_until > start else None
    summary = summarize_level(
        run.records, concurrency=run.concurrency, wall_s=run.wall_s, delta=delta, gauge_accept_length=gauge,
        window=window, cut=run.cut, itl=clock.resolves_steps,
    )  # fmt: skip
    notes = _level_notes(before, after, note or after_note, engine, delta)
    if summary.foreign_tokens:
        notes.append(
            f"the server generated {summary.foreign_tokens:,.0f} tokens for other clients during this level: "
            "its counters (acceptance, server throughput) are polluted; measure an idle server"
        )
    if summary.stopped_early:
        notes.append(f"{summary.stopped_early} request(s) stopped before max_tokens (EOS); they are flagged")
    if summary.errors:
        reasons = ", ".join(f"{k} x{v}" for k, v in summary.error_reasons.items())
        first = next(r.error for r in run.records if not r.ok)
        notes.append(f"{summary.errors} request(s) failed ({reasons}); the first: {first}")
    return LevelResult(
        summary=summary, records=run.records, delta=delta, notes=tuple(notes), stopped_by=run.stopped_by,
        warmup_s=warmup_s, cut=run.cut,
    )  # fmt: skip


def measured_nothing(level: LevelResult) -> str | None:
    """Why a level measured nothing, when every one of its requests failed (None: some succeeded)."""
    if not level.records or any(r.ok for r in level.records):
        return None
    where = f"at concurrency {level.summary.concurrency}" if level.summary.concurrency else "in the open loop"
    return f"every request {where} failed: {level.records[0].error or 'unknown error'}"


def _stop_reason(target: LevelTarget, clock: ServerClock, records: Sequence[RequestRecord]) -> str | None:
    """The level's stop rule on its requests in the rig's units (a rival's rate is in them)."""
    return stop_reason(target, clock.records(list(records)))


def run_measure(settings: MeasureSettings, workload: Workload, **kwargs: Any) -> Measurement:
    """Synchronous entry point for the layers above."""
    return asyncio.run(measure(settings, workload, **kwargs))
