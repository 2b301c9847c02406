"""The default profile against the user report, measured the way the report measured it.

32 requests of 600 tokens per level over the streaming API, exact counts from usage,
per-position acceptance from /metrics deltas (the figures docs/calibration.md tabulates).
"""

from __future__ import annotations

import pytest

from specsweep.emulator.profile import load_profile
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.workload import load_workload

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
    assert single.decode_tokens_per_s_per_stream.p50 / SCALE == pytest.approx(40.4, rel=0.10)
    assert four.output_tokens_per_s / SCALE == pytest.approx(66.7, rel=0.10)
    # per-stream rates at 4 concurrent fall well below the single stream (17-22 in the report)
    assert four.decode_tokens_per_s_per_stream.p50 < 0.6 * single.decode_tokens_per_s_per_stream.p50
