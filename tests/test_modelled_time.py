"""The emulator's clock undone in runtime/ (runtime/modelled_time.py), against the arithmetic of a
server that runs ``s`` times faster than the hardware it models: rates over ``s``, times times ``s``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from specsweep.measurement.levels import summarize_level
from specsweep.runtime.driver import LevelRun
from specsweep.runtime.modelled_time import (
    ITL_TIME_SCALE_LIMIT,
    ServerClock,
    clock_from_version,
    stored_in_modelled_time,
)
from specsweep.tuning.records import results_from_stored, results_to_stored
from specsweep.types import MetricsSnapshot, RequestRecord

SRC = Path(__file__).resolve().parents[1] / "src" / "specsweep"


def wall_run() -> LevelRun:
    """Two streams, each answering 100 tokens in 0.5 s of wall clock, 0.05 s to the first token."""
    records = tuple(
        RequestRecord(
            prompt_id=str(i),
            started_at=10.0 + 0.01 * i,
            max_tokens=100,
            completion_tokens=100,
            ttft_s=0.05,
            last_token_s=0.5,
            latency_s=0.5,
            num_chunks=4,
            chunk_tokens=(25,) * 4,
            chunk_times_s=(0.05, 0.2, 0.35, 0.5),
        )
        for i in range(2)
    )
    return LevelRun(concurrency=2, started_at=10.0, ended_at=10.51, records=records)


def summary(run: LevelRun, clock: ServerClock):
    return summarize_level(run.records, concurrency=2, wall_s=run.wall_s, delta=None, itl=clock.resolves_steps)


def test_a_level_on_a_fast_emulator_reads_in_the_modelled_hardware_units() -> None:
    wall = summary(wall_run(), ServerClock())
    clock = ServerClock(5.0)
    modelled = summary(clock.run(wall_run()), clock)
    assert modelled.output_tokens_per_s == pytest.approx(wall.output_tokens_per_s / 5)
    assert modelled.wall_s == pytest.approx(wall.wall_s * 5)
    assert modelled.ttft_s.p50 == pytest.approx(wall.ttft_s.p50 * 5)
    assert modelled.decode_tokens_per_s_per_stream.p50 == pytest.approx(wall.decode_tokens_per_s_per_stream.p50 / 5)
    assert modelled.tpot.p50_s == pytest.approx(wall.tpot.p50_s * 5)
    assert modelled.itl.p50_s == pytest.approx(wall.itl.p50_s * 5)  # 5 resolves the steps
    fast = ServerClock(ITL_TIME_SCALE_LIMIT * 2)
    assert summary(fast.run(wall_run()), fast).itl is None  # too fast: chunk gaps are not the steps
    assert clock.name == "modelled" and ServerClock().name == "wall clock" and not ServerClock().notes()
    assert any("5 times faster" in note for note in clock.notes())


def test_counter_rates_between_two_scrapes_are_modelled_too() -> None:
    clock = ServerClock(50.0)
    before = clock.snapshot(MetricsSnapshot(taken_at=2.0, samples={}))
    after = clock.snapshot(MetricsSnapshot(taken_at=3.0, samples={}))
    assert after.taken_at - before.taken_at == pytest.approx(50.0)  # one wall second, fifty modelled


def test_the_clock_is_read_from_what_the_server_says_it_is() -> None:
    assert clock_from_version({"version": "0.33.0", "emulator": {"time_scale": 100}}).time_scale == 100
    assert clock_from_version({"version": "0.33.0"}) == ServerClock()  # a real vLLM: wall clock
    assert clock_from_version(None) == ServerClock()
    assert clock_from_version({"emulator": {"time_scale": "fast"}}) == ServerClock()


def stored(**top) -> dict:
    record = {"started_at": 0.0, "ttft_s": 0.05, "last_token_s": 0.5, "latency_s": 0.5, "completion_tokens": 100}
    level = {"concurrency": 1, "output_tokens_per_s": 200.0, "saturated_output_tokens_per_s": 210.0,
             "records": [record], "cut": []}  # fmt: skip
    return {"workload": "technical", "levels": [level], **top}


def test_a_study_stored_before_the_clock_was_undone_reads_in_the_rig_units() -> None:
    clock = ServerClock(100.0)
    old = stored_in_modelled_time(stored(time_scale=1.0), clock)  # a study's trial file: all wall clock
    (level,) = old["levels"]
    assert level["output_tokens_per_s"] == pytest.approx(2.0) and level["saturated_output_tokens_per_s"] == 2.1
    assert level["records"][0]["last_token_s"] - level["records"][0]["ttft_s"] == pytest.approx(45.0)
    # `measure --json` had undone its summaries already: only the requests' times change
    measured = stored_in_modelled_time(stored(time_scale=100.0), clock)["levels"][0]
    assert measured["output_tokens_per_s"] == 200.0 and measured["records"][0]["latency_s"] == pytest.approx(50.0)
    # stored since: it says its clock, and nothing is scaled twice
    new = stored(clock="modelled")
    assert stored_in_modelled_time(new, clock) is new
    assert stored_in_modelled_time(stored(time_scale=1.0), ServerClock())["levels"][0]["output_tokens_per_s"] == 200


def test_a_trial_file_keeps_the_whole_levels_rate_under_its_own_name_and_reads_the_old_one() -> None:
    """The whole level's rate was stored as "wall_clock_output_tokens_per_s", which said a clock it
    is not on (it is modelled on the emulator): files of either name read the same."""
    figures = {"output_tokens_per_s": 210.0, "errors": 0, "requests": 4}
    old = results_from_stored({"prose": {"1": {**figures, "wall_clock_output_tokens_per_s": 200.0}}})
    assert old["prose"][1].whole_level_output_tokens_per_s == 200.0
    stored_now = results_to_stored(old)
    assert "wall_clock_output_tokens_per_s" not in stored_now["prose"]["1"]
    assert results_from_stored(stored_now) == old


def test_the_time_scale_is_named_only_where_the_emulator_is_run_or_its_clock_undone() -> None:
    allowed_dirs = {"runtime", "emulator"}
    allowed_files = {"config.py", "server_config.py", "cli/emulate.py"}
    named = []
    for path in SRC.rglob("*.py"):
        relative = path.relative_to(SRC)
        if relative.parts[0] in allowed_dirs or relative.as_posix() in allowed_files:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        names |= {a.arg for n in ast.walk(tree) if isinstance(n, ast.arguments) for a in n.args + n.kwonlyargs}
        if "time_scale" in names:
            named.append(str(relative))
    assert named == [], f"the emulator's time scale is used above runtime/ in {named}"
