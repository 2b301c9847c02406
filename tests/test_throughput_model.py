"""The throughput model recovers a known step time and best k from noisy synthetic observations."""

from __future__ import annotations

import json
from dataclasses import asdict, replace

import numpy as np
import pytest

from specsweep.analysis.acceptance import expected_tokens_per_step
from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.analysis.rates import predict_throughput, sample_rates
from specsweep.analysis.recommendation import recommend_draft_length
from specsweep.analysis.throughput import (
    ThroughputObservation,
    fit_throughput_model,
    joint_step_time_draws,
    step_time_draws,
)
from specsweep.errors import FitError

DSPARK = Drafter(method="dspark", draft_sample_method="probabilistic")
S = (0.741, 0.538, 0.411, 0.291, 0.241, 0.188, 0.149, 0.119)


def true_step_time_s(k: int, batch: int) -> float:
    """A verify-bound server: base, per sequence, per verified token, per drafted position."""
    return 0.0345 + 0.001 * batch + 0.0062 * batch * (k + 1) + 0.0014 * k


def observe(k, batch, rng=None, noise=0.0, workload="prose", per_position=S):
    e = expected_tokens_per_step(per_position, k)
    rate = batch * e / true_step_time_s(k, batch)
    if rng is not None:
        rate *= 1 + noise * rng.standard_normal()
    return ThroughputObservation(
        num_speculative_tokens=k,
        concurrency=batch,
        output_tokens_per_s=rate,
        tokens_per_step=e,
        drafter=None if k == 0 else DSPARK,
        workload=workload,
    )


def true_best_k(batch: int, k_max: int = 8) -> int:
    rates = [expected_tokens_per_step(S, k) / true_step_time_s(k, batch) for k in range(k_max + 1)]
    return int(np.argmax(rates))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_low_noise_observations_give_the_true_best_k(seed):
    rng = np.random.default_rng(seed)
    observations = [observe(k, b, rng, 0.002) for b in (1, 4) for k in (0, 1, 2, 4, 6, 8)]
    model = fit_throughput_model(observations)
    for batch in (1, 4):
        predictions = predict_throughput(model, {DSPARK: S}, concurrency=batch, seed=seed)
        best = max(predictions, key=lambda p: p.tokens_per_s)
        assert best.candidate.num_speculative_tokens == true_best_k(batch)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_recovers_step_time_and_best_k_from_noisy_observations(seed):
    rng = np.random.default_rng(seed)
    measured_k = (0, 1, 3, 5, 8)
    observations = [observe(k, b, rng, 0.03) for b in (1, 4) for k in measured_k for _ in range(2)]
    model = fit_throughput_model(observations)
    assert model.concurrency_levels == (1, 4)
    assert 0.01 < model.pooled_relative_sd < 0.06
    for batch in (1, 4):
        fit = model.fit_for(batch, DSPARK)
        # the noise is pooled over both lines (6 residual df each) and the off points' repeats
        assert fit is not None and not fit.wide_band and fit.residual_df == 14
        for k in (2, 4, 6, 7):  # between and beyond the measured points
            assert fit.step_time_s(k)[0] == pytest.approx(true_step_time_s(k, batch), rel=0.04)
        predictions = predict_throughput(model, {DSPARK: S}, concurrency=batch, seed=seed)
        best = max(predictions, key=lambda p: p.tokens_per_s)
        truth = true_best_k(batch)
        true_rate = batch * expected_tokens_per_step(S, truth) / true_step_time_s(truth, batch)
        # the curve is flat near its top, so judge the pick by what it costs: within 4% (3% noise per run)
        picked = best.candidate.num_speculative_tokens
        picked_rate = batch * expected_tokens_per_step(S, picked) / true_step_time_s(picked, batch)
        assert picked_rate >= 0.96 * true_rate


