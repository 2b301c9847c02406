"""Run-to-run noise from repeats and sibling pairs (analysis/noise.py), against known start factors."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest

from specsweep.analysis.noise import MIN_RELATIVE_SD, run_to_run_noise
from specsweep.engines import vllm
from specsweep.engines.vllm import validate_speculative_config
from specsweep.types import BootFacts, LevelFigures, MeasuredConfig, RunNoisePrior

LEVELS = (1, 4)
TOKENS_PER_STEP = {"greedy": 1.8, "probabilistic": 2.1}  # the methods accept differently


def step_time(k: int, level: int, method: str) -> float:
    """A rig's true step time: probabilistic drafting costs the same 3% of every step."""
    return (0.020 + 0.002 * level) * (1 + 0.08 * k) * (1.03 if method == "probabilistic" else 1.0)


def measured(trial: int, k: int, method: str, factor: float, *, per_level: tuple[float, ...] = ()) -> MeasuredConfig:
    """One server start of (k, method) whose step times are all ``factor`` times the truth (times
    ``per_level[i]`` at level i: noise of the level's own requests)."""
    spec = validate_speculative_config({"method": "dspark", "num_speculative_tokens": k, "draft_sample_method": method})
    rows = {}
    for i, level in enumerate(LEVELS):
        e = TOKENS_PER_STEP[method]
        own = per_level[i] if per_level else 1.0
        rows[level] = LevelFigures(
            concurrency=level, output_tokens_per_s=level * e / (step_time(k, level, method) * factor * own),
            whole_level_output_tokens_per_s=None, decode_tokens_per_s_p50=None, ttft_p95_s=None, errors=0,
            requests=8, mean_acceptance_length=e,
        )  # fmt: skip
    return MeasuredConfig(
        trial=trial, key=f"{k}-{method}", spec=spec, objective=0.0, feasible=True, results={"prose": rows},
        boot=BootFacts(), startup_s=None,
    )  # fmt: skip


def test_nothing_repeated_and_no_sibling_pair_is_no_estimate() -> None:
    configs = [measured(0, 1, "greedy", 1.0), measured(1, 2, "probabilistic", 1.3), measured(2, 3, "greedy", 0.8)]
    assert run_to_run_noise(configs, "prose") is None


def test_a_repeat_at_two_levels_is_one_degree_of_freedom() -> None:
    # Both levels of a start share its factor: the two levels are not two independent draws.
    configs = [measured(0, 2, "greedy", 1.0), measured(1, 2, "greedy", 1.2)]
    noise = run_to_run_noise(configs, "prose")
    assert noise is not None and noise.df == 1 and noise.repeated == 1 and noise.sibling_pairs == 0
    assert noise.relative_sd == pytest.approx(math.log(1.2) / math.sqrt(2))


def test_sibling_pairs_with_a_constant_cost_ratio_are_not_noise() -> None:
    # Greedy and probabilistic at k = 1..4, every start exact: the 3% ratio is the model, not noise
    # (3 degrees of freedom per level; residuals of 0 say nothing of the levels sharing starts), and
    # so is each drafter's line in k (4 draft lengths, 2 degrees of freedom per drafter and level).
    configs = [measured(2 * k + i, k, m, 1.0) for k in range(1, 5) for i, m in enumerate(("greedy", "probabilistic"))]
    noise = run_to_run_noise(configs, "prose")
    assert noise is not None and noise.repeated == 0 and noise.sibling_pairs == 4 and noise.lines == 4
    assert noise.df == 2 * (3 + 2 * 2)
    assert noise.relative_sd == MIN_RELATIVE_SD


def test_a_line_its_draft_lengths_fit_is_noise_evidence_and_one_they_misfit_is_not() -> None:
    """One drafter at k = 1..5, each start off the true line by a known factor: the line's misses
    (3 degrees of freedom per level) estimate the noise. Steps shaped by captured graph sizes (k = 3
    and 4 20% slow) misfit a line at the engine's usual 2%: their misses are not counted as noise."""
    factors = [1.02, 0.98, 1.0, 1.01, 0.99]
    configs = [measured(k, k, "greedy", f) for k, f in zip(range(1, 6), factors, strict=True)]
    prior = RunNoisePrior(relative_sd=0.02, df=2, source="test")
    noise = run_to_run_noise(configs, "prose", prior)
    assert noise is not None and noise.lines == 2 and noise.df == 3 and noise.repeated == 0
    assert 0.01 <= noise.relative_sd < 0.02  # the misses (about 1.5%) pulled the usual 2% down
    shaped = [measured(k, k, "greedy", 1.2 if k in (3, 4) else 1.0) for k in range(1, 6)]
    misfit = run_to_run_noise(shaped, "prose", prior)
    assert misfit is not None and misfit.lines == 0 and misfit.df == 0
    assert misfit.relative_sd == pytest.approx(0.02)  # the usual noise alone


