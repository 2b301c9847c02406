"""The emulator's clock undone, at the one place a measurement leaves ``runtime/``.

The emulator runs its modelled hardware ``time_scale`` times faster than the hardware it models
(its ``/version`` says by how much). Every time the client takes on such a server (request
stamps, a level's window, the scrapes of /metrics, a warm-up) is multiplied by the scale here,
before anything is summarised, so every rate and duration above ``runtime/`` is in the rig's
units. Watch's reads of /metrics (runtime/poll.py) are stamped on a modelled clock anchored at
its first read, so its windows are spans of the modelled hardware's time too. On any other
server the scale is 1 and nothing changes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import httpx

from specsweep.runtime.driver import LevelRun
from specsweep.types import ClockName, MetricsSnapshot, RequestRecord

# The fastest time scale at which the gaps between streamed chunks are the modelled steps: faster,
# a step is under a few milliseconds of wall clock and consecutive steps arrive together (at 100,
# half the gaps read 0), so ITL is not kept.
ITL_TIME_SCALE_LIMIT = 10.0

MODELLED: ClockName = "modelled"
WALL_CLOCK: ClockName = "wall clock"


@dataclass(frozen=True, slots=True)
class ServerClock:
    """How many of the modelled hardware's seconds pass in one second of wall clock."""

    time_scale: float = 1.0

    @property
    def name(self) -> ClockName:
        """What a measurement's times are: "modelled" (the emulator's hardware) or "wall clock"."""
        return WALL_CLOCK if self.time_scale == 1.0 else MODELLED

    @property
    def resolves_steps(self) -> bool:
        """Whether chunk arrival gaps are the modelled steps (ITL is kept only then)."""
        return self.time_scale <= ITL_TIME_SCALE_LIMIT

    def notes(self) -> tuple[str, ...]:
        """What a reader of a measurement taken on this clock must know."""
        if self.time_scale == 1.0:
            return ()
        out = [
            f"rates and times in the modelled hardware's units (the emulator runs {self.time_scale:g} times "
            "faster; undone as the requests were timed), as a study and watch give them"
        ]
        if not self.resolves_steps:
            out.append(
                f"ITL is not measured on an emulator {self.time_scale:g} times faster than its hardware: steps under "
                "a few milliseconds of wall clock apart arrive together; TPOT is not affected "
                f"(run the emulator at a time scale of {ITL_TIME_SCALE_LIMIT:g} or slower)"
            )
        return tuple(out)

    def seconds(self, wall_s: float) -> float:
        return wall_s * self.time_scale

    def record(self, record: RequestRecord) -> RequestRecord:
        """A request's stamps in modelled seconds."""
        if self.time_scale == 1.0:
            return record
        scale = self.time_scale

        def times(value: float | None) -> float | None:
            return None if value is None else value * scale

        return replace(
            record,
            started_at=record.started_at * scale,
            ttft_s=times(record.ttft_s),
            last_token_s=times(record.last_token_s),
            latency_s=times(record.latency_s),
            chunk_times_s=None if record.chunk_times_s is None else tuple(t * scale for t in record.chunk_times_s),
        )

    def records(self, records: tuple[RequestRecord, ...] | list[RequestRecord]) -> tuple[RequestRecord, ...]:
        return tuple(self.record(r) for r in records)

    def run(self, run: LevelRun) -> LevelRun:
        """A level's requests and window in modelled seconds."""
        if self.time_scale == 1.0:
            return run

        def at(value: float | None) -> float | None:
            return None if value is None else value * self.time_scale

        return replace(
            run,
            started_at=run.started_at * self.time_scale,
            ended_at=run.ended_at * self.time_scale,
            records=self.records(run.records),
            cut=self.records(run.cut),
            saturated_from=at(run.saturated_from),
            saturated_until=at(run.saturated_until),
        )

    def anchored(self, origin: float, wall: float) -> float:
        """A unix time on the modelled clock that reads ``origin`` at ``origin`` and runs at the modelled
        hardware's pace after it: watch's windows and printed times, from its first read on."""
        return origin + (wall - origin) * self.time_scale

    def anchored_snapshot(self, origin: float, snapshot: MetricsSnapshot) -> MetricsSnapshot:
        if self.time_scale == 1.0:
            return snapshot
        return MetricsSnapshot(taken_at=self.anchored(origin, snapshot.taken_at), samples=snapshot.samples)

    def snapshot(self, snapshot: MetricsSnapshot | None) -> MetricsSnapshot | None:
        """A scrape stamped in modelled seconds (so counter rates read in the rig's units)."""
        if snapshot is None or self.time_scale == 1.0:
            return snapshot
        return MetricsSnapshot(taken_at=snapshot.taken_at * self.time_scale, samples=snapshot.samples)


def clock_from_version(answer: Any) -> ServerClock:
    """The clock a server's ``/version`` answer describes (the emulator adds its time scale)."""
    emulated = answer.get("emulator") if isinstance(answer, dict) else None
    if isinstance(emulated, dict):
        try:
            return ServerClock(float(emulated.get("time_scale") or 1.0))
        except (TypeError, ValueError):
            return ServerClock()
    return ServerClock()


async def read_clock(http: httpx.AsyncClient) -> ServerClock:
    """The clock of the server behind ``http`` (wall clock unless it says it is the emulator)."""
    try:
        response = await http.get("/version", timeout=10.0)
        return clock_from_version(response.json()) if response.status_code == 200 else ServerClock()
    except (httpx.HTTPError, ValueError):
        return ServerClock()


def stored_in_modelled_time(measurement: dict[str, Any], clock: ServerClock) -> dict[str, Any]:
    """A stored measurement (runtime/store.py's shape) with its request times in modelled seconds.

    Measurements stored since the clock was undone as they were taken say so (``"clock"``); older
    ones kept wall-clock request times (and, in a study, wall-clock summaries), and ``clock`` (the
    server's, from the study's record of it) undoes here what a rig reads of them: the request
    times and the level rates."""
    if "clock" in measurement or clock.time_scale == 1.0:
        return measurement
    scale = clock.time_scale
    summaries_undone = measurement.get("time_scale", 1.0) != 1.0  # `measure --json` undid its summaries
    rate_keys = ("output_tokens_per_s", "saturated_output_tokens_per_s", "server_generation_tokens_per_s")

    def row(record: dict[str, Any]) -> dict[str, Any]:
        out = dict(record)
        for key in ("started_at", "ttft_s", "last_token_s", "latency_s"):
            if out.get(key) is not None:
                out[key] = out[key] * scale
        return out

    levels = []
    for stored in measurement.get("levels", []):
        level = dict(stored)
        for key in () if summaries_undone else rate_keys:
            if level.get(key) is not None:
                level[key] = level[key] / scale
        level["records"] = [row(r) for r in level.get("records", [])]
        level["cut"] = [row(r) for r in level.get("cut", [])]
        levels.append(level)
    return {**measurement, "levels": levels, "clock": clock.name}