def test_bands_between_and_beyond_measured_points_cover_the_truth():
    covered, total = 0, 0
    for seed in range(60):
        rng = np.random.default_rng(seed)
        observations = [observe(k, b, rng, 0.03) for b in (1, 4) for k in (0, 1, 3, 5, 8) for _ in range(2)]
        model = fit_throughput_model(observations)
        for batch in (1, 4):
            for row in predict_throughput(model, {DSPARK: S}, concurrency=batch, seed=seed, draws=300):
                k = row.candidate.num_speculative_tokens
                if row.step_time_source == "line":
                    truth = batch * expected_tokens_per_step(S, k) / true_step_time_s(k, batch)
                    covered += row.tokens_per_s_low <= truth <= row.tokens_per_s_high
                    total += 1
    assert total == 60 * 2 * 4
    assert 0.9 <= covered / total <= 0.99


def test_exact_observations_recover_the_line_and_best_k_exactly():
    observations = [observe(k, b) for b in (1, 4) for k in (0, 1, 2, 4, 8)]
    model = fit_throughput_model(observations)
    for batch in (1, 4):
        fit = model.fit_for(batch, DSPARK)
        assert fit.intercept_s == pytest.approx(0.0345 + 0.001 * batch + 0.0062 * batch)
        assert fit.slope_s_per_token == pytest.approx(0.0062 * batch + 0.0014)
        predictions = predict_throughput(model, {DSPARK: S}, concurrency=batch)
        best = max(predictions, key=lambda p: p.tokens_per_s)
        assert best.candidate.num_speculative_tokens == true_best_k(batch)
        assert all(p.tokens_per_s_high - p.tokens_per_s_low < 1e-6 * p.tokens_per_s for p in predictions)


def _bumped(k: int, factor: float, batch: int = 1) -> ThroughputObservation:
    """The observation at k with its step time ``factor`` times the true one."""
    row = observe(k, batch)
    return ThroughputObservation(
        **{**asdict(row), "drafter": DSPARK, "output_tokens_per_s": row.output_tokens_per_s / factor}
    )


def test_measured_points_come_before_a_line_they_misfit():
    """A step-shaped T (a graph size boundary at k = 3, 20% up, measured in two starts) misfits a
    line at 2% run-to-run noise: every measured k stays as measured, and the fit says it misfits."""
    observations = [observe(k, 1) for k in (0, 1, 2, 4)] + [_bumped(3, 1.2), _bumped(3, 1.2)]
    fit = fit_throughput_model(observations, run_noise=(0.02, 4)).fit_for(1, DSPARK)
    assert fit.misfit and not fit.line_fits and "misfit" in fit.basis and fit.lone_start_k is None
    assert fit.step_time_s(3) == (pytest.approx(1.2 * true_step_time_s(3, 1)), "measured")
    assert fit.step_time_s(2) == (pytest.approx(true_step_time_s(2, 1)), "measured")
    assert fit.step_time_s(5)[1] == "line"


def test_a_step_over_two_draft_lengths_is_shape_not_a_lone_start():
    """k = 3 and 4 both 20% up, one start each: leaving either out does not make the rest fit, so
    neither is a lone start and the line misfits."""
    observations = [observe(k, 1) for k in (0, 1, 2, 5)] + [_bumped(3, 1.2), _bumped(4, 1.2)]
    fit = fit_throughput_model(observations, run_noise=(0.02, 4)).fit_for(1, DSPARK)
    assert fit.misfit and fit.lone_start_k is None


