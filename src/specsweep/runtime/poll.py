"""Reading a running server's /metrics at a fixed interval, for as long as asked.

Each scrape becomes a MetricsSnapshot stamped with the server's clock: unix time, so live windows
line up with clock time as Prometheus ranges do; on the emulator, a modelled clock that reads the
unix time of the first scrape and runs at the modelled hardware's pace from there (its ``/version``
says how much faster it runs), so rates and windows are in the rig's units. Only the sample names
asked for are kept. The first scrape must succeed (a wrong URL or a server without metrics is one
line); a later failed scrape (the server restarting, a network blip) is reported to the callback
and polling goes on.
Scrapes run on an absolute schedule: a slow one does not push the later ones back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import httpx

from specsweep.errors import MetricsError, RequestError
from specsweep.measurement.series import keep_names
from specsweep.runtime.modelled_time import read_clock
from specsweep.runtime.scraper import scrape_metrics
from specsweep.types import MetricsSnapshot


@dataclass(frozen=True, slots=True, kw_only=True)
class PollMissed:
    """A scrape that failed after the first one succeeded."""

    at: float  # on the snapshots' clock (module doc)
    reason: str


def poll_metrics(
    url: str,
    *,
    interval_s: float,
    wanted: Callable[[MetricsSnapshot], Sequence[str]],
    on_snapshot: Callable[[MetricsSnapshot | PollMissed], bool | None],
    duration_s: float | None = None,
    api_key: str | None = None,
) -> None:
    """Scrape every ``interval_s`` until ``duration_s`` passed or ``on_snapshot`` returns True.

    ``wanted`` picks the sample names to keep from the first scrape (it also tells the engine)."""
    asyncio.run(_poll(url, interval_s, wanted, on_snapshot, duration_s, api_key))


async def _poll(url, interval_s, wanted, on_snapshot, duration_s, api_key) -> None:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    async with httpx.AsyncClient(base_url=url.rstrip("/"), headers=headers) as http:
        clock = await read_clock(http)
        started = time.monotonic()
        origin: float | None = None  # the first scrape's unix time, where the modelled clock is anchored
        names: Sequence[str] | None = None
        tick = 0
        while True:
            try:
                snapshot = await scrape_metrics(http)
            except (MetricsError, RequestError) as exc:
                if names is None:
                    raise MetricsError(f"{url}: {exc}") from None
                event: MetricsSnapshot | PollMissed = PollMissed(
                    at=clock.anchored(origin or time.time(), time.time()), reason=str(exc)
                )
            else:
                now = time.time()
                origin = now if origin is None else origin
                if names is None:
                    names = wanted(snapshot)
                stamped = MetricsSnapshot(taken_at=clock.anchored(origin, now), samples=snapshot.samples)
                event = keep_names(stamped, names)
            if on_snapshot(event):
                return
            tick += 1
            if duration_s is not None and tick * interval_s >= duration_s:
                return
            await asyncio.sleep(max(0.0, started + tick * interval_s - time.monotonic()))
