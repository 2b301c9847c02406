"""The trial files beside a study: ``trials/trial-NNNN.json``, the full measurement of one trial.

A trial's figures live in the study's storage (tuning/records.py); its file keeps everything
measured (every request, the notes), written before the storage is told, so a measurement
survives whatever happens to its trial in the storage.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from specsweep.runtime.measure import Measurement
from specsweep.runtime.store import measurement_to_dict, write_json_atomic
from specsweep.tuning.records import TrialRecord

TRIALS_FOLDER = "trials"


def trial_file(number: int) -> str:
    """A trial's measurement file, relative to the study folder."""
    return f"{TRIALS_FOLDER}/trial-{number:04d}.json"


def write_trial_file(folder: Path, number: int, *, header: dict[str, Any], measurements: dict[str, Measurement]) -> str:
    """Write the full measurement of a trial (every request, the notes) beside the study."""
    name = trial_file(number)
    record = {**header, "trial": number}
    if measurements:
        record["workloads"] = {w: measurement_to_dict(m) for w, m in measurements.items()}
    write_json_atomic(folder / name, record)
    return name


def read_trial_file(folder: Path, record: TrialRecord) -> dict[str, Any] | None:
    """The full measurement of a trial (None: no file, e.g. a copied folder without ``trials/``)."""
    if not record.record_file:
        return None
    try:
        stored: dict[str, Any] = json.loads((folder / record.record_file).read_text(encoding="utf-8"))
        return stored
    except (OSError, ValueError):
        return None
