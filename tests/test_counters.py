"""Counter differences and acceptance from Prometheus text: engines summed, windows differenced."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.engines.llamacpp import COUNTERS as LLAMA
from specsweep.engines.vllm import COUNTERS as VLLM
from specsweep.errors import MetricsError
from specsweep.measurement.counters import counter_delta, summarize_acceptance
from specsweep.runtime.scraper import parse_metrics_text


def vllm_text(engines: dict[str, tuple[int, int, int, list[int], int]]) -> str:
    lines = []
    for name, kind in (
        ("vllm:spec_decode_num_drafts", 0),
        ("vllm:spec_decode_num_draft_tokens", 1),
        ("vllm:spec_decode_num_accepted_tokens", 2),
        ("vllm:generation_tokens", 4),
    ):
        lines.append(f"# TYPE {name} counter")
        for engine, values in engines.items():
            lines.append(f'{name}_total{{engine="{engine}",model_name="m"}} {values[kind]}')
    lines.append("# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter")
    for engine, values in engines.items():
        for position, count in enumerate(values[3]):
            lines.append(
                f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="{engine}",model_name="m",'
                f'position="{position}"}} {count}'
            )
    return "\n".join(lines) + "\n"


def test_two_engines_are_summed_and_windows_differenced() -> None:
    before = parse_metrics_text(vllm_text({"0": (10, 30, 12, [6, 4, 2], 50), "1": (0, 0, 0, [0, 0, 0], 0)}), taken_at=1)
    after = parse_metrics_text(
        vllm_text({"0": (110, 330, 132, [66, 44, 22], 400), "1": (100, 300, 120, [60, 40, 20], 350)}), taken_at=11
    )
    delta = counter_delta(before, after, VLLM)
    assert delta.engines == 2 and delta.window_s == 10
    assert (delta.num_drafts, delta.num_draft_tokens, delta.num_accepted_tokens) == (200, 600, 240)
    assert delta.accepted_per_position == (120, 80, 40)
    assert delta.generation_tokens == 700
    acceptance = summarize_acceptance(delta)
    assert acceptance.per_position == pytest.approx((0.6, 0.4, 0.2))
    assert acceptance.conditional == pytest.approx((0.6, 2 / 3, 0.5))
    assert acceptance.mean_acceptance_length == pytest.approx(2.2)
    assert acceptance.draft_acceptance_rate == pytest.approx(0.4)


def test_llama_cpp_names_without_engine_labels() -> None:
    text = """# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 40
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 15
llamacpp:spec_decode_num_draft_tokens_total 60
llamacpp:spec_decode_num_accepted_tokens_total 23
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 5
"""
    empty = parse_metrics_text("", taken_at=0)
    delta = counter_delta(empty, parse_metrics_text(text, taken_at=2), LLAMA)
    assert (delta.generation_tokens, delta.num_drafts, delta.accepted_per_position) == (40, 15, (8, 5))
    assert summarize_acceptance(delta).mean_acceptance_length == pytest.approx(1 + 23 / 15)


def test_no_drafts_means_no_acceptance() -> None:
    text = "# TYPE vllm:generation_tokens counter\nvllm:generation_tokens_total 5\n"
    delta = counter_delta(parse_metrics_text(text), parse_metrics_text(text), VLLM)
    assert delta.num_drafts is None and summarize_acceptance(delta) is None


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=200))
def test_any_text_parses_or_raises_metrics_error(text: str) -> None:
    try:
        parse_metrics_text(text)
    except MetricsError as exc:
        assert "/metrics" in str(exc)
