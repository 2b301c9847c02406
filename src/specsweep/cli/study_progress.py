"""What ``specsweep study`` prints while it runs: one aligned row per trial and, on a terminal, one
live display (which start of at most how many, the time it should end, the level being measured as
a bar with its rate so far). Piped, only the rows: plain text with no live display.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime, timedelta

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from specsweep.analysis.drafters import configuration_label
from specsweep.runtime.measure import LevelStarted, RequestDone, WarmingUp
from specsweep.tuning.events import (
    MeasuredElsewhere,
    Note,
    Planned,
    StartsLeft,
    StudyEvent,
    TrialDone,
    TrialFailed,
    TrialProgress,
    TrialReady,
    TrialReused,
    TrialStarting,
    Waiting,
)
from specsweep.types import Configuration, LevelFigures


def minutes(seconds: float) -> str:
    """ "12.4 min", or "82 s" under a minute and a half."""
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def change(rate: float | None, off: float | None) -> str:
    """ "+12.3%": a rate against speculation off's ("" where either is missing)."""
    return f"{100 * (rate / off - 1):+.1f}%" if rate is not None and off else ""


class TrialRows:
    """One aligned row per trial: the configuration, why the search chose it, and per workload
    and level its rate with its change against speculation off. The phase column is left out
    where it would not fit the console."""

    RATE = 7  # "  123.4"
    CHANGE = 8  # "  +12.3%"

    def __init__(
        self,
        out: Console,
        *,
        workloads: Sequence[str],
        levels: Sequence[int],
        labels: Sequence[str],
        off: dict[tuple[str, int], float] | None = None,
    ) -> None:
        self.out = out
        self.cells = [(w, b) for w in workloads for b in levels]
        one = len(workloads) == 1
        self.heads = [f"at {b}" if one else f"{w} at {b}" for w, b in self.cells]
        self.cell_width = max([self.RATE + self.CHANGE, *(len(h) for h in self.heads)])
        self.label_width = max([len("k=5 probabilistic"), *(len(label) for label in labels)])
        self.phase_width = len("other draft sampling")
        self.phases = self.width(True) <= out.width
        self.off = dict(off or {})
        self.shown = False

    def width(self, phases: bool) -> int:
        return 5 + 2 + self.label_width + (2 + self.phase_width if phases else 0) + len(self.cells) * self.cell_width

    def _line(self, trial: str, label: str, phase: str, cells: Sequence[str]) -> str:
        line = f"{trial:>5}  {label:<{self.label_width}}"
        if self.phases:
            line += f"  {phase:<{self.phase_width}}"
        return line + "".join(f"{c:<{self.cell_width}}" for c in cells)

    def header(self) -> None:
        if self.shown:
            return
        self.shown = True
        self.out.print("\n[bold]trials[/bold] (aggregate output tok/s per level, and the change vs speculation off)")
        heads = [f"{h:>{max(self.RATE, len(h))}}" for h in self.heads]
        self.out.print(self._line("trial", "configuration", "chosen by", heads).rstrip(), style="bold", markup=False)

    def done(self, trial: int, configuration: Configuration, phase: str, results: dict[str, dict[int, LevelFigures]]):
        """A measured trial's row; speculation off's rates become what later rows are compared with."""
        self.header()
        rates = {(w, b): row.output_tokens_per_s for w, levels in results.items() for b, row in levels.items()}
        if configuration.spec is None:
            self.off.update({cell: rate for cell, rate in rates.items() if rate})
        cells = []
        for cell in self.cells:
            rate = rates.get(cell)
            shown = "-" if rate is None else f"{rate:.1f}"
            ahead = "" if configuration.spec is None else change(rate, self.off.get(cell))
            cells.append(f"{shown:>{self.RATE}}{ahead:>{self.CHANGE}}")
        label = configuration_label(configuration, short=True)
        self.out.print(self._line(str(trial), label, phase, cells).rstrip(), markup=False)

    def other(self, trial: int, label: str, said: str) -> None:
        """A trial with no rates: failed, reused, measured by another worker."""
        self.header()
        self.out.print(f"{trial:>5}  {label:<{self.label_width}}  {said}")


