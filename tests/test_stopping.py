"""Adaptive measurement: when a level has measured enough (measurement/stopping.py), against the math."""

from __future__ import annotations

import asyncio
import math
import random
import time
from dataclasses import replace

import pytest

from specsweep.config import parse_study_config
from specsweep.measurement.levels import summarize_level
from specsweep.measurement.stopping import (
    MIN_REQUEST_SD,
    LevelTarget,
    Z,
    estimate_rate,
    request_step_time_s,
    stop_reason,
)
from specsweep.runtime.driver import PromptCycle, run_closed_loop
from specsweep.tuning.trial import level_targets
from specsweep.types import RequestRecord
from specsweep.workload import load_workload


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


def drafted(per_step: list[float], step_s: float = 0.05, tokens: int = 601) -> list[RequestRecord]:
    """Answered requests whose texts draft differently (tokens per decode step) at one step time:
    one content chunk per step, as vLLM streams them."""
    out = []
    for i, e in enumerate(per_step):
        steps = round((tokens - 1) / e)
        chunks = (1, *[(tokens - 1) // steps] * (steps - 1), (tokens - 1) - (tokens - 1) // steps * (steps - 1))
        span = steps * step_s
        out.append(
            RequestRecord(prompt_id=str(i), started_at=0.0, max_tokens=tokens, completion_tokens=tokens,
                          ttft_s=0.1, last_token_s=0.1 + span, latency_s=0.1 + span, num_chunks=len(chunks),
                          chunk_tokens=chunks)
        )  # fmt: skip
    return out


def test_precision_is_the_step_times_not_the_rates_that_the_text_moves() -> None:
    """Four requests whose texts draft 2.0 to 3.0 tokens per step at one step time: their rates
    spread 17%, their step times agree, so the level is precise (acceptance is the counters'
    part). Without per-step counts the rates' spread is all it has, and it goes on."""
    records = drafted([2.0, 3.0, 2.5, 2.2])
    estimate = estimate_rate(records, concurrency=1)
    rates = [600 / (r.last_token_s - r.ttft_s) for r in records]
    assert max(rates) / min(rates) > 1.4
    assert estimate.step_time_relative_se == pytest.approx(MIN_REQUEST_SD / 2, rel=0.02)
    assert Z * estimate.relative_se > 0.1
    assert stop_reason(target(min_requests=4), records) == "precise"
    plain = [replace(r, chunk_tokens=None) for r in records]
    assert estimate_rate(plain, 1).step_time_relative_se == estimate_rate(plain, 1).relative_se
    assert stop_reason(target(min_requests=4), plain) is None
    # llama.cpp counts accepted drafts per request instead of streaming a step per chunk
    counted = [replace(r, chunk_tokens=(1,) * 601, draft_n_accepted=600 - (len(r.chunk_tokens or ()) - 1))
               for r in records]  # fmt: skip
    assert estimate_rate(counted, 1).step_time_relative_se == pytest.approx(MIN_REQUEST_SD / 2, rel=0.02)
    # step times that do spread keep it going
    uneven = [
        replace(r, last_token_s=end, latency_s=end)
        for r, f in zip(records, (0.9, 1.1, 0.9, 1.1), strict=True)
        for end in [0.1 + (r.last_token_s - 0.1) * f]
    ]
    assert stop_reason(target(min_requests=4), uneven) is None


def test_a_precise_rate_is_precise_where_step_times_spread_with_how_often_the_text_matched() -> None:
    """An n-gram drafter drafts only where the text matches: a llama-server step that drafted seven
    tokens and accepted three verifies eight, one with no match decodes one. Four requests whose
    rates agree while their step times spread 2.5-fold are precise by their rates; the same
    requests paced 20% apart, so that their rates spread too, go on."""

    def matched(share: float, tokens: int = 129, *, slower: float = 1.0) -> RequestRecord:
        """A request whose decode steps drafted (and accepted 3 of 7) ``share`` of the time, at
        50 tok/s whatever the share (drafting that barely pays), or ``slower``."""
        drafted_steps = share * (tokens - 1) / (share * 4 + (1 - share))  # 4 tokens a drafted step
        span = (tokens - 1) * 0.02 * slower
        return RequestRecord(prompt_id=f"{share}", started_at=0.0, max_tokens=tokens, completion_tokens=tokens,
                             ttft_s=0.1, last_token_s=0.1 + span, latency_s=0.1 + span,
                             draft_n_accepted=3 * drafted_steps)  # fmt: skip

    shares = (0.1, 0.6, 0.3, 0.9)
    records = [matched(s) for s in shares]
    estimate = estimate_rate(records, concurrency=1)
    steps = [request_step_time_s(r) for r in records]
    assert max(steps) / min(steps) > 2.5 and Z * estimate.step_time_relative_se > 0.2
    assert Z * estimate.relative_se <= 0.03
    assert stop_reason(target(min_requests=4), records) == "precise"
    spread = [matched(s, slower=f) for s, f in zip(shares, (0.8, 1.2, 0.8, 1.2), strict=True)]
    assert Z * estimate_rate(spread, 1).relative_se > 0.1
    assert stop_reason(target(min_requests=4), spread) is None


def test_a_lookup_drafters_levels_take_the_whole_budget() -> None:
    """A drafter that looks its drafts up drafts where a prompt's text matches, and a level's
    prompts come in one order: on a real llama-server (ngram-simple, technical) the first two
    drafted on 80% of the steps, the first twelve on 31%. Here the first two prompts draft three
    tokens a step and the other ten one and a half: the adaptive rule stops after the two as
    precise, at a rate about 1.8 times the twelve's. A lookup drafter's levels are therefore not
    adaptive (tuning/trial.level_targets): nothing stops them before the budget, a chain
    drafter's still may."""
    records = drafted([3.0, 3.0] + [1.5] * 10)
    assert stop_reason(target(), records[:2]) == "precise"
    early, whole = estimate_rate(records[:2], 1).tokens_per_s, estimate_rate(records, 1).tokens_per_s
    assert early > 1.7 * whole
    config = parse_study_config({"study": {"name": "n"}, "measure": {"concurrency": [1, 4], "max_requests": 12}})
    for looks_up in (True, False):
        targets = level_targets(
            config, [], key="k", spec=None, contender=False, acceptance_run=False, looks_up=looks_up
        )
        assert targets is not None
        for level in targets.values():
            for b, t in level.items():
                assert t.adaptive is not looks_up and t.max_requests == 12
                assert t.min_requests == (12 if looks_up else max(2, b))
                assert (stop_reason(t, drafted([3.0] * 11)) is None) is looks_up
                assert stop_reason(t, drafted([3.0] * 12)) is not None


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


class _SharedTimeline:
    """A client against a fake server that runs every stream in one shared timeline, as an
    engine's step loop does: a request's prefill is a step of its own that holds every stream
    (no tokens for anyone while it runs), then it streams one token per decode step. Request n
    decodes 30 + 4n tokens, so a round's answers come one after another."""

    def __init__(self, step_s: float = 0.004, prefill_s: float = 0.03, late_s: float = 0.02) -> None:
        self.step_s, self.prefill_s, self.late_s = step_s, prefill_s, late_s
        self.sent = 0
        self.prefilling = 0

    async def stream(self, prompt, *, max_tokens: int, temperature: float, cut=None) -> RequestRecord:
        n, self.sent = self.sent, self.sent + 1
        if n == 3:
            await asyncio.sleep(self.late_s)  # the fourth stream's first request leaves late
        started = time.perf_counter()
        self.prefilling += 1
        await asyncio.sleep(self.prefill_s)
        self.prefilling -= 1
        times: list[float] = []
        for _ in range(30 + 4 * n):
            while self.prefilling:  # another request's prefill holds the step loop
                await asyncio.sleep(self.step_s / 4)
            await asyncio.sleep(self.step_s)
            times.append(time.perf_counter() - started)
            if cut is not None and cut.is_set():
                return RequestRecord(
                    prompt_id=str(n), started_at=started, max_tokens=max_tokens, cut=True, num_chunks=len(times),
                    chunk_tokens=(1,) * len(times), chunk_times_s=tuple(times),
                )  # fmt: skip
        return RequestRecord(
            prompt_id=str(n), started_at=started, max_tokens=max_tokens, completion_tokens=len(times),
            ttft_s=times[0], last_token_s=times[-1], latency_s=times[-1], num_chunks=len(times),
            chunk_tokens=(1,) * len(times), chunk_times_s=tuple(times),
        )  # fmt: skip


def test_a_stopped_levels_window_is_where_every_stream_was_busy() -> None:
    """One round of four streams stopped at four answers: each of the first three answers sent a
    request that was then cut, after its prefill had held every stream. The saturated window ends
    where the first of them began, so no prefill without tokens is charged to the level and no
    cut request's token is in it; every stream was busy with its answered request until then. It
    starts when the last stream sent its first request (here 20 ms late), not when the level did."""
    prompts = PromptCycle(load_workload("prose"), seed=0)

    def four(records) -> str | None:
        return "precise" if len(records) >= 4 else None

    loop = run_closed_loop(
        _SharedTimeline(), prompts, concurrency=4, requests=32, max_tokens=600, temperature=0.0, stop=four
    )
    run = asyncio.run(loop)
    assert len(run.records) == 4 and len(run.cut) == 3
    first_cut = min(r.started_at for r in run.cut)
    first_answer = min(r.started_at + (r.latency_s or 0.0) for r in run.records)
    assert run.saturated_until == pytest.approx(first_cut, abs=1e-9)
    assert run.saturated_from == pytest.approx(max(r.started_at for r in run.records), abs=1e-9)
    assert run.saturated_from - run.started_at >= 0.02
    assert first_answer <= run.saturated_until < max(r.started_at + (r.latency_s or 0.0) for r in run.records)
    window = (run.saturated_from, run.saturated_until)
    summary = summarize_level(list(run.records), concurrency=4, wall_s=run.wall_s, delta=None, window=window,
                              cut=run.cut)  # fmt: skip
    in_window = sum(1 for r in run.records for t in r.chunk_times_s or () if window[0] <= r.started_at + t <= window[1])
    assert summary.saturated_output_tokens_per_s == pytest.approx(in_window / (window[1] - window[0]))
    assert all(r.started_at >= run.saturated_until for r in run.cut)


def test_a_level_paired_with_earlier_levels_of_its_group_stops_when_its_own_noise_is_settled() -> None:
    """Truth: prompts whose rates spread 25% between them, the same in every level, and a level's
    own noise of 1%. Alone, the prompts' spread is the level's error and it runs to its budget;
    paired with two earlier levels that sent the same prompts, what is left of its error is its
    own noise and the mix of the prompts it has not sent yet, and it stops once both are small."""
    rng = random.Random(23)
    prompt_rate = [40.0 * math.exp(rng.gauss(0.0, 0.25)) for _ in range(12)]

    def level(scale: float, n: int) -> list[RequestRecord]:
        return requests([scale * prompt_rate[p] * math.exp(rng.gauss(0.0, 0.01)) for p in range(n)])

    earlier = tuple(
        tuple((r.prompt_id, r.completion_tokens / r.latency_s, request_step_time_s(r)) for r in level(s, 12))
        for s in (1.0, 1.1)
    )
    alone = [n for n in range(2, 13) if stop_reason(target(precision=0.05), level(0.95, n)) == "precise"]
    paired = [n for n in range(2, 13) if stop_reason(target(precision=0.05, shared=earlier), level(0.95, n))]
    assert not alone  # 25% between prompts: the 95% half-width stays above 5% up to the budget
    assert paired and paired[0] < 12
    # at the budget every prompt is sent: the error is the level's own noise, at the floor
    full = estimate_rate(level(0.95, 12), 1, earlier)
    assert full.relative_se == pytest.approx(MIN_REQUEST_SD / math.sqrt(12), rel=0.3)
    # a level sharing no prompt with them keeps its own spread
    other = [replace(r, prompt_id=f"x{r.prompt_id}") for r in level(0.95, 6)]
    assert estimate_rate(other, 1, earlier) == estimate_rate(other, 1)