def test_a_lone_start_off_the_line_is_either_an_unlucky_start_or_a_step():
    """k = 3 measured once, 20% slow, where k = 1, 2 and 4 sit on a line: one start cannot tell an
    unlucky start from a step at a graph size. The measured points still stand for themselves
    (k = 3 keeps its measurement as its estimate), the line elsewhere is fitted without k = 3 (the
    truth), and k = 3's draws take the line or the measurement at even odds, so the study sees
    what a repeat would settle."""
    observations = [observe(k, 1) for k in (0, 1, 2, 4)] + [_bumped(3, 1.2)]
    model = fit_throughput_model(observations, run_noise=(0.02, 4))
    fit = model.fit_for(1, DSPARK)
    assert fit.lone_start_k == 3 and fit.misfit and not fit.line_fits and "measured in one start +20%" in fit.basis
    assert fit.step_time_s(5) == (pytest.approx(true_step_time_s(5, 1), rel=1e-6), "line")
    assert fit.step_time_s(3) == (pytest.approx(1.2 * true_step_time_s(3, 1)), "measured")
    assert fit.step_time_s(2) == (pytest.approx(true_step_time_s(2, 1)), "measured")
    sample = sample_rates(model, {DSPARK: S}, concurrency=1, k_max=5, draws=2000, seed=1, workload="prose")
    column = sample.draws[:, sample.candidates.index(Candidate(drafter=DSPARK, num_speculative_tokens=3))]
    true_rate = expected_tokens_per_step(S, 3) / true_step_time_s(3, 1)
    assert 0.4 < (np.abs(column / true_rate - 1) < 0.06).mean() < 0.6
    assert 0.4 < (np.abs(column * 1.2 / true_rate - 1) < 0.06).mean() < 0.6
    # the other measured points are drawn around what they measured, not as a mixture
    two = sample.draws[:, sample.candidates.index(Candidate(drafter=DSPARK, num_speculative_tokens=2))]
    assert (np.abs(two * true_step_time_s(2, 1) / expected_tokens_per_step(S, 2) - 1) < 0.06).mean() > 0.95
    # the line puts k = 3 first (the truth): until it is repeated, the recommendation names it as tied
    recommendation = recommend_draft_length(model, {DSPARK: S}, concurrency=1, workload="prose", k_max=5)
    three = Candidate(drafter=DSPARK, num_speculative_tokens=3)
    assert recommendation.choice != three and three in recommendation.tied
    # a repeat that lands on the line settles it: the two starts' mean is then within the noise
    settled = fit_throughput_model([*observations, observe(3, 1), observe(3, 1)], run_noise=(0.08, 6))
    assert settled.fit_for(1, DSPARK).lone_start_k is None and settled.fit_for(1, DSPARK).line_fits


def test_a_line_its_points_fit_is_the_estimate_at_a_measured_k_too():
    """Points 1% off a true line at 2% noise fit it: the line, which pools every start, is the
    step time at a measured k, closer to the truth than the point measured there."""
    misses = {1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 6: 1.0}
    misses[3] = 1.01  # one point 1% slow
    observations = [observe(0, 1)]
    for k, factor in misses.items():
        row = observe(k, 1)
        observations.append(
            ThroughputObservation(
                **{**asdict(row), "drafter": DSPARK, "output_tokens_per_s": row.output_tokens_per_s / factor}
            )
        )
    fit = fit_throughput_model(observations, run_noise=(0.02, 4)).fit_for(1, DSPARK)
    assert fit.line_fits and not fit.misfit
    t3, source = fit.step_time_s(3)
    assert source == "measured"
    assert abs(t3 / true_step_time_s(3, 1) - 1) < 0.005  # the point alone is 1% off


def _staircase(k: int) -> float:
    """Step time at one stream of a server whose verify pass pads k = 8 to a wider CUDA graph:
    the true line up to k = 7, then 12% up (on the bench's L4 rig, 72 verified tokens run 96 wide add
    about 20%)."""
    return true_step_time_s(k, 1) * (1.12 if k == 8 else 1.0)


def _observed(k: int, step_time_s: float) -> ThroughputObservation:
    row = observe(k, 1)
    return ThroughputObservation(
        **{**asdict(row), "drafter": DSPARK, "output_tokens_per_s": row.tokens_per_step / step_time_s}
    )


