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


def real_model():
    observations = [ThroughputObservation(num_speculative_tokens=0, concurrency=1, output_tokens_per_s=35.7, start=0)]
    for start, (k, (share, tokens, rate)) in enumerate(REAL.items(), start=1):
        observations.append(
            ThroughputObservation(
                num_speculative_tokens=k, concurrency=1, output_tokens_per_s=rate, tokens_per_step=tokens,
                drafter=NGRAM, start=start, drafted_share=share, relative_se=0.04,
            )
        )  # fmt: skip
    return fit_throughput_model(observations)


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


def test_measured_draft_lengths_keep_their_own_share() -> None:
    model = real_model()
    for k, (share, _, _) in REAL.items():
        candidate = Candidate(drafter=NGRAM, num_speculative_tokens=k)
        assert model.drafted_share(candidate, 1, 99.0) == pytest.approx(share)


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
