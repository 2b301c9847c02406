"""Workload files: the bundled ones, the format, and the errors users see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.emulator.content import count_tokens
from specsweep.errors import WorkloadError
from specsweep.workload import bundled_workload_names, load_workload, new_nonce, parse_workload

TECHNICAL_KINDS = {
    "code", "latex", "json-ids", "hex-base64", "numeric-table", "chemistry", "stack-trace", "infra-config",
}  # fmt: skip


def test_bundled_workloads() -> None:
    assert {"prose", "technical"} <= set(bundled_workload_names())
    for name in ("prose", "technical"):
        workload = load_workload(name)
        assert len(workload.prompts) >= 40
        assert all(p.subcategory for p in workload.prompts)
        # long prompts, each asking for far more than 600 tokens of output
        assert all(300 <= count_tokens(p.text()) <= 500 for p in workload.prompts)
    assert set(load_workload("technical").subcategories()) == TECHNICAL_KINDS


def test_repository_copy_is_what_ships() -> None:
    repo = Path(__file__).parents[1] / "workloads" / "technical.jsonl"
    assert load_workload(repo).prompts == load_workload("technical").prompts


def test_plain_prompts_and_messages(tmp_path: Path) -> None:
    path = tmp_path / "mine.jsonl"
    lines = [
        {"prompt": "Write a long story."},
        {"id": "m", "subcategory": "chat", "messages": [{"role": "system", "content": "Be terse."},
                                                        {"role": "user", "content": "Explain TCP."}]},
    ]  # fmt: skip
    path.write_text("// my workload\n" + "\n".join(json.dumps(x) for x in lines) + "\n\n")
    workload = load_workload(path)
    assert [p.id for p in workload.prompts] == ["mine-2", "m"]
    nonce = new_nonce()
    first = workload.prompts[1].chat_messages(nonce)
    assert first[0]["content"] == f"[{nonce}] Be terse." and first[1]["content"] == "Explain TCP."
    assert workload.prompts[0].completion_prompt(nonce) == f"[{nonce}] Write a long story."
    # the record itself is not changed by adding a nonce
    assert workload.prompts[1].messages[0]["content"] == "Be terse."


def test_nonces_are_unique() -> None:
    assert len({new_nonce() for _ in range(10_000)}) == 10_000


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 1: not valid JSON"),
        ('"just a string"', "JSON object"),
        ('{"prompt": "a", "messages": []}', "exactly one"),
        ('{"prompt": ""}', "non-empty"),
        ('{"prompt": "a", "temperature": 1}', "unknown key 'temperature'"),
        ('{"messages": [{"role": "robot", "content": "x"}]}', "role"),
        ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}', "used twice"),
        ("", "no prompts"),
    ],
)
def test_bad_workloads_say_what_to_fix(line: str, message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        parse_workload(line, name="w", source="w.jsonl")


def test_missing_file_names_the_bundled_workloads(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="prose"):
        load_workload(tmp_path / "nope.jsonl")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.text(max_size=40), st.from_regex(r'\{"(prompt|messages|id)": .{0,20}\}')), max_size=5))
def test_any_text_parses_or_raises_workload_error(lines: list[str]) -> None:
    try:
        parse_workload("\n".join(lines), name="fuzz", source="fuzz.jsonl")
    except WorkloadError as exc:
        assert "fuzz.jsonl" in str(exc)
