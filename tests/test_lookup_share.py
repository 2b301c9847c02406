"""A lookup drafter drafts only where the text matches: the share of its steps that draft at a draft
length the study did not measure, against a real llama-server's levels and against the algebra."""

from __future__ import annotations

import numpy as np
import pytest

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.rates import sample_rates
from specsweep.analysis.step_fit import fit_step_model
from specsweep.analysis.step_model import Cell, StepObservation
from specsweep.analysis.throughput import ThroughputObservation, fit_throughput_model

NGRAM = Drafter(method="ngram prompt_lookup_max=3,prompt_lookup_min=3", draft_sample_method="greedy")

# Measured on a real llama-server (Gemma 3 270M, ngram-simple lookup 3, the technical workload at one
# stream, 12 requests a level, one start each): k -> (share of steps that drafted, tokens per step,
# tok/s); speculation off at 35.7 tok/s. The acceptance per drafting step at positions 1..8 is the
# study's decay fit over those levels.
REAL = {3: (0.496, 2.264, 41.2), 4: (0.450, 2.466, 34.6), 5: (0.415, 2.519, 38.9), 8: (0.342, 3.048, 38.4)}
REAL_K6 = (0.385, 2.822)  # the same server's k = 6, measured in a later start of the same study
REAL_ACCEPTANCE = (0.906, 0.848, 0.807, 0.754, 0.696, 0.696, 0.655, 0.626)


def levels_model(levels, off_rate: float):
    """The step model of speculation off and one start of each of ``levels`` (k -> share, E, tok/s)."""
    observations = [ThroughputObservation(num_speculative_tokens=0, concurrency=1, output_tokens_per_s=off_rate)]
    for start, (k, (share, tokens, rate)) in enumerate(levels.items(), start=1):
        observations.append(
            ThroughputObservation(
                num_speculative_tokens=k, concurrency=1, output_tokens_per_s=rate, tokens_per_step=tokens,
                drafter=NGRAM, start=start, drafted_share=share, relative_se=0.04,
            )
        )  # fmt: skip
    return fit_throughput_model(observations)


def real_model():
    return levels_model(REAL, 35.7)


def test_a_real_servers_unmeasured_draft_length_drafts_as_its_text_says() -> None:
    """k = 6 not measured: the share of its steps that draft and its tokens per step come within 2%
    of what the server measured there later (the nearest measured k's share, k = 5's 0.415, was 8%
    too high, and put k = 6's tokens per step above k = 7's)."""
    model = real_model()
    sample = sample_rates(model, {NGRAM: REAL_ACCEPTANCE}, concurrency=1)
    k6 = Candidate(drafter=NGRAM, num_speculative_tokens=6)
    share = model.drafted_share(k6, 1, sum(REAL_ACCEPTANCE[:6]))
    assert share == pytest.approx(REAL_K6[0], rel=0.02)
    assert sample.tokens_per_step[sample.candidates.index(k6)] == pytest.approx(REAL_K6[1], rel=0.02)
    drafting = sample.tokens_per_step[1:]  # k = 1..8: a longer draft never emits fewer tokens a step
    assert np.all(np.diff(drafting) > 0)


def test_without_what_its_drafts_accept_a_measured_draft_length_keeps_its_own_share() -> None:
    model = real_model()
    for k, (share, _, _) in REAL.items():
        assert model.drafted_share(Candidate(drafter=NGRAM, num_speculative_tokens=k), 1) == pytest.approx(share)


# The same server in another study: each start's text is one draw, and k = 8's start drafted at far
# more of its steps than the others (c = 0.143 where they gave 0.218 to 0.238).
LUCKY = {3: (0.502, 2.285, 41.0), 4: (0.427, 2.411, 40.0), 5: (0.405, 2.498, 39.0), 6: (0.390, 2.741, 40.5),
         8: (0.483, 3.611, 44.0)}  # fmt: skip
LUCKY_ACCEPTANCE = (0.897, 0.848, 0.809, 0.618, 0.578, 0.578, 0.549, 0.525)
# k = 8's c in the nine other starts of technical at k = 8 across the kept studies of that server
OTHER_K8_STEPS = (0.230, 0.293, 0.218, 0.298, 0.151, 0.225, 0.168, 0.217, 0.216)


def test_one_starts_luck_of_text_is_not_read_as_its_draft_lengths() -> None:
    """The undrafted steps per output token that k = 8 is predicted to run at come within 0.01 of
    the median of nine other starts of k = 8 (0.218), where its own start's was 0.075 off: its
    tokens per step and rate are read at the text's share, not at its start's."""
    model = levels_model(LUCKY, 38.0)
    sample = sample_rates(model, {NGRAM: LUCKY_ACCEPTANCE}, concurrency=1)
    k8 = sample.candidates.index(Candidate(drafter=NGRAM, num_speculative_tokens=8))
    share = model.drafted_share(sample.candidates[k8], 1, sum(LUCKY_ACCEPTANCE))
    steps = (1 - share) / sample.tokens_per_step[k8]
    assert abs(steps - float(np.median(OTHER_K8_STEPS))) < 0.01
    assert abs((1 - LUCKY[8][0]) / LUCKY[8][1] - float(np.median(OTHER_K8_STEPS))) > 0.07


def test_a_draft_length_the_engine_never_drafted_at_stays_undrafted() -> None:
    """llama.cpp's ngram-simple with a lookup of 3 drafts nothing at k = 1 and 2: measured there
    at q = 0, they keep it whatever their drafts would accept."""
    observations = [
        StepObservation(concurrency=1, num_speculative_tokens=k, drafter=NGRAM if k else None, step_time_s=0.02,
                        start=k, drafted_share=q, tokens_per_step=e)
        for k, q, e in ((0, 1.0, 1.0), (2, 0.0, 1.0), (5, 0.4, 2.6))
    ]  # fmt: skip
    posterior = fit_step_model(observations)
    assert posterior.share(Cell(concurrency=1, num_speculative_tokens=2, drafter=NGRAM), 1.5) == 0.0
    assert posterior.share(Cell(concurrency=1, num_speculative_tokens=5, drafter=NGRAM), 4.0) == pytest.approx(0.4)


@pytest.mark.parametrize("steps_per_token", [0.0, 0.15, 0.4, 1.0])
def test_a_text_of_known_undrafted_steps_gives_the_share_at_every_k(steps_per_token: float) -> None:
    """A text where c of a step per output token draft nothing: at each k with A_k accepted a drafting
    step, q = (1 - c) / (1 + c A_k) (c = 0: a drafter that drafts at every step, q = 1; c = 1: one
    that never found a match, q = 0). Measured at k = 2 and 7, every other k is recovered."""
    acceptance = np.array([0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.3])

    def share(k: int) -> float:
        return (1 - steps_per_token) / (1 + steps_per_token * acceptance[:k].sum())

    observations = [StepObservation(concurrency=1, num_speculative_tokens=0, drafter=None, step_time_s=0.02, start=0)]
    for start, k in enumerate((2, 7), start=1):
        q = share(k)
        observations.append(
            StepObservation(
                concurrency=1, num_speculative_tokens=k, drafter=NGRAM, step_time_s=0.02 + 0.001 * k * q, start=start,
                drafted_share=q, tokens_per_step=1 + q * acceptance[:k].sum(),
            )
        )  # fmt: skip
    posterior = fit_step_model(observations)
    for k in range(1, 9):
        cell = Cell(concurrency=1, num_speculative_tokens=k, drafter=NGRAM)
        assert posterior.share(cell, float(acceptance[:k].sum())) == pytest.approx(share(k), abs=1e-9)
