"""Flag values checked while the command line is parsed, so a bad one is a usage error (exit 2)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import typer

from specsweep.config import parse_concurrency
from specsweep.errors import ConfigError


def check_levels(value: str | None) -> str | None:
    """A ``--concurrency`` value such as ``1,4,16``: whole numbers >= 1, no repeats."""
    if value is not None:
        try:
            parse_concurrency(value, flag="the value")
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def one_of(choices: Sequence[str]) -> Callable[[str | None], str | None]:
    """A check that the flag's value is one of ``choices`` (or not given)."""

    def check(value: str | None) -> str | None:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"must be one of {', '.join(choices)}; got {value!r}.")
        return value

    return check
