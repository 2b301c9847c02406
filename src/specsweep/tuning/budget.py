"""The search's budget of server starts: the starts made, the most it will make, the starts it
expects, and what a start costs (its boot and its measuring, this study's means).

Derived from the study's trials alone (their typed records).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.tuning.records import TrialRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class Budget:
    """The starts made, the most the search will make (``cap``), the starts it expects, and a start's cost."""

    starts: int  # server starts of the study so far (failed boots included)
    cap: int  # never more starts than this: the configurations to measure
    expected: int | None  # the starts the search expects in all now (None: not known before values exist)
    boot_s: float | None  # mean over this study's starts (None: no start timed yet)
    measure_s: float | None
    modelled: bool  # in the emulator's modelled seconds

    @property
    def start_s(self) -> float | None:
        """A start's mean cost: its boot and its measuring."""
        return None if self.boot_s is None or self.measure_s is None else self.boot_s + self.measure_s

    @property
    def left_s(self) -> float | None:
        if self.start_s is None or self.expected is None:
            return None
        return max(self.expected - self.starts, 0) * self.start_s


def start_budget(trials: Sequence[TrialRecord], grid: int) -> Budget:
    """Starts so far, the configurations to measure as the cap, and a start's mean cost."""
    # a server start: a trial that claimed a configuration and ran it, measured or failed (not
    # one reused, turned away or running now)
    started = [t for t in trials if t.reused_from is None and t.key is not None and (t.measured or t.failed)]
    timed = [t.times for t in started if t.times is not None]
    return Budget(
        starts=len(started),
        cap=grid,
        expected=None,
        boot_s=sum(x.boot_s for x in timed) / len(timed) if timed else None,
        measure_s=sum(x.measure_s for x in timed) / len(timed) if timed else None,
        modelled=any(x.modelled for x in timed),
    )


def minutes(seconds: float, modelled: bool) -> str:
    return (f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s") + (" (modelled)" if modelled else "")
