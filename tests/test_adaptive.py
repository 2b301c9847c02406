"""Adaptive measurement in real emulator studies, and the time a study reports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from specsweep.config import parse_study_config
from specsweep.tuning.records import read_trial_file, read_trials
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

from .builders import emulator_study, write_study


def levels_measured(folder: Path, study) -> dict[int, list[tuple[int, int, str | None]]]:
    """Per trial: (concurrency, requests, why it stopped) of every level, from the trial files."""
    out = {}
    for trial in read_trials(study):
        record = read_trial_file(folder, trial)
        if record is None:
            continue
        out[trial.number] = [
            (lv["concurrency"], lv["requests"], lv.get("stopped_by"))
            for measurement in record["workloads"].values()
            for lv in measurement["levels"]
        ]
    return out


def test_an_adaptive_study_measures_a_clear_loser_less_and_reports_its_time(tmp_path: Path) -> None:
    """Technical output on the default profile: k=5 with greedy drafting is far behind the best at
    one stream, so it stops long before the cap; every level stays between its minimum and the cap."""
    data = emulator_study(
        "adaptive", seed=31, time_scale=100, startup_s=20, k=(1, 5), workloads={"technical": 1.0},
        concurrency=(1, 4), requests=None, max_tokens=600, temperature=0.6,
        study={"sampler": "grid"}, measure={"max_requests": 12},
    )  # fmt: skip
    config = parse_study_config(data)
    paths = study_paths(config, tmp_path)
    outcome = StudyRunner(config, paths).run()
    measured = levels_measured(paths.folder, outcome.study)
    specs = {t.number: t.spec for t in read_trials(outcome.study)}
    for number, levels in measured.items():
        for concurrency, requests, why in levels:
            assert max(2, concurrency) <= requests <= 12 + concurrency, (number, levels)
            assert why in ("precise", "cannot win", "clearly ahead", "budget")
    loser = next(
        n for n, s in specs.items() if s and s.num_speculative_tokens == 5 and s.draft_sample_method == "greedy"
    )
    at_one = next(r for b, r, _ in measured[loser] if b == 1)
    assert at_one < 12 and any(why == "cannot win" for _, _, why in measured[loser]), measured[loser]
    spent = outcome.time
    assert spent.starts == outcome.restarts == len(measured) and spent.modelled
    assert spent.boot_s == 20 * spent.starts  # the emulator's modelled startup, per start
    assert spent.measure_s > 0 and spent.grid_s > spent.measure_s + spent.boot_s  # the grid at 12 costs more


def test_requests_forces_a_fixed_budget(tmp_path: Path) -> None:
    data = emulator_study(
        "fixed", seed=32, k=(2, 2), study={"sampler": "grid"}, workloads={"prose": 1.0}, concurrency=(1, 2),
        requests=None, max_tokens=60, search={"no_speculation": False, "draft_sample_method": ["probabilistic"]},
    )  # fmt: skip
    write_study(tmp_path / "s.toml", data)
    result = subprocess.run(
        [sys.executable, "-m", "specsweep", "study", "--config", "s.toml", "--requests", "3"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert "time: 1 server starts; booting" in result.stdout and "would take about" in result.stdout
    (trial_file,) = (tmp_path / "studies" / "fixed" / "trials").glob("trial-*.json")
    levels = [lv for m in json.loads(trial_file.read_text())["workloads"].values() for lv in m["levels"]]
    assert [(lv["concurrency"], lv["requests"], lv["stopped_by"]) for lv in levels] == [(1, 3, None), (2, 3, None)]
