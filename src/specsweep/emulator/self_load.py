"""The emulator's own traffic: closed-loop streams that submit straight to its engine, following a
schedule (emulator/traffic.py), so a server under a known, changing load needs no client.

Stream i runs while the window in force has more than i streams: it picks its next request's
content class from the window's mix (seeded per stream), submits it with the schedule's prompt
length and max_tokens, and waits until the engine has emitted its last token. A stream past the
window's count finishes the request it has and waits. The engine admits the next request at the
next step, as it would admit a client's: one step of the slot idles, as in a real closed loop.
"""

from __future__ import annotations

import asyncio
import random
import time

from specsweep.emulator.engine import Engine
from specsweep.emulator.traffic import TrafficSchedule, TrafficWindow


class SelfLoad:
    """Drives an engine with a schedule's traffic until cancelled."""

    def __init__(
        self, engine: Engine, schedule: TrafficSchedule, *, time_scale: float, seed: int, temperature: float
    ) -> None:
        self.engine = engine
        self.schedule = schedule
        self.time_scale = time_scale
        self.seed = seed
        self.temperature = temperature
        self.started_at: float | None = None  # wall clock (time.time()) when the schedule began
        self.window_index: int | None = None
        self._window: TrafficWindow | None = None
        self._changed = asyncio.Event()

    def describe(self) -> dict[str, object]:
        """What /version says about the traffic (for benchmarks that align windows with it)."""
        return {
            "schedule": self.schedule.name,
            "started_at": self.started_at,
            "window": self.window_index,
            "period_s": self.schedule.period_s,
            "repeat": self.schedule.repeat,
        }

    async def run(self) -> None:
        self.started_at = time.time()
        start = time.perf_counter()
        most = max(w.streams for w in self.schedule.window)
        streams = [asyncio.create_task(self._stream(i)) for i in range(most)]
        try:
            while True:
                modelled = (time.perf_counter() - start) * self.time_scale
                found = self.schedule.window_at(modelled)
                if found is None:
                    self._switch(None, None)
                    await asyncio.Event().wait()  # the schedule ended: idle until cancelled
                    return
                self._switch(found[1], found[0])
                ends = sum(w.duration_s for w in self.schedule.window[: found[0] + 1])
                period = self.schedule.period_s
                cycle_start = (modelled // period) * period if self.schedule.repeat else 0.0
                await asyncio.sleep(max(0.0, (cycle_start + ends - modelled) / self.time_scale))
        finally:
            for task in streams:
                task.cancel()

    def _switch(self, window: TrafficWindow | None, index: int | None) -> None:
        if window is self._window and index == self.window_index:
            return
        self._window, self.window_index = window, index
        self._changed.set()
        self._changed = asyncio.Event()

    async def _stream(self, number: int) -> None:
        rng = random.Random(f"traffic:{self.seed}:{number}")
        while True:
            window = self._window
            if window is None or number >= window.streams or not window.mix:
                await self._changed.wait()
                continue
            names = list(window.mix)
            content_class = rng.choices(names, weights=[window.mix[n] for n in names])[0]
            seq = self.engine.submit(
                content_class=content_class,
                prompt_tokens=self.schedule.prompt_tokens_of(content_class),
                max_tokens=self.schedule.max_tokens,
                temperature=self.temperature,
            )
            while (await seq.outbox.get()).finish_reason is None:
                pass