def test_a_far_point_that_bends_the_line_upward_misfits_it():
    """k = 1, 2, 3 on the true line and k = 8 padded 12% up, one start each, at 2.6% noise: the
    chi-square over the four points passes (2.9 against its 95th percentile, 6.0), but the bend
    upward is beyond the noise (z 1.7), so the line misfits and the short draft lengths keep what
    they measured instead of the line the far point steepens, which puts k = 1's step 2.4% below
    the truth and k = 3's 3.1% above it."""
    observations = [observe(0, 1)] + [_observed(k, _staircase(k)) for k in (1, 2, 3, 8)]
    fit = fit_throughput_model(observations, run_noise=(0.026, 6)).fit_for(1, DSPARK)
    assert fit.misfit and not fit.line_fits
    for k in (1, 2, 3):
        assert fit.step_time_s(k) == (pytest.approx(true_step_time_s(k, 1)), "measured")
    # the same points on the true line fit it
    straight = [observe(0, 1)] + [observe(k, 1) for k in (1, 2, 3, 8)]
    assert fit_throughput_model(straight, run_noise=(0.026, 6)).fit_for(1, DSPARK).line_fits


def _weighed(line: float, measured: float, relative_sd: float, starts: int) -> float:
    """The line and a measurement weighed by their variances: the measurement's noise, and the
    2% miss a bend can hide at a short draft length when three draft lengths are measured."""
    share = relative_sd**2 / starts / (relative_sd**2 / starts + 0.02**2)
    return share * line + (1 - share) * measured


def test_a_line_through_three_draft_lengths_is_weighed_against_what_was_measured():
    """k = 1, 2 on the true line and k = 8 padded 12% up: three draft lengths fit a line (the
    chi-square has one degree of freedom and cannot see a bend that three points pin exactly), but
    nothing can test that line for a bend, so at k = 1 and 2 it is weighed against what they
    measured by their variances, the line alone serves the gaps, and the study is not told the
    model misfits. Used as the step time there, the line the far point steepens would put k = 1's
    step 1.4% short and k = 2's 1.9% long, reversing the truth's 2% lead of k = 2 per token."""
    observations = [observe(0, 1)] + [_observed(k, _staircase(k)) for k in (1, 2, 8)]
    fit = fit_throughput_model(observations, run_noise=(0.026, 6)).fit_for(1, DSPARK)
    assert fit.bend_untested and not fit.line_fits and not fit.misfit and "too few to test it for a bend" in fit.basis
    line = {k: fit.intercept_s + fit.slope_s_per_token * k for k in (1, 2, 3)}
    miss = {k: line[k] / true_step_time_s(k, 1) - 1 for k in (1, 2)}
    assert miss[1] < -0.01 and miss[2] > 0.01
    for k in (1, 2):
        t, source = fit.step_time_s(k)
        assert source == "measured"
        assert t == pytest.approx(_weighed(line[k], true_step_time_s(k, 1), fit.relative_sd, 1))
        assert abs(t / true_step_time_s(k, 1) - 1) < 0.7 * abs(miss[k])  # the line weighs 63% at 2.6% noise
    assert fit.step_time_s(3) == (pytest.approx(line[3]), "line")
    draws = step_time_draws(fit, [1, 2, 3], draws=4000, rng=np.random.default_rng(0))
    assert np.median(draws[:, 0]) == pytest.approx(fit.step_time_s(1)[0], rel=0.01)


