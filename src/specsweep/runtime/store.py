"""Writing results to files: JSON records of measurements, written atomically."""

from __future__ import annotations

import json
import math
import os
import tempfile
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from specsweep import __version__
from specsweep.errors import OutputError
from specsweep.runtime.measure import Measurement
from specsweep.types import RequestRecord

# Settings that must never reach a file.
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


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to ``path`` through a temporary file and a rename: never a half-written file."""
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def write_atomic(path: Path, content: str | bytes) -> None:
    """Write text or bytes to ``path`` through a temporary file and a rename."""
    path = Path(path)
    make_folder(path.parent)
    try:
        mode = "wb" if isinstance(content, bytes) else "w"
        with tempfile.NamedTemporaryFile(mode, dir=path.parent, prefix=f".{path.name}.", delete=False) as handle:
            handle.write(content)
            temporary = handle.name
        # A temporary file is private (0600); the file it becomes is as any file the user writes.
        os.chmod(temporary, _file_mode())
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
