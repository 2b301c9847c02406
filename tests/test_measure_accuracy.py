"""Measurement accuracy against the emulator's ground truth, and the default profile against
the user report, from one measurement the way the report measured: 32 requests of 600 tokens
per level at concurrency 1 and 4 over the streaming API, exact counts from usage, per-position
acceptance from /metrics deltas (docs/calibration.md and docs/measure.md tabulate the figures).
"""

from __future__ import annotations

import math

import pytest

from specsweep.emulator.profile import load_profile
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.workload import load_workload

from .conftest import print_truth

SPEC5 = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'
REPORT = {"prose": [0.741, 0.538, 0.411, 0.291, 0.241], "technical": [0.569, 0.347, 0.188, 0.069, 0.035]}
SCALE = 50.0


@pytest.fixture(scope="module")
def measurements(tmp_path_factory):
    from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

    port = free_port()
    log = tmp_path_factory.mktemp("calibration") / "emulator.log"
    argv = emulator_argv(
        port=port, speculative_config=SPEC5, time_scale=SCALE, seed=3, extra=["--startup-seconds", "0"]
    )
    profile = load_profile()
    with ServerProcess(argv, log_path=log) as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        out = {}
        for workload in ("prose", "technical"):
            settings = MeasureSettings(
                endpoint=f"http://127.0.0.1:{port}",
                concurrency=(1, 4),
                requests=32,
                max_tokens=600,
                temperature=profile.reference_temperature,
                seed=3,
            )
            out[workload] = run_measure(settings, load_workload(workload))
    return out


@pytest.mark.parametrize("workload", ["prose", "technical"])
def test_per_position_acceptance_equals_the_report(measurements, workload: str) -> None:
    for level in measurements[workload].levels:
        acceptance = level.summary.acceptance
        assert acceptance is not None
        assert acceptance.per_position == pytest.approx(REPORT[workload], abs=0.02)


def test_throughput_matches_the_report(measurements) -> None:
    single, four = (level.summary for level in measurements["prose"].levels)
    assert single.errors == four.errors == 0
    assert single.decode_tokens_per_s_per_stream.p50 == pytest.approx(40.4, rel=0.10)
    assert four.output_tokens_per_s == pytest.approx(66.7, rel=0.10)
    # per-stream rates at 4 concurrent fall well below the single stream (17-22 in the report)
    assert four.decode_tokens_per_s_per_stream.p50 < 0.6 * single.decode_tokens_per_s_per_stream.p50


@pytest.fixture(scope="module")
def truth():
    return print_truth("--speculative-config", SPEC5, "--concurrency", "1,4", "--temperature", "0.6")


def _accepted_length_sd(per_position: list[float]) -> float:
    """Standard deviation of the accepted length A per step, from S_i: E[A^2] = sum (2i - 1) S_i."""
    mean = sum(per_position)
    second = sum((2 * i - 1) * s for i, s in enumerate(per_position, start=1))
    return math.sqrt(second - mean * mean)


@pytest.mark.parametrize("workload", ["prose", "technical"])
def test_aggregate_throughput_within_3_percent_of_truth(measurements, truth, workload: str) -> None:
    """Within 3% of the ground truth, widened by the emulator's own sampling noise (3 standard errors
    of the mean accepted length over the drafts this level drew), and within 3% of what the
    acceptance the server really drew implies."""
    t = truth[workload]
    sd = _accepted_length_sd(t["per_position"])
    for level, expected in zip(measurements[workload].levels, t["levels"], strict=True):
        summary = level.summary
        assert summary.concurrency == expected["concurrency"]
        measured = summary.output_tokens_per_s  # the modelled hardware's, as measure gives it
        noise = 3 * sd / math.sqrt(summary.acceptance.num_drafts) / t["expected_tokens_per_step"]
        assert measured == pytest.approx(expected["output_tokens_per_s"], rel=0.03 + noise)
        realized = (
            expected["output_tokens_per_s"] * summary.acceptance.mean_acceptance_length / t["expected_tokens_per_step"]
        )
        assert measured == pytest.approx(realized, rel=0.03)


@pytest.mark.parametrize("workload", ["prose", "technical"])
def test_per_position_acceptance_within_003_of_truth(measurements, truth, workload: str) -> None:
    for level in measurements[workload].levels:
        assert level.summary.acceptance.per_position == pytest.approx(truth[workload]["per_position"], abs=0.03)
        assert level.summary.acceptance.mean_acceptance_length == pytest.approx(
            truth[workload]["expected_tokens_per_step"], abs=0.1
        )


def test_counting_chunks_undercounts_and_usage_is_exact(measurements) -> None:
    for workload in ("prose", "technical"):
        for level in measurements[workload].levels:
            for record in level.records:
                assert record.completion_tokens == 600 or record.stopped_early
                assert record.num_chunks < record.completion_tokens  # chunks carry several tokens
                assert sum(record.chunk_tokens) == record.completion_tokens  # cumulative usage adds up
            chunks = sum(r.num_chunks for r in level.records)
            tokens = sum(r.completion_tokens for r in level.records)
            assert chunks / tokens < 0.6  # counting chunks would lose over 40% of the tokens