def test_both_draft_samplings_through_three_draft_lengths_share_their_factor_and_weigh_their_line():
    """Greedy and probabilistic drafting (3% dearer steps) at k = 1, 2 and a padded k = 8, starts
    8% apart: one factor still joins the two samplings, and each measured k is the mean of both
    samplings' starts there (an unlucky start of one is halved by the other's), weighed against
    the line through three draft lengths, which cannot be tested for a bend. Over four draft
    lengths the line can be tested and is used at each."""
    greedy = Drafter(method="dspark", draft_sample_method="greedy")
    luck = {1: (1.08, 0.96), 2: (0.95, 1.02), 3: (1.0, 1.0), 8: (1.03, 0.99)}

    def both(ks: tuple[int, ...]) -> list[ThroughputObservation]:
        out = [observe(0, 1)]
        for k in ks:
            g_luck, p_luck = luck[k]
            out.append(replace(_observed(k, _staircase(k) * g_luck), drafter=greedy))
            out.append(_observed(k, 1.03 * _staircase(k) * p_luck))
        return out

    model = fit_throughput_model(both((1, 2, 8)), run_noise=(0.08, 6))
    stochastic, deterministic = model.fit_for(1, DSPARK), model.fit_for(1, greedy)
    assert stochastic.scaled_from == greedy and not stochastic.line_fits and stochastic.bend_untested
    assert "too few to test their line for a bend" in stochastic.basis
    factor = stochastic.sibling_factor
    for k in (1, 2):
        g_luck, p_luck = luck[k]
        pooled = (g_luck + p_luck * 1.03 / factor) / 2 * _staircase(k)  # both starts, in greedy units
        line = deterministic.intercept_s + k * deterministic.slope_s_per_token
        expected = _weighed(line, pooled, deterministic.relative_sd, 2)
        assert deterministic.step_time_s(k) == (pytest.approx(expected), "measured")
        assert stochastic.step_time_s(k) == (pytest.approx(expected * factor), "measured")
    line_at_3 = deterministic.intercept_s + 3 * deterministic.slope_s_per_token
    assert deterministic.step_time_s(3) == (pytest.approx(line_at_3), "line")
    greedy_draws, stochastic_draws = joint_step_time_draws(
        deterministic, stochastic, [1, 2, 3], draws=4000, rng=np.random.default_rng(0)
    )
    assert np.median(greedy_draws[:, 0]) == pytest.approx(deterministic.step_time_s(1)[0], rel=0.01)
    assert np.median(stochastic_draws[:, 1] / greedy_draws[:, 1]) == pytest.approx(factor, rel=0.01)

    four = fit_throughput_model(both((1, 2, 3, 8)), run_noise=(0.08, 6))
    assert four.fit_for(1, DSPARK).scaled_from == greedy and four.fit_for(1, DSPARK).line_fits
    assert not four.fit_for(1, DSPARK).pooled_points and not four.fit_for(1, DSPARK).bend_untested


def test_both_draft_samplings_share_one_line_so_one_unlucky_start_is_pooled_away():
    """Greedy drafting at k = 1..5 and probabilistic at k = 1..4, every probabilistic step 3%
    dearer (the same draft and verify passes), starts about 4% apart, and the one start of
    probabilistic k = 2 unlucky (25% slow). With the run-to-run noise known, the two draft
    samplings fit one line with one factor: probabilistic k = 2 is read from all nine starts (its
    own luck shares the factor with three others), not from its own one alone."""
    greedy = Drafter(method="dspark", draft_sample_method="greedy")
    luck = {("greedy", 1): 1.04, ("greedy", 2): 0.97, ("greedy", 3): 1.02, ("greedy", 4): 0.96, ("greedy", 5): 1.03,
            ("probabilistic", 1): 0.99, ("probabilistic", 2): 1.25, ("probabilistic", 3): 1.0,
            ("probabilistic", 4): 1.01}  # fmt: skip
    observations = [observe(0, 1)]
    for (method, k), factor in luck.items():
        row = observe(k, 1)
        truth = 1.03 if method == "probabilistic" else 1.0
        observations.append(
            ThroughputObservation(
                **{**asdict(row), "drafter": Drafter(method="dspark", draft_sample_method=method),
                   "output_tokens_per_s": row.output_tokens_per_s / (truth * factor)}
            )
        )  # fmt: skip
    model = fit_throughput_model(observations, run_noise=(0.08, 6))
    stochastic = model.fit_for(1, DSPARK)
    assert stochastic.scaled_from == greedy and stochastic.line_fits and "both draft samplings" in stochastic.basis
    t2, source = stochastic.step_time_s(2)
    assert source == "measured"
    assert abs(t2 / (1.03 * true_step_time_s(2, 1)) - 1) < 0.08  # its own start alone is 25% off
    # without the known noise (no test of the line) each keeps its points: the unlucky one stands
    alone = fit_throughput_model(observations).fit_for(1, DSPARK)
    assert alone.scaled_from is None
    assert alone.step_time_s(2)[0] == pytest.approx(1.25 * 1.03 * true_step_time_s(2, 1))
    # the paired draws keep the factor: probabilistic k = 2 is its factor dearer than greedy k = 2,
    # draw by draw, up to the factor's own uncertainty (8% noise over four starts: 4%)
    sample = sample_rates(model, {greedy: S, DSPARK: S}, concurrency=1, k_max=5, draws=200, seed=3)
    g2 = sample.candidates.index(Candidate(drafter=greedy, num_speculative_tokens=2))
    p2 = sample.candidates.index(Candidate(drafter=DSPARK, num_speculative_tokens=2))
    ratio = sample.draws[:, g2] / sample.draws[:, p2]
    assert 1.0 < stochastic.sibling_factor < 1.03 * 1.1
    assert np.median(ratio) == pytest.approx(stochastic.sibling_factor, rel=0.01)
    assert np.std(np.log(ratio)) == pytest.approx(stochastic.sibling_factor_sd, rel=0.15)


