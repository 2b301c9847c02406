"""The official openai Python client talks to the emulator as it would to vLLM."""

from __future__ import annotations

import openai
import pytest

from .conftest import DEFAULT_MODEL

SPEC = '{"num_speculative_tokens":4,"draft_sample_method":"probabilistic"}'


def test_openai_client_streams_chat_with_usage(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC)
    client = openai.OpenAI(base_url=emulator.url + "/v1", api_key="unused")
    assert [m.id for m in client.models.list()] == [DEFAULT_MODEL]
    stream = client.chat.completions.create(
        model=DEFAULT_MODEL,
        messages=[{"role": "user", "content": "Write a long letter to an old friend about the harbour town."}],
        max_tokens=80,
        temperature=0.7,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, chunks, usage = "", 0, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                text += choice.delta.content
                chunks += 1
    assert usage is not None and usage.completion_tokens == 80
    assert text and chunks < 80  # several tokens per chunk under speculation


def test_openai_client_completions_and_errors(start_emulator) -> None:
    emulator = start_emulator(speculative_config=SPEC)
    client = openai.OpenAI(base_url=emulator.url + "/v1", api_key="unused")
    result = client.completions.create(model=DEFAULT_MODEL, prompt="def parse(x):\n    return {", max_tokens=25)
    assert result.usage.completion_tokens == 25
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hello", max_tokens=5)
