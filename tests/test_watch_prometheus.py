"""``specsweep watch --prometheus``: a real Prometheus server scrapes the emulator serving a traffic
schedule on loopback; watch reads the series back over a range and recommends per window. The
truth: the emulator's model of each window (emulator/traffic.py) on a rig of the model's own step
times (tests/builders.exact_rig)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from specsweep.emulator.profile import load_profile
from specsweep.emulator.traffic import load_schedule, mix_per_position
from specsweep.rigs.file import write_rig
from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

from .builders import exact_rig, specsweep
from .prometheus_server import prometheus_binary, running_prometheus
from .watch_truth import (
    PROFILE,
    RUNNING,
    TEMPERATURE,
    assert_acceptance_matches,
    served_mix_from_prometheus,
    spec,
    true_rates,
)

pytestmark = pytest.mark.alone  # a traffic schedule's windows are wall clock (pyproject.toml)

# At 100 a slow 2-core machine's emulator fell 9% behind its schedule at four streams (a step
# then takes a fifth of a millisecond of wall time): the served rate read the lag, not the model.
SCALE = 50.0
# Ten idle wall seconds (500 modelled) while Prometheus starts scraping (its discovery hands it the
# targets up to 5 s after it starts, later on a busy machine), then two windows of ten modelled
# minutes: a prose-heavy single stream, then technical at four streams. The truth: k=3 (2.2%
# ahead of k=2), then k=1 (5.5% ahead of k=2).
LEAD_S = 10.0
SCHEDULE = f"""name = "two"
max_tokens = 600
repeat = false
[[window]]
name = "idle"
duration_s = {LEAD_S * SCALE:.0f}
streams = 0
[[window]]
name = "prose alone"
duration_s = 600
streams = 1
mix = {{ prose = 0.8, technical = 0.2 }}
[[window]]
name = "technical at four"
duration_s = 600
streams = 4
mix = {{ technical = 1.0 }}
"""


@pytest.fixture(scope="module")
def rig_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("rig") / "rig.json"
    write_rig(path, exact_rig(PROFILE, "dspark", k_max=8))
    return path


@contextmanager
def scraped_emulators(folder: Path, schedules: list[str], **prometheus_options) -> Iterator[tuple[str, list[dict]]]:
    """Prometheus first (scraping ports chosen now), then one emulator per schedule serving it:
    Prometheus is scraping before the traffic starts. Yields Prometheus' URL and per emulator its
    url, port, the traffic's start (unix time) and the schedule."""
    ports = [free_port() for _ in schedules]
    with running_prometheus(folder / "prometheus", [f"127.0.0.1:{p}" for p in ports], **prometheus_options) as url:
        servers, out = [], []
        try:
            for seed, (port, text) in enumerate(zip(ports, schedules, strict=True)):
                path = folder / f"schedule-{seed}.toml"
                path.write_text(text)
                argv = emulator_argv(
                    port=port, speculative_config=json.dumps(RUNNING), profile=PROFILE, time_scale=SCALE, seed=seed,
                    extra=["--startup-seconds", "0", "--traffic", str(path)],
                )  # fmt: skip
                server = ServerProcess(argv, log_path=folder / f"emulator-{port}.log")
                servers.append(server)
                server.start()
                server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
                version = httpx.get(f"http://127.0.0.1:{port}/version", timeout=10).json()
                out.append({"url": f"http://127.0.0.1:{port}", "port": port, "schedule": load_schedule(path),
                            "started": version["emulator"]["traffic"]["started_at"]})  # fmt: skip
            scraped = wait_scraped(url, len(ports))
            for server in out:
                server["scraped"] = scraped
            yield url, out
        finally:
            for server in servers:
                server.stop(grace_s=5)