def test_one_slow_start_shows_against_its_sibling() -> None:
    # The repeats all landed in similar starts, so alone they say 1%; the one start 40% slow,
    # at k = 1 probabilistic, disagrees with its greedy sibling and the sibling at k = 5 does not.
    configs = [
        measured(0, 5, "greedy", 1.0), measured(1, 5, "probabilistic", 1.0), measured(2, 1, "probabilistic", 1.4),
        measured(3, 5, "probabilistic", 1.01), measured(4, 1, "greedy", 1.0), measured(5, 1, "greedy", 0.99),
    ]  # fmt: skip
    repeats_only = run_to_run_noise([c for c in configs if c.trial != 2], "prose")
    assert repeats_only is not None and repeats_only.relative_sd < 0.015
    noise = run_to_run_noise(configs, "prose")
    assert noise is not None and noise.sibling_pairs == 2
    # Per level: repeats (k=5 p at 1 and 1.01, k=1 g at 1 and 0.99), 2 df; log ratios at k=1 and
    # k=5, each of variance 1.5 starts', 1 df around their mean. Levels share starts: df 3.
    repeats = (math.log(1.01) ** 2 + math.log(0.99) ** 2) / 2
    d1, d5 = math.log(1.4) - math.log(0.99) / 2, math.log(1.01) / 2
    siblings = 2 * ((d1 - d5) / 2) ** 2 / 1.5
    assert noise.df == 3 and noise.relative_sd == pytest.approx(math.sqrt((repeats + siblings) / 3), rel=1e-6)
    assert noise.relative_sd > 8 * repeats_only.relative_sd


@pytest.mark.parametrize("sd", [0.05, 0.15])
def test_the_estimate_recovers_a_known_start_variation(sd: float) -> None:
    # Many seeded studies' worth of starts: each start draws one lognormal factor for all its levels.
    rng = random.Random(7)
    configs, trial = [], 0
    for k in range(1, 9):
        for method in ("greedy", "probabilistic"):
            for _ in range(3):
                configs.append(measured(trial, k, method, math.exp(rng.gauss(0.0, sd))))
                trial += 1
    noise = run_to_run_noise(configs, "prose")
    assert noise is not None and noise.repeated == 16 and noise.sibling_pairs == 8
    # per level: two per repeated configuration, 8 pairs less one ratio, and two lines through 8
    # draft lengths (6 each); the levels share their starts, so one level's count
    assert noise.df == 16 * 2 + 7 + 2 * 6
    assert noise.relative_sd == pytest.approx(sd, rel=0.25)


def test_levels_that_share_their_starts_variation_count_once_and_unrelated_ones_add_up() -> None:
    rng = random.Random(11)
    runs = [(k, m) for k in range(1, 6) for m in ("greedy", "probabilistic") for _ in range(2)]
    shared = [measured(i, k, m, math.exp(rng.gauss(0.0, 0.1))) for i, (k, m) in enumerate(runs)]
    own = [
        measured(i, k, m, 1.0, per_level=(math.exp(rng.gauss(0.0, 0.1)), math.exp(rng.gauss(0.0, 0.1))))
        for i, (k, m) in enumerate(runs)
    ]
    per_level = 10 + 4 + 2 * 3  # 10 repeated configurations, 5 sibling ratios less their mean, 2 lines through 5 k
    a, b = run_to_run_noise(shared, "prose"), run_to_run_noise(own, "prose")
    assert a is not None and b is not None
    assert a.level_correlation > 0.9 and a.df == per_level  # a start slow at one level is slow at both
    assert b.level_correlation < 0.5 and b.df > 1.6 * per_level  # nearly independent draws: close to 28


def test_a_line_is_tested_at_the_noise_the_repeats_show_not_at_the_prior_alone() -> None:
    """Starts that vary by about 10%, an engine whose usual noise is 2%: the repeats show the 10%,
    and the line through k = 1..5 misses by as much. Tested at the prior alone the line would
    misfit and be left out, so only steady evidence would count (the estimate biased low wherever
    starts vary more than the prior says); tested at what the repeats show, it fits and counts."""
    factors = {1: (0.90, 1.10), 2: (1.08,), 3: (0.93,), 4: (1.06,), 5: (1.10, 0.92)}
    configs, trial = [], 0
    for k, draws in factors.items():
        for factor in draws:
            configs.append(measured(trial, k, "greedy", factor))
            trial += 1
    prior = RunNoisePrior(relative_sd=0.02, df=2, source="test")
    noise = run_to_run_noise(configs, "prose", prior)
    assert noise is not None and noise.repeated == 2 and noise.lines == 2  # one line per level, both kept
    # two repeats and a line through 5 draft lengths (3 df) per level, the levels sharing their starts
    assert noise.df == 2 + 3
    # the factors' own spread around the line, pooled with the prior's 2% (2 df)
    assert 0.06 < noise.relative_sd < 0.11


def test_a_drafter_that_looks_its_drafts_up_gives_no_line_however_well_its_points_fit() -> None:
    """An n-gram drafter's step time follows where the text matches, not k: five steady starts
    that happen to sit on a line are no measure of the noise, and the engine's rule says so."""
    factors = [1.02, 0.98, 1.0, 1.01, 0.99]
    configs = []
    for k, f in zip(range(1, 6), factors, strict=True):
        row = measured(k, k, "greedy", f)
        spec = validate_speculative_config({"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 4})
        configs.append(replace(row, spec=spec, key=f"ngram-{k}"))
    prior = RunNoisePrior(relative_sd=0.05, df=2, source="test")
    unknown = run_to_run_noise(configs, "prose", prior)  # no rule: taken for a line of a drafting model
    assert unknown is not None and unknown.lines == 2 and unknown.df == 3 and unknown.relative_sd < 0.04
    noise = run_to_run_noise(configs, "prose", prior, looks_up=vllm.looks_up)
    assert noise is not None and noise.lines == 0 and noise.df == 0
    assert noise.relative_sd == pytest.approx(0.05)  # the usual noise alone, not the line's luck