def test_the_factor_between_draft_samplings_is_as_uncertain_as_refitting_fresh_starts_shows():
    """Greedy starts at k = 1, 2, 4, 8 and probabilistic at k = 1..3, each start 10% off at random
    (lognormal), every probabilistic step 3% dearer. Fitted on 400 fresh sets of starts, the
    factor's spread and the probabilistic k = 3 step's spread are what one fit's stated sd and
    draws say: the factor is fitted together with the line the greedy starts pin, so its sd is
    well above the noise over the root of the probabilistic starts, which leaves that out."""
    noise, truth = 0.10, 1.03
    greedy = Drafter(method="dspark", draft_sample_method="greedy")
    design = [(greedy, k, 1.0) for k in (1, 2, 4, 8)] + [(DSPARK, k, truth) for k in (1, 2, 3)]
    rng = np.random.default_rng(11)

    def starts(luck):
        out = [observe(0, 1)]
        for (drafter, k, factor), z in zip(design, luck, strict=True):
            row = observe(k, 1)
            rate = row.output_tokens_per_s / factor * np.exp(noise * z)
            out.append(ThroughputObservation(**{**asdict(row), "drafter": drafter, "output_tokens_per_s": rate}))
        return fit_throughput_model(out, run_noise=(noise, 1000))

    fresh = [starts(rng.standard_normal(len(design))).fit_for(1, DSPARK) for _ in range(400)]
    fits = [f for f in fresh if f.scaled_from == greedy]
    # the joint line passes its two tests (lack of fit, 95th percentile; a bend upward, one-sided
    # 95th) about 86% of the time on this true line: 360 of 400 for the first alone, 343 for both
    assert 320 < len(fits) < 380
    log_factors = np.log([f.sibling_factor for f in fits])
    stated = float(np.median([f.sibling_factor_sd for f in fits]))
    assert np.mean(log_factors) == pytest.approx(np.log(truth), abs=0.02)
    assert np.std(log_factors) == pytest.approx(stated, rel=0.15)
    assert stated > 1.2 * noise / np.sqrt(3)  # three probabilistic starts alone would say 5.8%
    # one fit's draws at probabilistic k = 3 spread as the fresh fits' estimates there do
    exact = starts(np.zeros(len(design)))
    assert exact.fit_for(1, DSPARK).scaled_from == greedy
    sample = sample_rates(exact, {greedy: S, DSPARK: S}, concurrency=1, k_max=8, draws=4000, seed=5)
    p3 = sample.candidates.index(Candidate(drafter=DSPARK, num_speculative_tokens=3))
    drawn = sample.tokens_per_step[p3] / sample.draws[:, p3]
    fitted = np.array([f.step_time_s(3)[0] for f in fits])
    assert np.std(np.log(drawn)) == pytest.approx(np.std(np.log(fitted)), rel=0.15)


