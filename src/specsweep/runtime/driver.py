"""The load driver: closed-loop concurrency levels (or an open-loop request rate) over a workload."""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from specsweep.runtime.client import RequestRecord, StreamingClient
from specsweep.workload import Workload, WorkloadPrompt

ProgressCallback = Callable[[RequestRecord], None]
StopRule = Callable[[Sequence[RequestRecord]], str | None]  # why to send no more requests, or None


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelRun:
    """The measured requests of one level and its wall-clock window."""

    concurrency: int
    started_at: float
    ended_at: float
    records: tuple[RequestRecord, ...]
    # closed loop: when the last stream sent its first request, and when the first stream ran out
    # of requests (or began the request that was cut): every stream busy in between
    saturated_from: float | None = None
    saturated_until: float | None = None
    stopped_by: str | None = None  # closed loop with a stop rule: why it stopped before its last request
    cut: tuple[RequestRecord, ...] = ()  # requests in flight when it stopped, closed mid-stream

    @property
    def wall_s(self) -> float:
        return self.ended_at - self.started_at


class PromptCycle:
    """Hands out a workload's prompts in a shuffled order, round after round."""

    def __init__(self, workload: Workload, seed: int = 0) -> None:
        self._rng = random.Random(seed)
        self._prompts = list(workload.prompts)
        self._iter: Iterator[WorkloadPrompt] = iter(())

    def next(self) -> WorkloadPrompt:
        try:
            return next(self._iter)
        except StopIteration:
            order = self._prompts[:]
            self._rng.shuffle(order)
            self._iter = iter(order)
            return next(self._iter)


async def run_closed_loop(
    client: StreamingClient,
    prompts: PromptCycle,
    *,
    concurrency: int,
    requests: int,
    max_tokens: int,
    temperature: float,
    on_done: ProgressCallback | None = None,
    stop: StopRule | None = None,
) -> LevelRun:
    """Keep ``concurrency`` requests in flight until ``requests`` have been sent and answered, or
    until ``stop`` (asked after each answer) gives a reason: then no more are sent, and the
    requests in flight are cut (closed mid-stream, which makes the server abort them) when every
    answer so far carried per-chunk token counts, so the tokens they streamed before the cut still
    count in the saturated window; without those counts they finish, as with a fixed budget."""
    counter = itertools.count()
    records: list[RequestRecord] = []
    cut: list[RequestRecord] = []
    saturated_until: list[float] = []
    stopped: list[str] = []
    cutting = asyncio.Event()

    first_sent: list[float] = []  # when each stream sent its first request

    async def worker() -> None:
        first = True
        while not stopped and next(counter) < requests:
            record = await client.stream(
                prompts.next(), max_tokens=max_tokens, temperature=temperature, cut=cutting
            )  # fmt: skip
            if first:
                first_sent.append(record.started_at)
                first = False
            if record.cut:
                cut.append(record)
                break
            records.append(record)
            if on_done is not None:
                on_done(record)
            if stop is not None and not stopped and (reason := stop(records)) is not None:
                stopped.append(reason)
                if all(r.chunk_tokens is not None for r in records if r.ok):
                    cutting.set()
        saturated_until.append(time.perf_counter())

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(min(concurrency, requests))))
    ended = time.perf_counter()
    # A cut request paid its prefill, a step every stream shares, and streamed a few tokens: the
    # saturated window ends where the first of them began. After one round of B streams that
    # started together, the round's answers come close together and each starts a request that
    # is then cut; counting those would charge up to B - 1 prefills the window got no tokens for
    # (3% low on a fast 8B model at 4 streams).
    until = [*saturated_until, *(r.started_at for r in cut)]
    # The window also starts only once every stream has sent its first request: a stream whose
    # first request left late (a new connection, a busy client) leaves the others alone meanwhile.
    return LevelRun(
        concurrency=concurrency,
        started_at=started,
        ended_at=ended,
        records=tuple(records),
        saturated_from=max(first_sent) if first_sent else None,
        saturated_until=min(until) if until else None,
        stopped_by=stopped[0] if stopped else None,
        cut=tuple(cut),
    )


async def run_open_loop(
    client: StreamingClient,
    prompts: PromptCycle,
    *,
    rate_per_s: float,
    requests: int,
    max_tokens: int,
    temperature: float,
    seed: int = 0,
    on_done: ProgressCallback | None = None,
) -> LevelRun:
    """Send ``requests`` requests as a Poisson process at ``rate_per_s``, however many are in flight."""
    rng = random.Random(seed)
    records: list[RequestRecord] = []

    async def one(prompt: WorkloadPrompt) -> None:
        record = await client.stream(prompt, max_tokens=max_tokens, temperature=temperature)
        records.append(record)
        if on_done is not None:
            on_done(record)

    started = time.perf_counter()
    tasks = []
    next_at = started
    for _ in range(requests):
        delay = next_at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(prompts.next())))
        next_at += rng.expovariate(rate_per_s)
    await asyncio.gather(*tasks)
    ended = time.perf_counter()
    # Concurrency of an open loop is not fixed: report the mean number in flight.
    busy = sum(r.latency_s or 0.0 for r in records)
    mean_in_flight = max(1, round(busy / max(ended - started, 1e-9)))
    return LevelRun(concurrency=mean_in_flight, started_at=started, ended_at=ended, records=tuple(records))
