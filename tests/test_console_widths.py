"""`measure`, `report` and `recommend` on the console at 80 and 120 columns, on a terminal and
piped, as a user runs them (a child process; rich reads COLUMNS, and FORCE_COLOR makes it a
terminal): every line within the width, 100 at most, but a paste; piped, no control codes.
(`study` and `--dry-run`: tests/test_study_console.py and tests/test_dry_run_output.py; `watch`:
tests/test_watch_view_output.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .builders import measured_study, specsweep

CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
PASTES = ("--speculative-config '{",)  # a paste line is never wrapped
SHAPES = [(80, False), (120, False), (80, True), (120, True)]


def _lines(text: str, *, width: int, terminal: bool) -> list[str]:
    if not terminal:
        assert not CONTROL.search(text), "piped output carries control codes"
    lines = CONTROL.sub("", text).splitlines()
    too_wide = [line for line in lines if len(line) > min(width, 100) and not line.lstrip().startswith(PASTES)]
    assert not too_wide, f"{len(too_wide)} lines over {min(width, 100)} columns: {too_wide[:3]}"
    return lines


def _env(width: int, terminal: bool) -> dict[str, str]:
    env = {"COLUMNS": str(width), "NO_COLOR": ""} if not terminal else {"COLUMNS": str(width), "FORCE_COLOR": "1"}
    return {k: v for k, v in env.items() if v}


@pytest.fixture(scope="module")
def stored_study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return measured_study(tmp_path_factory.mktemp("widths"), "wide", k=(1, 3))


@pytest.mark.parametrize(("width", "terminal"), SHAPES)
def test_report_prints_the_picks_table_and_the_paste_within_the_width(
    stored_study: Path, tmp_path: Path, width: int, terminal: bool
) -> None:
    result = specsweep("report", str(stored_study), "--out", str(tmp_path / "r"), env=_env(width, terminal))
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout, width=width, terminal=terminal)
    assert any(line.startswith("picks for prose") for line in lines)
    assert any(line.split()[:2] == ["concurrency", "pick"] for line in lines), "the picks as a table"
    assert any(line.startswith("--speculative-config '{") for line in lines), "the paste on one line"
    assert any(line.startswith("wrote report.md") for line in lines[-3:])


@pytest.mark.parametrize(("width", "terminal"), SHAPES)
def test_recommend_prints_the_paste_alone(stored_study: Path, width: int, terminal: bool) -> None:
    result = specsweep("recommend", str(stored_study), env=_env(width, terminal))
    assert result.returncode == 0, result.stderr
    lines = _lines(result.stdout, width=width, terminal=terminal)
    assert len(lines) == 1 and lines[0].startswith("--speculative-config '{"), lines


def test_measure_fits_the_width_on_a_terminal_and_piped(start_emulator, tmp_path: Path) -> None:
    emulator = start_emulator()
    for width, terminal in SHAPES:
        result = specsweep(
            "measure", "--endpoint", emulator.url, "--workload", "technical", "--concurrency", "1,2",
            "--requests", "2", "--max-tokens", "40", "--out", str(tmp_path / f"m{width}{terminal}"),
            env=_env(width, terminal),
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = _lines(result.stdout, width=width, terminal=terminal)
        assert any(line.startswith("single stream") for line in lines) and any("2 concurrent" in x for x in lines)
        assert any("tok/s aggregate output" in line for line in lines)
