"""Emulator profiles: the bundled ones load, bad ones fail naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.emulator.profile import Faults, StepTiming, bundled_profile_names, load_profile, parse_profile
from specsweep.errors import ConfigError

DEFAULT_TEXT = (
    Path(__file__).parents[1] / "src" / "specsweep" / "emulator" / "profiles" / "dgx-spark-v4-flash.toml"
).read_text()


@pytest.mark.parametrize("name", bundled_profile_names())
def test_bundled_profiles_load(name: str) -> None:
    profile = load_profile(name)
    assert profile.name == name
    assert set(profile.classes) >= {"prose", "technical"}


def test_default_profile_carries_the_report_rig() -> None:
    profile = load_profile()
    assert profile.kv_cache_tokens(5) == 1_760_985
    assert round(profile.kv_cache_tokens(5) / profile.max_model_len, 2) == 4.40
    assert profile.kv_cache_tokens(1) > profile.kv_cache_tokens(5)  # the pool shrinks as k grows
    assert profile.rank_memory_suggestions == (0.8526, 0.8556)
    assert profile.fp8_default_kernel_warning


def test_a_profile_file_by_path(tmp_path: Path) -> None:
    path = tmp_path / "mine.toml"
    path.write_text(DEFAULT_TEXT.replace('name = "dgx-spark-v4-flash"', 'name = "mine"'))
    assert load_profile(path).name == "mine"


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ("base_s = 0.0345", "base_s = -1.0", "timing.base_s must be >= 0"),
        ("base_s = 0.0345", "base_s = 'fast'", "timing.base_s must be a number"),
        ("jitter = 0.03", "jitter = 0.03\nturbo = true", "timing.turbo is not a known key"),
        ('methods = ["dspark", "mtp"]', "methods = []", "drafter.methods"),
        ("[classes.technical]", "[classes.code]", r"\[classes.technical\] is missing"),
        ("0.741, 0.538", "0.741, 0.838", "non-increasing"),
        ("rank_memory_suggestions = [0.8526, 0.8556]", "rank_memory_suggestions = [0.8526]", "one value per rank"),
        ('served_model_name = "deepseek-ai/DeepSeek-V4-Flash-0731"\n', "", "served_model_name is required"),
        ("verify_token_s = 0.0062\n", "", "timing.verify_token_s is required"),
        ("jitter = 0.03", "jitter = 0.03\ncaptured_widths = [8, 2.5]", "captured_widths must be a list of whole"),
        ("[faults]", "[faults]\ncrash_after_requests = -1", "crash_after_requests must be a whole"),
        ("[faults]", "[faults]\nstartup_s = 5.0", "faults.startup_s is not a known key"),
    ],
)
def test_bad_profiles_name_the_key(old: str, new: str, message: str) -> None:
    assert old in DEFAULT_TEXT
    with pytest.raises(ConfigError, match=message):
        parse_profile(DEFAULT_TEXT.replace(old, new, 1), source="t")


def test_unknown_profile_name_lists_the_bundled_ones() -> None:
    with pytest.raises(ConfigError, match="dgx-spark-v4-flash"):
        load_profile("no-such-profile")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(max_size=300))
def test_any_text_parses_or_raises_config_error(text: str) -> None:
    try:
        parse_profile(text, source="fuzz")
    except ConfigError as exc:
        assert "profile fuzz" in str(exc)


def test_timing_and_faults_left_out_take_their_records_defaults() -> None:
    """A profile that writes only the required timing keys gets StepTiming's and Faults' own
    defaults for the rest: the records are the one place those defaults live."""
    lines = [line for line in DEFAULT_TEXT.splitlines() if not line.startswith(OPTIONAL_TIMING_KEYS)]
    profile = parse_profile("\n".join(lines), source="t")
    required = {"base_s": 0.0345, "per_sequence_s": 0.001, "verify_token_s": 0.0062, "draft_position_s": 0.0014}
    assert profile.timing == StepTiming(**required)
    assert profile.faults == Faults(boot_fail_above_k=10)  # the one fault the profile writes
    with_widths = parse_profile(DEFAULT_TEXT.replace("jitter = 0.03", "captured_widths = [16, 4, 8]"), source="t")
    assert with_widths.timing.captured_widths == (4, 8, 16)  # sorted: a step pads to the smallest that holds it
    assert with_widths.timing.verified_width(5) == 8 and with_widths.timing.verified_width(20) == 20


OPTIONAL_TIMING_KEYS = (
    "draft_batch_slope", "probabilistic_factor", "prefill_tokens_per_s", "request_overhead_s", "jitter",
)  # fmt: skip