def test_one_draft_length_falls_back_to_a_wide_band():
    observations = [observe(0, 1), observe(0, 1), observe(5, 1)]
    model = fit_throughput_model(observations)
    fit = model.fit_for(1, DSPARK)
    assert fit.wide_band and "one draft length" in fit.basis
    assert fit.intercept_s == pytest.approx(true_step_time_s(0, 1))  # the line through the off point
    narrow = fit_throughput_model([observe(k, 1) for k in (0, 1, 3, 5)])
    wide_rows = predict_throughput(model, {DSPARK: S}, concurrency=1)
    narrow_rows = predict_throughput(narrow, {DSPARK: S}, concurrency=1)
    k2 = next(r for r in wide_rows if r.candidate.num_speculative_tokens == 2)
    k2_narrow = next(r for r in narrow_rows if r.candidate.num_speculative_tokens == 2)
    assert k2.tokens_per_s_high - k2.tokens_per_s_low > 5 * (k2_narrow.tokens_per_s_high - k2_narrow.tokens_per_s_low)
    alone = fit_throughput_model([observe(5, 1)]).fit_for(1, DSPARK)
    assert alone.wide_band and "no off point" in alone.basis


def test_two_draft_lengths_borrow_noise_from_the_other_fits():
    rng = np.random.default_rng(3)
    observations = [observe(k, 4, rng, 0.03) for k in (1, 2, 3, 5)] + [observe(k, 1, rng, 0.03) for k in (1, 4)]
    model = fit_throughput_model(observations)
    fit = model.fit_for(1, DSPARK)
    assert "noise from the other fits" in fit.basis
    assert fit.relative_sd == pytest.approx(model.pooled_relative_sd)
    assert fit.residual_df == model.fit_for(4, DSPARK).residual_df > 0  # the pooled residual df


def test_a_line_through_two_draft_lengths_is_not_read_as_repeats():
    """Two k's on one line leave no residual: the pooled noise is the fallback, not their difference."""
    observations = [observe(0, 1), observe(4, 1), observe(8, 1)]
    model = fit_throughput_model(observations, fallback_relative_sd=0.07)
    assert model.pooled_relative_sd == pytest.approx(0.07)
    repeated = fit_throughput_model([observe(4, 1), observe(4, 1, np.random.default_rng(1), 0.02)])
    assert 0.0 < repeated.pooled_relative_sd < 0.07


def test_draws_are_paired_across_k():
    rng = np.random.default_rng(4)
    observations = [observe(k, 1, rng, 0.03) for k in (0, 1, 2, 3, 4, 5, 6) for _ in range(2)]
    model = fit_throughput_model(observations)
    sample = sample_rates(model, {DSPARK: S}, concurrency=1, draws=2000, seed=1)
    line = [sample.candidates.index(Candidate(drafter=DSPARK, num_speculative_tokens=k)) for k in (7, 8)]
    paired = np.std(sample.draws[:, line[1]] - sample.draws[:, line[0]])
    unpaired = np.hypot(np.std(sample.draws[:, line[0]]), np.std(sample.draws[:, line[1]]))
    assert paired < 0.5 * unpaired
    again = sample_rates(model, {DSPARK: S}, concurrency=1, draws=2000, seed=1)
    assert np.array_equal(sample.draws, again.draws)


@pytest.mark.parametrize(
    "bad",
    [
        {"output_tokens_per_s": 0.0},
        {"output_tokens_per_s": float("nan")},
        {"tokens_per_step": -1.0},
        {"concurrency": 0},
        {"num_speculative_tokens": -1},
    ],
)
def test_unusable_observations_raise_fit_error(bad):
    row = {"num_speculative_tokens": 2, "concurrency": 1, "output_tokens_per_s": 40.0, "tokens_per_step": 2.0}
    with pytest.raises(FitError):
        fit_throughput_model([ThroughputObservation(**{**row, **bad}, drafter=DSPARK)])


def test_nothing_measured_at_a_concurrency_raises_fit_error():
    model = fit_throughput_model([observe(2, 1)])
    with pytest.raises(FitError, match="concurrency 4"):
        sample_rates(model, {DSPARK: S}, concurrency=4)


