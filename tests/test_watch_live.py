"""``specsweep watch --endpoint``: the live poll of /metrics against the emulator serving a traffic
schedule whose truth per window is known (emulator/traffic.py), on a rig of the model's own step
times (tests/builders.exact_rig). Each schedule window serves one content class, so the mix served
is the nominal one and the truth is exact."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specsweep.emulator.model import acceptance_curve
from specsweep.emulator.profile import load_profile
from specsweep.emulator.traffic import load_schedule
from specsweep.rigs.file import write_rig
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port
from specsweep.watch.report import served_lengths

from .builders import exact_rig, specsweep
from .watch_truth import PROFILE, RUNNING, TEMPERATURE, assert_acceptance_matches, spec, true_rates

pytestmark = pytest.mark.alone  # a traffic schedule's windows are wall clock (pyproject.toml)

SCALE = 100.0
WINDOW_S = 400.0  # watch's windows, on the emulator's modelled clock (4 s of wall clock)
# Technical text at one stream, then at four: the truth is k=2 (3.2% ahead of k=3, +21% over the
# running k=5), then k=1 (5.8% ahead of k=2, +53%).
SCHEDULE = """name = "live"
max_tokens = 600
repeat = false
[[window]]
name = "technical alone"
duration_s = 1000
streams = 1
mix = { technical = 1.0 }
[[window]]
name = "technical at four"
duration_s = 1000
streams = 4
mix = { technical = 1.0 }
"""
SCHEDULE_WINDOW_S = 1000  # modelled, as the schedule says it
DRAIN_S = 50  # modelled: after a switch the previous window's requests finish
STEADY = 'name = "steady"\n[[window]]\nduration_s = 3600\nstreams = 1\nmix = { technical = 1.0 }\n'


@pytest.fixture(scope="module")
def rig_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rig") / "rig.json"
    write_rig(path, exact_rig(PROFILE, "dspark", k_max=8))
    return path


def start_traffic(start_emulator, folder: Path, text: str):
    path = folder / "schedule.toml"
    path.write_text(text)
    server = start_emulator(
        speculative_config=json.dumps(RUNNING), profile=PROFILE, time_scale=SCALE, extra=["--traffic", str(path)]
    )
    started = httpx.get(server.url + "/version", timeout=10).json()["emulator"]["traffic"]["started_at"]
    return server, started, load_schedule(path)


@pytest.mark.slow
def test_live_watch_recommends_the_truth_of_each_window(start_emulator, rig_path, tmp_path) -> None:
    server, started, schedule = start_traffic(start_emulator, tmp_path, SCHEDULE)
    duration = started + 2 * SCHEDULE_WINDOW_S / SCALE - time.time()
    result = specsweep(
        "watch", "--endpoint", server.url, "--rig", str(rig_path), "--interval", "0.25s",
        "--window", f"{WINDOW_S:g}s", "--duration", f"{duration:.2f}s", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    intervals, span = lines[:-1], lines[-1]
    assert span["kind"] == "span" and all(line["kind"] == "interval" for line in intervals)
    # one line per poll: every 0.25 s, on an absolute schedule
    assert len(intervals) == pytest.approx(duration / 0.25, abs=3)
    assert intervals[-1]["window"]["number"] == len(span["windows"])

    # watch's clock reads the unix time of its first read (where its first window starts) and runs at
    # the modelled hardware's pace from there: the traffic's start on that clock
    origin = span["windows"][0]["start"]
    started = origin + (started - origin) * SCALE
    assert span["clock"] == "modelled"
    curve = acceptance_curve(load_profile(PROFILE), "technical", spec(5), TEMPERATURE)
    compared = set()
    for row in span["windows"]:
        index = int((row["start"] - started) // SCHEDULE_WINDOW_S)
        if not 0 <= index < len(schedule.window):
            continue  # before the traffic's first window or after its last (a slow machine runs past it)
        lo, hi = started + index * SCHEDULE_WINDOW_S, started + (index + 1) * SCHEDULE_WINDOW_S
        if not (lo + DRAIN_S <= row["start"] and row["end"] <= hi + 5) or row["end"] - row["start"] < WINDOW_S - 10:
            continue  # straddles a switch of the schedule, or is the short last one
        window = schedule.window[index]
        compared.add(window.name)
        truth = true_rates(schedule, window)
        best = max(truth, key=truth.__getitem__)
        rec = row["recommendation"]
        assert rec["choice"]["k_by_batch"][str(window.streams)] == best, (window.name, rec["choice"], truth)
        true_gain = truth[best] / truth[5] - 1.0
        assert (1 + rec["gain"]) / (1 + true_gain) == pytest.approx(1.0, abs=0.03), (window.name, rec["gain"])
        assert rec["gain_low"] <= rec["gain"] <= rec["gain_high"]
        assert row["concurrency"][str(window.streams)] >= 0.8
        positions = row["acceptance"]["per_position"]
        assert_acceptance_matches(positions, curve, context=window.name)
        assert {p["source"] for p in positions[5:]} == {"extrapolated"}
        # the server's own generated-token rate, in modelled units, is the window's truth at the running k
        assert row["generation_tokens_per_s"] == pytest.approx(truth[5], rel=0.08)
    assert compared == {w.name for w in schedule.window}, [
        (w["start"] - started, w["end"] - started) for w in span["windows"]
    ]
    assert "the recommendation changes with the traffic" in result.stderr
    table = span["span"]["recommendation"]["choice"]["k_by_batch"]
    assert table["1"] == 2 and table["4"] == 1
    assert '"num_speculative_tokens_per_batch_size":[[1,' in span["span"]["recommendation"]["snippet"]
    assert "paste:" in result.stderr and "--speculative-config" in result.stderr


@pytest.mark.slow
def test_live_watch_without_a_rig_gives_acceptance_and_how_to_get_a_rig(start_emulator, tmp_path) -> None:
    server, _, _ = start_traffic(start_emulator, tmp_path, SCHEDULE)
    result = specsweep(
        "watch", "--endpoint", server.url, "--interval", "0.25s", "--window", "200s", "--duration", "2.5s", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    span = json.loads(result.stdout.splitlines()[-1])
    first = span["windows"][0]
    assert first["recommendation"] is None and first["acceptance"]["running_k"] == 5
    curve = acceptance_curve(load_profile(PROFILE), "technical", spec(5), TEMPERATURE)
    assert_acceptance_matches(first["acceptance"]["per_position"], curve)
    assert any("no rig" in note and "specsweep study" in note for note in span["notes"])
    # what study --context-from reads of a window: the server's prompt tokens per finished request
    sample = served_lengths(span)
    assert sample and all(100 < length < 1500 for length, _ in sample), sample
    assert "no rig: acceptance and load only" in result.stderr
    assert "recommended" not in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_live_watch_stops_on_ctrl_c_or_sigterm_even_started_with_sigint_ignored(
    start_emulator, tmp_path, sig: signal.Signals
) -> None:
    """A background job of a non-interactive shell (or nohup) starts with SIGINT ignored, and
    Python then installs no Ctrl-C handler of its own: watch still stops, with its summary."""
    server, _, _ = start_traffic(start_emulator, tmp_path, STEADY)
    command = [sys.executable, "-m", "specsweep", "watch", "--endpoint", server.url, "--interval", "0.25s",
               "--window", "1h", "--json"]  # fmt: skip
    watcher = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),  # noqa: PLW1509
    )  # fmt: skip
    try:
        assert select.select([watcher.stdout], [], [], 60.0)[0], "watch printed nothing in 60 s"
        first = watcher.stdout.readline()
        watcher.send_signal(sig)
        out, err = watcher.communicate(timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.communicate()
    assert watcher.returncode == 0, err
    assert "Traceback" not in err, err
    lines = [json.loads(line) for line in [first, *out.splitlines()]]
    assert lines[-1]["kind"] == "span" and lines[-1]["span"]["acceptance"]["running_k"] == 5


def test_live_watch_errors_are_one_line(tmp_path, rig_path) -> None:
    cases = [
        (["--endpoint", "http://127.0.0.1:9", "--duration", "1s"], "could not"),
        ([], "give --endpoint URL"),
        (["--endpoint", "http://127.0.0.1:9", "--since", "1h"], "go with --prometheus"),
        (["--endpoint", "http://127.0.0.1:9", "--interval", "soon"], "not a duration"),
        (["--endpoint", "http://127.0.0.1:9", "--running-config", "{k}"], "not JSON"),
    ]
    for args, message in cases:
        result = specsweep("watch", *args, cwd=tmp_path)
        assert result.returncode != 0, (args, result.stderr)
        assert message in result.stderr and "Traceback" not in result.stderr, (args, result.stderr)
        if "--interval" not in args:  # a flag's value checked while parsing gets typer's usage box
            assert result.returncode == 1 and result.stderr.count("\n") == 1, (args, result.stderr)


@pytest.mark.slow
def test_live_watch_goes_on_through_a_server_restart(tmp_path) -> None:
    """The server restarts on the same port while watch polls: the missed reads are skipped, the
    counters count from zero after it (one restart said), and the acceptance is still the truth."""
    path = tmp_path / "steady.toml"
    path.write_text(STEADY)
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    def emulator(seed: int) -> ServerProcess:
        argv = emulator_argv(
            port=port, speculative_config=json.dumps(RUNNING), profile=PROFILE, time_scale=SCALE, seed=seed,
            extra=["--startup-seconds", "0", "--traffic", str(path)],
        )  # fmt: skip
        server = ServerProcess(argv, log_path=tmp_path / f"emulator-{seed}.log")
        server.start()
        server.wait_ready(url + "/health", timeout_s=60)
        return server

    first = emulator(0)
    command = [sys.executable, "-m", "specsweep", "watch", "--endpoint", url, "--interval", "0.25s",
               "--duration", "10s", "--window", "1h", "--json"]  # fmt: skip
    watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    second = None
    try:
        # watch's first read must succeed: restart only once it has read (its first interval line,
        # after its second read), however long its interpreter took to start, then a few reads more
        assert select.select([watcher.stdout], [], [], 60.0)[0], "watch printed nothing in 60 s"
        first_line = watcher.stdout.readline()
        time.sleep(3.0)
        stopping = time.time()
        first.stop(grace_s=5)
        stopped = time.time()
        second = emulator(1)
        back = time.time()
        out, err = watcher.communicate(timeout=120)
        out = first_line + out
    finally:
        if watcher.poll() is None:
            watcher.kill()
        first.stop(grace_s=5)
        if second is not None:
            second.stop(grace_s=5)
    assert watcher.returncode == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    intervals, span = lines[:-1], lines[-1]
    assert sum(line["resets"] for line in intervals) == 1
    assert all(value >= 0 for line in intervals for value in line["growth"].values())
    assert any("restarted from zero 1 time(s)" in note for note in span["notes"])
    curve = acceptance_curve(load_profile(PROFILE), "technical", spec(5), TEMPERATURE)
    assert_acceptance_matches(span["span"]["acceptance"]["per_position"], curve)
    truth = true_rates(load_schedule(path), load_schedule(path).window[0])
    # the span covers the restart's gap too: its rate is the truth's times the share of the span a server
    # was up, timed here (the first server's last poll interval and the request it had under way are lost)
    whole = (span["span"]["end"] - span["span"]["start"]) / SCALE  # wall seconds: watch's clock is modelled
    up_at_most = (whole - (back - stopped)) / whole
    up_at_least = (whole - (back - stopping) - 0.25) / whole
    served = span["span"]["generation_tokens_per_s"]
    assert 0.8 * up_at_least * truth[5] < served < 1.05 * up_at_most * truth[5], (up_at_least, up_at_most)
