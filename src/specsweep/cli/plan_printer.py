"""What ``study --dry-run`` prints: the plan, the server command once and each configuration's part
of it, and how each server is stopped before the next starts.

Prose is wrapped to the terminal, at most ``PROSE_WIDTH`` columns, continued lines indented;
commands (and the parts of them) are printed whole on lines of their own, never wrapped or cut,
so they can be copied.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.text import Text

from specsweep.analysis.drafters import configuration_label
from specsweep.runtime.server_plan import PlannedStop
from specsweep.tuning.plan import PlannedConfiguration, StudyPlan

PROSE_WIDTH = 100
PART = "<PART>"  # where each configuration's part goes, when words of the command follow it (never a quoted word)


@dataclass(frozen=True, slots=True, kw_only=True)
class CommandSplit:
    """Commands as the words they share and what each has of its own: command i is
    ``head + parts[i] + tail``, word for word."""

    head: tuple[str, ...]
    tail: tuple[str, ...]
    parts: tuple[tuple[str, ...], ...]


def split_commands(commands: Sequence[Sequence[str]]) -> CommandSplit:
    """The longest run of words every command starts with, the longest every one ends with after
    it, and the words of each between them."""
    words = [tuple(c) for c in commands]
    shortest = min((len(w) for w in words), default=0)
    head = 0
    while head < shortest and len({w[head] for w in words}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head and len({w[len(w) - 1 - tail] for w in words}) == 1:
        tail += 1
    first = words[0] if words else ()
    return CommandSplit(
        head=first[:head],
        tail=first[len(first) - tail :] if tail else (),
        parts=tuple(w[head : len(w) - tail] for w in words),
    )


def print_plan(out: Console, plan: StudyPlan) -> None:
    """``study --dry-run``: the space, the levels and workloads, the server commands and the stops."""
    say = _Prose(out)
    say(f"dry run of study {plan.name}: nothing is started, nothing is written", style="bold")
    first = [_planned_label(c, plan) for c in plan.configurations if c.first]
    say(
        f"space: {len(plan.configurations)} distinct configurations on {plan.engine} ({plan.mode} mode), "
        f"sampler {plan.sampler}" + (f"; measured first: {', '.join(first)}" if first else "")
    )
    if plan.collapsed:
        say(f"note: {plan.collapsed}", indent=2)
    for w in plan.workloads:
        kinds = ", ".join(f"{tag or '-'} {count}" for tag, count in sorted(w.subcategories.items()))
        say(f"workload {w.name}: weight {w.weight:g}, {w.prompts} prompts ({kinds})")
    say(
        f"levels: concurrency {', '.join(map(str, plan.concurrency))}; requests {plan.requests}; "
        f"max_tokens {plan.max_tokens}, temperature {plan.temperature:g}"
    )
    if plan.context:
        say(f"context levels: {plan.context}")
    say(f"objective: {plan.objective}; {plan.budget}")
    if plan.mode == "attach":
        say("the server is restarted by hand for each configuration, with:")
        for c in plan.configurations:
            say(f"{_planned_label(c, plan)}:", indent=2)
            _command(out, c.command, indent=4)
    else:
        _print_starts(out, say, plan)
    _print_stops(out, say, plan)
    for warning in plan.warnings:
        say(f"warning: {warning}", style="yellow")


def _print_starts(out: Console, say: _Prose, plan: StudyPlan) -> None:
    """The start command once, then each configuration's part of it."""
    configurations = plan.configurations
    split = split_commands([c.words for c in configurations])
    picked = any("PORT" in word for c in configurations for word in c.words)
    port = " (PORT: a free port picked at each start)" if picked else ""
    if len(configurations) == 1:
        say(f"server command{port}:")
        _command(out, configurations[0].command, indent=2)
        return
    if not any(split.parts):
        say(f"every configuration's server runs this same command{port}:")
        _command(out, " ".join(split.head), indent=2)
        return
    if split.tail:
        say(f"each configuration's server runs this command, with its part below where {PART} stands{port}:")
        _command(out, " ".join((*split.head, PART, *split.tail)), indent=2)
    else:
        say(f"each configuration's server runs this command, then its part below{port}:")
        _command(out, " ".join(split.head), indent=2)
    for planned, part in zip(configurations, split.parts, strict=True):
        if part:
            say(f"{_planned_label(planned, plan)}:", indent=2)
            _command(out, " ".join(part), indent=4)
        else:
            say(f"{_planned_label(planned, plan)}: nothing added", indent=2)


def _print_stops(out: Console, say: _Prose, plan: StudyPlan) -> None:
    """How each server is stopped and what the next start waits for (per configuration where the
    stop commands differ between them, through a placeholder)."""
    stops = {c.stop for c in plan.configurations}
    if not any(s.stop or s.signals or s.wait_free or s.port for s in stops):
        return  # attach mode without wait_free: the user stops the server
    if len(stops) == 1:
        say("once a configuration is measured, before the next start:")
        _print_stop(out, say, next(iter(stops)), indent=2)
        return
    say("once a configuration is measured, before the next start, per configuration:")
    for c in plan.configurations:
        say(f"{_planned_label(c, plan)}:", indent=2)
        _print_stop(out, say, c.stop, indent=4)


def _print_stop(out: Console, say: _Prose, stop: PlannedStop, *, indent: int) -> None:
    then = ""
    if stop.stop is not None:
        say(f"the server is stopped with (given {stop.stop_timeout_s:g} s):", indent=indent)
        _command(out, stop.stop, indent=indent + 2)
        then = "then "
    if stop.signals:
        say(
            f"{then}what the start command left running gets SIGTERM, SIGKILL after {stop.grace_s:g} s "
            "(server.stop_grace_s)",
            indent=indent,
        )
        then = "then "
    if stop.wait_free is not None:
        say(
            f"{then}this runs every {stop.wait_every_s:g} s until it succeeds (at most {stop.wait_timeout_s:g} s, "
            "server.ready_timeout_s):",
            indent=indent,
        )
        _command(out, stop.wait_free, indent=indent + 2)
    if stop.port is not None:
        say(f"the next start waits up to {stop.port_wait_s:g} s for port {stop.port} to be free", indent=indent)


class _Prose:
    """Prints prose wrapped to the console's width, at most PROSE_WIDTH columns."""

    def __init__(self, out: Console) -> None:
        self.out = out

    def __call__(self, text: str, *, indent: int = 0, style: str = "") -> None:
        width = min(self.out.width, PROSE_WIDTH)
        lines = textwrap.wrap(
            text, width=width, initial_indent=" " * indent, subsequent_indent=" " * (indent + 4),
            break_long_words=False, break_on_hyphens=False,
        )  # fmt: skip
        for line in lines:
            self.out.print(Text(line, style=style), soft_wrap=True)


def _command(out: Console, command: str, *, indent: int) -> None:
    """A command on lines of its own, whole: never wrapped or cut (a shell script keeps its lines)."""
    out.print(Text(" " * indent + command), soft_wrap=True)


def _planned_label(planned: PlannedConfiguration, plan: StudyPlan) -> str:
    """A planned configuration's label, with ``(baseline)`` after a speculative baseline."""
    c = planned.configuration
    return configuration_label(c) + (" (baseline)" if c.spec is not None and c == plan.baseline else "")
