"""The ``specsweep`` command line: one module per command, errors as one line."""

from __future__ import annotations

import sys

import click
import typer

from specsweep import __version__
from specsweep.cli import emulate, measure, recommend, report, rig, study, workloads
from specsweep.errors import SpecsweepError
from specsweep.tuning.study import StudyInterrupted

app = typer.Typer(
    name="specsweep",
    help="Find the speculative-decoding settings (draft length, draft sampling) that make an "
    "inference server fastest on your workload.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.command("study")(study.study)
app.command("measure")(measure.measure)
app.command("report")(report.report)
app.command("recommend")(recommend.recommend)
app.command("rig")(rig.rig)
app.command("emulate")(emulate.emulate)
app.command("workloads")(workloads.workloads)


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
    """Entry point: run the app; a SpecsweepError becomes one line on stderr and exit code 1."""
    try:
        code = app(standalone_mode=False)  # returns the code of a typer.Exit
        sys.exit(code if isinstance(code, int) else 0)
    except StudyInterrupted as exc:
        print(f"specsweep: {exc}", file=sys.stderr)
        sys.exit(130)
    except SpecsweepError as exc:
        print(f"specsweep: error: {exc}", file=sys.stderr)
        sys.exit(1)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.Abort:
        print("specsweep: aborted.", file=sys.stderr)
        sys.exit(130)
    except KeyboardInterrupt:
        print("specsweep: interrupted.", file=sys.stderr)
        sys.exit(130)