def test_model_and_predictions_serialise_to_json():
    model = fit_throughput_model([observe(k, 1) for k in (0, 2, 4)])
    rows = predict_throughput(model, {DSPARK: S}, concurrency=1)
    json.dumps({"model": asdict(model), "rows": [asdict(r) for r in rows]}, allow_nan=False)


def test_no_drawn_step_is_faster_than_speculation_off():
    """A drafter measured at one k only has its slope drawn up to twice the off point's; no draw
    of its step time may fall below the step without speculation (which once gave rates of 1e9)."""
    model = fit_throughput_model([observe(0, 4), observe(8, 4)])
    sample = sample_rates(model, {DSPARK: S}, concurrency=4, draws=2000, seed=2)
    off = sample.candidates.index(Candidate(drafter=None, num_speculative_tokens=0))
    for j, candidate in enumerate(sample.candidates):
        if not candidate.off:
            e = expected_tokens_per_step(S, candidate.num_speculative_tokens)
            assert np.all(sample.draws[:, j] <= e * sample.draws[:, off] + 1e-9)


def test_a_drafter_that_looks_its_drafts_up_keeps_its_measured_points_where_a_line_would_pass():
    """An n-gram drafter drafts only where the text matches: its true step time here is a line but
    8% lower at k = 7 (where the text's matches run long), measured once per k with 5% noise. A
    line passes its noise test through these points and would erase the dip; told the drafter
    looks its drafts up, the model keeps every measured point, and k = 7 is predicted at what it
    measured."""
    ngram = Drafter(method="ngram", draft_sample_method="greedy")
    truth = {k: true_step_time_s(k, 1) * (0.92 if k == 7 else 1.0) for k in range(3, 9)}
    observations = [observe(0, 1)]
    for k, t in truth.items():
        row = observe(k, 1)
        rate = row.concurrency * row.tokens_per_step / t
        observations.append(ThroughputObservation(**{**asdict(row), "drafter": ngram, "output_tokens_per_s": rate}))
    as_line = fit_throughput_model(observations, run_noise=(0.05, 10)).fit_for(1, ngram)
    assert as_line.line_fits and as_line.step_time_s(7)[0] > 1.05 * truth[7]  # the dip is gone
    looked_up = fit_throughput_model(observations, run_noise=(0.05, 10), lookups={ngram}).fit_for(1, ngram)
    assert not looked_up.line_fits and looked_up.misfit and "looks its drafts up" in looked_up.basis
    assert all(looked_up.step_time_s(k) == (pytest.approx(t), "measured") for k, t in truth.items())
    rows = predict_throughput(
        fit_throughput_model(observations, run_noise=(0.05, 10), lookups={ngram}),
        {ngram: S}, concurrency=1, k_min=3, workload="prose",
    )  # fmt: skip
    (k7,) = [r for r in rows if r.candidate.num_speculative_tokens == 7]
    assert k7.tokens_per_s == pytest.approx(observations[5].output_tokens_per_s)


def test_a_configuration_that_never_drafts_is_neither_chosen_nor_named_tied():
    """A draft length the engine runs as speculation off (llama.cpp's ngram-simple below its lookup
    length) is not a candidate of its own: with the truth's best k marked so, the recommendation is
    another k and never names it, though the model predicts it best."""
    observations = [observe(k, 1) for k in (0, 1, 3, 5, 8)]
    model = fit_throughput_model(observations)
    best = Candidate(drafter=DSPARK, num_speculative_tokens=true_best_k(1))
    free = recommend_draft_length(model, {DSPARK: S}, concurrency=1)
    assert free.choice == best
    held = recommend_draft_length(model, {DSPARK: S}, concurrency=1, idle={best})
    assert held.choice != best and best not in held.tied
    assert held.choice.num_speculative_tokens in (best.num_speculative_tokens - 1, best.num_speculative_tokens + 1)
