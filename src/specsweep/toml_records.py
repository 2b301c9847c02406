"""TOML tables read against the frozen records they fill.

A record's fields say everything about its table: the keys it may hold (the field names), what
a missing key means (the field's default) and, for a field that is a record itself, a nested
table. So a parser states only its checks, never a key list or a default a second time.

Field metadata marks the two kinds of field that are not a key of their record's table:
``NAMES_TABLE`` (a table of its own whose keys the user names, such as ``[workloads]``) and
``NOT_IN_FILE`` (filled in by the loader, such as the file's name). Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import MISSING, dataclass, fields, is_dataclass
from typing import Any

from specsweep.errors import ConfigError

NAMES_TABLE = {"toml": "names"}
NOT_IN_FILE = {"toml": "none"}

_TYPE_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}
_FROM_RECORD: Any = object()


def record_keys(record: type, table: str, prefix: str = "") -> dict[str, tuple[str, ...]]:
    """``{table: keys}`` for ``record``, then its nested tables (named ``prefix`` + field), in field order."""
    keys: list[str] = []
    nested: dict[str, tuple[str, ...]] = {}
    for spec in fields(record):
        role = spec.metadata.get("toml")
        if role == "names":
            nested[prefix + spec.name] = ()
        elif is_dataclass(spec.default_factory):  # a record of its own: a nested table
            path = prefix + spec.name
            nested |= record_keys(spec.default_factory, path, path + ".")
        elif role != "none":
            keys.append(spec.name)
    return {table: tuple(keys), **nested}


def record_default(record: type, key: str) -> Any:
    """The default of ``record``'s field ``key``, a tuple as the list a TOML file would write."""
    spec = next(spec for spec in fields(record) if spec.name == key)
    if spec.default is not MISSING:
        value = spec.default
    elif spec.default_factory is not MISSING:
        value = spec.default_factory()
    else:
        raise KeyError(f"{record.__name__}.{key} has no default")
    return list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordTable:
    """One table of a TOML file, read against the record whose field defaults fill its gaps."""

    values: dict[str, Any]
    path: str  # the table's key path, e.g. "server.emulator"
    record: type
    source: str  # the file, first in every error

    def raw(self, key: str) -> Any:
        """The value as written, unchecked, or the record's default."""
        return self.values[key] if key in self.values else record_default(self.record, key)

    def get(self, key: str, kind: type, *, default: Any = _FROM_RECORD) -> Any:
        """The value checked as ``kind`` (a whole number is a number too), or the default."""
        if key not in self.values:
            return record_default(self.record, key) if default is _FROM_RECORD else default
        value = self.values[key]
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{self.source}: {self.path}.{key} must be {_TYPE_NAMES[kind]} (got {value!r}).")
        if kind is float and not math.isfinite(value):  # TOML writes nan and inf; no setting means them
            raise ConfigError(f"{self.source}: {self.path}.{key} must be a finite number (got {value!r}).")
        return value

    def choice(self, key: str, choices: tuple[str, ...], *, default: Any = _FROM_RECORD) -> str:
        """A string that must be one of ``choices``."""
        value = self.get(key, str, default=default)
        if value not in choices:
            raise ConfigError(f"{self.source}: {self.path}.{key} must be one of {', '.join(choices)} (got {value!r}).")
        return value

    def nested(self, key: str, record: type) -> RecordTable:
        """The table under ``key`` (empty if absent), read against ``record``."""
        return RecordTable(
            values=self.values.get(key, {}), path=f"{self.path}.{key}", record=record, source=self.source
        )
