"""The package's annotations are checked: mypy on src/specsweep with pyproject.toml's [tool.mypy]
settings finds nothing, so a wrong type fails the suite like a failing test."""

from __future__ import annotations

from pathlib import Path

import pytest
from mypy import api

ROOT = Path(__file__).parents[1]


@pytest.mark.slow
def test_mypy_finds_no_errors() -> None:
    stdout, stderr, status = api.run(
        [
            "--config-file", str(ROOT / "pyproject.toml"),
            # The repository's cache (ignored by git): a run after a small change rechecks only what it touched.
            "--cache-dir", str(ROOT / ".mypy_cache"),
            "--no-error-summary",
            str(ROOT / "src" / "specsweep"),
        ]
    )  # fmt: skip
    assert status == 0 and not stdout.strip(), f"mypy found type errors:\n{stdout}{stderr}"
