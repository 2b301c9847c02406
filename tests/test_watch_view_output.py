"""watch's live view as a user sees it, at 80 and 120 columns, on a terminal and piped, from recorded
windows (hand-made snapshots, tests/test_watch_prediction.served): every line within the width, the
paste whole, no "none", and a window that generated tokens never said to have had no running
request. Structure and widths only: the numbers are other tests' business."""

from __future__ import annotations

import re
from io import StringIO

import pytest
from rich.console import Console
from rich.live import Live

from specsweep.cli.watch_printers import print_watch, watch_view
from specsweep.measurement.series import intervals_from_snapshots
from specsweep.report.snippets import render_snippet
from specsweep.watch.windows import WatchReport, WatchSettings, analyse_windows

from .builders import exact_rig
from .test_watch_analysis import NAMES, RUNNING, snap
from .test_watch_prediction import served
from .watch_truth import PROFILE

CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
FOLDED = "paste (folded to fit; printed unbroken when watch stops):"


@pytest.fixture(scope="module")
def rig():
    return exact_rig(PROFILE, "dspark", k_max=8)


def report_of(rig, snapshots, *, window_s: float = 5.0) -> WatchReport:
    settings = WatchSettings(names=NAMES, rig=rig, drafter=rig.drafters[0], window_s=window_s)
    return analyse_windows(intervals_from_snapshots(snapshots, NAMES), settings, start=0.0, end=20.0)


def shown(report: WatchReport, *, width: int, terminal: bool, height: int = 200, fmt: str = "vllm") -> list[str]:
    buffer = StringIO()
    console = Console(
        file=buffer, width=width, height=height, force_terminal=terminal, color_system="standard" if terminal else None
    )
    console.print(watch_view(report, fmt, source="http://server:8000"))
    text = buffer.getvalue()
    if not terminal:
        assert "\x1b" not in text  # piped: no control code
    return CONTROL.sub("", text).splitlines()


def paste_of(lines: list[str]) -> tuple[str, list[str]]:
    """The paste's heading and its lines (it ends the view)."""
    at = next(i for i, line in enumerate(lines) if line.startswith("paste"))
    return lines[at], lines[at + 1 :]


def assert_readable(lines: list[str], width: int) -> None:
    assert all(len(line) <= width for line in lines), [line for line in lines if len(line) > width]
    assert not any(re.search(r"\bnone\b", line) for line in lines), lines
    assert not any("never showed a running request" in line for line in lines)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_the_live_view_fits_the_width_and_shows_the_paste_whole(rig, width: int, terminal: bool) -> None:
    report = report_of(rig, served([1] * 10 + [4] * 10))  # a per-batch-size table: the longest paste
    lines = shown(report, width=width, terminal=terminal)
    assert_readable(lines, width)
    assert lines[0].startswith("watch vllm at http://server:8000")
    assert [line.split()[1] for line in lines if line.startswith("window ")] == ["2", "3", "4"]  # the last three
    snippet = render_snippet(report.overall.spec, "vllm")
    assert len(snippet) > 120
    heading, paste = paste_of(lines)
    assert heading == FOLDED and "".join(paste) == snippet  # folded, not one character lost or added
    assert all(line.endswith(",") for line in paste[:-1])  # folded after commas: still JSON if copied so
    # the summary once watch stops: the paste unbroken on one line, to copy
    buffer = StringIO()
    print_watch(Console(file=buffer, width=width, soft_wrap=True), report, "vllm", source="http://server:8000")
    assert snippet in buffer.getvalue().splitlines()


def test_a_paste_that_fits_is_not_folded(rig) -> None:
    report = report_of(rig, served([4] * 20), window_s=100.0)  # one batch size: a single k
    snippet = render_snippet(report.overall.spec, "vllm")
    assert 80 < len(snippet) <= 120
    heading, paste = paste_of(shown(report, width=120, terminal=False))
    assert heading == "paste:" and paste == [snippet]
    heading, paste = paste_of(shown(report, width=80, terminal=False))
    assert heading == FOLDED and "".join(paste) == snippet and len(paste) == 2


def test_a_short_terminal_keeps_the_summary_and_the_paste_and_drops_old_windows(rig) -> None:
    report = report_of(rig, served([1] * 10 + [4] * 10))
    lines = shown(report, width=80, terminal=True, height=24)
    assert len(lines) <= 23 and lines[0].startswith("watch vllm")
    windows = [line for line in lines if line.startswith("window ")]
    assert windows and windows[-1].startswith("window 4")  # the newest stays
    assert "".join(paste_of(lines)[1]) == render_snippet(report.overall.spec, "vllm")


def test_the_live_view_in_a_live_display_is_not_cut_at_80_columns(rig) -> None:
    report = report_of(rig, served([1] * 10 + [4] * 10))
    buffer = StringIO()
    console = Console(file=buffer, width=80, height=60, force_terminal=True, color_system="standard", soft_wrap=True)
    with Live(console=console, auto_refresh=False) as live:
        live.update(watch_view(report, "vllm", source="http://server:8000"), refresh=True)
    lines = CONTROL.sub("", buffer.getvalue()).splitlines()
    assert_readable(lines, 80)
    assert render_snippet(report.overall.spec, "vllm") in "".join(lines)


@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_a_window_that_generated_tokens_says_why_it_has_no_concurrency(rig, terminal: bool) -> None:
    # the gauge read 0 at every read while the generation counter grew: requests ran between reads
    idle = report_of(rig, served([0] * 20))
    lines = shown(idle, width=80, terminal=terminal)
    assert_readable(lines, 80)
    text = " ".join(" ".join(lines).split())
    assert "tok/s generated, idle at every read" in text
    assert "the running-requests gauge read 0 at every read, though the server generated tokens" in text
    assert "no recommendation: no window had a prediction: the running-requests gauge read 0" in text
    # no gauge published at all: said as such, not as a gauge that showed nothing
    bare = [snap(s.taken_at, {n: list(v) for n, v in s.samples.items() if n != RUNNING}) for s in served([1] * 20)]
    lines = shown(report_of(rig, bare), width=80, terminal=terminal)
    assert_readable(lines, 80)
    text = " ".join(" ".join(lines).split())
    assert "tok/s generated, concurrency not published" in text
    assert "the server publishes no running-requests gauge (vllm:num_requests_running)" in text
