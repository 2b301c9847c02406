"""Each engine validates against its own vocabulary: a spec-config field the engine has no flag for
is refused before any start, in one line that names the field and the engine, and every field an
engine accepts changes the flags it renders (none is accepted and then passed as nothing, which
would measure identical servers under different keys)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from specsweep.config import SearchSpace
from specsweep.engines import llamacpp, vllm
from specsweep.engines.registry import engine_info
from specsweep.errors import ConfigError
from specsweep.tuning.space import build_space, check_space

from .builders import emulator_study, specsweep, write_study

# A value other than the default for every field an engine might take, with the drafter it applies to.
DRAFTER = {"method": "eagle", "model": "d", "num_speculative_tokens": 3}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3}
VALUES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "draft_sample_method": (DRAFTER, {"draft_sample_method": "probabilistic"}),
    "rejection_sample_method": (DRAFTER, {"rejection_sample_method": "block"}),
    "synthetic_acceptance_rates": (
        DRAFTER, {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": [0.9, 0.5, 0.1]},
    ),
    "synthetic_acceptance_length": (
        DRAFTER, {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0},
    ),
    "prompt_lookup_max": (NGRAM, {"prompt_lookup_max": 4}),
    "prompt_lookup_min": (NGRAM, {"prompt_lookup_min": 2}),
    "draft_tensor_parallel_size": (DRAFTER, {"draft_tensor_parallel_size": 1}),
    "num_speculative_tokens_per_batch_size": (
        DRAFTER, {"num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 64, 1]]},
    ),
    "quantization": (DRAFTER, {"quantization": "fp8"}),
    "max_model_len": (DRAFTER, {"max_model_len": 2048}),
    "revision": (DRAFTER, {"revision": "main"}),
    "code_revision": (DRAFTER, {"code_revision": "main"}),
    "disable_padded_drafter_batch": (DRAFTER, {"disable_padded_drafter_batch": True}),
    "parallel_drafting": (DRAFTER, {"parallel_drafting": True}),
    "suffix_decoding_max_tree_depth": (DRAFTER, {"suffix_decoding_max_tree_depth": 8}),
    "suffix_decoding_max_cached_requests": (DRAFTER, {"suffix_decoding_max_cached_requests": 100}),
    "suffix_decoding_max_spec_factor": (DRAFTER, {"suffix_decoding_max_spec_factor": 2.0}),
    "suffix_decoding_min_token_prob": (DRAFTER, {"suffix_decoding_min_token_prob": 0.2}),
    # llama.cpp's own
    "spec_type": (NGRAM, {"spec_type": "ngram-map-k"}),
    "p_min": (DRAFTER, {"p_min": 0.5}),
    "p_split": (DRAFTER, {"p_split": 0.2}),
    "n_min": (DRAFTER, {"n_min": 1}),
    "ngram_min_hits": (NGRAM, {"ngram_min_hits": 2}),
}  # fmt: skip
# What each engine refuses (every other field it takes renders a flag of its own).
REFUSED = {
    "sglang": {
        "draft_sample_method", "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
        "prompt_lookup_max", "prompt_lookup_min", "draft_tensor_parallel_size", "max_model_len", "code_revision",
        "disable_padded_drafter_batch", "parallel_drafting", *(f for f in VALUES if f.startswith("suffix_")),
        *llamacpp.FIELDS,
    },
    "llama.cpp": {
        "rejection_sample_method", "synthetic_acceptance_rates", "synthetic_acceptance_length",
        "draft_tensor_parallel_size", "num_speculative_tokens_per_batch_size", "quantization", "max_model_len",
        "revision", "code_revision", "disable_padded_drafter_batch", "parallel_drafting",
        *(f for f in VALUES if f.startswith("suffix_")),
    },
}  # fmt: skip


def test_every_field_is_covered() -> None:
    assert set(VALUES) == set(vllm.FIELDS) - {"method", "model", "num_speculative_tokens"} | set(llamacpp.FIELDS)


@pytest.mark.parametrize("engine_name", list(REFUSED))
def test_every_field_an_engine_accepts_changes_its_flags(engine_name: str) -> None:
    engine = engine_info(engine_name)
    refused = set()
    for name, (drafter, value) in VALUES.items():
        base = {**drafter, "method": "draft_model"} if engine_name == "llama.cpp" and drafter is DRAFTER else drafter
        before = engine.render_spec_args(engine.validate_spec(dict(base)))
        try:
            spec = engine.validate_spec({**base, **value})
        except ConfigError as exc:
            refused.add(name)
            assert "\n" not in str(exc)
            continue
        assert engine.render_spec_args(spec) != before, f"{engine_name} accepts {name} and renders nothing for it"
    assert refused == REFUSED[engine_name]


REFUSALS = [
    # (engine, search.fixed, the start of the one line)
    ("sglang", {**NGRAM, "prompt_lookup_max": 4}, "SGLang 0.5.23 has no flag for speculative_config.prompt_lookup_max"),
    ("sglang", {**NGRAM, "prompt_lookup_min": 2}, "SGLang 0.5.23 has no flag for speculative_config.prompt_lookup_min"),
    ("sglang", {**DRAFTER, "rejection_sample_method": "block"},
     "SGLang 0.5.23 has no flag for speculative_config.rejection_sample_method 'block'"),
    ("sglang", {**DRAFTER, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0},
     "SGLang 0.5.23 has no flag for speculative_config.rejection_sample_method 'synthetic'"),
    ("sglang", {**DRAFTER, "parallel_drafting": True},
     "SGLang 0.5.23 has no flag for speculative_config.parallel_drafting"),
    ("sglang", {**DRAFTER, "draft_tensor_parallel_size": 1},
     "SGLang 0.5.23 has no flag for speculative_config.draft_tensor_parallel_size"),
    ("sglang", {**DRAFTER, "max_model_len": 2048}, "SGLang 0.5.23 has no flag for speculative_config.max_model_len"),
    ("sglang", {**DRAFTER, "quantization": "int3"}, "SGLang 0.5.23 has no draft quantization 'int3'"),
    ("llama.cpp", {**NGRAM, "prompt_lookup_max": 4, "prompt_lookup_min": 2},
     r"llama.cpp build 11434 looks up one n-gram length \(--spec-ngram-T-size-n\), so prompt_lookup_max \(4\)"),
    ("llama.cpp", {**NGRAM, "rejection_sample_method": "block"},
     "llama.cpp build 11434 has no flag for speculative_config.rejection_sample_method 'block'"),
    ("llama.cpp", {**NGRAM, "rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.0},
     "llama.cpp build 11434 has no flag for speculative_config.rejection_sample_method 'synthetic'"),
    ("llama.cpp", {**NGRAM, "quantization": "fp8"},
     "llama.cpp build 11434 has no flag for speculative_config.quantization"),
    ("llama.cpp", {**NGRAM, "parallel_drafting": True},
     "llama.cpp build 11434 has no flag for speculative_config.parallel_drafting"),
    ("llama.cpp", {**NGRAM, "draft_tensor_parallel_size": 1},
     "llama.cpp build 11434 has no flag for speculative_config.draft_tensor_parallel_size"),
    ("llama.cpp", {**NGRAM, "num_speculative_tokens_per_batch_size": [[1, 4, 3]]},
     "llama.cpp build 11434 has no flag for speculative_config.num_speculative_tokens_per_batch_size"),
]  # fmt: skip


@pytest.mark.parametrize(("engine_name", "fixed", "line"), REFUSALS, ids=[f"{e}-{m[:60]}" for e, _, m in REFUSALS])
def test_a_study_that_opens_a_field_the_engine_cannot_pass_stops_before_any_start(
    engine_name: str, fixed: dict[str, Any], line: str
) -> None:
    engine = engine_info(engine_name)
    fixed = {key: value for key, value in fixed.items() if key != "num_speculative_tokens"}
    space = build_space(
        SearchSpace(num_speculative_tokens=(1, 3), fixed=fixed), temperature=0.0,
        engine_has_draft_sample_method=engine.has_draft_sample_method, validate=engine.validate_spec,
        samples_drafts=engine.drafts_from_a_distribution,
    )  # fmt: skip
    with pytest.raises(ConfigError) as caught:
        check_space(space, "s.toml")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("s.toml: search.fixed / search.open give an invalid spec config (")
    assert re.search(line, message), message


def test_fields_each_engine_passes_are_still_taken() -> None:
    """SGLang passes a draft's revision and quantization as its own flags; llama.cpp takes one lookup
    length given either way, and vLLM's lookup default is no SGLang setting (not in the key)."""
    sglang = engine_info("sglang")
    spec = sglang.validate_spec({**DRAFTER, "revision": "v2", "quantization": "fp8"})
    assert sglang.render_spec_args(spec)[-4:] == [
        "--speculative-draft-model-revision", "v2", "--speculative-draft-model-quantization", "fp8",
    ]  # fmt: skip
    assert sglang.validate_spec(dict(NGRAM)).to_json() == '{"method":"ngram","num_speculative_tokens":3}'
    llama = engine_info("llama.cpp")
    both = llama.validate_spec({**NGRAM, "prompt_lookup_max": 3, "prompt_lookup_min": 3})
    assert llama.render_spec_args(both) == [
        "--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "3",
    ]  # fmt: skip


def test_an_sglang_study_file_with_a_lookup_length_starts_nothing(tmp_path: Path) -> None:
    data = emulator_study("ngram", k=(1, 3), search={"fixed": {"method": "ngram", "prompt_lookup_max": 4}})
    data["server"] = {"engine": "sglang", "mode": "process", "start": ["sglang", "serve", "{spec_args}"]}
    write_study(tmp_path / "s.toml", data)
    done = specsweep("study", "--config", "s.toml", "--dry-run", cwd=tmp_path)
    assert done.returncode == 1 and done.stdout == "" and done.stderr.count("\n") == 1
    assert done.stderr.startswith(
        "specsweep: error: s.toml: search.fixed / search.open give an invalid spec config (SGLang 0.5.23 has no "
        "flag for speculative_config.prompt_lookup_max (its NGRAM matches"
    )
