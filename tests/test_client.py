"""The streaming client against scripted servers (httpx.MockTransport): protocol edge cases."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.measurement.counters import CounterDelta
from specsweep.measurement.levels import summarize_level
from specsweep.runtime.client import StreamingClient, _StreamTracker
from specsweep.types import RequestRecord
from specsweep.workload import WorkloadPrompt

PROMPT = WorkloadPrompt(id="p1", subcategory="", prompt="Write a long story about the sea.")


def sse(*events: object, done: bool = True) -> bytes:
    lines = [f"data: {json.dumps(e) if not isinstance(e, str) else e}\n\n" for e in events]
    if done:
        lines.append("data: [DONE]\n\n")
    return "".join(lines).encode()


def chunk(text: str | None = None, finish: str | None = None, usage: int | None = None, prompt: int = 7) -> dict:
    event: dict = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": []}
    if text is not None or finish is not None:
        event["choices"] = [{"index": 0, "delta": {"content": text or ""}, "finish_reason": finish}]
    if usage is not None:
        event["usage"] = {"prompt_tokens": prompt, "completion_tokens": usage, "total_tokens": prompt + usage}
    return event


def run(body: bytes | None = None, status: int = 200, handler=None, **client_args):
    seen: list[httpx.Request] = []

    def default(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(status, content=body, headers={"content-type": "text/event-stream"})

    async def go():
        transport = httpx.MockTransport(handler or default)
        async with StreamingClient("http://server", model="m", transport=transport, **client_args) as client:
            return await client.stream(PROMPT, max_tokens=8, temperature=0.0)

    return asyncio.run(go()), seen


def test_tokens_come_from_usage_not_chunks() -> None:
    body = sse(
        chunk("", usage=0),
        chunk("Once", usage=1),
        chunk(" upon a time", usage=4),
        chunk(" there was", usage=6),
        chunk(" a sea.", finish="length", usage=8),
        chunk(usage=8),
    )
    record, seen = run(body)
    assert record.ok and record.completion_tokens == 8 and record.prompt_tokens == 7
    assert record.num_chunks == 4  # counting chunks would say 4 tokens
    assert record.chunk_tokens == (1, 3, 2, 2)
    assert record.finish_reason == "length" and not record.stopped_early
    sent = json.loads(seen[0].content)
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert sent["messages"][0]["content"].startswith("[") and sent["messages"][0]["content"].endswith("the sea.")
    assert record.ttft_s is not None and record.last_token_s >= record.ttft_s


def test_final_usage_only_leaves_tokens_per_chunk_unknown() -> None:
    record, _ = run(sse(chunk("a"), chunk("bc", finish="stop"), chunk(usage=3)))
    assert record.ok and record.completion_tokens == 3 and record.chunk_tokens is None
    assert record.stopped_early  # 3 < max_tokens 8, finish_reason stop


def test_missing_usage_is_an_error_not_a_guess() -> None:
    record, _ = run(sse(chunk("a"), chunk("b", finish="length")))
    assert not record.ok and "no usage" in record.error
    assert record.completion_tokens is None


def test_stream_without_done_is_a_dropped_stream() -> None:
    record, _ = run(sse(chunk("a", usage=1), done=False))
    assert not record.ok and "before [DONE]" in record.error


def test_malformed_event() -> None:
    record, _ = run(sse(chunk("a", usage=1), "{not json"))
    assert not record.ok and "malformed SSE" in record.error


def test_http_error_carries_the_server_message() -> None:
    body = json.dumps({"error": {"message": "The model `m` does not exist.", "type": "NotFoundError", "code": 404}})
    record, _ = run(body.encode(), status=404)
    assert record.error == "HTTP 404: The model `m` does not exist."
    record, _ = run(b"upstream exploded", status=503)
    assert record.error == "HTTP 503: upstream exploded"


def test_error_event_inside_the_stream() -> None:
    record, _ = run(sse(chunk("a", usage=1), {"error": {"message": "EngineDeadError", "code": 500}}))
    assert not record.ok and "EngineDeadError" in record.error


def test_connection_dropped_before_any_byte_is_retried_once() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=sse(chunk("a", usage=1), chunk("b", finish="length", usage=2)))

    record, _ = run(handler=handler)
    assert record.ok and len(calls) == 2 and record.retried
    # the retry sends the same body: the same nonce, so the server sees the same prompt
    assert calls[0].content == calls[1].content
    answered, _ = run(sse(chunk("a", usage=1), chunk("b", finish="length", usage=2)))
    assert answered.ok and not answered.retried


def test_a_retried_first_attempts_tokens_are_not_another_clients() -> None:
    """The server may have generated up to max_tokens for an attempt whose connection dropped
    before any byte came back: the level's counters include them, and they are this tool's."""

    def delta(generated: float) -> CounterDelta:
        return CounterDelta(
            window_s=10.0, generation_tokens=generated, prompt_tokens=None, num_drafts=None, num_draft_tokens=None,
            num_accepted_tokens=None, accepted_per_position=None, engines=1,
        )  # fmt: skip

    plain = RequestRecord(prompt_id="p", started_at=0.0, max_tokens=50, completion_tokens=50, latency_s=1.0)
    retried = RequestRecord(
        prompt_id="q", started_at=0.0, max_tokens=50, completion_tokens=50, latency_s=1.0, retried=True
    )
    # 100 answered, and the dropped first attempt's 30: nothing foreign
    summary = summarize_level([plain, retried], concurrency=1, wall_s=2.0, delta=delta(130.0))
    assert summary.foreign_tokens == 0.0
    # the same growth with no retry: 30 tokens came from someone else
    summary = summarize_level([plain, replace(retried, retried=False)], concurrency=1, wall_s=2.0, delta=delta(130.0))
    assert summary.foreign_tokens == 30.0
    # beyond what the dropped attempt could have asked for, the rest is still foreign
    summary = summarize_level([plain, retried], concurrency=1, wall_s=2.0, delta=delta(170.0))
    assert summary.foreign_tokens == 20.0


def test_connection_refused_twice_is_reported() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused")

    record, _ = run(handler=handler)
    assert not record.ok and record.error.startswith("connection: ConnectError")


def test_bearer_token_and_completions_api() -> None:
    body = sse({"id": "cmpl-1", "choices": [{"index": 0, "text": "abc", "finish_reason": "length"}]}, chunk(usage=8))
    record, seen = run(body, api="completions", api_key="s3cret")
    assert record.ok and record.num_chunks == 1
    assert seen[0].headers["authorization"] == "Bearer s3cret"
    assert seen[0].url.path == "/v1/completions"
    assert json.loads(seen[0].content)["prompt"].endswith("Write a long story about the sea.")


def test_llama_cpp_timings_and_sglang_fields() -> None:
    body = sse(
        chunk("a", usage=1),
        {**chunk("bcd", finish="length", usage=8), "timings": {"draft_n": 12, "draft_n_accepted": 7}},
        # SGLang 0.5.23 sends the details in a chunk of their own, with no choices
        {"id": "chatcmpl-1", "choices": [], "sglext": {"spec_tokens_details": {"spec_verify_ct": 3,
                                                                              "spec_num_correct_drafts": 5}}},
        chunk(usage=8),
    )  # fmt: skip
    record, _ = run(body)
    assert (record.draft_n, record.draft_n_accepted, record.spec_verify_ct) == (12, 7, 3)
    assert record.response_id == "chatcmpl-1"
    listed = sse(chunk("ab", finish="length", usage=8), {"choices": [], "sglext": {"spec_tokens_details": [
        {"spec_verify_ct": 4}]}})  # fmt: skip
    assert run(listed)[0].spec_verify_ct == 4


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "delta", "content", "text", "usage", "completion_tokens", "prompt_tokens",
                         "finish_reason", "timings", "draft_n", "sglext", "spec_tokens_details", "id", "error",
                         "index"]), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip
_lines = st.one_of(
    st.text(max_size=60),
    st.builds(lambda s: "data: " + s, st.text(max_size=60)),
    st.builds(lambda v: "data: " + json.dumps(v), _json),
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_lines, max_size=8))
def test_any_line_sequence_ends_in_a_record_or_an_error(lines: list[str]) -> None:
    tracker = _StreamTracker(0.0)
    for line in lines:
        if tracker.feed(line.encode(), 1.0):
            break
    record = tracker.record("p", 8)
    assert record.ok or record.error
