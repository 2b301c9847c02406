"""``study --dry-run`` as a user reads it, at 80 and 120 columns, on a terminal and piped: the server
command once and each configuration's part of it, exact (the planner's command rebuilt from what
is printed), the stop and wait commands, prose within the width and commands whole."""

from __future__ import annotations

import re
from io import StringIO
from pathlib import Path

import pytest
from rich.console import Console

from specsweep.analysis.drafters import configuration_label
from specsweep.cli.plan_printer import PART, PROSE_WIDTH, print_plan, split_commands
from specsweep.config import load_study_config, parse_study_config
from specsweep.tuning.plan import StudyPlan, plan_study

from .builders import emulator_study

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
HEADING = "each configuration's server runs this command"


def printed(plan: StudyPlan, *, width: int, terminal: bool) -> list[str]:
    """The dry run's lines as a terminal of ``width`` columns (or a pipe) gets them, control codes
    checked and stripped."""
    buffer = StringIO()
    console = Console(file=buffer, width=width, force_terminal=terminal, color_system="standard" if terminal else None)
    print_plan(console, plan)
    text = buffer.getvalue()
    assert ("\x1b[" in text) is terminal  # styles on a terminal; no control code in a pipe
    return ANSI.sub("", text).splitlines()


def label(plan: StudyPlan, index: int) -> str:
    c = plan.configurations[index].configuration
    return configuration_label(c) + (" (baseline)" if c.spec is not None and c == plan.baseline else "")


def rebuilt_commands(plan: StudyPlan, lines: list[str]) -> list[str]:
    """Each configuration's start command from the printed common command and its printed part."""
    heading = next(i for i, line in enumerate(lines) if line.startswith(HEADING))
    while not lines[heading].endswith(":"):  # a heading wrapped over several lines
        heading += 1
    common = lines[heading + 1].strip()
    out = []
    for index in range(len(plan.configurations)):
        name = label(plan, index)
        if f"  {name}: nothing added" in lines:
            part = ""
        else:
            part = lines[lines.index(f"  {name}:", heading) + 1]
            assert part.startswith("    ") and not part.startswith("     "), part
            part = part.strip()
        if PART in common.split(" "):
            out.append(common.replace(f" {PART}", f" {part}" if part else "", 1))
        else:
            out.append(f"{common} {part}" if part else common)
    return out


def commands_of(plan: StudyPlan) -> list[str]:
    """Every command the plan holds, whole: starts, stops, waits."""
    out = [c.command for c in plan.configurations]
    for c in plan.configurations:
        out += [command for command in (c.stop.stop, c.stop.wait_free) if command]
    return out


def assert_widths(lines: list[str], plan: StudyPlan, width: int, parts: list[str]) -> None:
    """Prose fits min(width, 100) columns; a longer line is a command (or a piece of one) printed whole."""
    wholes = commands_of(plan)
    for line in lines:
        if len(line) <= min(width, PROSE_WIDTH):
            continue
        shown = line.strip()
        assert any(shown in whole for whole in wholes) or shown in parts, f"a prose line past {width}: {line!r}"


@pytest.fixture(scope="module")
def dgx_plan() -> StudyPlan:
    return plan_study(load_study_config(ROOT / "studies/dgx-spark.toml"))


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("terminal", [True, False], ids=["terminal", "piped"])
def test_the_dgx_spark_dry_run_prints_the_command_once_and_each_configurations_part(
    dgx_plan: StudyPlan, width: int, terminal: bool
) -> None:
    lines = printed(dgx_plan, width=width, terminal=terminal)
    commands = [c.command for c in dgx_plan.configurations]
    assert len(commands) == 11 and len(set(commands)) == 11
    # exact: the planner's command of every configuration, rebuilt from what is printed
    assert rebuilt_commands(dgx_plan, lines) == commands
    # the ~540 characters every start shares, once; each configuration adds only its spec config
    assert sum("vllm serve /models/DeepSeek-V4-Flash-0731" in line for line in lines) == 1
    parts = [line.strip() for line in lines if line.startswith("    --speculative-config '{")]
    assert len(parts) == 10 and all(len(p) < 110 for p in parts)
    assert "  speculation off: nothing added" in lines
    assert "  k=5 dspark (probabilistic) (baseline):" in lines
    # how each server is stopped and what the next start waits for, the commands whole
    stop = dgx_plan.configurations[0].stop
    assert stop.stop == "docker exec vllm-head pkill -INT -f 'vllm serve'"
    assert f"    {stop.stop}" in lines
    assert stop.wait_free is not None and stop.wait_free.startswith("/bin/sh -c 'for box in ")
    text = "\n".join(lines)
    assert "\n    " + stop.wait_free + "\n" in text  # the script with its own lines, nothing folded into it
    prose = " ".join(text.split())
    assert "the server is stopped with (given 90 s):" in prose
    assert "SIGKILL after 60 s (server.stop_grace_s)" in prose
    assert "this runs every 2 s until it succeeds (at most 1800 s, server.ready_timeout_s):" in prose
    assert "the next start waits up to 10 s for port 8000 to be free" in prose
    assert_widths(lines, dgx_plan, width, parts)
    assert not any("none" in line.split() for line in lines)


def test_a_part_in_the_middle_of_the_command_is_marked_where_it_goes(tmp_path: Path) -> None:
    data = emulator_study("middle", k=(1, 2))
    data["server"] = {
        "engine": "vllm", "mode": "process", "port": 8123,
        "start": ["vllm", "serve", "/models/m", "{spec_args}", "--port", "{port}", "--enforce-eager"],
        "stop_grace_s": 5,
    }  # fmt: skip
    plan = plan_study(parse_study_config(data, source=str(tmp_path / "s.toml")))
    for width, terminal in ((80, False), (120, True)):
        lines = printed(plan, width=width, terminal=terminal)
        assert rebuilt_commands(plan, lines) == [c.command for c in plan.configurations]
        assert f"  vllm serve /models/m {PART} --port 8123 --enforce-eager" in lines
        assert_widths(lines, plan, width, [])
    assert "the next start waits up to 10 s for port 8123 to be free" in " ".join(" ".join(lines).split())


def test_split_commands_keeps_every_word() -> None:
    commands = [("a", "b", "x", "z"), ("a", "b", "z"), ("a", "b", "y", "y", "z")]
    split = split_commands(commands)
    assert split.head == ("a", "b") and split.tail == ("z",)
    assert [(*split.head, *p, *split.tail) for p in split.parts] == commands
    same = split_commands([("a", "b"), ("a", "b")])
    assert same.head == ("a", "b") and same.parts == ((), ()) and same.tail == ()
    # one command a prefix of another: the tail never eats into the shared head
    nested = split_commands([("a", "b"), ("a", "b", "b")])
    assert [(*nested.head, *p, *nested.tail) for p in nested.parts] == [("a", "b"), ("a", "b", "b")]


def test_attach_mode_lists_each_configurations_flags_and_no_stop() -> None:
    data = emulator_study("hand", k=(1, 2))
    data["server"] = {"engine": "vllm", "mode": "attach", "port": 8000}
    plan = plan_study(parse_study_config(data, source="s.toml"))
    lines = printed(plan, width=80, terminal=False)
    for c in plan.configurations:
        assert f"    {c.command}" in lines
    assert not any(line.startswith("once a configuration is measured") for line in lines)
