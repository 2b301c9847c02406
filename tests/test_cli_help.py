"""What ``--help`` tells a user: an example for every command that the command's own parser
takes, one spelling per option (older ones still accepted, not shown), and ``study``'s
overrides of the [measure] table, each reaching the study and each bad value refused as a usage
error.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from specsweep.cli import app

from .builders import emulator_study, specsweep, write_study
from .test_cli_errors import assert_usage_error

# typer 0.29 carries its own copy of click: its classes are read by what they hold, not their type.
COMMANDS = dict(typer.main.get_command(app).commands)  # type: ignore[attr-defined]


def help_of(name: str) -> str:
    result = CliRunner().invoke(app, [name, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.output


def examples_in(help_text: str) -> list[str]:
    """The command lines under the help's "Examples:" heading."""
    assert "Examples:" in help_text, help_text
    after = help_text.split("Examples:", 1)[1]
    return [line.strip() for line in after.splitlines() if line.strip().startswith("specsweep ")]


def test_every_command_is_covered() -> None:
    assert set(COMMANDS) == {"study", "measure", "report", "recommend", "emulate", "watch", "rig", "workloads"}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_help_ends_with_examples_its_parser_takes(name: str) -> None:
    """Each example names this command and parses with its parser: every option exists, every value
    passes the option's own checks (types, ranges, callbacks), nothing is run."""
    examples = examples_in(help_of(name))
    assert examples, name
    for line in examples:
        argv = shlex.split(line)
        assert argv[:2] == ["specsweep", name], line
        command = COMMANDS[name]
        with command.make_context(name, argv[2:]) as ctx:  # raises a UsageError on any bad flag or value
            assert ctx.params is not None


def test_the_top_help_ends_with_examples_the_commands_take() -> None:
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    for line in examples_in(result.output):
        argv = shlex.split(line)
        with COMMANDS[argv[1]].make_context(argv[1], argv[2:]) as ctx:
            assert ctx.params is not None


def test_workloads_import_has_its_example() -> None:
    assert any(line.startswith("specsweep workloads import ") for line in examples_in(help_of("workloads")))


def test_the_readme_shows_every_example() -> None:
    """The README's command reference is the examples --help shows, the emulator's among them."""
    readme = (Path(__file__).parents[1] / "README.md").read_text(encoding="utf-8")
    for name in COMMANDS:
        for line in examples_in(help_of(name)):
            assert line in readme, line


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_each_shown_option_has_one_spelling_and_one_default(name: str) -> None:
    for param in COMMANDS[name].params:
        if param.param_type_name != "option" or param.hidden:
            continue
        assert len(param.opts) + len(param.secondary_opts) == 1, (name, param.opts)
        if param.default not in (None, False):  # shown by typer as [default: ...]; not said again
            assert "default" not in (param.help or "").lower(), (name, param.opts, param.help)


@pytest.mark.parametrize(
    ("name", "old", "new", "value"),
    [
        ("report", "--snippet-format", "--format", "sglang"),
        ("watch", "--snippet-format", "--format", "json"),
        ("watch", "--report", "--out", "out"),
        ("emulate", "-sc", "--speculative-config", '{"num_speculative_tokens":5}'),
    ],
)
def test_old_spellings_are_accepted_and_hidden(name: str, old: str, new: str, value: str) -> None:
    command = COMMANDS[name]
    with command.make_context(name, [old, value]) as ctx:
        assert value in {str(v) for v in ctx.params.values() if v is not None}
    shown = help_of(name)
    assert new in shown and f"{old} " not in shown and f"{old}," not in shown


def test_old_spellings_of_format_are_checked_as_the_new_one() -> None:
    with pytest.raises(typer.BadParameter):
        COMMANDS["report"].make_context("report", ["--snippet-format", "html"])


def test_the_short_speculative_config_gives_the_same_truth() -> None:
    spec = '{"num_speculative_tokens":3}'
    runs = [
        CliRunner().invoke(app, ["emulate", "--print-truth", flag, spec, "--concurrency", "1"])
        for flag in ("--speculative-config", "-sc")
    ]
    assert all(r.exit_code == 0 for r in runs), [r.output for r in runs]
    assert runs[0].output == runs[1].output


def test_study_overrides_reach_the_plan() -> None:
    result = specsweep(
        "study", "--workload", "technical", "--concurrency", "2,8", "--max-tokens", "300",
        "--temperature", "0.6", "--requests", "5", "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr  # prose wrapped at the width: compared word by word
    assert "levels: concurrency 2, 8; requests exactly 5 per level; max_tokens 300, temperature 0.6" in " ".join(
        result.stdout.split()
    )
    # the built-in study's objective follows its levels
    assert "objective: aggregate output tok/s at concurrency 2" in " ".join(result.stdout.split())


def test_study_overrides_apply_over_a_study_file(tmp_path) -> None:
    path = write_study(tmp_path / "s.toml", emulator_study("over", concurrency=(1, 4), max_tokens=60, requests=2))
    result = specsweep(
        "study", "--config", str(path), "--concurrency", "1,4,16", "--max-tokens", "90",
        "--temperature", "1.0", "--requests", "3", "--dry-run",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "levels: concurrency 1, 4, 16; requests exactly 3 per level; max_tokens 90, temperature 1" in " ".join(
        result.stdout.split()
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("--concurrency", "0,4"), "--concurrency"),
        (("--concurrency", "1,1"), "twice"),
        (("--max-tokens", "0"), "--max-tokens"),
        (("--max-tokens", "100000000"), "--max-tokens (100,000,000) leaves no room for a prompt"),
        (("--temperature", "2.5"), "--temperature"),
        (("--temperature", "inf"), "--temperature"),
        (("--requests", "0"), "--requests"),
    ],
)
def test_bad_study_overrides_are_usage_errors(args: tuple[str, ...], says: str) -> None:
    assert_usage_error(specsweep("study", *args, "--dry-run"), "study", says)


def test_levels_without_the_files_objective_are_a_usage_error(tmp_path) -> None:
    path = write_study(tmp_path / "s.toml", emulator_study("obj", concurrency=(1, 4), objective={"concurrency": 4}))
    result = specsweep("study", "--config", str(path), "--concurrency", "1,16", "--dry-run")
    assert_usage_error(result, "study", "leaves out objective.concurrency (4)")


def test_a_resumed_study_refuses_other_overrides(tmp_path) -> None:
    """A study resumed with another --temperature or --concurrency is refused in one line naming the key."""
    path = write_study(tmp_path / "s.toml", emulator_study("resumed", k=(1, 1), concurrency=(1,), max_tokens=20))
    common = ("study", "--config", str(path), "--studies-dir", str(tmp_path / "studies"))
    first = specsweep(*common, "--trials", "1")
    assert first.returncode == 0, first.stderr
    for flag, value, key in (
        ("--temperature", "0.6", "measure.temperature"),
        ("--concurrency", "1,2", "measure.concurrency"),
    ):
        again = specsweep(*common, "--resume", "--trials", "1", flag, value)
        assert again.returncode == 1, again.stderr
        lines = again.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("specsweep: error:") and key in lines[0], lines
