"""The ``specsweep`` command line: one module per command, errors as one line.

Usage errors (an unknown flag, a missing argument, a bad value) are typer's own: the usage line,
a hint to ``--help`` and one ``Error:`` line, exit code 2. A :class:`SpecsweepError` raised by a
command is one ``specsweep: error: ...`` line on stderr and exit code 1, its secrets masked (a URL's
password, a flag's key: ``specsweep.secrets``); an interrupt is one line and exit code 130.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import Any

import typer

from specsweep import __version__
from specsweep.errors import SpecsweepError
from specsweep.secrets import mask_text

COMMANDS = ("study", "measure", "report", "recommend", "rig", "emulate", "workloads", "watch")


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


def _one_line_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """``command`` with the errors a user can cause turned into one line and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except SpecsweepError as exc:  # a study stopped by its user (130) is not an error
            label = "" if exc.exit_code == 130 else "error: "
            print(f"specsweep: {label}{mask_text(str(exc))}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            print("specsweep: interrupted.", file=sys.stderr)
            raise typer.Exit(130) from None

    return run


def _version(value: bool) -> None:
    if value:
        typer.echo(f"specsweep {__version__}")
        raise typer.Exit()


def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Find the speculative-decoding settings that make an inference server fastest."""


def build_app(commands: Sequence[str] = COMMANDS) -> typer.Typer:
    """The command line with ``commands``, each imported from its module (``specsweep.cli.NAME``)."""
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
    app.callback()(_root)
    for name in commands:
        module = importlib.import_module(f"specsweep.cli.{name}")
        app.command(name, epilog=examples_epilog(module.EXAMPLES))(_one_line_errors(getattr(module, name)))
    return app


def __getattr__(name: str) -> Any:
    """``specsweep.cli.app``: every command, built on first use."""
    if name != "app":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    app = globals()["app"] = build_app()
    return app


def main() -> None:
    """Entry point: typer's standalone mode exits with the command's code (2 for a usage error)."""
    sys.argv[1:] = old_spellings(sys.argv[1:])
    # A command imports its own module alone: the emulator, started once per server start of a
    # study on it, then starts in under a second, where every command's imports take over two.
    named = [arg for arg in sys.argv[1:2] if arg in COMMANDS]
    build_app(named or COMMANDS)(prog_name="specsweep")


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
