"""Several workers, one study: a real PostgreSQL server and optuna's journal file as the shared storage.

Each worker is a `specsweep study` process with its own emulator (its own server config); the
storage is all they share.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import optuna
import pytest

from specsweep.config import parse_study_config
from specsweep.errors import ConfigError
from specsweep.runtime.launcher import free_port
from specsweep.tuning.records import is_repeat
from specsweep.tuning.space import build_space
from specsweep.tuning.storage import StorageError, journal_path, open_storage, redact_password

from .builders import emulator_study, write_study
from .conftest import _require

COMPLETE = optuna.trial.TrialState.COMPLETE
FAIL = optuna.trial.TrialState.FAIL


# --- a throwaway PostgreSQL cluster -------------------------------------------------------------


def _pg_bindir() -> Path | None:
    """Where initdb and pg_ctl are: on PATH, else Debian's /usr/lib/postgresql/VERSION/bin."""
    found = shutil.which("pg_ctl")
    if found and shutil.which("initdb"):
        return Path(found).resolve().parent
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return candidates[-1].parent if candidates else None


@dataclass
class Postgres:
    port: int
    user: str

    def url(self, database: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user=self.user, dbname="postgres") as connection:
            connection.autocommit = True
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


@pytest.fixture(scope="module")
def postgres() -> Iterator[Postgres]:
    """A PostgreSQL cluster of its own on a free loopback port, stopped and deleted afterwards."""
    bindir = _pg_bindir()
    if bindir is None:
        _require("PostgreSQL is not installed: apt-get install postgresql (scripts/test does)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        _require("psycopg is not installed: pip install -e '.[test]'")
    base = Path(tempfile.mkdtemp(prefix="specsweep-pg-"))  # not under pytest's root-only tmp: postgres reads it
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb and postgres refuse to run as root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(base)
            _require("there is no postgres user to run PostgreSQL as (Debian's postgresql package makes one)")
        os.chown(base, owner.pw_uid, owner.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    data = base / "data"
    port = free_port()

    def pg(*args: str) -> None:
        subprocess.run([*prefix, *args], check=True, capture_output=True, timeout=120)

    pg(str(bindir / "initdb"), "-D", str(data), "-U", "specsweep", "-A", "trust", "-E", "UTF8", "--no-sync")
    options = f"-h 127.0.0.1 -p {port} -k {base} -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
    pg(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(base / "log"), "-o", options, "-w", "-t", "60", "start")
    pid = int((data / "postmaster.pid").read_text().split()[0])
    try:
        yield Postgres(port=port, user="specsweep")
    finally:
        try:
            pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop")
        except subprocess.SubprocessError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(base, ignore_errors=True)


# --- workers -----------------------------------------------------------------------------------


def study_file(tmp_path: Path, *, name: str, seed: int, startup_s: float = 0.0, sampler: str = "grid") -> Path:
    """A node's study file: the same search, workloads and measurement everywhere, its own server.

    The grid by default: these tests check that every configuration of the space is measured
    exactly once across the workers."""
    data = emulator_study(
        name, seed=seed, time_scale=150, startup_s=startup_s, k=(1, 5), max_tokens=40,
        study={"sampler": sampler, "heartbeat_s": 1, "max_consecutive_failures": 3}, measure={"warmup": 0},
    )  # fmt: skip
    return write_study(tmp_path / f"node-{seed}.toml", data)


def start_worker(config: Path, storage: str, worker: str, studies_dir: Path) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "specsweep", "study", "--config", str(config), "--storage", storage]
    argv += ["--worker", worker, "--studies-dir", str(studies_dir)]
    return subprocess.Popen(argv, cwd=config.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def emulator_pids(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "emulate" in cmdline and marker in cmdline:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def workers() -> Iterator[list[subprocess.Popen[str]]]:
    """The worker processes a test starts; any still running at the end is killed by its PID."""
    started: list[subprocess.Popen[str]] = []
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=30)


def finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err
    return out


def space_keys(config: Path) -> set[str]:
    from specsweep.config import load_study_config

    chosen = load_study_config(config)
    space = build_space(chosen.search, temperature=chosen.measure.temperature, engine_has_draft_sample_method=True)
    return {c.key for c in space.configurations()}


def check_complete_and_consistent(study: optuna.Study, keys: set[str], folders: dict[str, Path]) -> None:
    """Every configuration measured once, by one worker, with its record and log in that worker's folder."""
    measured = [t for t in study.trials if t.state == COMPLETE and "reused_from" not in t.user_attrs]
    assert sorted(t.user_attrs["key"] for t in measured) == sorted(keys)  # each once, none twice
    # every server any worker started (a trial that reused another's figures carries its copied
    # startup_s but started nothing: which worker meets a measured configuration first is timing)
    started = [t for t in study.trials if "startup_s" in t.user_attrs and "reused_from" not in t.user_attrs]
    assert len(started) == len(keys), [(t.number, t.state, t.user_attrs.get("key")) for t in started]
    for trial in study.trials:
        assert trial.state in (COMPLETE, optuna.trial.TrialState.PRUNED, FAIL), trial
        assert trial.user_attrs["worker"] in folders
    for trial in measured:
        worker = trial.user_attrs["worker"]
        folder = folders[worker]
        assert trial.user_attrs["record"] == f"trials/trial-{trial.number:04d}.json"
        record = json.loads((folder / trial.user_attrs["record"]).read_text())
        assert record["trial"] == trial.number and record["worker"] == worker
        assert json.loads(record["spec"] or "null") == json.loads(trial.user_attrs["spec"] or "null")
        assert Path(record["log"]).is_file() and Path(record["log"]).parent == folder / "logs"
        assert trial.user_attrs["results"]["prose"]["1"]["output_tokens_per_s"] > 0
    # No worker wrote a record for a trial it did not measure (nothing overwritten, nothing stray).
    by_worker = {w: {f"trial-{t.number:04d}.json" for t in measured if t.user_attrs["worker"] == w} for w in folders}
    for worker, folder in folders.items():
        written = {p.name for p in (folder / "trials").glob("*.json")} if (folder / "trials").is_dir() else set()
        shared_with = {w for w, f in folders.items() if f == folder}
        assert written == set().union(*(by_worker[w] for w in shared_with)), (worker, written)


# --- the tests ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_workers_share_one_study_on_postgresql(tmp_path: Path, postgres: Postgres) -> None:
    storage = postgres.create_database("two_workers")
    configs = {
        "node-a": study_file(tmp_path, name="shared", seed=6101),
        "node-b": study_file(tmp_path, name="shared", seed=6102),
    }
    folders = {w: tmp_path / w / "studies" for w in configs}  # two machines: two disks
    with workers() as started:
        for worker, config in configs.items():  # at once, on an empty database
            started.append(start_worker(config, storage, worker, folders[worker]))
        outputs = [finish(p) for p in started]
    for out in outputs:
        assert "every configuration in the space was tried" in out or "other workers" in out, out
    study = optuna.load_study(study_name="shared", storage=open_storage(storage, heartbeat_s=None))
    folders = {w: f / "shared" for w, f in folders.items()}
    check_complete_and_consistent(study, space_keys(configs["node-a"]), folders)
    assert {t.user_attrs["worker"] for t in study.trials if t.state == COMPLETE} == set(configs)
    assert emulator_pids("--seed 610") == []


def test_two_workers_share_one_model_guided_search(tmp_path: Path, postgres: Postgres) -> None:
    """The model-guided search on two workers: a worker whose next choice needs the other's
    running largest-k trial waits for it instead of stopping; nothing is measured twice, and
    both end with a recommendation."""
    storage = postgres.create_database("model_workers")
    configs = {
        "node-a": study_file(tmp_path, name="guided", seed=6301, sampler="model"),
        "node-b": study_file(tmp_path, name="guided", seed=6302, sampler="model"),
    }
    folders = {w: tmp_path / w / "studies" for w in configs}
    with workers() as started:
        for worker, config in configs.items():
            started.append(start_worker(config, storage, worker, folders[worker]))
        outputs = [finish(p) for p in started]
    for out in outputs:
        assert "no drafter could be measured" not in out, out
        assert "picks for " in out, out
    study = optuna.load_study(study_name="guided", storage=open_storage(storage, heartbeat_s=None))
    measured = [t for t in study.trials if t.state == COMPLETE and "reused_from" not in t.user_attrs]
    first = [t.user_attrs["key"] for t in measured if not is_repeat(t)]
    # off and the largest k at least (the search may stop there: with one drafter, a start at a
    # shorter k can be worth less than it costs); a configuration is measured twice only when the
    # search asks for a repeat (to separate leaders), never because two workers claimed it
    assert len(first) == len(set(first)) >= 2, outputs
    assert {t.user_attrs["key"] for t in measured if is_repeat(t)} <= set(first)
    assert emulator_pids("--seed 630") == []


@pytest.mark.slow
def test_a_killed_worker_leaves_a_failed_trial_and_the_other_finishes(tmp_path: Path, postgres: Postgres) -> None:
    storage = postgres.create_database("killed_worker")
    fast = study_file(tmp_path, name="killed", seed=6201)
    slow = study_file(tmp_path, name="killed", seed=6202, startup_s=900)  # 6 s to boot: killed while it does
    folders = {"fast": tmp_path / "fast", "slow": tmp_path / "slow"}
    with workers() as started:
        started.append(start_worker(slow, storage, "slow", folders["slow"]))
        victim = started[0]
        deadline = time.monotonic() + 60
        doomed = None
        while doomed is None and time.monotonic() < deadline and victim.poll() is None:
            with contextlib.suppress(KeyError, optuna.exceptions.OptunaError):
                running = optuna.load_study(
                    study_name="killed", storage=open_storage(storage, heartbeat_s=None)
                ).get_trials(states=(optuna.trial.TrialState.RUNNING,))
                doomed = next((t for t in running if "key" in t.user_attrs and emulator_pids("--seed 6202")), None)
            time.sleep(0.2)
        assert doomed is not None, victim.communicate(timeout=30)
        started.append(start_worker(fast, storage, "fast", folders["fast"]))
        time.sleep(1.0)
        victim.kill()  # SIGKILL: no chance to tell optuna anything
        victim.communicate(timeout=30)
        for pid in emulator_pids("--seed 6202"):  # its server outlives it; this test started it, so it stops it
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        out = finish(started[1])
    assert "every configuration in the space was tried" in out, out
    study = optuna.load_study(study_name="killed", storage=open_storage(storage, heartbeat_s=None))
    dead = study.trials[doomed.number]
    assert dead.state == FAIL and dead.user_attrs["worker"] == "slow"
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == dead.number]
    assert len(retry) == 1 and retry[0].state == COMPLETE and retry[0].user_attrs["worker"] == "fast"
    assert "stopped sending heartbeats" in retry[0].user_attrs["retry_reason"]
    assert retry[0].user_attrs["key"] == dead.user_attrs["key"]
    measured = [t for t in study.trials if t.state == COMPLETE and "reused_from" not in t.user_attrs]
    assert sorted(t.user_attrs["key"] for t in measured) == sorted(space_keys(fast))
    assert all(t.user_attrs["worker"] == "fast" for t in measured)
    assert emulator_pids("--seed 620") == []


@pytest.mark.slow
def test_two_workers_share_one_study_in_a_journal_file(tmp_path: Path) -> None:
    shared = tmp_path / "nfs"  # a shared filesystem: one journal, one studies folder for both
    shared.mkdir()
    storage = f"journal://{shared / 'journal.log'}"
    configs = {
        "node-a": study_file(tmp_path, name="journaled", seed=6301),
        "node-b": study_file(tmp_path, name="journaled", seed=6302),
    }
    with workers() as started:
        for worker, config in configs.items():
            started.append(start_worker(config, storage, worker, shared / "studies"))
        for process in started:
            finish(process)
    study = optuna.load_study(study_name="journaled", storage=open_storage(storage, heartbeat_s=None))
    folder = shared / "studies" / "journaled"
    check_complete_and_consistent(study, space_keys(configs["node-a"]), dict.fromkeys(configs, folder))
    assert {t.user_attrs["worker"] for t in study.trials if t.state == COMPLETE} == set(configs)
    assert emulator_pids("--seed 630") == []


def test_storage_urls_and_their_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert journal_path("journal:///mnt/shared/x.log") == Path("/mnt/shared/x.log")
    assert journal_path("journal:runs/x.log") == Path("runs/x.log")
    assert (
        redact_password("postgresql://me:s3cret@db.example:5432/studies")
        == "postgresql://me:***@db.example:5432/studies"
    )
    with pytest.raises(StorageError, match="folder of journal storage"):
        open_storage(f"journal://{tmp_path}/missing/x.log", heartbeat_s=None)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # as if the driver were not installed
    with pytest.raises(StorageError, match=r"pip install 'specsweep\[postgres\]'"):
        open_storage("postgresql://me@127.0.0.1:1/db", heartbeat_s=5)


def test_an_unreachable_database_is_one_line(tmp_path: Path) -> None:
    config = study_file(tmp_path, name="nowhere", seed=6401)
    url = f"postgresql://me:s3cret@127.0.0.1:{free_port()}/db"
    result = subprocess.run(
        [sys.executable, "-m", "specsweep", "study", "--config", str(config), "--storage", url],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot open the study database" in lines[0], result.stderr
    assert "s3cret" not in result.stderr and "***" in lines[0]


def test_joining_a_study_that_measures_differently_is_refused(tmp_path: Path) -> None:
    storage = f"journal://{tmp_path / 'j.log'}"
    data = {
        "study": {"name": "mixed"},
        "server": {"engine": "emulator"},
        "search": {"num_speculative_tokens": [1, 2]},
        "measure": {"concurrency": [1], "temperature": 0.0},
    }
    from specsweep.tuning.study import StudyRunner
    from specsweep.tuning.study_store import StudyPaths

    paths = StudyPaths(folder=tmp_path / "mixed", storage=storage)
    StudyRunner(parse_study_config(data), paths, worker="a")
    data["measure"]["temperature"] = 0.7
    with pytest.raises(ConfigError, match="give every worker the same"):
        StudyRunner(parse_study_config(data), paths, worker="b")


@pytest.mark.slow
def test_on_a_journal_a_dead_workers_trial_waits_for_that_worker_to_start_again(tmp_path: Path) -> None:
    storage = f"journal://{tmp_path / 'journal.log'}"
    fast = study_file(tmp_path, name="rejoined", seed=6501)
    slow = study_file(tmp_path, name="rejoined", seed=6502, startup_s=900)
    studies = tmp_path / "studies"
    reader = open_storage(storage, heartbeat_s=None)
    with workers() as started:
        started.append(start_worker(slow, storage, "node-b", studies))
        deadline = time.monotonic() + 60
        doomed = None
        while doomed is None and time.monotonic() < deadline and started[0].poll() is None:
            with contextlib.suppress(KeyError):
                running = optuna.load_study(study_name="rejoined", storage=reader).get_trials(
                    states=(optuna.trial.TrialState.RUNNING,)
                )
                doomed = next((t for t in running if "key" in t.user_attrs and emulator_pids("--seed 6502")), None)
            time.sleep(0.2)
        assert doomed is not None, started[0].communicate(timeout=30)
        started[0].kill()
        started[0].communicate(timeout=30)
        for pid in emulator_pids("--seed 6502"):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        started.append(start_worker(fast, storage, "node-a", studies))
        out = finish(started[1])
        assert f"being measured by other workers (trials [{doomed.number}])" in out, out
        started.append(start_worker(fast, storage, "node-b", studies))  # node-b again, its server fixed
        finish(started[2])
    study = optuna.load_study(study_name="rejoined", storage=open_storage(storage, heartbeat_s=None))
    dead = study.trials[doomed.number]
    assert dead.state == FAIL and "interrupted" in dead.user_attrs["fail_reason"]
    retry = [t for t in study.trials if t.user_attrs.get("retry_of") == dead.number]
    assert len(retry) == 1 and retry[0].state == COMPLETE and retry[0].user_attrs["worker"] == "node-b"
    measured = [t for t in study.trials if t.state == COMPLETE and "reused_from" not in t.user_attrs]
    assert sorted(t.user_attrs["key"] for t in measured) == sorted(space_keys(fast))
    assert emulator_pids("--seed 650") == []
