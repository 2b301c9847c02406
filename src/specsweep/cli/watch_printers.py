"""What ``specsweep watch`` prints: the live view refreshed in place, and every window and the
summary once it stops.

The live view is drawn to the terminal's size: every line fits its width (prose wrapped, continued
lines indented; a paste wider than the terminal folded after a comma, all of it shown, and said),
and the oldest windows give way when the terminal is too short for them; the summary printed when
watch stops has the paste unbroken, to copy.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterator

from rich.console import Console, ConsoleOptions, RenderResult
from rich.text import Text

from specsweep.cli.rig_printers import describe_rig
from specsweep.report.snippets import render_snippet
from specsweep.watch.report import summary_lines, window_lines
from specsweep.watch.windows import WatchReport

LIVE_WINDOWS = 3  # the live view shows at most the last three windows


def print_watch(out: Console, report: WatchReport, fmt: str, *, source: str, unchecked: tuple[str, ...] = ()) -> None:
    """Every window in a few lines, then the recommendation over all of them and the snippet."""
    out.print(f"\n[bold]watch[/bold] {report.engine} at {source}: {len(report.windows)} window(s)" + _scale(report))
    if report.rig is not None:
        out.print(f"rig: {describe_rig(report.rig)}")
    if unchecked:
        out.print(f"  unchecked against the running server: {', '.join(unchecked)}")
    for number, window in enumerate(report.windows, 1):
        for line in window_lines(window, number):
            out.print(line, highlight=False, markup=False)
    out.print("")
    for line in summary_lines(report, fmt):
        out.print(line, highlight=False, markup=False)


class WatchView:
    """The live view: the last windows and the span so far, drawn to the terminal's width and height."""

    def __init__(self, report: WatchReport, fmt: str, *, source: str) -> None:
        self.report = report
        self.fmt = fmt
        self.source = source

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield from (Text(line) for line in self.lines(options.max_width, options.height or console.height))

    def lines(self, width: int, height: int) -> list[str]:
        """The view's lines, none wider than ``width``, the oldest windows left out past ``height``."""
        report = self.report
        title = f"watch {report.engine} at {self.source}{_scale(report)} (Ctrl-C stops and prints the summary)"
        head = _wrap(title, width)
        tail = [line for text in summary_lines(report, self.fmt, snippet=False) for line in _wrap(text, width)]
        if report.overall.recommendation is not None:
            tail += _paste(render_snippet(report.overall.spec, self.fmt), width)
        windows: list[str] = []
        shown = list(enumerate(report.windows, 1))[-LIVE_WINDOWS:]
        for number, window in reversed(shown):  # the newest first, while the terminal has room
            block = [line for text in window_lines(window, number) for line in _wrap(text, width)]
            if windows and len(head) + len(windows) + len(block) + len(tail) > height - 1:
                break
            windows = block + windows
        return [*head, *windows, *tail]


def watch_view(report: WatchReport, fmt: str, *, source: str) -> WatchView:
    """The live view of ``report`` (see ``WatchView``)."""
    return WatchView(report, fmt, source=source)


def _wrap(text: str, width: int) -> list[str]:
    """Prose wrapped to ``width``, continued lines indented four more than the first."""
    indent = " " * (len(text) - len(text.lstrip(" ")))
    return textwrap.wrap(
        text.lstrip(" "), width=width, initial_indent=indent, subsequent_indent=indent + "    ",
        break_long_words=True, break_on_hyphens=False,
    ) or [""]  # fmt: skip


def _paste(snippet: str, width: int) -> list[str]:
    """The paste whole: a line wider than ``width`` folded after a comma where it can be (inside a
    JSON value a line break there still parses), else at the width."""
    lines = list(_fold(snippet.splitlines(), width))
    folded = len(lines) > len(snippet.splitlines())
    return ["paste (folded to fit; printed unbroken when watch stops):" if folded else "paste:", *lines]


def _fold(lines: list[str], width: int) -> Iterator[str]:
    for line in lines:
        rest = line
        while len(rest) > width:
            cut = rest.rfind(",", 0, width) + 1 or width
            yield rest[:cut]
            rest = rest[cut:]
        yield rest


def _scale(report: WatchReport) -> str:
    return f"; {report.rates_note}" if report.rates_note else ""
