"""Usage errors are typer's: the usage line, a hint to --help, one Error line, exit code 2.

Errors a command meets while it runs (a SpecsweepError) are one ``specsweep: error:`` line and
exit code 1. Neither ever shows a traceback. Each case runs the installed command line as a
user would.
"""

from __future__ import annotations

import subprocess

import pytest

from .builders import specsweep

COMMANDS = ("study", "measure", "report", "recommend", "rig", "emulate", "workloads")


def assert_usage_error(result: subprocess.CompletedProcess[str], command: str, says: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr + result.stdout
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines[0].startswith(f"Usage: specsweep {command}".rstrip()), lines
    assert lines[1] == f"Try 'specsweep {command} --help' for help.".replace("  ", " "), lines
    errors = [line for line in lines if line.startswith("Error:")]
    assert len(errors) == 1 and len(lines) == 3, lines
    assert says in errors[0], errors[0]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_flag_is_a_usage_error(command: str) -> None:
    result = specsweep(command, "--bogus")
    assert_usage_error(result, command, "No such option")  # typer 0.29 adds ": --bogus", earlier ones " '--bogus'."
    assert "--bogus" in result.stderr


def test_an_unknown_command_is_a_usage_error() -> None:
    assert_usage_error(specsweep("studdy"), "", "No such command 'studdy'")


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("rig",), "Missing argument"),
        (("measure",), "Missing option '--endpoint'"),
    ],
)
def test_a_missing_argument_is_a_usage_error(argv: tuple[str, ...], says: str) -> None:
    assert_usage_error(specsweep(*argv), argv[0], says)


def test_a_flag_without_its_value_is_one_line_and_exit_2() -> None:
    """The parser stops before it knows the command's usage line: the error line alone."""
    result = specsweep("measure", "--endpoint")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == "Error: Option '--endpoint' requires an argument."


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (("measure", "--endpoint", "http://127.0.0.1:1", "--requests", "many"), "'--requests'"),
        (("measure", "--endpoint", "http://127.0.0.1:1", "--requests", "0"), "'--requests'"),
        (("measure", "--endpoint", "http://127.0.0.1:1", "--concurrency", "1,x"), "'--concurrency'"),
        (("measure", "--endpoint", "http://127.0.0.1:1", "--api", "grpc"), "chat, completions"),
        (("recommend", "studies/x", "--format", "yaml"), "vllm, vllm-yaml"),
        (("report", "studies/x", "--format", "yaml"), "'--format'"),
        (("emulate", "--print-truth", "--concurrency", "0"), "'--concurrency'"),
        (("study", "--trials", "-3"), "'--trials'"),
    ],
)
def test_a_bad_value_is_a_usage_error(argv: tuple[str, ...], says: str) -> None:
    assert_usage_error(specsweep(*argv), argv[0], says)


def test_an_error_while_running_is_one_line_and_exit_1(tmp_path) -> None:
    result = specsweep("report", str(tmp_path / "nowhere"))
    assert result.returncode == 1
    assert result.stderr.startswith("specsweep: error: ") and result.stderr.count("\n") == 1
    assert "holds no study.db" in result.stderr and result.stdout == ""


def test_version_and_help_exit_0() -> None:
    version = specsweep("--version")
    assert version.returncode == 0 and version.stdout.startswith("specsweep ")
    bare = specsweep()
    assert bare.returncode in (0, 2) and "Usage: specsweep" in bare.stdout + bare.stderr
