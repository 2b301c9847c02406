"""Bad input: whatever the stream, /metrics, a study file or a workload holds, only the documented
errors come out, and each names what to fix. A wrong study file fails before any server starts.
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.config import KNOWN_KEYS, load_study_config, parse_study_config
from specsweep.engines.registry import engine_info
from specsweep.errors import ConfigError, MetricsError, WorkloadError
from specsweep.measurement.counters import counter_delta, summarize_acceptance
from specsweep.runtime.client import StreamingClient, _StreamTracker
from specsweep.runtime.scraper import parse_metrics_text
from specsweep.tuning.space import build_space, check_space
from specsweep.workload import WorkloadPrompt, load_workload, parse_workload

from .conftest import emulator_processes

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the SSE parser ----------------------------------------------------------------------------

_scalar = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True), st.text(max_size=8))
_keys = st.sampled_from(
    ["choices", "delta", "content", "text", "usage", "completion_tokens", "prompt_tokens", "finish_reason",
     "timings", "draft_n", "draft_n_accepted", "sglext", "spec_verify_ct", "id", "error", "message"]
)  # fmt: skip
_json = st.recursive(_scalar, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_keys, inner, max_size=4))
_line = st.one_of(
    st.binary(max_size=40),
    st.builds(lambda b: b"data:" + b, st.binary(max_size=40)),
    st.builds(lambda v: b"data: " + json.dumps(v).encode(), _json),
    st.just(b"data: [DONE]"),
)


@FUZZ
@given(st.lists(_line, max_size=10))
def test_any_event_stream_gives_a_record_or_a_one_line_error(lines: list[bytes]) -> None:
    tracker = _StreamTracker(0.0)
    for line in lines:
        if tracker.feed(line, 1.0):
            break
    record = tracker.record("p", 8)
    assert record.ok != bool(record.error)
    if record.error:
        assert "\n" not in record.error
    else:
        assert record.completion_tokens is not None and record.completion_tokens >= 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_line, max_size=8), st.integers(1, 7), st.sampled_from([200, 200, 500, 404]))
def test_any_response_body_through_the_client(lines: list[bytes], cut: int, status: int) -> None:
    body = b"\n\n".join(lines)
    pieces = [body[i : i + cut] for i in range(0, len(body), cut)] or [b""]

    async def stream_body():
        for piece in pieces:
            yield piece

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=stream_body())

    async def go():
        async with StreamingClient("http://server", model="m", transport=httpx.MockTransport(handler)) as client:
            return await client.stream(WorkloadPrompt(id="p", subcategory="", prompt="x"), max_tokens=8, temperature=0)

    record = asyncio.run(go())
    assert record.ok or (record.error and "\n" not in record.error)
    if status != 200:
        assert record.error and record.error.startswith(f"HTTP {status}")


# -- the Prometheus reader ---------------------------------------------------------------------

VLLM = engine_info("vllm").counters
_names = st.sampled_from(
    [VLLM.num_drafts, VLLM.num_draft_tokens, VLLM.num_accepted_tokens, VLLM.accepted_per_position,
     VLLM.generation_tokens, VLLM.prompt_tokens, "other"]
)  # fmt: skip
_label_value = st.one_of(st.sampled_from(["0", "1", "2", "07"]), st.text(alphabet="ab1²-_ ", max_size=4))
_sample = st.builds(
    lambda name, labels, value: (
        name + ("{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else "") + f" {value}"
    ),
    _names,
    st.dictionaries(st.sampled_from(["position", "engine", "model_name"]), _label_value, max_size=3),
    st.one_of(st.integers(-10, 10**9), st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=4)),
)


@FUZZ
@given(st.lists(_sample, max_size=8), st.lists(_sample, max_size=8))
def test_any_metrics_text_gives_acceptance_or_a_metrics_error(before: list[str], after: list[str]) -> None:
    try:
        first = parse_metrics_text("\n".join(before) + "\n")
        second = parse_metrics_text("\n".join(after) + "\n")
        summarize_acceptance(counter_delta(first, second, VLLM))
    except MetricsError as exc:
        assert "/metrics" in str(exc) and "\n" not in str(exc)


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_as_metrics_text(data: bytes) -> None:
    try:
        parse_metrics_text(data.decode("utf-8", "replace"))
    except MetricsError as exc:
        assert "/metrics" in str(exc)


# -- the study-config loader -------------------------------------------------------------------

_toml_scalar = st.one_of(
    st.booleans(), st.integers(-3, 100), st.floats(-1, 1e4, allow_nan=False), st.text(max_size=12),
    st.sampled_from(["emulator", "vllm", "process", "commands", "grid", "tpe", "greedy", "dspark", "{port}", "x"]),
)  # fmt: skip
_toml_value = st.recursive(
    _toml_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def _table(name: str):
    keys = [*KNOWN_KEYS[name], "unknown_key"] if KNOWN_KEYS[name] else ["prose", "technical", "nope.jsonl"]
    return st.dictionaries(st.sampled_from(keys), _toml_value, max_size=4)


_study_file = st.fixed_dictionaries(
    {"study": st.fixed_dictionaries({"name": st.sampled_from(["s", "bad name", ""])})},
    optional={
        **{name: _table(name) for name in ("server", "search", "measure", "objective", "workloads")},
        "server.emulator": _table("server.emulator"),
        "extra": st.dictionaries(st.text(max_size=4), _toml_value, max_size=2),
    },
)
_KEY_PATH = re.compile(r"\b(study|server|search|workloads|measure|objective)\b|\[\w+\]")


@FUZZ
@given(_study_file)
def test_any_study_file_parses_or_names_the_key_to_fix(data: dict) -> None:
    if "server.emulator" in data:
        data.setdefault("server", {})["emulator"] = data.pop("server.emulator")
    try:
        config = parse_study_config(data, source="fuzz.toml")
        space = build_space(config.search, temperature=config.measure.temperature, engine_has_draft_sample_method=True)
        check_space(space, config.source, config.search.baseline)
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("fuzz.toml: ") and "\n" not in message, message
        assert _KEY_PATH.search(message.removeprefix("fuzz.toml: ")), message


@FUZZ
@given(st.text(max_size=120))
def test_any_text_as_a_study_file(tmp_path_factory: pytest.TempPathFactory, text: str) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz.toml"
    path.write_text(text, encoding="utf-8")
    try:
        load_study_config(path)
    except ConfigError as exc:
        assert str(exc).startswith(f"{path}: ") or f"study file {path}" in str(exc), str(exc)


def test_a_file_that_is_not_toml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text("[study\nname = ")
    with pytest.raises(ConfigError, match=r"s\.toml is not valid TOML"):
        load_study_config(path)
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match=r"s\.toml"):
        load_study_config(path)


# -- the workload loader -----------------------------------------------------------------------

_record = st.dictionaries(
    st.sampled_from(["id", "subcategory", "prompt", "messages", "temperature"]),
    st.one_of(
        _toml_scalar,
        st.lists(st.dictionaries(st.sampled_from(["role", "content"]), _toml_scalar, max_size=2), max_size=2),
    ),
    max_size=4,
)
_workload_line = st.one_of(st.builds(json.dumps, _record), st.text(max_size=30), st.builds(json.dumps, _json))


@FUZZ
@given(st.lists(_workload_line, max_size=6))
def test_any_workload_parses_or_names_the_line_to_fix(lines: list[str]) -> None:
    try:
        workload = parse_workload("\n".join(lines), name="fuzz", source="fuzz.jsonl")
    except WorkloadError as exc:
        message = str(exc)
        assert message.startswith("workload fuzz.jsonl") and "\n" not in message, message
        assert re.match(r"workload fuzz\.jsonl( line \d+: |: no prompts)", message), message
    else:
        for prompt in workload.prompts:
            assert prompt.chat_messages("n")[0]["content"].startswith("[n] ")


@FUZZ
@given(st.binary(max_size=100))
def test_a_workload_file_of_any_bytes(tmp_path_factory: pytest.TempPathFactory, data: bytes) -> None:
    path = tmp_path_factory.getbasetemp() / "fuzz.jsonl"
    path.write_bytes(data)
    try:
        load_workload(path)
    except WorkloadError as exc:
        assert str(path) in str(exc)


_turn = st.dictionaries(st.sampled_from(["from", "value", "role", "content"]), st.one_of(
    st.sampled_from(["human", "gpt", "system", "user", "assistant", "robot"]), st.text(max_size=8), st.integers()
), max_size=3)  # fmt: skip
_foreign = st.one_of(
    st.builds(lambda turns: {"conversations": turns}, st.lists(_turn, max_size=3)),
    st.builds(lambda turns: {"messages": turns, "tools": []}, st.lists(_turn, max_size=3)),
    _json,
)


@FUZZ
@given(st.lists(_foreign, max_size=4), st.sampled_from([".json", ".jsonl", ".txt"]))
def test_any_file_in_another_format_reads_or_names_the_record_to_fix(
    tmp_path_factory: pytest.TempPathFactory, records: list, suffix: str
) -> None:
    """ShareGPT, OpenAI chat or plain text: prompts whose first message carries the nonce, or one line
    that names the file and the line or record."""
    path = tmp_path_factory.getbasetemp() / f"foreign{suffix}"
    text = json.dumps(records) if suffix == ".json" else "\n".join(json.dumps(r) for r in records)
    path.write_text(text)
    try:
        workload = load_workload(path)
    except WorkloadError as exc:
        message = str(exc)
        assert message.startswith(f"workload {path}") and "\n" not in message, message
    else:
        for prompt in workload.prompts:
            assert prompt.chat_messages("n")[0]["content"].startswith("[n] ")


# -- a wrong study file starts nothing ---------------------------------------------------------

WRONG = {
    "a spec field the engine refuses": ('fixed = { method = "dspark", prompt_lookup_max = 3 }', "search.fixed"),
    "a baseline that is not a spec config": (
        'fixed = { method = "dspark" }\nbaseline = { num_speculative_tokens = 2, draft_sample_method = "gumbel" }',
        "search.baseline",
    ),
    "an unknown profile": ('fixed = { method = "dspark" }', "profile 'no-such-rig'"),
    "a missing API key variable": ('fixed = { method = "dspark" }', "SPECSWEEP_UNSET_KEY"),
    "an unreadable workload": ('fixed = { method = "dspark" }', "no-such-workload"),
}


@pytest.mark.parametrize("name", list(WRONG))
def test_a_wrong_study_file_fails_before_any_server_starts(tmp_path: Path, name: str) -> None:
    search, message = WRONG[name]
    profile = "no-such-rig" if "profile" in name else "dgx-spark-v4-flash"
    key = 'api_key_env = "SPECSWEEP_UNSET_KEY"' if "API key" in name else ""
    workload = '"no-such-workload" = 1.0' if "workload" in name else "prose = 1.0"
    (tmp_path / "s.toml").write_text(
        f"""
[study]
name = "wrong"
[server]
engine = "emulator"
{key}
[server.emulator]
profile = "{profile}"
seed = 6500
[search]
{search}
[workloads]
{workload}
[measure]
concurrency = [1]
requests = 1
max_tokens = 10
"""
    )
    result = subprocess.run(
        [sys.executable, "-m", "specsweep", "study", "--config", "s.toml"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert message in result.stderr, result.stderr
    assert not (tmp_path / "studies" / "wrong" / "logs").exists()  # a server's log is opened before it starts
    assert emulator_processes("--seed 6500") == []
