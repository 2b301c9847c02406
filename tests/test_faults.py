"""Faults during a study: each ends its trial with a one-line reason (or a note, when it only
degrades data), keeps what was measured, leaves no server process, and --resume carries on.

Every study here has two configurations: speculation off (measured cleanly first) and k = 2
(measured under the fault, then again cleanly on --resume). docs/reliability.md lists them.
"""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from specsweep.config import parse_study_config
from specsweep.runtime import launcher
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.runtime.lease import lease_for, process_start_ticks, reclaim_leases, write_lease
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

from .builders import emulator_study
from .conftest import emulator_processes

# faults injected mid-level: which requests they hit follows the emulator's timing (pyproject.toml)
pytestmark = pytest.mark.alone

K2 = '{"method":"dspark","num_speculative_tokens":2}'
COMPLETE, FAIL = optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.FAIL


def study_data(seed: int, extra: list[str] | None = None, **server: object) -> dict:
    return emulator_study(
        "faults", seed=seed, extra_args=extra or (), k=(2, 2), requests=3, max_tokens=40,
        study={"max_consecutive_failures": 3}, server={"ready_timeout_s": 20, **server}, measure={"warmup": 1},
    )  # fmt: skip


def run_study(tmp_path: Path, data: dict, *, resume: bool, max_trials: int | None = None) -> optuna.Study:
    config = parse_study_config(data)
    return StudyRunner(config, study_paths(config, tmp_path), resume=resume).run(max_trials=max_trials).study


# (emulator flags, server overrides, expected state of the k = 2 trial, text in its reason or notes)
FAULTS = {
    "boot failure": (["--fail-boot-above-k", "1"], {}, FAIL, "OutOfMemoryError"),
    "hang at boot": (["--hang-at-boot"], {"ready_timeout_s": 1.5}, FAIL, "was not ready after"),
    "crash mid-trial": (["--crash-after-requests", "1"], {}, FAIL, "EngineDeadError"),
    "every stream dropped": (["--drop-stream-every", "1"], {}, FAIL, "peer closed the connection"),
    "some streams dropped": (["--drop-stream-every", "2"], {}, COMPLETE, "2 request(s) failed (connection"),
    "malformed SSE": (["--malformed-sse-every", "1"], {}, FAIL, "malformed SSE event"),
    "missing usage chunk": (["--omit-usage"], {}, FAIL, "no usage in the stream"),
    "HTTP 500 on every request": (["--http-500-every", "1"], {}, FAIL, "HTTP 500: EngineCore"),
    "HTTP 500 on some requests": (["--http-500-every", "2"], {}, COMPLETE, "2 request(s) failed (HTTP 500"),
    "/metrics missing": (["--metrics-404"], {}, COMPLETE, "/metrics answered HTTP 404"),
    "/metrics without spec counters": (["--metrics-without-spec"], {}, COMPLETE, "no spec-decode counters"),
}


