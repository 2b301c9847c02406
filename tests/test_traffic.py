"""Traffic schedules: parsing, the truth of a window, and the emulator serving a schedule itself."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import load_profile
from specsweep.emulator.traffic import (
    TrafficSchedule,
    TrafficWindow,
    load_schedule,
    mix_per_position,
    parse_schedule,
    segments_between,
    window_tokens_per_s,
)
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.runtime.scraper import parse_metrics_text

from .conftest import print_truth

pytestmark = pytest.mark.alone  # a traffic schedule's windows are wall clock (pyproject.toml)

PROFILE = "dgx-spark-v4-flash"
SPEC = {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic"}


def spec(k: int):
    return validate_speculative_config({**SPEC, "num_speculative_tokens": k}) if k else None


def test_bundled_schedule_reads_and_says_which_window_holds() -> None:
    schedule = load_schedule("day-night")
    assert [w.name for w in schedule.window] == ["morning", "day", "evening", "night"]
    assert schedule.period_s == 3600
    assert schedule.window_at(0)[1].name == "morning"
    assert schedule.window_at(1799.9)[1].name == "day"
    assert schedule.window_at(3600 + 2700)[1].name == "night"  # it repeats
    once = TrafficSchedule(window=schedule.window, repeat=False)
    assert once.window_at(3600) is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"window": []}, "at least one [[window]]"),
        ({"window": [{"duration_s": 10, "streams": 1, "mix": {}}]}, "at least one class"),
        ({"window": [{"duration_s": 0, "streams": 1, "mix": {"prose": 1}}]}, "duration_s > 0"),
        ({"window": [{"duration_s": 10, "streams": 1, "mix": {"prose": 1}, "rate": 3}]}, "window[0].rate"),
        ({"windows": []}, "unknown key 'windows'"),
        ({"window": [{"duration_s": "ten", "streams": 1, "mix": {"prose": 1}}]}, "window[0].duration_s must be"),
        ({"max_tokens": 1, "window": [{"duration_s": 1, "streams": 1, "mix": {"prose": 1}}]}, "max_tokens"),
    ],
)
def test_a_bad_schedule_is_one_line_naming_the_key(data: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_schedule(data, source="t.toml")


def test_mix_shares_are_normalised_and_segments_cut_windows() -> None:
    schedule = parse_schedule(
        {
            "window": [
                {"duration_s": 100, "streams": 2, "mix": {"prose": 3, "technical": 1}},
                {"duration_s": 50, "streams": 1, "mix": {"technical": 1}},
            ]
        }
    )
    assert schedule.window[0].mix == {"prose": 0.75, "technical": 0.25}
    cut = segments_between(schedule, 80, 330)  # 80-100, 100-150, 150-250, 250-300, 300-330
    assert [(s.index, round(s.duration_s)) for s in cut] == [(0, 20), (1, 50), (0, 100), (1, 50), (0, 30)]


def test_a_one_class_window_has_that_class_truth() -> None:
    """The mix truth of a window that is all one class equals compute_truth's closed loop of that class."""
    profile = load_profile(PROFILE)
    schedule = TrafficSchedule(window=())
    for streams in (1, 3):
        window = TrafficWindow(duration_s=60, streams=streams, mix={"technical": 1.0})
        prompts = {"technical": workload_prompt_tokens("technical"), "prose": workload_prompt_tokens("prose")}
        truth = compute_truth(profile, spec(3), 0.6, [streams], prompt_tokens=prompts)["technical"]
        # the bundled prompts' mean length carries a random nonce: a token either way between calls
        assert window_tokens_per_s(profile, schedule, window, spec(3)) == pytest.approx(
            truth.levels[0].output_tokens_per_s, rel=1e-3
        )


