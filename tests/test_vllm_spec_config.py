"""vLLM's --speculative-config rules, as the emulator and the tuner apply them."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specsweep.engines.vllm import FIELDS, parse_speculative_config, validate_speculative_config, vocabulary_for
from specsweep.errors import ConfigError
from specsweep.types import SpeculativeConfig


@pytest.mark.parametrize(
    ("text", "expected_k", "expected_method"),
    [
        ('{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}', 5, "dspark"),
        ('{"num_speculative_tokens":3}', 3, None),
        ('{"method":"deepseek_mtp","num_speculative_tokens":2}', 2, "mtp"),
        ('{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}', 4, "ngram"),
        ('{"method":"mtp"}', None, "mtp"),
    ],
)
def test_valid_configs_parse(text: str, expected_k: int | None, expected_method: str | None) -> None:
    spec = parse_speculative_config(text)
    assert spec.num_speculative_tokens == expected_k
    assert spec.method == expected_method


def test_prompt_lookup_mirrors_the_one_given() -> None:
    spec = parse_speculative_config('{"method":"ngram","num_speculative_tokens":4,"prompt_lookup_max":3}')
    assert (spec.prompt_lookup_max, spec.prompt_lookup_min) == (3, 3)
    spec = parse_speculative_config('{"method":"ngram","num_speculative_tokens":4}')
    assert (spec.prompt_lookup_max, spec.prompt_lookup_min) == (5, 5)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        ('{"num_speculative_tokens":3,"draft_len":2}', "draft_len"),
        ('{"num_speculative_tokens":0}', "num_speculative_tokens"),
        ('{"num_speculative_tokens":true}', "num_speculative_tokens"),
        ('{"num_speculative_tokens":2.5}', "num_speculative_tokens"),
        ('{"method":"medusa","num_speculative_tokens":2}', "removed"),
        ('{"method":"warp","num_speculative_tokens":2}', "method"),
        ('{"method":"eagle3","num_speculative_tokens":2}', "model"),
        ('{"method":"ngram"}', "num_speculative_tokens"),
        ('{"num_speculative_tokens":2,"draft_sample_method":"gumbel"}', "draft_sample_method"),
        ('{"num_speculative_tokens":2,"rejection_sample_method":"strict"}', "rejection_sample_method"),
        ('{"num_speculative_tokens":2,"rejection_sample_method":"synthetic"}', "exactly one"),
        (
            '{"num_speculative_tokens":2,"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[0.5]}',
            "entries",
        ),
        (
            '{"num_speculative_tokens":2,"rejection_sample_method":"synthetic","synthetic_acceptance_rates":[0.4,0.6]}',
            "non-increasing",
        ),
        ('{"num_speculative_tokens":2,"synthetic_acceptance_length":2.0}', "synthetic"),
        ('{"num_speculative_tokens":2,"prompt_lookup_max":3}', "ngram"),
        ('{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":2,"prompt_lookup_min":3}', "<="),
        ('{"num_speculative_tokens":2,"draft_tensor_parallel_size":3}', "draft_tensor_parallel_size"),
        ('{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,4,-1]]}', "K >= 0"),
        ('{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[2,4,3]]}', "start at 1"),
        ('{"num_speculative_tokens":2,"speculative_token_tree":"[(0,)]"}', "unknown field"),
        ('{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,4,3],[4,8,2]]}', "overlap"),
    ],
)
def test_invalid_configs_name_the_problem(text: str, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        parse_speculative_config(text)


def test_per_batch_size_table_picks_k_by_batch() -> None:
    spec = parse_speculative_config(
        '{"num_speculative_tokens":4,"num_speculative_tokens_per_batch_size":[[1,2,4],[3,8,2],[9,64,0]]}'
    )
    # Past the last row its K holds, as vLLM expands the table.
    assert [spec.k_for_batch_size(b) for b in (1, 2, 3, 8, 9, 64, 65)] == [4, 4, 2, 2, 0, 0, 0]


def test_per_batch_size_gaps_and_large_k_run_as_vllm_runs_them() -> None:
    """vLLM's own example (v1/spec_decode/dynamic/utils.py): [(1, 16, 3), (32, 128, 2)] runs 17-31
    at K=3; and a K above num_speculative_tokens runs at num_speculative_tokens."""
    spec = parse_speculative_config(
        '{"num_speculative_tokens":5,"num_speculative_tokens_per_batch_size":[[1,16,3],[32,128,2],[200,300,9]]}'
    )
    assert [spec.k_for_batch_size(b) for b in (16, 17, 31, 32, 128, 129, 199, 200, 301)] == [3, 3, 3, 2, 2, 2, 2, 5, 5]


@pytest.mark.parametrize(
    ("version", "method", "rejection", "ok"),
    [
        ("0.33.0", "ngram", "fly", True),
        ("0.32.0", "ngram", "fly", False),  # "fly" arrived in 0.33
        ("0.32.0", "ngram", "block", True),
        ("0.32.0", "medusa", "standard", True),  # removed in 0.33 only
        ("0.33.0", "medusa", "standard", False),
        ("0.99.0", "ngram", "fly", True),  # unknown: the newest known vocabulary
    ],
)
def test_validation_follows_the_servers_version(version: str, method: str, rejection: str, ok: bool) -> None:
    raw = {"method": method, "num_speculative_tokens": 2, "rejection_sample_method": rejection, "model": "m"}
    if rejection == "synthetic":
        raw["synthetic_acceptance_length"] = 2.0
    if ok:
        assert validate_speculative_config(raw, version=version).rejection_sample_method == rejection
    else:
        with pytest.raises(ConfigError, match=method if method == "medusa" else "fly"):
            validate_speculative_config(raw, version=version)


def test_an_unknown_version_gets_the_newest_vocabulary_with_a_line() -> None:
    assert vocabulary_for("0.32.1").note is None and vocabulary_for("0.32.1").known_as == "0.32"
    choice = vocabulary_for("0.20.0")
    assert choice.known_as == "0.33" and "0.20.0" in choice.note and "0.33" in choice.note


def test_round_trip_through_json() -> None:
    text = '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}'
    spec = parse_speculative_config(text)
    assert json.loads(spec.to_json()) == json.loads(text)
    assert parse_speculative_config(spec.to_json()) == spec


_values = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 20), st.floats(allow_nan=True), st.text(max_size=8),
    st.lists(st.integers(-1, 9), max_size=4), st.lists(st.lists(st.integers(-1, 9), max_size=4), max_size=3),
)  # fmt: skip


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*FIELDS, "bogus"]), _values, max_size=6))
def test_any_mapping_parses_or_raises_config_error(raw: dict) -> None:
    try:
        spec = parse_speculative_config(json.dumps(raw))
    except ConfigError as exc:
        assert str(exc)  # a message that says what is wrong
    else:
        assert spec.num_speculative_tokens is None or spec.num_speculative_tokens > 0


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from([*FIELDS, "bogus"]), _values, max_size=6))
def test_a_valid_config_reads_back_from_its_own_json_unchanged(raw: dict) -> None:
    """Stored studies read their spec configs with SpeculativeConfig.from_json, no engine rules:
    every config the validator accepts must come back equal, and write the same JSON again."""
    try:
        spec = parse_speculative_config(json.dumps(raw))
    except ConfigError:
        return
    again = SpeculativeConfig.from_json(spec.to_json())
    assert again == spec and again.to_json() == spec.to_json()


def test_a_start_command_with_vllms_shorthand_flags_is_refused() -> None:
    """--spec-method/--spec-model/--spec-tokens beside the same key in --speculative-config stop
    vLLM at startup (engine/arg_utils.py): the study refuses them before any start."""
    from specsweep.engines.registry import server_args_without_spec
    from specsweep.tuning.space import check_start_command

    with pytest.raises(ConfigError, match=r"server\.start has --spec-method.*set method in search\.fixed"):
        check_start_command(("vllm", "serve", "m", "--spec-method", "ngram", "{spec_args}"), "vllm", "s.toml")
    with pytest.raises(ConfigError, match="--spec-tokens"):
        check_start_command("vllm serve m --spec-tokens=3 {spec_args}", "vllm", "s.toml")
    check_start_command(("vllm", "serve", "m", "{spec_args}"), "vllm", "s.toml")
    # a rig compares server flags without them
    assert server_args_without_spec("vllm", ["vllm", "serve", "m", "--spec-model", "d", "-tp", "2"]) == (
        "vllm", "serve", "m", "-tp", "2",
    )  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "match"),
    [
        # config/speculative.py 0.32 lines 1179-1186, 0.33 lines 1284-1291
        ({"method": "custom_class", "num_speculative_tokens": 2}, "'custom_class' needs 'model'"),
        # 0.33 lines 2014-2022
        ({"method": "ngram", "num_speculative_tokens": 1, "rejection_sample_method": "fly"}, "'fly' needs"),
    ],
)
def test_what_vllm_refuses_at_startup_is_refused_before_any_start(raw: dict, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        validate_speculative_config(raw, version="0.33.0")
    ok = {**raw, "model": "my_module.MyProposer"} if "custom_class" in match else {**raw, "num_speculative_tokens": 2}
    assert validate_speculative_config(ok, version="0.33.0").num_speculative_tokens == 2
