"""Brings real studies kept before each level's prefill speed was kept up to date, in place.

    source ~/.cache/specsweep/real-engines.env
    python bench/kept_prefill.py FOLDER [FOLDER ...]

Each FOLDER is one ``bench/search_real_llamacpp.py --folder`` keeps (``real-grid/`` and
``real-model/``). A trial's record (``trials/trial-NNNN.json``, the whole measurement) has every
level's prefill speed; the study's stored figures (``LevelFigures``) did not keep it before, nor
whether the trial's first token costs what speculation off's does (``first_token_as_off``, from
the llama.cpp engine's ``looks_up`` of its spec config). This writes both into the study's
``study.db`` where missing, so ``bench/kept_real_pastes.py`` and ``--replay`` read those starts as
a study measured now would be read. Prints how many levels and trials it filled per study.
Running it twice changes nothing more.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from pathlib import Path

from specsweep.engines.registry import engine_info
from specsweep.tuning.records import spec_from_json


def fill(study: Path) -> tuple[int, int]:
    """(levels, trials) filled in one kept study."""
    looks_up = engine_info("llama.cpp").looks_up
    levels = trials = 0
    with sqlite3.connect(study / "study.db") as db:
        rows = db.execute(
            "select t.trial_id, t.number from trials t join studies s on s.study_id = t.study_id"
        ).fetchall()
        for trial_id, number in rows:
            attrs = dict(db.execute(
                "select key, value_json from trial_user_attributes where trial_id = ?", (trial_id,)
            ).fetchall())  # fmt: skip
            if "first_token_as_off" not in attrs and "spec" in attrs:
                spec = spec_from_json(json.loads(attrs["spec"]))
                db.execute(
                    "insert into trial_user_attributes (trial_id, key, value_json) values (?, ?, ?)",
                    (trial_id, "first_token_as_off", json.dumps(spec is None or looks_up(spec))),
                )
                trials += 1
            record = study / "trials" / f"trial-{number:04d}.json"
            if "results" not in attrs or not record.is_file():
                continue
            results = json.loads(attrs["results"])
            for workload, measured in json.loads(record.read_text()).get("workloads", {}).items():
                for level in measured.get("levels") or []:
                    row = results.get(workload, {}).get(str(level["concurrency"]))
                    speed = (level.get("prefill_tokens_per_s") or {}).get("mean")
                    if row is not None and speed and row.get("prefill_tokens_per_s") is None:
                        row["prefill_tokens_per_s"] = speed
                        levels += 1
            db.execute(
                "update trial_user_attributes set value_json = ? where trial_id = ? and key = 'results'",
                (json.dumps(results), trial_id),
            )
    return levels, trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", type=Path, nargs="+")
    for folder in parser.parse_args().folders:
        studies = sorted(folder.glob("real-*/study.db"))
        if not studies:
            raise SystemExit(f"error: {folder} holds no real-*/study.db: pass a folder --folder kept")
        for db in studies:
            levels, trials = fill(db.parent)
            print(f"{db.parent}: {levels} levels given their prefill speed, {trials} trials their first token's kind")


if __name__ == "__main__":
    main()
