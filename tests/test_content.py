"""Content classes and token counts, decided from the prompt text alone."""

from __future__ import annotations

import pytest

from specsweep.emulator.content import classify_content, count_tokens
from specsweep.workload import load_workload, new_nonce


@pytest.mark.parametrize("name", ["prose", "technical"])
def test_every_shipped_prompt_lands_in_its_class(name: str) -> None:
    workload = load_workload(name)
    wrong = [p.id for p in workload.prompts if classify_content(p.completion_prompt(new_nonce())) != name]
    assert wrong == []


def test_classification_ignores_the_nonce_and_is_deterministic() -> None:
    text = "Tell me about the quiet river at morning, slowly, as she remembered it."
    assert classify_content(text) == "prose"
    assert classify_content(f"[{new_nonce()}] {text}") == "prose"
    code = 'def f(x):\n    return {"id": 0x3f, "v": [1, 2, 3]}\n'
    assert classify_content(code) == classify_content(code) == "technical"


@pytest.mark.parametrize(
    ("text", "tokens"),
    [("", 0), ("hello", 1), ("understanding", 3), ("x = 1234;", 5), ("a_b", 3), ("  \n ", 0)],
)
def test_token_count_rule(text: str, tokens: int) -> None:
    # letters in runs of up to 6, digits in runs of up to 3, every other non-space char alone
    assert count_tokens(text) == tokens
