"""A study in use is never touched by a second run: on local storage the second run refuses in one
line before it changes anything, and a trial is failed as interrupted only when the run that owns
it is provably gone (docs/reliability.md)."""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from specsweep.errors import StudyInUseError
from specsweep.runtime.lease import process_start_ticks
from specsweep.runtime.run_owner import RunOwner, owner_is_dead, this_host, this_run
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import hold_study, study_paths

from .builders import emulator_config, emulator_study, specsweep, write_study
from .conftest import emulator_processes

RUNNING, COMPLETE, FAIL = (
    optuna.trial.TrialState.RUNNING,
    optuna.trial.TrialState.COMPLETE,
    optuna.trial.TrialState.FAIL,
)


def test_a_second_run_refuses_in_one_line_and_the_first_keeps_its_trial(tmp_path: Path) -> None:
    # A 10 s boot (modelled 1000 s at time scale 100): the second run comes while the first measures.
    seed = 7100
    config = write_study(
        tmp_path / "s.toml",
        emulator_study("busy", seed=seed, time_scale=100, startup_s=1000, k=(2, 2), max_tokens=40),
    )
    command = ["study", "--config", str(config), "--trials", "1"]
    first = subprocess.Popen(
        [sys.executable, "-m", "specsweep", *command], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        lock = tmp_path / "studies/busy/run.lock"
        deadline = time.monotonic() + 60
        while not emulator_processes(f"--seed {seed}"):  # the first run holds the study and boots its server
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.1)
        assert lock.read_text()
        second = specsweep(*command, cwd=tmp_path, timeout=120)
        assert first.poll() is None, "the first run was still measuring when the second one came"
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 1 and len(lines) == 1, second.stderr
    assert f"study 'busy' is in use by another specsweep run (pid {first.pid} on {this_host()})" in lines[0]
    assert "wait for it to finish" in lines[0] and "--study-name" in lines[0]
    assert first.returncode == 0, err
    for text in (out, err, second.stdout, second.stderr):
        assert "Traceback" not in text
    study = optuna.load_study(study_name="busy", storage=f"sqlite:///{tmp_path / 'studies/busy/study.db'}")
    trial = study.trials[0]
    assert trial.state == COMPLETE and "fail_reason" not in trial.user_attrs
    assert trial.user_attrs["owner"]["pid"] == first.pid
    assert (tmp_path / "studies/busy" / trial.user_attrs["record"]).is_file()
    assert emulator_processes(f"--seed {seed}") == []


def test_the_owner_dead_rule() -> None:
    gone = subprocess.Popen(["true"])
    started = process_start_ticks(gone.pid)
    gone.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        live = RunOwner(pid=alive.pid, host=this_host(), started=process_start_ticks(alive.pid))
        assert not owner_is_dead(live, heartbeat_age_s=None, stale_s=60)
        assert not owner_is_dead(this_run(), heartbeat_age_s=None, stale_s=60)
        assert owner_is_dead(
            RunOwner(pid=gone.pid, host=this_host(), started=started), heartbeat_age_s=None, stale_s=60
        )
        # the pid runs, but another program started at another time took it
        assert owner_is_dead(replace(live, started=(live.started or 0) + 1), heartbeat_age_s=None, stale_s=60)
        elsewhere = replace(live, host=f"not-{this_host()}")
        assert not owner_is_dead(elsewhere, heartbeat_age_s=None, stale_s=60)  # no heartbeat: nothing proves it
        assert not owner_is_dead(elsewhere, heartbeat_age_s=30, stale_s=60)
        assert owner_is_dead(elsewhere, heartbeat_age_s=61, stale_s=60)
    finally:
        alive.kill()
        alive.wait()


def test_resume_fails_a_dead_runs_trial_and_leaves_a_live_ones(tmp_path: Path) -> None:
    config = emulator_config("owners", k=(1, 2))
    paths = study_paths(config, tmp_path)
    study = StudyRunner(config, paths).study
    dead_trial, live_trial, old_trial, own_trial = study.ask(), study.ask(), study.ask(), study.ask()
    own_trial.set_user_attr("owner", this_run().to_stored())  # left by an earlier runner of this process
    gone = subprocess.Popen(["true"])
    gone_started = process_start_ticks(gone.pid)
    gone.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        dead_trial.set_user_attr("owner", {"pid": gone.pid, "host": this_host(), "started": gone_started})
        live_trial.set_user_attr(
            "owner", {"pid": alive.pid, "host": this_host(), "started": process_start_ticks(alive.pid)}
        )
        # old_trial has no owner: stored before runs were kept with their trials, so taken as gone
        again = StudyRunner(config, paths, resume=True).study
        states = {t.number: t for t in again.trials}
        assert states[dead_trial.number].state == FAIL
        assert states[dead_trial.number].user_attrs["fail_reason"] == "interrupted: the run that measured it died"
        assert states[old_trial.number].state == states[own_trial.number].state == FAIL
        assert states[live_trial.number].state == RUNNING
    finally:
        alive.kill()
        alive.wait()


def test_the_lock_names_its_holder_and_is_free_again_once_released(tmp_path: Path) -> None:
    paths = study_paths(emulator_config("held"), tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from specsweep.tuning.study_store import "
         "StudyPaths, hold_study; hold_study('held', StudyPaths(folder=Path(sys.argv[1]), storage='sqlite:///x.db'), "
         "'w'); print('held', flush=True); time.sleep(30)", str(paths.folder)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(StudyInUseError, match=rf"in use by another specsweep run \(pid {holder.pid} on "):
            hold_study("held", paths, "w")
    finally:
        holder.kill()
        holder.wait()
    lock = hold_study("held", paths, "w")  # the kernel dropped the killed run's lock
    assert lock is not None and hold_study("held", paths, "w") is lock  # held again in one process: the same lock
    lock.release()
    lock.release()
