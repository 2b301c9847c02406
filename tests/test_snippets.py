"""Config snippets: each format parses back, with its own engine's parser, to the same config."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from specsweep.engines.vllm import validate_speculative_config
from specsweep.report.snippets import FORMATS, render_snippet

DSPARK = validate_speculative_config(
    {"method": "dspark", "num_speculative_tokens": 3, "draft_sample_method": "probabilistic"}
)
PER_BATCH = validate_speculative_config(
    {"method": "dspark", "num_speculative_tokens": 2, "num_speculative_tokens_per_batch_size": [[1, 2, 2], [3, 4, 1]]}
)


def _vllm_value(fmt: str, text: str) -> dict:
    """The JSON that vLLM would receive for --speculative-config from a snippet of ``fmt``."""
    if fmt == "vllm":
        flag, value = shlex.split(text)
        assert flag == "--speculative-config"
        return json.loads(value)
    if fmt == "vllm-yaml":
        value = yaml.safe_load(text)["speculative-config"]
        assert isinstance(value, str)  # a string, which every vLLM release passes through as is
        return json.loads(value)
    if fmt == "compose":
        command = yaml.safe_load(text)["command"]
        assert command[0] == "--speculative-config"
        return json.loads(command[1])
    assert fmt == "json"
    return json.loads(text)


@pytest.mark.parametrize("fmt", ["vllm", "vllm-yaml", "compose", "json"])
@pytest.mark.parametrize("spec", [DSPARK, PER_BATCH])
def test_vllm_forms_carry_the_exact_config(fmt: str, spec) -> None:
    value = _vllm_value(fmt, render_snippet(spec, fmt))
    assert value == json.loads(spec.to_json())
    assert validate_speculative_config(value) == spec


def test_the_report_s_example_form() -> None:
    expected = '{"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}'
    assert render_snippet(DSPARK, "vllm") == f"--speculative-config '{expected}'"


@given(path=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), min_size=1, max_size=30))
def test_hostile_model_paths_survive_every_vllm_form(path: str) -> None:
    spec = validate_speculative_config({"method": "draft_model", "model": path, "num_speculative_tokens": 4})
    for fmt in ("vllm", "vllm-yaml", "compose", "json"):
        assert _vllm_value(fmt, render_snippet(spec, fmt))["model"] == path


def test_other_engines_in_their_own_flags() -> None:
    ngram = validate_speculative_config({"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 3})
    assert shlex.split(render_snippet(ngram, "llama.cpp")) == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "6",
    ]  # fmt: skip
    eagle = validate_speculative_config({"method": "eagle3", "model": "head", "num_speculative_tokens": 4})
    flags = shlex.split(render_snippet(eagle, "sglang"))
    assert flags[flags.index("--speculative-num-steps") + 1] == "4"
    assert flags[flags.index("--speculative-num-draft-tokens") + 1] == "5"


@pytest.mark.parametrize("fmt", FORMATS)
def test_speculation_off_says_so(fmt: str) -> None:
    text = render_snippet(None, fmt)
    assert text in ("null", "--spec-type none") or text.startswith("# speculation off")