def wait_scraped(url: str, targets: int, timeout_s: float = 30.0) -> float:
    """Wait until Prometheus has scraped every target once (its discovery hands targets to the
    scrape loop up to 5 s after it starts); the unix time by which it had."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        active = httpx.get(url + "/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
        if len(active) == targets and all(t["health"] == "up" for t in active):
            return time.time()
        time.sleep(0.1)
    raise AssertionError(f"Prometheus did not scrape its {targets} target(s) within {timeout_s:g} s")


@pytest.mark.slow
def test_watch_reads_prometheus_and_recommends_the_truth_per_window(rig_path, tmp_path) -> None:
    prometheus_binary()
    with scraped_emulators(tmp_path, [SCHEDULE]) as (url, (server,)):
        started, schedule = server["started"] + LEAD_S, server["schedule"]
        assert server["scraped"] < started, "Prometheus began scraping after the traffic did"
        end = started + 2 * 600 / SCALE
        time.sleep(max(0.0, end + 1.0 - time.time()))
        result = specsweep(
            "watch", "--prometheus", url, "--selector", '{job="emulator"}', "--start", str(started),
            "--end", str(end), "--endpoint", server["url"], "--step", "0.25s", "--window", "10m", "--rig",
            str(rig_path), "--json", "--report", str(tmp_path / "report"), cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        lines = [json.loads(line) for line in result.stdout.splitlines()]
        windows = [line for line in lines if line["kind"] == "window"]
        # with --endpoint on the emulator, watch's windows run on its modelled clock from --start on
        assert lines[-1]["clock"] == "modelled"
        wall = [
            (started + (row["start"] - started) / SCALE, started + (row["end"] - started) / SCALE) for row in windows
        ]
        served = [served_mix_from_prometheus(url, lo, hi) for lo, hi in wall]
    assert len(windows) == 2 and lines[-1]["kind"] == "span"
    profile = load_profile(PROFILE)
    for row, window, mix in zip(windows, schedule.window[1:], served, strict=True):
        # the truth of the traffic as served: a few dozen requests, so their mix is not quite the nominal one
        truth = true_rates(schedule, window, mix)
        served_s = mix_per_position(profile, spec(5), TEMPERATURE, mix)
        best = max(truth, key=truth.__getitem__)
        choice = row["recommendation"]["choice"]
        assert choice["k_by_batch"][str(window.streams)] == best, (window.name, row["recommendation"])
        true_gain = truth[best] / truth[5] - 1.0
        assert (1 + row["recommendation"]["gain"]) / (1 + true_gain) == pytest.approx(1.0, abs=0.03)
        assert row["recommendation"]["gain_low"] <= row["recommendation"]["gain"] <= row["recommendation"]["gain_high"]
        assert row["concurrency"][str(window.streams)] >= 0.8
        measured = row["acceptance"]["per_position"]
        assert_acceptance_matches(measured, served_s, context=window.name)
        assert measured[6]["source"] == "extrapolated"
        # the server's own generated-token rate, in modelled units, is the window's truth at the running k
        assert row["generation_tokens_per_s"] == pytest.approx(truth[5], rel=0.08)
    assert "the recommendation changes with the traffic" in result.stderr
    span = lines[-1]["span"]["recommendation"]
    # each load its own k: a per-batch-size table (batch sizes between them came up at the switch)
    assert span["choice"]["k_by_batch"]["1"] == 3 and span["choice"]["k_by_batch"]["4"] == 1
    assert '"num_speculative_tokens_per_batch_size":[[1,' in span["snippet"]
    report = tmp_path / "report"
    assert (report / "report.md").is_file() and (report / "report.html").stat().st_size > 10_000
    assert sorted(p.name for p in (report / "figures").iterdir()) == [
        "acceptance-by-window.png", "concurrency.png", "predicted-gain.png",
    ]  # fmt: skip
    assert json.loads((report / "results.json").read_text())["span"]["recommendation"]["choice"]["label"]


STEADY = 'name = "steady"\n[[window]]\nduration_s = 600\nstreams = {n}\nmix = {{ prose = 1.0 }}\n'


@pytest.mark.slow
def test_two_servers_under_one_selector_are_summed_and_each_is_a_batch(rig_path, tmp_path) -> None:
    prometheus_binary()
    with scraped_emulators(tmp_path, [STEADY.format(n=1), STEADY.format(n=3)]) as (url, servers):
        begin = max(s["started"] for s in servers) + 1.0
        begin = max(begin, servers[0]["scraped"] + 0.5)
        end = begin + 5.0
        time.sleep(max(0.0, end + 1.0 - time.time()))
        result = specsweep(
            "watch", "--prometheus", url, "--selector", '{job="emulator"}', "--start", str(begin), "--end", str(end),
            "--endpoint", servers[0]["url"], "--step", "0.25s", "--window", "1000s", "--rig", str(rig_path), "--json",
            cwd=tmp_path,
        )  # fmt: skip
        totals = []
        for server in servers:
            query = f'vllm:generation_tokens_total{{instance="127.0.0.1:{server["port"]}"}}'
            answers = [
                httpx.get(url + "/api/v1/query", params={"query": query, "time": t}).json() for t in (begin, end)
            ]
            assert all(a["data"]["result"] for a in answers), (query, answers, result.stderr)
            values = [float(a["data"]["result"][0]["value"][1]) for a in answers]
            totals.append(values[1] - values[0])
    assert result.returncode == 0, result.stderr
    window = json.loads(result.stdout.splitlines()[0])
    # counters: the two servers' growth, summed (each read from Prometheus series by series)
    assert window["generation_tokens_per_s"] * SCALE * (end - begin) == pytest.approx(sum(totals), rel=0.05)
    # gauges: each server's batch kept apart, so batch sizes 1 and 3 each hold about half the time
    assert window["concurrency"]["1"] == pytest.approx(0.5, abs=0.1)
    assert window["concurrency"]["3"] == pytest.approx(0.5, abs=0.1)
    assert "label sets publish the running-requests gauge" in result.stderr


@pytest.mark.slow
def test_without_per_position_counters_watch_fits_the_mean_acceptance_length(rig_path, tmp_path) -> None:
    prometheus_binary()
    dropped = [
        "vllm:spec_decode_num_accepted_tokens_per_pos_total",
        "vllm:spec_decode_num_accepted_tokens_per_pos_created",
    ]
    with scraped_emulators(tmp_path, [SCHEDULE], drop=dropped) as (url, (server,)):
        started = server["started"] + LEAD_S
        end = started + 600 / SCALE
        time.sleep(max(0.0, end + 1.0 - time.time()))
        result = specsweep(
            "watch", "--prometheus", url, "--start", str(started), "--end", str(end), "--step", "0.25s",
            "--window", "6s", "--rig", str(rig_path), "--json", cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        window = json.loads(result.stdout.splitlines()[0])
        served = mix_per_position(
            load_profile(PROFILE), spec(5), TEMPERATURE, served_mix_from_prometheus(url, window["start"], window["end"])
        )
    assert window["acceptance"]["source"] == "aggregate"
    assert all(p["source"] != "measured" for p in window["acceptance"]["per_position"])
    # the geometric fit keeps the mean acceptance length the counters measured: S_1 + ... + S_5 as served
    fitted = sum(p["S"] for p in window["acceptance"]["per_position"][:5])
    assert fitted == pytest.approx(sum(served), rel=0.03)
    assert "from the mean acceptance length only" in result.stderr
    assert window["recommendation"]["choice"]["label"].startswith("k=")


def test_prometheus_errors_are_one_line(tmp_path, rig_path) -> None:
    prometheus_binary()
    with running_prometheus(tmp_path / "prometheus", ["127.0.0.1:9"]) as url:
        cases = [
            (
                ["--prometheus", url, "--selector", '{job="nobody"}', "--since", "5m"],
                "no vLLM, llama.cpp or SGLang series",
            ),
            (["--prometheus", url, "--selector", '{job=~"("}', "--since", "5m"], "Prometheus refused"),
            (["--prometheus", url, "--selector", "vllm:foo{job='x'}", "--since", "5m"], "label matchers in braces"),
            (["--prometheus", url], "give the range"),
            (["--prometheus", url, "--since", "5m", "--rig", str(tmp_path / "none.json")], "cannot read rig file"),
        ]
        for args, message in cases:
            result = specsweep("watch", *args, cwd=tmp_path)
            assert result.returncode == 1, (args, result.stderr)
            assert result.stderr.count("\n") == 1 and message in result.stderr, (args, result.stderr)
    result = specsweep("watch", "--prometheus", url, "--since", "5m", cwd=tmp_path)  # it stopped: unreachable
    assert result.returncode == 1 and "could not reach Prometheus" in result.stderr and result.stderr.count("\n") == 1
