"""Adaptive measurement: when a level has measured enough (analysis/stopping.py), against the math."""

from __future__ import annotations

import math
import random

import pytest

from specsweep.analysis.levels import summarize_level
from specsweep.analysis.stopping import MIN_REQUEST_SD, LevelTarget, Z, estimate_rate, stop_reason
from specsweep.types import RequestRecord


def requests(rates: list[float], tokens: int = 600) -> list[RequestRecord]:
    """Answered requests of ``tokens`` tokens each at the given per-stream rates (tok/s)."""
    return [
        RequestRecord(
            prompt_id=str(i),
            started_at=0.0,
            max_tokens=tokens,
            completion_tokens=tokens,
            latency_s=tokens / rate,
            ttft_s=0.1,
            last_token_s=tokens / rate,
        )
        for i, rate in enumerate(rates)
    ]


def target(**changes) -> LevelTarget:
    return LevelTarget(**{"concurrency": 1, "min_requests": 2, "max_requests": 12, "precision": 0.03, **changes})


def test_the_estimate_is_b_times_the_mean_request_rate_with_its_standard_error() -> None:
    rates = [30.0, 32.0, 31.0, 29.0]
    estimate = estimate_rate(requests(rates), concurrency=4)
    mean = sum(rates) / 4
    sd = math.sqrt(sum((r - mean) ** 2 for r in rates) / 3)
    assert estimate.tokens_per_s == pytest.approx(4 * mean)
    assert estimate.relative_se == pytest.approx(max(sd / mean, MIN_REQUEST_SD) / 2)
    # agreeing requests say little: the sd floor keeps the error from vanishing
    assert estimate_rate(requests([30.0, 30.0]), concurrency=1).relative_se == pytest.approx(
        MIN_REQUEST_SD / math.sqrt(2)
    )


def test_never_before_the_minimum_always_at_the_budget() -> None:
    assert stop_reason(target(min_requests=3), requests([30.0, 30.0])) is None
    assert stop_reason(target(max_requests=5), requests([30.0, 10.0, 50.0, 20.0, 40.0])) == "budget"


def test_a_precise_level_stops_a_noisy_one_goes_on() -> None:
    # 2 agreeing requests: z se = 2 x 0.02 / sqrt(2) = 2.8% <= 3%
    assert stop_reason(target(), requests([30.0, 30.0])) == "precise"
    # 10% spread between requests: z se ~ 2 x 0.1 / sqrt(n) needs n >= 45; not yet at 6
    noisy = requests([27.0, 33.0, 27.0, 33.0, 27.0, 33.0])
    assert stop_reason(target(), noisy) is None
    assert Z * estimate_rate(noisy, 1).relative_se > 0.03


def test_a_configuration_far_behind_the_best_stops_one_far_ahead_too_a_close_one_goes_on() -> None:
    spread = requests([27.0, 33.0, 27.0])  # 30 tok/s, about 12% z se
    assert stop_reason(target(best_tokens_per_s=40.0, best_noise=0.01), spread) == "cannot win"
    assert stop_reason(target(best_tokens_per_s=20.0, best_noise=0.01), spread) == "clearly ahead"
    assert stop_reason(target(best_tokens_per_s=31.0, best_noise=0.01), spread) is None  # a close contender
    # a large run-to-run noise of the best widens what counts as "far"
    assert stop_reason(target(best_tokens_per_s=40.0, best_noise=0.15), spread) is None


@pytest.mark.parametrize(("spread", "most"), [(0.01, 0.001), (0.02, 0.005), (0.05, 0.06)])
def test_the_loser_rule_rarely_stops_a_configuration_as_fast_as_the_best(spread: float, most: float) -> None:
    """Its error rate: a configuration exactly as fast as the best (best noise 1%), with this much
    spread between requests, stopped as 'cannot win' anywhere from the minimum to the budget.
    About 0%, 0.05% and 4% (docs/search.md); a false stop only shortens that configuration's
    measurement, whose rate still enters the model."""
    rng = random.Random(3)
    stopped = 0
    runs = 2000
    for _ in range(runs):
        rates: list[float] = []
        for _ in range(12):
            rates.append(30.0 * math.exp(rng.gauss(0.0, spread)))
            reason = stop_reason(target(best_tokens_per_s=30.0, best_noise=0.01), requests(rates))
            if reason is not None:
                stopped += reason == "cannot win"
                break
    assert stopped / runs <= most


def test_the_saturated_window_counts_cut_requests_by_their_chunks() -> None:
    """Two answered requests and two cut: one cut after two chunks (both inside the window), one
    before its first token. The window's tokens are every chunk that arrived inside it."""
    answered = [
        RequestRecord(prompt_id=str(i), started_at=0.0, max_tokens=6, completion_tokens=6, num_chunks=3,
                      chunk_tokens=(2, 2, 2), chunk_times_s=(0.5, 1.0, 1.5), latency_s=1.5)
        for i in range(2)
    ]  # fmt: skip
    cut = [
        RequestRecord(prompt_id="c", started_at=1.0, max_tokens=6, num_chunks=2, chunk_tokens=(3, 1),
                      chunk_times_s=(0.2, 0.4), cut=True),
        RequestRecord(prompt_id="d", started_at=1.9, max_tokens=6, cut=True),
    ]  # fmt: skip
    summary = summarize_level(answered, concurrency=2, wall_s=2.0, delta=None, window=(0.0, 2.0), cut=cut)
    assert summary.saturated_output_tokens_per_s == pytest.approx((12 + 4) / 2.0)
    assert summary.requests == 2 and summary.cut_requests == 2 and summary.errors == 0
    assert summary.output_tokens == 12  # answered requests' usage only
