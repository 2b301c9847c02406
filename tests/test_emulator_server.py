"""The emulator as a real process on a loopback port: endpoints, streaming, metrics, logs, faults."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specsweep.errors import ReadyTimeoutError, ServerCrashedError
from specsweep.runtime.scraper import parse_metrics_text

from .conftest import DEFAULT_MODEL

SPEC5 = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'
PROSE = "Continue the story of the old ferryman who remembered every face that crossed the river. " * 3


def sse_events(response_text: str) -> list[str]:
    return [line[len("data: ") :] for line in response_text.split("\n") if line.startswith("data: ")]


def chat_body(**extra) -> dict:
    body = {"model": DEFAULT_MODEL, "messages": [{"role": "user", "content": PROSE}], "max_tokens": 120}
    body.update(extra)
    return body


def test_simple_endpoints(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    with httpx.Client(base_url=emulator.url) as http:
        assert http.get("/health").status_code == 200
        # vLLM's {"version"}, plus what the emulator emulates (a rig file tells it apart by this)
        assert http.get("/version").json() == {
            "version": "0.33.0",
            "emulator": {"profile": "dgx-spark-v4-flash", "time_scale": 50.0, "startup_s": 0.0, "max_num_seqs": 4},
        }
        models = http.get("/v1/models").json()
        assert models["data"][0]["id"] == DEFAULT_MODEL
        missing = http.post("/v1/chat/completions", json=chat_body(model="gpt-unknown"))
        assert missing.status_code == 404
        assert missing.json()["error"]["type"] == "NotFoundError"
        bad = http.post("/v1/chat/completions", json=chat_body(max_tokens=0))
        assert bad.status_code == 400 and "max_tokens" in bad.json()["error"]["message"]


def test_streaming_chat_follows_vllm(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    body = chat_body(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True})
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        text = http.post("/v1/chat/completions", json=body).text
    events = sse_events(text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    final = chunks[-1]
    assert final["choices"] == [] and final["usage"]["completion_tokens"] == 120
    content = [c for c in chunks[:-1] if c["choices"][0]["delta"].get("content")]
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    # cumulative usage on every chunk, increasing by the tokens each chunk carries
    per_chunk = []
    previous = 0
    for chunk in content:
        per_chunk.append(chunk["usage"]["completion_tokens"] - previous)
        previous = chunk["usage"]["completion_tokens"]
    assert sum(per_chunk) == 120
    assert max(per_chunk) > 1  # speculation: some steps emit several tokens in one chunk
    assert max(per_chunk) <= 6  # at most k accepted + 1 bonus
    assert per_chunk[0] == 1  # the prefill step emits one token
    assert len(content) < 120  # so counting chunks undercounts
    assert content[-1]["choices"][0]["finish_reason"] == "length"


def test_include_usage_only_and_no_usage(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        only_final = sse_events(
            http.post("/v1/chat/completions", json=chat_body(stream=True, stream_options={"include_usage": True})).text
        )
        none = sse_events(http.post("/v1/chat/completions", json=chat_body(stream=True)).text)
    assert ["usage" in json.loads(e) for e in only_final[:-1]].count(True) == 1
    assert all("usage" not in json.loads(e) for e in none[:-1])


def test_completions_endpoint_and_non_streaming(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        whole = http.post("/v1/completions", json={"model": DEFAULT_MODEL, "prompt": PROSE, "max_tokens": 50}).json()
        assert whole["object"] == "text_completion"
        assert whole["usage"]["completion_tokens"] == 50
        assert whole["choices"][0]["finish_reason"] == "length"
        chat = http.post("/v1/chat/completions", json=chat_body(max_tokens=40)).json()
        assert chat["choices"][0]["message"]["role"] == "assistant"
        assert chat["usage"]["completion_tokens"] == 40
        streamed = sse_events(
            http.post(
                "/v1/completions",
                json={"model": DEFAULT_MODEL, "prompt": PROSE, "max_tokens": 30, "stream": True,
                      "stream_options": {"include_usage": True}},
            ).text
        )  # fmt: skip
        assert json.loads(streamed[-2])["usage"]["completion_tokens"] == 30
        assert json.loads(streamed[0])["object"] == "text_completion"


def test_metrics_follow_vllm_and_count_what_was_served(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        for _ in range(3):
            http.post("/v1/chat/completions", json=chat_body(max_tokens=100))
        text = http.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in (
        "vllm:spec_decode_num_drafts",
        "vllm:spec_decode_num_draft_tokens",
        "vllm:spec_decode_num_accepted_tokens",
        "vllm:spec_decode_num_accepted_tokens_per_pos",
        "vllm:generation_tokens",
        "vllm:prompt_tokens",
    ):
        assert families[name].type == "counter", name
    assert families["vllm:num_requests_running"].type == "gauge"
    assert families["vllm:time_to_first_token_seconds"].type == "histogram"
    snapshot = parse_metrics_text(text)
    assert snapshot.total("vllm:generation_tokens_total") == 300
    drafts = snapshot.total("vllm:spec_decode_num_drafts_total")
    assert snapshot.total("vllm:spec_decode_num_draft_tokens_total") == 5 * drafts
    per_pos = [snapshot.total("vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in range(5)]
    assert sum(per_pos) == snapshot.total("vllm:spec_decode_num_accepted_tokens_total")
    assert per_pos == sorted(per_pos, reverse=True)
    labels = snapshot.values("vllm:spec_decode_num_drafts_total")[0][0]
    assert labels == {"engine": "0", "model_name": DEFAULT_MODEL}
    assert "vllm:spec_decode_num_drafts_created" in snapshot.samples
    ttft_count = snapshot.total("vllm:time_to_first_token_seconds_count")
    assert ttft_count == 3


def test_without_speculation_there_are_no_spec_counters(start_emulator) -> None:
    emulator = start_emulator()
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        events = sse_events(
            http.post(
                "/v1/chat/completions",
                json=chat_body(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
            ).text
        )
        text = http.get("/metrics").text
    counts = [json.loads(e)["usage"]["completion_tokens"] for e in events[:-1]]
    assert counts[1:-1] == list(range(1, 121))  # one token per chunk without speculation
    assert "spec_decode" not in text and "vllm:generation_tokens_total" in text


def test_disable_log_stats_removes_engine_metrics(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, extra=["--disable-log-stats"])
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        http.post("/v1/chat/completions", json=chat_body(max_tokens=20))
        assert "vllm:" not in http.get("/metrics").text


def test_startup_log_lines(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, time_scale=100, startup_seconds=50)
    log = emulator.log()
    assert "GPU KV cache size: 1,760,985 tokens, Maximum concurrency for 400,000 tokens per request: 4.40x" in log
    suggestions = [line for line in log.splitlines() if "is equivalent to --gpu-memory-utilization=" in line]
    assert len(suggestions) == 2
    assert "=0.8526 without" in suggestions[0] and "=0.8556 without" in suggestions[1]
    assert "Using default W8A8 Block FP8 kernel config. Performance might be sub-optimal!" in log
    assert log.rstrip().endswith("Application startup complete.")


def test_periodic_stats_lines(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, time_scale=200)
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        http.post("/v1/chat/completions", json=chat_body(max_tokens=600))
    time.sleep(0.2)
    log = emulator.log()
    assert "Avg prompt throughput:" in log and "Avg generation throughput:" in log and "Running: " in log
    spec_lines = [line for line in log.splitlines() if "SpecDecoding metrics: Mean acceptance length:" in line]
    assert spec_lines
    assert "Per-position acceptance rate: " in spec_lines[0] and "Avg Draft acceptance rate:" in spec_lines[0]


def test_vllm_refuses_connections_until_ready(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, time_scale=10, startup_seconds=20, wait=False)
    time.sleep(0.3)
    with pytest.raises(httpx.ConnectError):
        httpx.get(emulator.url + "/health")
    emulator.process.wait_ready(emulator.url + "/health", timeout_s=30)
    assert httpx.get(emulator.url + "/health").status_code == 200


@pytest.mark.parametrize(
    ("config", "reason"),
    [
        ('{"num_speculative_tokens":5,"draft_len":3}', "draft_len"),
        ('{"num_speculative_tokens":-1}', "num_speculative_tokens"),
        ('{"method":"ngram","num_speculative_tokens":3}', "not available"),
    ],
)
def test_invalid_spec_config_exits_at_startup_with_the_reason(start_emulator, config: str, reason: str) -> None:
    emulator = start_emulator(speculative_config=config, wait=False)
    with pytest.raises(ServerCrashedError, match=reason):
        emulator.process.wait_ready(emulator.url + "/health", timeout_s=30)
    assert emulator.process.exit_code() != 0


def test_boot_failure_above_max_k(start_emulator) -> None:
    emulator = start_emulator(speculative_config='{"num_speculative_tokens":11}', wait=False)
    with pytest.raises(ServerCrashedError, match="OutOfMemoryError"):
        emulator.process.wait_ready(emulator.url + "/health", timeout_s=30)
    fits = start_emulator(speculative_config='{"num_speculative_tokens":10}')
    assert httpx.get(fits.url + "/health").status_code == 200


def test_hang_at_boot_never_becomes_ready(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, extra=["--hang-at-boot"], wait=False)
    with pytest.raises(ReadyTimeoutError):
        emulator.process.wait_ready(emulator.url + "/health", timeout_s=1.5)
    assert emulator.process.exit_code() is None  # still running: a hang, not a crash
    assert emulator.process.stop(grace_s=5) is not None


def test_crash_after_n_requests(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, extra=["--crash-after-requests", "2"])
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        for _ in range(2):
            assert http.post("/v1/chat/completions", json=chat_body(max_tokens=20)).status_code == 200
        with pytest.raises(httpx.HTTPError):
            http.post("/v1/chat/completions", json=chat_body(max_tokens=20, stream=True))
    deadline = time.monotonic() + 10
    while emulator.process.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert emulator.process.exit_code() == 1
    assert "EngineDeadError" in emulator.log()


def test_stream_dropped_mid_response(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5, extra=["--drop-stream-every", "2"])
    body = chat_body(stream=True, stream_options={"include_usage": True})
    with httpx.Client(base_url=emulator.url, timeout=30) as http:
        first = http.post("/v1/chat/completions", json=body).text
        assert first.endswith("data: [DONE]\n\n")
        with pytest.raises(httpx.RemoteProtocolError):
            http.post("/v1/chat/completions", json=body)
        third = http.post("/v1/chat/completions", json=body).text
        assert third.endswith("data: [DONE]\n\n")


def test_sigterm_stops_it_cleanly(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC5)
    os.kill(emulator.process.pid, signal.SIGTERM)
    emulator.process.process.wait(timeout=10)
    assert emulator.process.exit_code() == 0
    assert "Shutting down" in emulator.log()


def test_print_truth_matches_the_model() -> None:
    from .conftest import print_truth

    truth = print_truth("--speculative-config", SPEC5, "--concurrency", "1,4,8")
    assert set(truth) == {"prose", "technical"}
    assert truth["prose"]["per_position"] == pytest.approx([0.741, 0.538, 0.411, 0.291, 0.241])
    assert truth["technical"]["expected_tokens_per_step"] == pytest.approx(2.208)
    levels = truth["prose"]["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4, 8]
    assert levels[2]["batch_size"] == 4  # max_num_seqs of the profile
    rates = [lv["decode_tokens_per_s"] for lv in levels]
    assert rates[0] == pytest.approx(40.4, rel=0.01) and rates[1] == pytest.approx(66.7, rel=0.05)
