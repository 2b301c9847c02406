"""Adaptive measurement in real emulator studies, and the time a study reports."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from specsweep.config import parse_study_config
from specsweep.engines import vllm
from specsweep.measurement.stopping import LevelTarget
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.runtime.scraper import scrape_metrics
from specsweep.tuning.records import read_trials
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.tuning.trial_files import read_trial_file
from specsweep.workload import load_workload

from .builders import emulator_study, write_study
from .conftest import print_truth


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
    assert spent.starts == outcome.starts == len(measured) and spent.modelled
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
    assert re.search(r"^time: .+, 1 start \(.+ booting\); a grid of \d+: about ", result.stdout, re.M), result.stdout
    (trial_file,) = (tmp_path / "studies" / "fixed" / "trials").glob("trial-*.json")
    levels = [lv for m in json.loads(trial_file.read_text())["workloads"].values() for lv in m["levels"]]
    assert [(lv["concurrency"], lv["requests"], lv["stopped_by"]) for lv in levels] == [(1, 3, None), (2, 3, None)]


SPEC5 = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'


def test_a_level_that_has_measured_enough_cuts_its_requests_in_flight(start_emulator) -> None:
    """Four streams of 600 tokens stopped at one request per stream: the three sent meanwhile are
    closed mid-stream and the server aborts them (its running gauge falls to zero, its abort count
    grows by three) instead of running a second round; the tokens they streamed before the cut
    still count, so the saturated rate is the emulator's truth."""
    server = start_emulator(speculative_config=SPEC5, seed=5)
    settings = MeasureSettings(
        endpoint=server.url, concurrency=(4,), requests=32, max_tokens=600, temperature=0.6, seed=5,
        targets={4: LevelTarget(concurrency=4, min_requests=4, max_requests=32, precision=1.0)},
    )  # fmt: skip
    (level,) = run_measure(settings, load_workload("prose")).levels
    assert level.stopped_by == "precise" and level.summary.requests == 4
    assert level.summary.cut_requests == len(level.cut) == 3
    assert all(r.cut and not r.ok and r.completion_tokens is None and r.chunk_tokens for r in level.cut)
    longest = max(r.latency_s for r in level.records)
    assert level.summary.wall_s < 1.25 * longest  # one round, not a second one run to its end

    async def server_state() -> tuple[float | None, float | None]:
        async with httpx.AsyncClient(base_url=server.url) as http:
            for _ in range(50):
                snapshot = await scrape_metrics(http)
                running = snapshot.total(vllm.NUM_REQUESTS_RUNNING)
                if running == 0:
                    break
                await asyncio.sleep(0.05)
            return running, snapshot.total(vllm.REQUEST_SUCCESS + "_total", finished_reason="abort")

    running, aborted = asyncio.run(server_state())
    assert running == 0 and aborted == 3
    truth = print_truth("--speculative-config", SPEC5, "--concurrency", "4", "--temperature", "0.6")["prose"]
    (expected,) = truth["levels"]
    assert level.summary.saturated_output_tokens_per_s == pytest.approx(expected["output_tokens_per_s"], rel=0.1)
