"""Config snippets: each format parses back, with its own engine's parser, to the same config."""

from __future__ import annotations

import json
import shlex
from pathlib import PurePosixPath

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.report.snippets import FORMATS, render_snippet

from .builders import run_sglang_paste

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


@pytest.mark.parametrize(
    ("method", "expected"),
    [
        # SGLang 0.5.23's hooks (srt/arg_groups/speculative_hook.py): chains for EAGLE, EAGLE3,
        # STANDALONE and MTP-as-EAGLE; DSPARK's block size is k (verify window k+1); DFLASH's block
        # size is the verify window, k+1; NGRAM's topk is its BFS breadth, 1 for a chain.
        ("eagle", "EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
        ("eagle3", "EAGLE3 --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
        ("mtp", "EAGLE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"),
        (
            "draft_model",
            "STANDALONE --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4",
        ),
        ("dspark", "DSPARK --speculative-dspark-block-size 3"),
        ("dflash", "DFLASH --speculative-dflash-block-size 4"),
        ("ngram", "NGRAM --speculative-num-draft-tokens 4 --speculative-ngram-max-bfs-breadth 1"),
    ],
)
def test_sglang_flags_per_algorithm(method: str, expected: str) -> None:
    spec = validate_speculative_config({"method": method, "model": "m", "num_speculative_tokens": 3})
    assert render_snippet(spec, "sglang") == f"--speculative-algorithm {expected} --speculative-draft-model-path m"


@pytest.mark.parametrize("method", ["ngram_gpu", "suffix", "custom_class"])
def test_methods_sglang_has_no_name_for_are_refused_before_any_start(method: str) -> None:
    from specsweep.engines import sglang

    with pytest.raises(ConfigError, match=f"SGLang 0.5.23 has no speculative algorithm for method '{method}'"):
        sglang.validate_spec_config({"method": method, "num_speculative_tokens": 2, "model": "m"})


def test_sglang_per_batch_size_choice_is_an_adaptive_config_that_pins_each_range(tmp_path) -> None:
    """EAGLE's table becomes --speculative-adaptive with a config file of one candidate per
    range (adaptive_spec_params.py); DSPARK's adaptive mode does not exist, so no table is pasted.
    The paste is self-contained: run from any directory, it writes the file at the absolute path
    its flags name."""
    from specsweep.report.snippets import adaptive_config_path_for

    eagle = validate_speculative_config(
        {"method": "eagle", "model": "m", "num_speculative_tokens": 2,
         "num_speculative_tokens_per_batch_size": [[1, 2, 2], [3, 4, 1], [5, 64, 0]]}
    )  # fmt: skip
    server_path = tmp_path / "server" / "adaptive.json"
    server_path.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    text = render_snippet(eagle, "sglang", adaptive_config_path=PurePosixPath(server_path))
    flags = run_sglang_paste(text, elsewhere)
    assert json.loads(server_path.read_text()) == {
        "1": {"candidate_steps": [2]}, "3": {"candidate_steps": [1]}, "5": {"candidate_steps": [0]},
    }  # fmt: skip
    assert flags[-3:] == ["--speculative-adaptive", "--speculative-adaptive-config", str(server_path)]
    assert flags[flags.index("--speculative-num-steps") + 1] == "2"  # the largest candidate: in every union
    assert list(elsewhere.iterdir()) == []  # nothing written where the paste ran
    assert str(adaptive_config_path_for("tech nical")) == "/tmp/sglang-adaptive-tech_nical.json"
    assert "--speculative-adaptive-config /tmp/sglang-adaptive.json" in render_snippet(eagle, "sglang")
    with pytest.raises(ConfigError, match="adaptive config drives EAGLE and EAGLE3 only, not DSPARK"):
        render_snippet(PER_BATCH, "sglang")
