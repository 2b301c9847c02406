"""A level's error paired on shared prompts (measurement/paired.py), against simulated truth."""

from __future__ import annotations

import math
import random

import pytest

from specsweep.measurement.paired import paired_relative_se
from specsweep.measurement.stopping import MIN_REQUEST_SD


def _levels(
    rng: random.Random, *, levels: int, prompts: int, prompt_sd: float, noise_sd: float, sent: list[int] | None = None
) -> dict[int, list[tuple[str, float]]]:
    """Each level's requests: a level effect, each prompt's own effect (shared), and the level's noise."""
    prompt_effect = [rng.gauss(0.0, prompt_sd) for _ in range(prompts)]
    out = {}
    for level in range(levels):
        base = math.log(50.0) + 0.1 * level
        n = prompts if sent is None else sent[level]
        out[level] = [(f"p{p}", math.exp(base + prompt_effect[p] + rng.gauss(0.0, noise_sd))) for p in range(n)]
    return out


def test_the_prompts_shared_spread_is_taken_out_and_the_levels_own_noise_is_left() -> None:
    rng = random.Random(7)
    estimates = []
    for _ in range(200):
        levels = _levels(rng, levels=6, prompts=12, prompt_sd=0.15, noise_sd=0.03)
        se = paired_relative_se(levels)
        assert set(se) == set(levels)
        estimates.append(se[0] * math.sqrt(12))
    # the pooled sd is the level's noise (0.03), not the prompts' spread (0.15): mean within 5%
    assert sum(estimates) / len(estimates) == pytest.approx(0.03, rel=0.05)


def test_without_shared_prompt_effects_the_paired_error_is_the_requests_spread() -> None:
    rng = random.Random(11)
    estimates = [
        paired_relative_se(_levels(rng, levels=4, prompts=12, prompt_sd=0.0, noise_sd=0.08))[2] * math.sqrt(12)
        for _ in range(200)
    ]
    assert sum(estimates) / len(estimates) == pytest.approx(0.08, rel=0.06)


def test_a_level_that_stopped_early_has_the_wider_error_of_its_fewer_requests() -> None:
    # no prompt effects: the level's error is its fewer requests' alone
    levels = _levels(random.Random(3), levels=3, prompts=12, prompt_sd=0.0, noise_sd=0.05, sent=[12, 12, 4])
    se = paired_relative_se(levels)
    # (the prompts' fitted spread is noise here, and counted only where it exceeds the noise's share)
    assert se[2] / se[0] == pytest.approx(math.sqrt(12 / 4), rel=0.05)


def test_a_level_that_stopped_early_carries_the_mix_of_the_prompts_it_did_not_send() -> None:
    """Truth: the level's mean over the prompts it sent, against its value at the group's mix (its
    own effect plus the mean effect of the twelve prompts), over many draws."""
    rng = random.Random(17)
    prompt_sd, noise_sd, sent = 0.15, 0.03, [12, 12, 12, 4]
    errors: dict[int, list[float]] = {2: [], 3: []}
    estimates: dict[int, list[float]] = {2: [], 3: []}
    for _ in range(400):
        effects = [rng.gauss(0.0, prompt_sd) for _ in range(12)]
        levels = {
            level: [(f"p{p}", math.exp(0.1 * level + effects[p] + rng.gauss(0.0, noise_sd))) for p in range(n)]
            for level, n in enumerate(sent)
        }
        se = paired_relative_se(levels)
        for level, found in errors.items():
            mean = sum(math.log(v) for _, v in levels[level]) / len(levels[level])
            found.append(mean - (0.1 * level + sum(effects) / 12))
            estimates[level].append(se[level])

    def rms(values: list[float]) -> float:
        return math.sqrt(sum(v * v for v in values) / len(values))

    for level, found in errors.items():
        # the estimated error is the level's true error at the group's mix, within 10%
        assert rms(estimates[level]) == pytest.approx(rms(found), rel=0.1)
    # the early level's error is mostly the unsent prompts' mix: far above its requests' own noise
    assert rms(errors[3]) > 2 * noise_sd / math.sqrt(4)


def test_a_level_sharing_no_prompt_or_a_lone_level_gets_no_paired_error() -> None:
    levels = _levels(random.Random(5), levels=3, prompts=12, prompt_sd=0.1, noise_sd=0.05)
    levels[9] = [("other", 40.0), ("another", 41.0)]
    se = paired_relative_se(levels)
    assert 9 not in se and set(se) == {0, 1, 2}
    assert paired_relative_se({0: levels[0]}) == {}
    # two levels of two shared prompts leave one degree of freedom: too few to estimate an sd
    assert paired_relative_se({0: levels[0][:2], 1: levels[1][:2]}) == {}


def test_identical_levels_keep_the_floor_of_one_requests_jitter() -> None:
    rows = [(f"p{i}", 50.0 + i) for i in range(10)]
    se = paired_relative_se({0: rows, 1: [(p, v * 1.1) for p, v in rows]})
    assert se[0] == pytest.approx(MIN_REQUEST_SD / math.sqrt(10))
