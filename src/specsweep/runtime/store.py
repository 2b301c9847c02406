"""Writing results to files: JSON records of measurements, written atomically; logs, appended.

Neither follows a symlink planted where a file of its own goes: the atomic writers rename over
it, ``open_log`` removes it and creates the log afresh.
"""

from __future__ import annotations

import errno
import json
import math
import os
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any, BinaryIO

from specsweep import __version__
from specsweep.errors import OutputError
from specsweep.runtime.measure import Measurement
from specsweep.secrets import mask_url
from specsweep.types import RequestRecord

# Settings that must never reach a file (the endpoint's userinfo is masked: specsweep.secrets).
SECRET_SETTINGS = ("api_key",)


def _record_row(record: RequestRecord, start: float) -> dict[str, Any]:
    row = asdict(record)
    del row["chunk_times_s"]  # thousands of numbers per level; the summary keeps what they give
    row["started_at"] = record.started_at - start  # seconds from the level's first request
    return row


def measurement_to_dict(measurement: Measurement) -> dict[str, Any]:
    """A JSON-ready record of a measurement: summaries, notes and every request."""
    settings = {
        f.name: getattr(measurement.settings, f.name)
        for f in fields(measurement.settings)
        if f.name not in SECRET_SETTINGS
    }
    settings["endpoint"] = mask_url(measurement.settings.endpoint)
    if measurement.settings.targets is not None:
        settings["targets"] = {str(b): asdict(t) for b, t in measurement.settings.targets.items()}
    levels = []
    for level in measurement.levels:
        summary = asdict(level.summary)
        start = min((r.started_at for r in level.records), default=0.0)
        levels.append({
            **summary, "notes": list(level.notes), "stopped_by": level.stopped_by,
            "records": [_record_row(r, start) for r in level.records],
            "cut": [_record_row(r, start) for r in level.cut],
        })  # fmt: skip
    return finite_json(
        {
            "specsweep_version": __version__,
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "endpoint": measurement.endpoint,
            "model": measurement.model,
            "engine": measurement.engine,
            "workload": measurement.workload,
            "settings": settings,
            "error": measurement.error,
            # "modelled": the server was the emulator, and every rate and time here, request
            # records included, is in its modelled hardware's units (runtime/modelled_time.py)
            "clock": measurement.clock,
            "notes": list(measurement.notes),
            "levels": levels,
        }
    )


def finite_json(value: Any) -> Any:
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): finite_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite_json(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any, *, private: bool = False) -> None:
    """Write JSON to ``path`` through a temporary file and a rename: never a half-written file."""
    write_atomic(path, json.dumps(data, indent=2) + "\n", private=private)


def write_atomic(path: Path, content: str | bytes, *, private: bool = False) -> None:
    """Write text or bytes to ``path`` through a temporary file and a rename; ``private``: readable
    by the user only (0600), for a file that must hold a secret unmasked."""
    path = Path(path)
    make_folder(path.parent)
    try:
        mode = "wb" if isinstance(content, bytes) else "w"
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
            handle.write(content)
            temporary = handle.name
        # A temporary file is private (0600); the file it becomes is as any file the user writes.
        os.chmod(temporary, 0o600 if private else _file_mode())
        os.replace(temporary, path)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}.") from None


def make_folder(folder: Path) -> Path:
    """Create ``folder`` and its parents if missing; an OutputError that names it if it cannot be."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if isinstance(exc, FileExistsError | NotADirectoryError):
            reason = "a file is in the way of a folder on that path"
        raise OutputError(f"cannot create the folder {folder}: {reason}; choose a folder you can write.") from None
    return folder


def open_log(path: Path) -> BinaryIO:
    """Open a log for appending (its folder made if missing); a new log is readable by the user
    only (a server may print its command line, keys and all, and its log is kept as it wrote it).
    A symlink at ``path`` is removed and the log created in its place, as the atomic writers
    replace one: a log never writes through a link to another file. A link planted again between
    the removal and the open is refused."""
    path = Path(path)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(path, flags, 0o600)
        except OSError as exc:
            if exc.errno != errno.ELOOP or not path.is_symlink():
                raise
            path.unlink()  # the link itself; whatever it points at is left as it was
            descriptor = os.open(path, flags | os.O_EXCL, 0o600)
    except OSError as exc:
        raise OutputError(f"cannot write the log {path}: {exc.strerror or exc}.") from None
    return os.fdopen(descriptor, "ab")


def _file_mode() -> int:
    """0666 less the process's umask: the mode ``open()`` would give a new file. Linux says the
    umask in /proc; elsewhere it is read by setting it, which other threads could see a moment."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            umask = next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError, IndexError):
        umask = os.umask(0o022)
        os.umask(umask)
    return 0o666 & ~umask