@pytest.fixture(scope="module")
def measured_off(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A study folder whose first trial (speculation off) was measured cleanly; each test copies it."""
    folder = tmp_path_factory.mktemp("measured")
    study = run_study(folder, study_data(5999), resume=False, max_trials=1)
    assert (study.trials[0].state, study.trials[0].user_attrs["key"]) == (COMPLETE, "off")
    return folder / "faults"


@pytest.mark.parametrize("name", list(FAULTS))
def test_a_fault_fails_or_notes_its_trial_and_resume_carries_on(tmp_path: Path, measured_off: Path, name: str) -> None:
    extra, server, state, text = FAULTS[name]
    seed = 6000 + list(FAULTS).index(name)
    marker = f"--seed {seed}"
    shutil.copytree(measured_off, tmp_path / "faults")
    first = optuna.load_study(study_name="faults", storage=f"sqlite:///{tmp_path / 'faults' / 'study.db'}")
    record = tmp_path / "faults" / "trials" / "trial-0000.json"
    kept = record.read_bytes()

    faulty = run_study(tmp_path, study_data(seed, extra, **server), resume=True, max_trials=1)
    trial = faulty.trials[1]
    assert trial.user_attrs["key"] == K2 and trial.state == state
    if state == FAIL:
        reason = trial.user_attrs["fail_reason"]
        assert text in reason and "\n" not in reason, reason
    else:
        notes = trial.user_attrs["results"]["prose"]["1"]["notes"]
        assert any(text in note for note in notes), notes
    assert emulator_processes(marker) == []
    assert faulty.trials[0].state == COMPLETE and record.read_bytes() == kept

    done = run_study(tmp_path, study_data(seed), resume=True)
    measured = {t.user_attrs["key"] for t in done.trials if t.state == COMPLETE}
    assert measured == {"off", K2}
    assert done.trials[0].value == first.trials[0].value and record.read_bytes() == kept
    assert emulator_processes(marker) == []
    assert not any((tmp_path / "faults" / "servers").glob("*.json"))  # no lease outlives its server


def test_a_port_already_in_use_fails_the_trial_and_leaves_the_other_server_alone(
    tmp_path: Path, measured_off: Path, start_emulator
) -> None:
    """A server already answering on the port would pass the readiness check: it must not be measured."""
    other = start_emulator(seed=6100)
    seed = 6101
    shutil.copytree(measured_off, tmp_path / "faults")
    study = run_study(tmp_path, study_data(seed, port=other.port, ready_timeout_s=1), resume=True, max_trials=1)
    reason = study.trials[1].user_attrs["fail_reason"]
    assert study.trials[1].state == FAIL and f"port {other.port} on 127.0.0.1 is already in use" in reason
    assert other.process.exit_code() is None  # someone else's server is not ours to stop
    assert emulator_processes(f"--seed {seed}") == []
    done = run_study(tmp_path, study_data(seed), resume=True)
    assert {t.user_attrs["key"] for t in done.trials if t.state == COMPLETE} == {"off", K2}


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


@pytest.mark.skipif(not EPHEMERAL.exists(), reason="the kernel's ephemeral port range is known on Linux only")
def test_a_chosen_port_is_outside_the_range_outgoing_connections_take_their_ports_from() -> None:
    """Between choosing a server's port and the server binding it (minutes for a large model), an
    outgoing connection must not be able to take the port as its own local one."""
    low, high = (int(v) for v in EPHEMERAL.read_text().split())
    ports = {free_port() for _ in range(20)}
    assert all(port < low or port > high for port in ports), sorted(ports)
    assert len(ports) > 1  # chosen at random, so two starts at once rarely try the same one


def test_a_port_in_use_is_never_the_one_chosen(monkeypatch: pytest.MonkeyPatch) -> None:
    """The candidates are tried in turn: one something already listens on is passed over."""
    with socket.socket() as taken, socket.socket() as probe:
        taken.bind(("127.0.0.1", 0))
        probe.bind(("127.0.0.1", 0))
        busy, spare = taken.getsockname()[1], probe.getsockname()[1]
        probe.close()  # free again: the candidate after the busy one
        monkeypatch.setattr(launcher.random, "sample", lambda population, n: [busy, spare])
        monkeypatch.setattr(launcher, "_LISTEN_PORTS_FROM", 0)  # whatever the kernel's range
        assert free_port() == spare


# -- the tool itself stopped mid-trial ---------------------------------------------------------


def write_config(tmp_path: Path, seed: int, server: str | None = None) -> Path:
    server = (
        server
        or f"""
engine = "emulator"
stop_grace_s = 5
[server.emulator]
time_scale = 100
seed = {seed}
extra_args = ["--startup-seconds", "0"]
"""
    )
    path = tmp_path / "s.toml"
    path.write_text(
        f"""
[study]
name = "stopped"
[server]
{server}
[search]
num_speculative_tokens = [2, 2]
fixed = {{ method = "dspark" }}
[workloads]
prose = 1.0
[measure]
concurrency = [1]
requests = 3
max_tokens = 300
temperature = 0.0
"""
    )
    return path


def start_and_stop_mid_trial(
    tmp_path: Path, config: Path, marker: str, sig: signal.Signals, wait_for: Path | None = None
) -> subprocess.Popen:
    """Start `specsweep study`, wait until trial 1's server has started (and ``wait_for`` exists), send ``sig``."""
    process = subprocess.Popen(
        [sys.executable, "-m", "specsweep", "study", "--config", str(config)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith("    0  "):  # trial 0's row
            break
    deadline = time.monotonic() + 30
    while not emulator_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    while wait_for is not None and not (wait_for.is_file() and wait_for.read_text().strip()):
        assert time.monotonic() < deadline, f"{wait_for} never appeared"
        time.sleep(0.05)
    assert emulator_processes(marker), "trial 1's server never started"
    time.sleep(0.3)  # into the measurement
    process.send_signal(sig)
    return process


def wait_gone(marker: str, timeout_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while emulator_processes(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return emulator_processes(marker)


def resume(tmp_path: Path, config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specsweep", "study", "--config", str(config), "--resume"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def load(tmp_path: Path) -> optuna.Study:
    return optuna.load_study(study_name="stopped", storage=f"sqlite:///{tmp_path / 'studies/stopped/study.db'}")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_sigint_and_sigterm_stop_the_server_keep_the_data_and_resume(tmp_path: Path, sig: signal.Signals) -> None:
    seed = 6200 + int(sig)
    config = write_config(tmp_path, seed)
    process = start_and_stop_mid_trial(tmp_path, config, f"--seed {seed}", sig)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert err.count("\n") == 1 and "stopped by the user" in err and "--resume" in err
    assert emulator_processes(f"--seed {seed}") == []
    study = load(tmp_path)
    assert study.trials[0].state == COMPLETE and study.trials[1].state == FAIL
    assert study.trials[1].user_attrs["fail_reason"] == "interrupted by the user"
    result = resume(tmp_path, config)
    assert result.returncode == 0, result.stderr
    assert {t.user_attrs["key"] for t in load(tmp_path).trials if t.state == COMPLETE} == {"off", K2}


def test_sigkill_of_specsweep_leaves_no_server(tmp_path: Path) -> None:
    """The kernel stops a local server whose specsweep died (PR_SET_PDEATHSIG)."""
    seed = 6300
    config = write_config(tmp_path, seed)
    process = start_and_stop_mid_trial(tmp_path, config, f"--seed {seed}", signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert wait_gone(f"--seed {seed}") == []
    result = resume(tmp_path, config)
    assert result.returncode == 0, result.stderr
    assert "a server left by an earlier run that died (trial 1" in result.stdout
    study = load(tmp_path)
    assert study.trials[1].state == FAIL and "died" in study.trials[1].user_attrs["fail_reason"]
    assert {t.user_attrs["key"] for t in study.trials if t.state == COMPLETE} == {"off", K2}


def test_sigkill_with_a_detached_server_is_stopped_by_the_next_run(tmp_path: Path) -> None:
    """commands mode, a start command that detaches (as `docker run -d`): only the lease can stop it."""
    seed, port = 6301, free_port()
    emulate = f"{sys.executable} -m specsweep emulate --host 127.0.0.1 --startup-seconds 0 --time-scale 100"
    pid_file = f"{tmp_path}/server-{{trial}}.pid"
    start = (
        f"setsid {emulate} --seed {seed} --port {{port}} {{spec_args}} >> {tmp_path}/server.log 2>&1 < /dev/null "
        f"& echo $! > {pid_file}"
    )
    # The stop command waits until the server is gone (a zombie counts as gone: this machine's init reaps late).
    stop = (
        f"pid=$(cat {pid_file}); kill -TERM $pid; "
        "while [ -d /proc/$pid ] && [ $(cut -d' ' -f3 /proc/$pid/stat) != Z ]; do sleep 0.05; done"
    )
    server = f"""
engine = "vllm"
mode = "commands"
port = {port}
stop_grace_s = 5
ready_timeout_s = 30
start = {json.dumps(start)}
stop = {json.dumps(stop)}
"""
    config = write_config(tmp_path, seed, server)
    process = start_and_stop_mid_trial(
        tmp_path, config, f"--seed {seed}", signal.SIGKILL, wait_for=tmp_path / "server-1.pid"
    )
    process.communicate(timeout=30)
    left = int((tmp_path / "server-1.pid").read_text())
    assert left in emulator_processes(f"--seed {seed}"), (
        "a detached server outlives its specsweep (as a container would)"
    )
    result = resume(tmp_path, config)
    assert result.returncode == 0, result.stderr
    assert "ran its stop command (exit code 0)" in " ".join(result.stdout.split())  # notes wrap at the width
    assert emulator_processes(f"--seed {seed}") == []
    assert {t.user_attrs["key"] for t in load(tmp_path).trials if t.state == COMPLETE} == {"off", K2}


def test_a_lease_of_a_live_run_is_left_alone_and_a_dead_ones_server_is_stopped(tmp_path: Path) -> None:
    leases = tmp_path / "servers"
    port = free_port()
    server = ServerProcess(
        emulator_argv(port=port, seed=6400, extra=["--startup-seconds", "0"]), log_path=tmp_path / "e.log"
    )
    server.start()
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=30)
        live = lease_for(trial=3, pid=server.pid)
        other = subprocess.Popen(["sleep", "30"])  # a live "owner" that is not this process
        try:
            owned = replace(live, owner_pid=other.pid, owner_started=process_start_ticks(other.pid))
            write_lease(leases / "live.json", owned)
            assert reclaim_leases(leases, grace_s=5) == [
                f"another specsweep run (pid {other.pid}) is using this study folder; its server is left alone"
            ]
            assert server.exit_code() is None
        finally:
            other.kill()
            other.wait()
        notes = reclaim_leases(leases, grace_s=5)  # its owner is gone now
        assert notes == [
            f"a server left by an earlier run that died (trial 3, pid {server.pid}): "
            f"stopped its process group {server.pid}"
        ]
        assert server.process is not None and server.process.wait(timeout=10) is not None
        assert not list(leases.glob("*.json"))
        (leases / "junk.json").write_text("{not json")
        assert reclaim_leases(leases) == ["removed an unreadable lease file junk.json"]
    finally:
        server.stop(grace_s=5)


# -- `specsweep measure` against a failing server, from the command line -------------------------


def measure_cli(url: str, *args: str, json_path: Path | None = None) -> subprocess.CompletedProcess[str]:
    extra = ["--json", str(json_path)] if json_path else []
    return subprocess.run(
        [sys.executable, "-m", "specsweep", "measure", "--endpoint", url, "--requests", "2", "--warmup", "1",
         "--max-tokens", "30", *args, *extra],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("flags", "reason"),
    [
        (["--malformed-sse-every", "1"], "malformed SSE event"),
        (["--omit-usage"], "no usage in the stream"),
        (["--http-500-every", "1"], "HTTP 500: EngineCore encountered an issue"),
        (["--drop-stream-every", "1"], "peer closed the connection"),
    ],
)
def test_measure_against_malformed_responses_is_one_line(start_emulator, flags: list[str], reason: str) -> None:
    emulator = start_emulator(speculative_config='{"num_speculative_tokens":2}', time_scale=200, extra=flags)
    result = measure_cli(emulator.url, "--concurrency", "1")
    assert result.returncode == 1, result.stdout
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "measurement stopped: every warm-up request failed" in result.stderr and reason in result.stderr


def test_measure_against_a_server_that_dies_mid_level_keeps_the_first_level(start_emulator, tmp_path: Path) -> None:
    emulator = start_emulator(time_scale=200, extra=["--crash-after-requests", "3"])
    out = tmp_path / "m.json"
    result = measure_cli(emulator.url, "--concurrency", "1,2", json_path=out)
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "measurement stopped" in result.stderr and "levels measured before it are shown above" in result.stderr
    assert "single stream" in result.stdout and "2 requests, 0 failed" in result.stdout
    record = json.loads(out.read_text())
    assert record["error"] and [level["concurrency"] for level in record["levels"]] == [1]


def test_measure_notes_missing_metrics_and_still_measures(start_emulator) -> None:
    emulator = start_emulator(
        speculative_config='{"num_speculative_tokens":2}', time_scale=200, extra=["--metrics-404"]
    )
    result = measure_cli(emulator.url, "--concurrency", "1", "--engine", "vllm")
    assert result.returncode == 0, result.stderr
    assert "/metrics answered HTTP 404" in result.stdout and "tok/s aggregate output" in result.stdout