class StudyProgress:
    """The study's events as trial rows and, on a terminal, one live display: which start of at
    most how many, the time it should end (on the wall clock, where you wait), the trial and level
    being measured as a bar with its rate so far on the rows' clock. ``verbose``: also what the
    search said of each start, and each trial's boot and measuring time."""

    def __init__(self, out: Console, rows: TrialRows, *, verbose: bool = False) -> None:
        """``rows`` may be replaced before the first trial (once the study knows its space)."""
        self.out = out
        self.rows = rows
        self.verbose = verbose
        self.plan = "opening the study"
        self.doing = ""
        self.bar: tuple[int, int] | None = None  # requests done, at most
        self.rate = ""
        self.level_records: list[tuple[float, float, int]] = []  # start, end, tokens on the server's clock
        self.phase = "first"  # the search's phase of the next trial (queued ones are measured first)
        self.labels: dict[int, str] = {}
        self.phases: dict[int, str] = {}
        self.seen: set[str] = set()
        self.wall_started = 0.0
        self.wall_s = self.clock_s = 0.0  # the wall clock and the server's clock of the timed starts
        self.live = Live(get_renderable=self.render, console=out, transient=True, refresh_per_second=4)

    def __enter__(self) -> StudyProgress:
        if self.out.is_terminal:
            self.live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live.is_started:
            self.live.stop()

    def render(self) -> RenderableType:
        lines: list[RenderableType] = [Text(self.plan, style="dim")]
        if self.doing:
            line = Table.grid(padding=(0, 1))
            parts: list[RenderableType] = [Text(self.doing)]
            if self.bar is not None:
                done, most = self.bar
                parts += [ProgressBar(total=most, completed=done, width=24), Text(f"{done}/{most} requests")]
            if self.rate:
                parts.append(Text(self.rate))
            line.add_row(*parts)
            lines.append(line)
        return Group(*lines)

    def eta(self, left_s: float) -> str:
        """The wall-clock time ``left_s`` (on the server's clock) should end, from the starts timed so far."""
        if not self.clock_s:
            return ""
        end = datetime.now() + timedelta(seconds=left_s * self.wall_s / self.clock_s)
        return f"; ETA {end:%H:%M:%S}"

    def __call__(self, event: StudyEvent) -> None:
        match event:
            case Note(text=text):
                self.out.print(f"[yellow]note:[/yellow] {text}")
            case StartsLeft() as left:
                self.plan = f"start {left.starts + 1} of at most {left.cap}"
                if left.expected is not None:
                    self.plan += f", about {left.expected} expected"
                self.plan += self.eta(left.left_s) if left.left_s is not None else ""
                if self.verbose:
                    self.out.print(f"          {left_line(left)}", markup=False)
            case Planned(phase=phase, reason=reason, configuration=configuration) if configuration is not None:
                self.phase = phase + (" again" if configuration.key in self.seen else "")
                if self.verbose:
                    self.out.print(f"          next: {phase}: {reason}", markup=False)
            case TrialStarting(trial=trial, configuration=configuration):
                self.labels[trial] = configuration_label(configuration, short=True)
                self.phases[trial], self.phase = self.phase, "first"
                self.seen.add(configuration.key)
                self.wall_started = time.monotonic()
                self.doing, self.bar, self.rate = f"trial {trial}  {self.labels[trial]}: starting the server", None, ""
            case TrialReady(trial=trial):
                self.doing = f"trial {trial}  {self.labels.get(trial, '')}: server ready"
            case TrialProgress(trial=trial, workload=workload, event=WarmingUp(concurrency=level)):
                self.doing = f"trial {trial}  {self.labels.get(trial, '')}: {workload} at {level}, warming up"
                self.bar, self.rate = None, ""
            case TrialProgress(trial=trial, workload=workload, event=LevelStarted(concurrency=level, requests=most)):
                self.doing = f"trial {trial}  {self.labels.get(trial, '')}: {workload} at {level}"
                self.bar, self.rate, self.level_records = (0, most), "", []
            case TrialProgress(event=RequestDone(record=record)):
                end = record.started_at + (record.latency_s or 0.0)
                self.level_records.append((record.started_at, end, record.completion_tokens or 0))
                if self.bar is not None:
                    self.bar = (min(self.bar[0] + 1, self.bar[1]), self.bar[1])
                span = max(e for _, e, _ in self.level_records) - min(s for s, _, _ in self.level_records)
                if span > 0:
                    self.rate = f"{sum(t for _, _, t in self.level_records) / span:,.1f} tok/s so far"
            case TrialDone(trial=trial, configuration=configuration, results=results) as done:
                if done.boot_s is not None and done.measure_s is not None:
                    self.wall_s += time.monotonic() - self.wall_started
                    self.clock_s += done.boot_s + done.measure_s
                self.rows.done(trial, configuration, self.phases.get(trial, ""), results)
                if self.verbose and done.boot_s is not None and done.measure_s is not None:
                    self.out.print(f"          boot {minutes(done.boot_s)}, measuring {minutes(done.measure_s)}")
                self.doing, self.bar, self.rate = "", None, ""
            case TrialFailed(trial=trial, reason=reason):
                self.rows.other(trial, self.labels.get(trial, ""), f"[red]failed[/red]: {escape(reason)}")
            case TrialReused(trial=trial, source=source):
                self.rows.other(trial, self.labels.get(trial, ""), f"same server as trial {source}: reused, no start")
            case MeasuredElsewhere(trial=trial, source=source, worker=worker):
                self.rows.other(trial, self.labels.get(trial, ""), f"measured by worker {worker} (trial {source})")
            case Waiting(trials=trials):
                self.doing = f"other workers measure the rest (trials {list(trials)}): waiting for them"


def left_line(left: StartsLeft) -> str:
    """What is left of the study: "start 4 of at most 11, about 6 expected; about 12.4 min left"."""
    line = f"start {left.starts + 1} of at most {left.cap}"
    if left.expected is not None and left.left_s is not None:
        return line + f", about {left.expected} expected; about {minutes(left.left_s)} left"
    if left.start_s is not None:
        return line + f"; a start takes about {minutes(left.start_s)}"
    return line + "; time left: known once a start is timed"
