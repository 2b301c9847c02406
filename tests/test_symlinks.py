"""A symlink planted where specsweep writes a file is replaced, never written through: the atomic
writers rename over it, and the log writer (``store.open_log``) removes it and creates the log."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from specsweep.errors import OutputError
from specsweep.runtime.run_owner import hold_run_lock
from specsweep.runtime.store import open_log, write_json_atomic

from .builders import emulator_study, specsweep, write_study


def plant(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("not specsweep's\n", encoding="utf-8")
    link.symlink_to(target)


def test_a_log_replaces_a_symlink_and_leaves_its_target_alone(tmp_path: Path) -> None:
    target, log = tmp_path / "elsewhere.txt", tmp_path / "logs" / "trial-0000.log"
    plant(log, target)
    with open_log(log) as handle:
        handle.write(b"server says hello\n")
    assert target.read_text(encoding="utf-8") == "not specsweep's\n"
    assert not log.is_symlink() and log.read_bytes() == b"server says hello\n"
    with open_log(log) as handle:  # an ordinary log is appended to
        handle.write(b"and goodbye\n")
    assert log.read_bytes() == b"server says hello\nand goodbye\n"


def test_a_dangling_symlink_is_replaced_too(tmp_path: Path) -> None:
    log = tmp_path / "trial-0001.log"
    log.symlink_to(tmp_path / "missing" / "file")
    with open_log(log) as handle:
        handle.write(b"x")
    assert not log.is_symlink() and log.read_bytes() == b"x"
    assert not (tmp_path / "missing").exists()


def test_the_atomic_writers_replace_a_symlink_the_same_way(tmp_path: Path) -> None:
    target, record = tmp_path / "elsewhere.txt", tmp_path / "trial-0000.json"
    plant(record, target)
    write_json_atomic(record, {"a": 1})
    assert target.read_text(encoding="utf-8") == "not specsweep's\n"
    assert not record.is_symlink()


def test_a_run_lock_replaces_a_symlink_and_a_lock_that_cannot_be_made_is_one_error(tmp_path: Path) -> None:
    target, path = tmp_path / "elsewhere.txt", tmp_path / "studies" / "planted" / "run.lock"
    plant(path, target)
    lock = hold_run_lock(path, lambda holder: "in use")
    try:
        assert target.read_text(encoding="utf-8") == "not specsweep's\n"
        assert not path.is_symlink() and b'"pid"' in path.read_bytes()
    finally:
        lock.release()
    (tmp_path / "afile").write_text("x")
    with pytest.raises(OutputError, match="a file is in the way of a folder"):
        hold_run_lock(tmp_path / "afile" / "run.lock", lambda holder: "in use")


def test_a_study_never_appends_to_a_planted_trial_log(tmp_path: Path) -> None:
    """The trial's log path is a symlink to a file outside the study before the study starts."""
    target = tmp_path / "outside.txt"
    log = tmp_path / "studies" / "planted" / "logs" / "trial-0000.log"
    plant(log, target)
    config = write_study(tmp_path / "s.toml", emulator_study("planted", k=(1, 1)))
    done = specsweep("study", "--config", str(config), "--trials", "1", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert target.read_text(encoding="utf-8") == "not specsweep's\n"
    assert not log.is_symlink() and os.path.getsize(log) > 0
