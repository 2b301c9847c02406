"""Project-wide rules checked mechanically: the layer contracts and a clean lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)


def test_layer_contracts_hold() -> None:
    """analysis/ and engines/ import no I/O library; layers import downwards only."""
    tool = shutil.which("lint-imports") or pytest.fail("import-linter is not installed (pip install -e '.[test]')")
    result = run(tool, "--no-cache")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "broken" not in result.stdout.split("Contracts:")[-1].replace("0 broken", "")


def test_ruff_is_clean() -> None:
    result = run(sys.executable, "-m", "ruff", "check", ".")
    assert result.returncode == 0, result.stdout[-3000:]
    result = run(sys.executable, "-m", "ruff", "format", "--check", ".")
    assert result.returncode == 0, result.stdout[-3000:]


def test_every_command_has_help() -> None:
    """Every registered command answers --help with its description and options."""
    from specsweep.cli import app

    commands = [c.name for c in app.registered_commands]
    assert {"study", "measure", "emulate", "workloads"} <= set(commands)
    result = run(sys.executable, "-m", "specsweep", "--help")
    assert result.returncode == 0
    for command in commands:
        assert command in result.stdout
        sub = run(sys.executable, "-m", "specsweep", command, "--help")
        assert sub.returncode == 0 and "--help" in sub.stdout and len(sub.stdout) > 300, command
