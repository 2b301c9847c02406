"""Flag values checked while the command line is parsed, so a bad one is a usage error (exit 2)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from urllib.parse import urlsplit

import typer

from specsweep.config import parse_concurrency
from specsweep.errors import ConfigError
from specsweep.secrets import mask_url


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


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds_of(text: str, *, flag: str) -> float:
    """``90``, ``90s``, ``15m``, ``6h``, ``1d`` (or ``0.5s``) in seconds; ConfigError otherwise."""
    value = text.strip().lower()
    unit = _UNITS.get(value[-1:])
    number = value[:-1] if unit is not None else value
    try:
        seconds = float(number) * (unit or 1.0)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not a duration such as 30s, 15m, 6h or 1d.") from None
    if not seconds > 0:
        raise ConfigError(f"{flag} must be longer than 0 (got {text!r}).")
    return seconds


def check_duration(value: str | None) -> str | None:
    """A duration flag's value, checked while the command line is parsed."""
    if value is not None:
        try:
            seconds_of(value, flag="the value")
        except ConfigError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def check_url(value: str | None) -> str | None:
    """A server's base URL: it names its scheme (httpx sends nothing without one), a host, and a
    port from 1 to 65535 if any."""
    if value is None:
        return value
    if not value.startswith(("http://", "https://")):
        bare = mask_url("http://" + value.split("://", 1)[-1]).removeprefix("http://")  # userinfo masked
        shown = mask_url(value) if "://" in value else bare
        raise typer.BadParameter(f"{shown!r} has no http:// or https://; write http://{bare} (or https://).")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise typer.BadParameter(f"{mask_url(value)!r} is not a URL ({exc}).") from None
    if not parts.hostname or any(c.isspace() for c in value):
        raise typer.BadParameter(f"{mask_url(value)!r} names no host; write e.g. http://127.0.0.1:8000.")
    if port == 0:
        raise typer.BadParameter(f"{mask_url(value)!r}: port 0 is no server's port.")
    return value


def check_finite(value: float | None) -> float | None:
    """A number flag's value that is a number: not nan, not inf (typer's float takes both)."""
    if value is not None and not math.isfinite(value):
        raise typer.BadParameter(f"must be a finite number; got {value!r}.")
    return value
