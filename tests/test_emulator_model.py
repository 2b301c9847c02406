"""The emulator's stochastic model: acceptance curves, step time, ground truth."""

from __future__ import annotations

import bisect
import math
import random
import statistics
from dataclasses import replace
from itertools import accumulate, pairwise
from pathlib import Path

import pytest

from specsweep.emulator.model import acceptance_curve, compute_truth, step_time_s
from specsweep.emulator.profile import bundled_profile_names, load_profile
from specsweep.engines.vllm import parse_speculative_config
from specsweep.measurement.acceptance import accepted_length_distribution, expected_tokens_per_step

REPORT_PROSE = [0.741, 0.538, 0.411, 0.291, 0.241]
REPORT_TECHNICAL = [0.569, 0.347, 0.188, 0.069, 0.035]


BENCH_PROFILES = Path(__file__).resolve().parent.parent / "bench" / "profiles"


def spec(text: str):
    return parse_speculative_config(text)


def test_default_profile_reproduces_the_report_curves_at_its_configuration() -> None:
    profile = load_profile()
    config = spec('{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}')
    prose = acceptance_curve(profile, "prose", config, profile.reference_temperature)
    technical = acceptance_curve(profile, "technical", config, profile.reference_temperature)
    assert prose == pytest.approx(REPORT_PROSE, abs=1e-9)
    assert technical == pytest.approx(REPORT_TECHNICAL, abs=1e-9)
    # docs/math.md#worked-numbers: E(5) = 3.222 (prose) and 2.208 (technical)
    assert expected_tokens_per_step(prose) == pytest.approx(3.222, abs=1e-6)
    assert expected_tokens_per_step(technical) == pytest.approx(2.208, abs=1e-6)


@pytest.mark.parametrize("name", bundled_profile_names())
def test_draft_methods_are_identical_at_temperature_zero_and_differ_above(name: str) -> None:
    profile = load_profile(name)
    greedy = spec('{"num_speculative_tokens":6,"draft_sample_method":"greedy"}')
    probabilistic = spec('{"num_speculative_tokens":6,"draft_sample_method":"probabilistic"}')
    for content in ("prose", "technical"):
        assert acceptance_curve(profile, content, greedy, 0.0) == acceptance_curve(profile, content, probabilistic, 0.0)
        hot_greedy = acceptance_curve(profile, content, greedy, 0.8)
        hot_probabilistic = acceptance_curve(profile, content, probabilistic, 0.8)
        assert all(g < p for g, p in zip(hot_greedy, hot_probabilistic, strict=True))
        # acceptance falls as temperature rises
        assert (
            acceptance_curve(profile, content, probabilistic, 1.0)[0]
            < acceptance_curve(profile, content, probabilistic, 0.0)[0]
        )


def test_curves_extend_past_the_profile_with_the_last_conditional_rate() -> None:
    profile = load_profile()
    config = spec('{"num_speculative_tokens":12,"draft_sample_method":"probabilistic"}')
    curve = acceptance_curve(profile, "prose", config, profile.reference_temperature)
    assert len(curve) == 12
    listed = profile.classes["prose"].per_position
    last_conditional = listed[-1] / listed[-2]
    assert curve[9] / curve[8] == pytest.approx(last_conditional)
    assert all(b <= a for a, b in pairwise(curve))


def test_synthetic_rates_replace_the_model() -> None:
    profile = load_profile()
    forced = spec(
        '{"num_speculative_tokens":3,"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[0.9,0.5,0.1]}'
    )
    assert acceptance_curve(profile, "technical", forced, 0.3) == [0.9, 0.5, 0.1]
    by_length = spec(
        '{"num_speculative_tokens":4,"rejection_sample_method":"synthetic","synthetic_acceptance_length":2.5}'
    )
    assert expected_tokens_per_step(acceptance_curve(profile, "prose", by_length, 0.0)) == pytest.approx(2.5)


