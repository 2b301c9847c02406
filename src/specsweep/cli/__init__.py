"""The ``specsweep`` command line: one module per command, errors as one line.

Usage errors (an unknown flag, a missing argument, a bad value) are typer's own: the usage line,
a hint to ``--help`` and one ``Error:`` line, exit code 2. A :class:`SpecsweepError` raised by a
command is one ``specsweep: error: ...`` line on stderr and exit code 1, its secrets masked (a URL's
password, a flag's key: ``specsweep.secrets``); an interrupt is one line and exit code 130.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any

import typer

from specsweep import __version__
from specsweep.cli import emulate, measure, recommend, report, rig, study, watch, workloads
from specsweep.errors import SpecsweepError
from specsweep.secrets import mask_text
from specsweep.tuning.interrupts import StudyInterrupted


def examples_epilog(examples: tuple[str, ...]) -> str:
    """A command's examples as its --help ends with them: a heading, then one command line each,
    kept as written (click's ``\\b`` stops it rewrapping the paragraph)."""
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in examples)


# The first commands a user runs, shown under specsweep --help (each command's own are in its module).
EXAMPLES = (
    "specsweep study --workload technical",
    "specsweep report studies/emulator-technical",
    "specsweep recommend studies/emulator-technical --format vllm",
)

app = typer.Typer(
    name="specsweep",
    help="Find the speculative-decoding settings (draft length, draft sampling) that make an "
    "inference server fastest on your workload.",
    epilog=examples_epilog(EXAMPLES),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Plain errors: a usage mistake is the usage line, a --help hint and one "Error:" line, not a panel.
    rich_markup_mode=None,
)


def _one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with the errors a user can cause turned into one line and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except StudyInterrupted as exc:
            print(f"specsweep: {mask_text(str(exc))}", file=sys.stderr)
            raise typer.Exit(130) from None
        except SpecsweepError as exc:
            print(f"specsweep: error: {mask_text(str(exc))}", file=sys.stderr)
            raise typer.Exit(1) from None
        except KeyboardInterrupt:
            print("specsweep: interrupted.", file=sys.stderr)
            raise typer.Exit(130) from None

    return run


for _name, _module in (
    ("study", study),
    ("measure", measure),
    ("report", report),
    ("recommend", recommend),
    ("rig", rig),
    ("emulate", emulate),
    ("workloads", workloads),
    ("watch", watch),
):
    app.command(_name, epilog=examples_epilog(_module.EXAMPLES))(_one_line_errors(getattr(_module, _name)))


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specsweep {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Find the speculative-decoding settings that make an inference server fastest."""


def main() -> None:
    """Entry point: typer's standalone mode exits with the command's code (2 for a usage error)."""
    sys.argv[1:] = old_spellings(sys.argv[1:])
    app(prog_name="specsweep")


def old_spellings(args: list[str]) -> list[str]:
    """Command lines in spellings from before options meant one thing everywhere, kept working for
    now: ``measure --json FILE`` (now ``--out DIR``; ``--json`` alone prints JSON, as in watch)."""
    if args[:1] != ["measure"]:
        return args
    out = list(args)
    for i, arg in enumerate(out):
        if arg.startswith("--json="):
            out[i] = "--json-file=" + arg.removeprefix("--json=")
        elif arg == "--json" and i + 1 < len(out) and not out[i + 1].startswith("-"):
            out[i] = "--json-file"
    return out
