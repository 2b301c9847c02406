"""What `specsweep study` prints, at a glance: the built-in study run once, its events replayed into
the study's own printers at 80 and 120 columns, on a terminal and piped. The structure is asserted
(line count, widths, the trial rows, the picks table, no control codes when piped), not modelled
numbers that move from run to run."""

from __future__ import annotations

import io
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from specsweep.cli.printers import WIDTH, fitted_console
from specsweep.cli.study import default_study, print_outcome, trial_rows
from specsweep.cli.study_printers import print_header
from specsweep.cli.study_progress import StudyProgress
from specsweep.tuning.events import StudyEvent
from specsweep.tuning.storage import redact_password
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

CONTROL = re.compile(r"\x1b|\r|[\x00-\x08\x0b-\x1f]")
CODE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\r|\n|[^\x1b\r\n]+")


def screen(raw: str) -> str:
    """What a terminal shows once ``raw`` is written: colours dropped, the live display's cursor
    moves and erased lines applied (rich's Live draws and clears it with these)."""
    lines, row, col = [""], 0, 0
    for match in CODE.finditer(raw):
        text, (args, code) = match.group(0), match.groups()
        if text == "\n":
            row, col = row + 1, 0
            lines += [""] * (row + 1 - len(lines))
        elif text == "\r":
            col = 0
        elif code == "A":
            row = max(0, row - int(args or 1))
        elif code == "K":
            lines[row] = ""
        elif code is None:
            lines[row] = lines[row][:col] + text + lines[row][col + len(text) :]
            col += len(text)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """The README's first study, run in-process once in an empty folder (the tests print from
    there, as the command does): its events and its outcome."""
    before = Path.cwd()
    os.chdir(tmp_path_factory.mktemp("console"))
    try:
        config = default_study("technical")
        paths = study_paths(config, Path("studies"), None)
        events: list[StudyEvent] = []
        runner = StudyRunner(config, paths, on_event=events.append)
        outcome = runner.run()
        yield {"config": config, "paths": paths, "runner": runner, "events": events, "outcome": outcome}
    finally:
        os.chdir(before)


def render(recorded: dict[str, Any], *, width: int, terminal: bool, verbose: bool = False) -> str:
    """What `study` prints for the recorded run, on a console of ``width`` columns."""
    buffer = io.StringIO()
    out = fitted_console(file=buffer, width=width, force_terminal=terminal)
    config, runner = recorded["config"], recorded["runner"]
    progress = StudyProgress(out, trial_rows(out, config, runner), verbose=verbose)
    progress.rows.off.clear()  # as before the run: speculation off's rates come from its row
    print_header(
        out, config, size=runner.space.size(), storage=redact_password(recorded["paths"].storage), built_in=True
    )
    with progress:
        for event in recorded["events"]:
            progress(event)
    print_outcome(out, recorded["outcome"], config, recorded["paths"], verbose=verbose)
    return buffer.getvalue()


def paste_of(lines: list[str]) -> list[str]:
    return [line for line in lines if line.startswith("--speculative-config ")]


def check_glance(text: str, width: int, starts: int) -> list[str]:
    """The shape every console shares; returns its lines."""
    lines = text.splitlines()
    assert len(lines) <= 30, text
    wide = [line for line in lines if len(line) > min(width, WIDTH) and line not in paste_of(lines)]
    assert not wide, wide
    assert len(paste_of(lines)) == 1 and paste_of(lines)[0].endswith("'")  # whole, on one line
    assert sum("modelled" in line for line in lines) == 1  # said once, in the header
    assert "on the built-in emulator" in lines[1]
    first = next(i for i, line in enumerate(lines) if line.startswith("trial  configuration")) + 1
    rows = lines[first : lines.index("", first)]
    assert all(re.match(r"\s+\d+  (k=\d+ \w+|speculation off) ", row) for row in rows), rows
    assert len(rows) == starts, text
    cells = [re.findall(r"\d+\.\d", row) for row in rows]
    assert all(len(c) >= 2 for c in cells), rows  # a rate per level
    assert re.search(r"[+-]\d+\.\d%", rows[-1]), rows  # the change against speculation off
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("concurrency"))
    assert "pick" in lines[header] and "vs off" in lines[header] and "vs baseline" in lines[header]
    picks = [line for line in lines[header + 2 : header + 4]]
    assert all(re.match(r"\s+[14]  k=\d+ \w+ +\d+\.\d +\d+\.\d-\d+\.\d +\d+\.\d +[+-]\d", p) for p in picks), picks
    assert lines[-1].startswith("figures, tables and fits: specsweep report ")
    for said in ("stopped: ", "time: ", "rig: ", "boot of trial "):
        assert sum(line.startswith(said) for line in lines) == 1, said
    return lines


@pytest.mark.parametrize("width", [80, 120])
def test_piped_study_is_plain_text_at_a_glance(recorded: dict[str, Any], width: int) -> None:
    text = render(recorded, width=width, terminal=False)
    assert not CONTROL.search(text.replace("\n", "")), repr(text[:400])
    check_glance(text, width, recorded["outcome"].starts)


@pytest.mark.parametrize("width", [80, 120])
def test_a_terminal_gets_colour_and_the_same_lines(recorded: dict[str, Any], width: int) -> None:
    text = render(recorded, width=width, terminal=True)
    assert "\x1b[" in text  # styled for a terminal
    check_glance(screen(text), width, recorded["outcome"].starts)


def test_the_live_display_says_the_start_the_level_and_the_time_it_ends(recorded: dict[str, Any]) -> None:
    """Mid-level: which start of at most how many, the ETA on the wall clock, a bar of requests, the rate."""
    out = fitted_console(file=io.StringIO(), width=100, force_terminal=True)
    config, runner = recorded["config"], recorded["runner"]
    progress = StudyProgress(out, trial_rows(out, config, runner))
    events = recorded["events"]
    last_level = max(i for i, e in enumerate(events) if type(getattr(e, "event", None)).__name__ == "LevelStarted")
    for event in events[: last_level + 4]:
        progress(event)
    shown = io.StringIO()
    fitted_console(file=shown, width=100, force_terminal=False).print(progress.render())
    live = shown.getvalue()
    assert re.search(r"start \d+ of at most 11, about \d+ expected; ETA \d\d:\d\d:\d\d", live), live
    assert re.search(r"trial \d+  k=\d+ \w+: technical at 4 .*\d+/12 requests [\d,.]+ tok/s so far", live), live


def test_verbose_says_what_the_search_said(recorded: dict[str, Any]) -> None:
    """--verbose: before each start what it is and what is left, each trial's times, the long forms."""
    text = render(recorded, width=100, terminal=False, verbose=True)
    starts = recorded["outcome"].starts
    assert len(re.findall(r"next: worth it: .+: expected to buy [\d.]+ tok/s", text)) == starts - 3  # off, 2 largest k
    caps = [int(c) for c in re.findall(r"start \d+ of at most (\d+)[;,]", text)]
    assert caps == [11] * starts, text
    assert "start 1 of at most 11; time left: known once a start is timed" in text
    assert re.search(r"start 2 of at most 11; a start takes about [\d.]+ min", text), text
    expected = [
        int(e) for e in re.findall(r"start \d+ of at most 11, about (\d+) expected; about [\d.]+ min left", text)
    ]
    assert len(expected) == starts - 3 and all(starts - 3 <= e <= 11 for e in expected), text
    assert len(re.findall(r"boot 4\.0 min, measuring ", text)) == starts  # the profile's 240 s boot, as it was
    assert "best measured configuration" in text and "has the highest predicted rate" in text