def test_sampling_from_the_distribution_reproduces_the_curve() -> None:
    # The engine draws A by inverting this CDF; check the draw against S_i with many samples.
    curve = REPORT_TECHNICAL
    cdf = list(accumulate(accepted_length_distribution(curve)))[:-1]
    rng = random.Random(7)
    n = 200_000
    counts = [0] * len(curve)

    for _ in range(n):
        accepted = bisect.bisect_right(cdf, rng.random())
        for i in range(accepted):
            counts[i] += 1
    for i, rate in enumerate(curve):
        sigma = math.sqrt(rate * (1 - rate) / n)
        assert abs(counts[i] / n - rate) < 5 * sigma


def test_step_time_grows_with_k_and_batch() -> None:
    profile = load_profile()
    config = spec('{"num_speculative_tokens":8}')
    times = [[step_time_s(profile, config, k, b) for k in range(9)] for b in (1, 2, 4)]
    for row in times:
        assert all(b > a for a, b in pairwise(row))
    for k in range(9):
        assert times[0][k] < times[1][k] < times[2][k]


def test_captured_widths_and_a_fixed_drafting_cost_shape_the_step_time() -> None:
    """Widths 16, 24, 48 captured at 8 streams: k = 1 and 2 run at 16 and 24, k = 3 (32) and k = 4
    (40) both pad to 48, so T is flat between them; a fixed drafting cost is paid at k >= 1 only."""
    profile = load_profile(str(BENCH_PROFILES / "l4-eagle3-graphs.toml"))
    timing = replace(profile.timing, captured_widths=(16, 24, 48), draft_fixed_s=0.0)
    shaped = replace(profile, timing=timing)
    config = spec('{"num_speculative_tokens":8}')
    t = {k: step_time_s(shaped, config, k, 8) for k in range(6)}
    per_position = timing.draft_position_s * (1 + timing.draft_batch_slope * 7)
    assert t[4] - t[3] == pytest.approx(per_position)  # the same 48-wide graph: only the drafting differs
    assert t[3] - t[2] == pytest.approx(per_position + timing.verify_token_s * (48 - 24))
    assert t[5] - t[4] == pytest.approx(per_position)  # 48 tokens: still the 48-wide graph
    fixed = replace(profile, timing=replace(timing, captured_widths=(), draft_fixed_s=0.01))
    plain = replace(profile, timing=replace(timing, captured_widths=()))
    assert step_time_s(fixed, None, 0, 8) == step_time_s(plain, None, 0, 8)
    for k in (1, 3, 8):
        assert step_time_s(fixed, config, k, 8) - step_time_s(plain, config, k, 8) == pytest.approx(0.01)


def test_truth_is_the_throughput_identity() -> None:
    profile = load_profile()
    config = spec('{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,1,4],[2,8,2]]}')
    truth = compute_truth(profile, config, 0.6, [1, 4, 16])
    for content, t in truth.items():
        assert len(t.per_position) == 4
        for level in t.levels:
            k = level.num_speculative_tokens
            assert k == (4 if level.concurrency == 1 else 2)
            assert level.batch_size == min(level.concurrency, profile.max_num_seqs)
            expected = expected_tokens_per_step(t.per_position, k)
            assert level.decode_tokens_per_s == pytest.approx(level.batch_size * expected / level.step_time_s)
            assert level.output_tokens_per_s < level.decode_tokens_per_s  # prefill and idle slots cost
        assert content in ("prose", "technical")


def best_k(profile_name: str, content: str, concurrency: int, k_max: int = 8) -> int:
    profile = load_profile(profile_name)
    rates = []
    for k in range(k_max + 1):
        text = f'{{"num_speculative_tokens":{max(k, 1)},"draft_sample_method":"probabilistic"}}'
        config = spec(text) if k else None
        truth = compute_truth(profile, config, profile.reference_temperature, [concurrency])
        rates.append(truth[content].levels[0].output_tokens_per_s)
    return max(range(k_max + 1), key=rates.__getitem__)


