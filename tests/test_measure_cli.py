"""`specsweep measure` end to end against the emulator: output, JSON, notes, errors."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import httpx

from specsweep.runtime.measure import LevelStarted, MeasureSettings, run_measure
from specsweep.workload import load_workload

from .builders import specsweep
from .conftest import DEFAULT_MODEL

SPEC = '{"num_speculative_tokens":4,"draft_sample_method":"probabilistic"}'


def test_measure_prints_the_report_shape_and_writes_json(start_emulator, tmp_path: Path) -> None:
    secret = "sk-do-not-store-4f1c"
    emulator = start_emulator(speculative_config=SPEC, time_scale=100, env={"VLLM_API_KEY": secret})
    out = tmp_path / "m.json"
    result = specsweep(
        "measure", "--endpoint", emulator.url, "--workload", "technical", "--requests", "6", "--max-tokens", "200",
        "--temperature", "0.6", "--api-key-env", "MY_KEY", "--json", str(out),
        env={"MY_KEY": secret},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    text = result.stdout
    assert "single stream" in text and "4 concurrent" in text
    assert "acceptance per position" in text and "mean acceptance length" in text
    assert "server-reported generation" in text
    data = json.loads(out.read_text())
    assert secret not in out.read_text() and secret not in text + result.stderr
    assert data["engine"] == "vllm" and data["model"] == DEFAULT_MODEL
    levels = data["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for level in levels:
        assert level["requests"] == 6 and level["errors"] == 0
        assert level["output_tokens_per_s"] > 0
        assert {"p50", "min", "max"} <= set(level["decode_tokens_per_s_per_stream"])
        assert {"p50", "p95", "max"} <= set(level["ttft_s"])
        assert level["prefill_tokens_per_s"]["max"] > 0
        assert level["server_generation_tokens_per_s"] > 0
        acceptance = level["acceptance"]
        assert len(acceptance["per_position"]) == len(acceptance["conditional"]) == 4
        assert 1 < acceptance["mean_acceptance_length"] <= 5
        assert 0 < acceptance["draft_acceptance_rate"] < 1 and acceptance["num_drafts"] > 0
        assert len(level["records"]) == 6
        assert all(r["completion_tokens"] == 200 or r["finish_reason"] == "stop" for r in level["records"])


def test_speculation_off_and_disabled_stats_are_said_plainly(start_emulator) -> None:
    plain = start_emulator(time_scale=100)
    result = specsweep(
        "measure", "--endpoint", plain.url, "--requests", "2", "--max-tokens", "30", "--concurrency", "1"
    )
    assert result.returncode == 0 and "speculation is off" in result.stdout
    quiet = start_emulator(speculative_config=SPEC, time_scale=100, extra=["--disable-log-stats"])
    result = specsweep(
        "measure", "--endpoint", quiet.url, "--requests", "2", "--max-tokens", "30", "--concurrency", "1",
        "--engine", "vllm",
    )  # fmt: skip
    assert result.returncode == 0 and "--disable-log-stats" in result.stdout


def test_unreachable_server_is_one_line(tmp_path: Path) -> None:
    from specsweep.runtime.launcher import free_port

    result = specsweep("measure", "--endpoint", f"http://127.0.0.1:{free_port()}", "--requests", "1")
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "cannot reach" in result.stderr and "Traceback" not in result.stderr


def test_a_server_that_wants_an_api_key_says_how_to_pass_one(start_emulator) -> None:
    """401 means a key is missing or wrong: say so and name the flag, never "pass --model"."""
    emulator = start_emulator(speculative_config=SPEC, time_scale=100, env={"VLLM_API_KEY": "right"})
    base = ("measure", "--endpoint", emulator.url, "--requests", "1", "--concurrency", "1", "--max-tokens", "8")
    for extra, env, says in (
        ((), {}, "the server wants an API key"),
        (("--model", DEFAULT_MODEL), {}, "the server wants an API key"),  # the first request is refused
        (("--api-key-env", "MY_KEY"), {"MY_KEY": "wrong"}, "the server refused the API key"),
    ):
        result = specsweep(*base, *extra, env=env)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        assert result.stderr.count("\n") == 1 and "HTTP 401" in result.stderr and says in result.stderr
        assert "--api-key-env" in result.stderr and "server.api_key_env" in result.stderr
        assert "--model" not in result.stderr


def test_bad_flags_are_one_line() -> None:
    result = specsweep("measure", "--endpoint", "http://127.0.0.1:1", "--concurrency", "1,x")
    assert result.returncode == 2 and "--concurrency" in result.stderr and "Traceback" not in result.stderr
    result = specsweep("measure", "--endpoint", "http://127.0.0.1:1", "--workload", "nope.jsonl")
    assert result.returncode == 1 and "prose" in result.stderr
    result = specsweep("measure", "--endpoint", "http://127.0.0.1:1", "--api-key-env", "SPECSWEEP_UNSET_VAR")
    assert result.returncode == 1 and "SPECSWEEP_UNSET_VAR" in result.stderr


def test_foreign_traffic_is_detected(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC, time_scale=100)
    stop = threading.Event()

    def other_client() -> None:
        with httpx.Client(base_url=emulator.url, timeout=30) as http:
            for _ in range(200):  # bounded
                if stop.is_set():
                    return
                try:
                    http.post(
                        "/v1/completions",
                        json={"model": DEFAULT_MODEL, "prompt": "def f(x): return", "max_tokens": 50},
                    )
                except httpx.HTTPError:
                    return  # the emulator was stopped at the end of the test

    def on_event(event: object) -> None:
        if isinstance(event, LevelStarted):
            threading.Thread(target=other_client, daemon=True).start()

    settings = MeasureSettings(endpoint=emulator.url, concurrency=(1,), requests=4, max_tokens=200)
    try:
        result = run_measure(settings, load_workload("prose"), on_event=on_event)
    finally:
        stop.set()
    level = result.levels[0]
    assert level.summary.foreign_tokens > 0
    assert any("other clients" in note for note in level.notes)


def test_a_server_that_dies_mid_measurement_keeps_what_was_measured(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC, time_scale=100, extra=["--crash-after-requests", "6"])
    settings = MeasureSettings(endpoint=emulator.url, concurrency=(1, 4), requests=4, warmup=1, max_tokens=50)
    result = run_measure(settings, load_workload("prose"))
    first = result.levels[0].summary
    assert first.errors == 0 and first.output_tokens == 200
    # the second level's warm-up or requests hit the dead server: reported, not raised
    assert result.error is not None or result.levels[1].summary.errors > 0


def test_open_loop_rate(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC, time_scale=100)
    settings = MeasureSettings(endpoint=emulator.url, rate_per_s=20.0, requests=10, warmup=1, max_tokens=50)
    result = run_measure(settings, load_workload("prose"))
    assert len(result.levels) == 1 and result.levels[0].summary.requests == 10
    assert result.levels[0].summary.errors == 0
