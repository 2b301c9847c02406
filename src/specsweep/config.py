"""Parsing what users write (flags now, study files later) into values; errors name the fix."""

from __future__ import annotations

from specsweep.errors import ConfigError


def parse_concurrency(text: str, *, flag: str = "--concurrency") -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16); each level a whole number >= 1, no repeats."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be whole numbers separated by commas, e.g. 1,4; got {text!r}.") from None
    if not levels or any(level < 1 for level in levels):
        raise ConfigError(f"{flag} needs levels >= 1, e.g. 1,4; got {text!r}.")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"{flag} lists a level twice: {text!r}.")
    return levels
