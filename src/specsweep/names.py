"""Names that become paths: a study's folder, an imported workload's file, a report's files.

A name the user chooses for something specsweep writes is one path component: letters, digits,
'.', '_' or '-', starting with a letter or a digit, so ``..``, ``/tmp/x`` and ``a/b`` never
reach a path and every file lands inside the folder chosen for it. ``check_name`` is the one
check; ``file_part`` turns a name chosen for another purpose (a workload given as a path) into
one such component for the files named after it.
"""

from __future__ import annotations

import re

from specsweep.errors import ConfigError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")
_OUTSIDE = re.compile(r"[^A-Za-z0-9._-]+")


def check_name(name: object, *, what: str) -> str:
    """``name`` if it can be one file or folder name inside its folder, else a ConfigError naming
    ``what`` (the key or flag it came from)."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(
            f"{what} must be letters, digits, '.', '_' or '-', starting with a letter or a digit, at most "
            f"81 characters: it names a folder or file inside the one chosen for it (got {name!r})."
        )
    return name


def file_part(name: str) -> str:
    """A name that passes ``check_name``, made from any text: the text itself when it passes, else
    its runs of other characters as '_' (``../data/x.jsonl`` -> ``data_x.jsonl``)."""
    if NAME_PATTERN.match(name):
        return name
    part = _OUTSIDE.sub("_", name).strip("._-")[:81]
    return part if NAME_PATTERN.match(part) else "unnamed"
