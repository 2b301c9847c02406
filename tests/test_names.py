"""Names that become paths stay in their folder: a study's name (file and --study-name), an
imported workload's --name, a report's folder and files named after a study or a workload.

Each command runs in a child process in its own folder beside a sibling one; every file under the
test's folder is listed before and after, and whatever appeared must be inside the folder chosen
for it."""

from __future__ import annotations

import shutil
from pathlib import Path

import optuna
import pytest

from specsweep import names
from specsweep.errors import ConfigError

from .builders import emulator_study, specsweep, write_study

BUNDLED = Path(__file__).resolve().parents[1] / "workloads"


def files_under(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


def appeared(root: Path, before: set[Path]) -> set[Path]:
    return files_under(root) - before


def one_line_failure(done, *, says: str) -> None:
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specsweep: error: ") and says in lines[0], done.stderr


ESCAPING = ("../escaped", "..", "a/b", "/ABSOLUTE", ".hidden", "", "x" * 82, "tab\there")


@pytest.mark.parametrize("name", ["ok", "k2.greedy-run_1", "A" * 81])
def test_a_plain_name_passes(name: str) -> None:
    assert names.check_name(name, what="n") == name


@pytest.mark.parametrize("name", [*ESCAPING, None, 3])
def test_a_name_that_is_not_one_path_component_is_refused(name: object) -> None:
    with pytest.raises(ConfigError, match=r"^the key must be letters"):
        names.check_name(name, what="the key")


@pytest.mark.parametrize("text", [*ESCAPING, "../data/my.jsonl", "été", "...", "prose"])
def test_file_part_is_always_a_name_that_passes(text: str) -> None:
    part = names.file_part(text)
    assert names.check_name(part, what="part") == part
    assert "/" not in part and not part.startswith(".")


def test_a_study_name_outside_its_folder_is_refused_from_the_file_and_the_flag(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "sibling").mkdir()
    good = write_study(run / "good.toml", emulator_study("good"))
    bad = write_study(run / "bad.toml", emulator_study("../escaped"))
    before = files_under(tmp_path)
    absolute = str(tmp_path / "sibling" / "abs")
    for argv, says in (
        (("--config", str(bad)), "study.name must be letters"),
        (("--config", str(bad), "--dry-run"), "study.name must be letters"),
        (("--config", str(good), "--study-name", "../escaped"), "--study-name must be letters"),
        (("--config", str(good), "--study-name", absolute), "--study-name must be letters"),
        (("--config", str(good), "--study-name", "../escaped", "--dry-run"), "--study-name must be letters"),
        (("--workload", "prose", "--study-name", "../../escaped"), "--study-name must be letters"),
    ):
        done = specsweep("study", *argv, "--studies-dir", "studies", cwd=run)
        one_line_failure(done, says=says)
    assert appeared(tmp_path, before) == set()


def test_an_imported_workloads_name_stays_in_out(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    source = run / "mine.txt"
    source.write_text("Write a poem about the sea.\n\nSummarise the plot of Hamlet.\n", encoding="utf-8")
    before = files_under(tmp_path)
    for name in ("../escaped", str(tmp_path / "abs"), "sub/x", ".."):
        done = specsweep("workloads", "import", str(source), "--out", "out", "--name", name, cwd=run)
        one_line_failure(done, says="--name must be letters")
    assert appeared(tmp_path, before) == set()
    done = specsweep("workloads", "import", str(source), "--out", "out", "--name", "poems", cwd=run)
    assert done.returncode == 0, done.stderr
    assert appeared(tmp_path, before) == {run / "out", run / "out" / "poems.jsonl"}


def test_a_study_name_in_a_storage_cannot_place_its_report_outside_here(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    optuna.create_study(study_name="../escaped", storage=storage)
    before = files_under(tmp_path)
    done = specsweep("report", "--storage", storage, "--study-name", "../escaped", cwd=run)
    one_line_failure(done, says="Pass --out DIR")
    assert appeared(tmp_path, before) == set()


def test_report_files_named_after_a_workload_path_stay_in_the_report_folder(tmp_path: Path) -> None:
    """A workload given by its path (outside the study's folder, with '..') names figures in the report."""
    run, shared = tmp_path / "run", tmp_path / "shared"
    run.mkdir()
    shared.mkdir()
    shutil.copy(BUNDLED / "prose.jsonl", shared / "my.jsonl")
    key = "../shared/my.jsonl"
    config = write_study(run / "s.toml", emulator_study("paths", k=(1, 2), workloads={key: 1.0}))
    done = specsweep("study", "--config", str(config), "--trials", "3", cwd=run)
    assert done.returncode == 0, done.stdout + done.stderr
    before = files_under(tmp_path)
    done = specsweep("report", "studies/paths", cwd=run)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    new = appeared(tmp_path, before)
    report = run / "studies" / "paths" / "report"
    assert new and all(p == report or report in p.parents for p in new), new
    figures = {p.name for p in new if p.suffix == ".png"}
    assert {"acceptance-shared_my.jsonl.png", "throughput-shared_my.jsonl.png"} <= figures