def test_a_mix_weights_each_class_by_its_share_of_steps() -> None:
    profile = load_profile(PROFILE)
    prose = mix_per_position(profile, spec(5), 0.6, {"prose": 1.0})
    technical = mix_per_position(profile, spec(5), 0.6, {"technical": 1.0})
    half = mix_per_position(profile, spec(5), 0.6, {"prose": 0.5, "technical": 0.5})
    # steps per request are (M - 1) / E: technical requests take more steps, so they weigh more
    e_prose, e_technical = 1 + sum(prose), 1 + sum(technical)
    weight = (0.5 / e_technical) / (0.5 / e_technical + 0.5 / e_prose)
    assert half == pytest.approx([weight * t + (1 - weight) * p for p, t in zip(prose, technical, strict=True)])
    assert weight > 0.5


def test_print_truth_gives_every_window() -> None:
    out = print_truth("--traffic", "day-night", "--profile", PROFILE, "--speculative-config", json.dumps(SPEC))
    assert [w["window"] for w in out["windows"]] == ["morning", "day", "evening", "night"]
    schedule, profile = load_schedule("day-night"), load_profile(PROFILE)
    for row, window in zip(out["windows"], schedule.window, strict=True):
        # the bundled prompts' mean length carries a random nonce: a token either way between processes
        truth = window_tokens_per_s(profile, schedule, window, spec(5))
        assert row["output_tokens_per_s"] == pytest.approx(truth, rel=1e-3)


def _scrape(url: str):
    return parse_metrics_text(httpx.get(url + "/metrics", timeout=10).text, taken_at=time.time())


@pytest.mark.slow
def test_the_emulator_serves_its_schedule_at_the_truth(start_emulator, tmp_path) -> None:
    """Two windows at time scale 50: the running gauge holds each window's streams, the counters'
    acceptance is the mix's, and the generated-token rate is the window truth's (within 4%). At
    100 a slow 2-core machine's emulator fell 5% behind its schedule at three streams (its steps
    then take a fifth of a millisecond of wall time), so the rate read the lag, not the model."""
    scale = 50.0
    seconds = 600 / scale  # a window's wall time
    path = tmp_path / "two.toml"
    path.write_text(
        'name = "two"\nmax_tokens = 600\nrepeat = false\n'
        "[[window]]\nduration_s = 600\nstreams = 1\nmix = { technical = 1.0 }\n"
        "[[window]]\nduration_s = 600\nstreams = 3\nmix = { prose = 0.5, technical = 0.5 }\n"
    )
    server = start_emulator(
        speculative_config=json.dumps(SPEC), profile=PROFILE, time_scale=scale, extra=["--traffic", str(path)]
    )
    started = httpx.get(server.url + "/version", timeout=10).json()["emulator"]["traffic"]["started_at"]
    schedule, profile = load_schedule(path), load_profile(PROFILE)
    for index, window in enumerate(schedule.window):
        begin = started + index * seconds
        time.sleep(max(0.0, begin + 1.0 - time.time()))  # skip the first second: the previous window drains
        first, running = _scrape(server.url), []
        while time.time() < begin + seconds - 0.2:
            running.append(_scrape(server.url).total("vllm:num_requests_running"))
            time.sleep(0.2)
        last = _scrape(server.url)
        tokens = last.total("vllm:generation_tokens_total") - first.total("vllm:generation_tokens_total")
        rate = tokens / (last.taken_at - first.taken_at) / scale
        assert rate == pytest.approx(window_tokens_per_s(profile, schedule, window, spec(5)), rel=0.04)
        assert sum(r == window.streams for r in running) >= 0.7 * len(running)
        assert max(running) <= window.streams
        drafts = last.total("vllm:spec_decode_num_drafts_total") - first.total("vllm:spec_decode_num_drafts_total")
        per_pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
        s1 = last.total(per_pos, position="0") - first.total(per_pos, position="0")
        assert s1 / drafts == pytest.approx(mix_per_position(profile, spec(5), 0.6, window.mix)[0], abs=0.03)