def test_default_profile_says_k5_is_too_long_for_technical_output() -> None:
    # The report's open question: for dense technical output k = 5 is past what earns its keep.
    assert best_k("dgx-spark-v4-flash", "technical", 1) < 5
    assert best_k("dgx-spark-v4-flash", "technical", 4) < best_k("dgx-spark-v4-flash", "technical", 1)


def test_second_profile_has_a_different_best_draft_length() -> None:
    names = bundled_profile_names()
    assert len(names) >= 2
    firsts = {name: best_k(name, "prose", 1, 10) for name in names}
    assert len(set(firsts.values())) > 1, firsts


def test_closed_loop_truth_tends_to_the_decode_rate_for_long_requests() -> None:
    """Prefill and idle slots are paid once per request: with long requests and short prompts the
    closed-loop rate approaches B * E(k) / T(k, B) (at the mean context of its requests, prompt and
    half of max_tokens); with short requests it falls well below it."""
    from specsweep.emulator.model import closed_loop_tokens_per_s

    profile = load_profile()
    config = spec('{"num_speculative_tokens":3,"draft_sample_method":"probabilistic"}')
    curve = acceptance_curve(profile, "prose", config, 0.6)
    for concurrency in (1, 4, 8):
        batch = min(concurrency, profile.max_num_seqs)
        step = step_time_s(profile, config, 3, batch, batch * (1 + 10**6 / 2))
        decode = batch * expected_tokens_per_step(curve) / step
        long_run = closed_loop_tokens_per_s(profile, config, curve, concurrency, max_tokens=10**6, prompt_tokens=1)
        short = closed_loop_tokens_per_s(profile, config, curve, concurrency, max_tokens=50, prompt_tokens=2000)
        assert long_run == pytest.approx(decode, rel=1e-3)
        assert short < 0.7 * decode
    # one stream: one request overhead + one prefill + D steps, with D from renewal theory
    off = closed_loop_tokens_per_s(profile, None, [], 1, max_tokens=101, prompt_tokens=300)
    per_request = profile.timing.request_overhead_s + 300 / profile.timing.prefill_tokens_per_s
    per_request += (100 + 0.5) * step_time_s(profile, None, 0, 1, 300 + 101 / 2)
    assert off == pytest.approx(101 / per_request)


def test_run_to_run_variation_draws_one_factor_per_start_around_the_truth() -> None:
    """The noise knob: each start (process) draws its own step-time factor, log-normal with mean 1
    and the asked relative sd, reproducible per (seed, start); the truth stays the nominal model."""
    from specsweep.emulator.engine import Engine

    profile = load_profile().with_variation(start_variation=0.15, drift=None)
    factors = [Engine(profile, None, seed=7, start_index=i).start_factor for i in range(2000)]
    assert statistics.fmean(factors) == pytest.approx(1.0, abs=0.015)
    assert statistics.stdev(math.log(f) for f in factors) == pytest.approx(0.15, rel=0.08)
    assert Engine(profile, None, seed=7, start_index=3).start_factor == factors[3]
    assert Engine(load_profile(), None, seed=7, start_index=3).start_factor == 1.0  # off by default
    quiet = compute_truth(load_profile(), None, 0.6, [1])
    assert compute_truth(profile, None, 0.6, [1]) == quiet  # the truth is the nominal rig


def test_drift_moves_the_step_time_slowly_around_its_nominal_value() -> None:
    from specsweep.emulator.engine import Engine

    profile = load_profile().with_variation(start_variation=None, drift=0.05)
    engine = Engine(profile, None, seed=1, start_index=0)
    seen = []
    for step in range(900):
        engine._modelled_s = step  # one modelled second apart, over one drift period (900 s)
        seen.append(engine._variation())
    assert max(seen) == pytest.approx(1.05, abs=0.002) and min(seen) == pytest.approx(0.95, abs=0.002)
    assert max(abs(b - a) for a, b in pairwise(seen)) < 0.001  # slow: no jump between neighbouring seconds
