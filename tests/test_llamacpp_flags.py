"""llama.cpp's spec-config fields, their flags, and the build's --help deciding which names to use.

The help texts below are excerpts in the two shapes llama-server prints: the late-2026 build's
(renamed flags, removed ones still listed with a notice) and a 2025 build's (``--draft-max``).
The real build's --help is read in tests/test_real_llamacpp.py.
"""

from __future__ import annotations

import pytest

from specsweep.config import SearchSpace
from specsweep.engines import llamacpp
from specsweep.engines.registry import engine_info
from specsweep.errors import ConfigError
from specsweep.tuning.space import build_space, check_spec_args
from specsweep.types import SpeculativeConfig

NEW_HELP = """\
----- speculative params -----

--spec-draft-n-max N                    number of tokens to draft for speculative decoding (default: 3)
                                        (env: LLAMA_ARG_SPEC_DRAFT_N_MAX)
--spec-draft-n-min N                    minimum number of draft tokens to use for speculative decoding
                                        (default: 0)
--spec-draft-p-min, --draft-p-min P     minimum speculative decoding probability (greedy) (default: 0.00)
--spec-draft-sampling {greedy,probabilistic}
                                        how the draft is sampled (default: greedy)
--spec-draft-model, -md, --model-draft FNAME
                                        draft model for speculative decoding (default: unused)
--spec-type none,draft-simple,draft-eagle3,draft-mtp,ngram-simple,ngram-map-k,ngram-mod
                                        comma-separated list of types of speculative decoding to use
--spec-ngram-simple-size-n N            ngram size N for ngram-simple speculative decoding
--spec-ngram-simple-size-m N            ngram size M for ngram-simple speculative decoding
--spec-ngram-map-k-size-n N             ngram size N for ngram-map-k speculative decoding
--spec-ngram-map-k-size-m N             ngram size M for ngram-map-k speculative decoding
--spec-ngram-map-k-min-hits N           minimum hits for ngram-map-k speculative decoding (default: 1)
--spec-ngram-mod-n-min N                minimum number of ngram tokens (default: 48)
--spec-ngram-mod-n-max N                maximum number of ngram tokens (default: 64)
--spec-ngram-mod-n-match N              ngram-mod lookup length (default: 24)
--draft, --draft-n, --draft-max N       the argument has been removed. use --spec-draft-n-max or
                                        --spec-ngram-mod-n-max
--draft-min, --draft-n-min N            the argument has been removed. use --spec-draft-n-min or
                                        --spec-ngram-mod-n-min
"""
OLD_HELP = """\
-md,   --model-draft FNAME              draft model for speculative decoding (default: unused)
--draft-max, --draft, --draft-n N       number of tokens to draft for speculative decoding (default: 16)
--draft-min, --draft-n-min N            minimum number of draft tokens to use for speculative decoding
--draft-p-min P                         minimum speculative decoding probability (greedy) (default: 0.8)
-t,    --threads N                      number of threads to use during generation
"""
NEW = llamacpp.parse_help_flags(NEW_HELP)
OLD = llamacpp.parse_help_flags(OLD_HELP)


def spec(**fields):
    return llamacpp.validate_spec_config({"num_speculative_tokens": 4, **fields})


def test_help_lists_usable_flags_and_not_the_removed_ones() -> None:
    assert {"--spec-draft-sampling", "--spec-draft-p-min", "--draft-p-min", "-md", "--spec-type"} <= NEW
    assert not {"--draft-max", "--draft", "--draft-min", "--draft-n-min"} & NEW
    assert {"--draft-max", "--draft-min", "--draft-p-min", "-md", "-t", "--threads"} <= OLD
    assert "--spec-type" not in OLD and "--spec-draft-sampling" not in OLD


def test_every_field_renders_to_its_flag_on_a_new_build() -> None:
    draft = spec(method="draft_model", model="d.gguf", draft_sample_method="probabilistic", p_min=0.6, n_min=2)
    assert llamacpp.render_spec_args(draft, flags=NEW) == [
        "-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "--spec-draft-n-min", "2",
        "--spec-draft-p-min", "0.6", "--spec-draft-sampling", "probabilistic",
    ]  # fmt: skip
    greedy = spec(method="draft_model", model="d.gguf")
    assert llamacpp.render_spec_args(greedy, flags=NEW)[-2:] == ["--spec-draft-sampling", "greedy"]
    map_k = spec(method="ngram", spec_type="ngram-map-k", prompt_lookup_min=2, ngram_min_hits=3)
    assert llamacpp.render_spec_args(map_k, flags=NEW) == [
        "--spec-type", "ngram-map-k", "--spec-ngram-map-k-size-n", "2", "--spec-ngram-map-k-size-m", "4",
        "--spec-ngram-map-k-min-hits", "3",
    ]  # fmt: skip
    mod = spec(method="ngram", spec_type="ngram-mod", n_min=2, prompt_lookup_min=8)
    assert llamacpp.render_spec_args(mod, flags=NEW) == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "4", "--spec-ngram-mod-n-min", "2",
        "--spec-ngram-mod-n-match", "8",
    ]  # fmt: skip
    mtp = spec(method="mtp", p_min=0.75)
    assert llamacpp.render_spec_args(mtp, flags=NEW) == [
        "--spec-type", "draft-mtp", "--spec-draft-n-max", "4", "--spec-draft-p-min", "0.75",
        "--spec-draft-sampling", "greedy",
    ]  # fmt: skip


def test_an_old_build_gets_its_own_names_and_a_refusal_for_what_it_lacks() -> None:
    draft = spec(method="draft_model", model="d.gguf", p_min=0.5, n_min=1)
    assert llamacpp.render_spec_args(draft, flags=OLD) == [
        "-md", "d.gguf", "--draft-max", "4", "--draft-min", "1", "--draft-p-min", "0.5",
    ]  # fmt: skip
    probabilistic = spec(method="draft_model", model="d.gguf", draft_sample_method="probabilistic")
    with pytest.raises(ConfigError, match=r"no --spec-draft-sampling .* draft_sample_method 'probabilistic'"):
        llamacpp.render_spec_args(probabilistic, flags=OLD)
    with pytest.raises(ConfigError, match=r"no --spec-type .* spec_type 'draft-mtp'"):
        llamacpp.render_spec_args(spec(method="mtp"), flags=OLD)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"method": "ngram", "p_min": 0.5}, "p_min applies to llama.cpp spec types draft-simple"),
        ({"method": "draft_model", "model": "d", "ngram_min_hits": 2}, "ngram_min_hits applies to"),
        ({"method": "draft_model", "model": "d", "p_min": 1.5}, "probabilities"),
        ({"method": "draft_model", "model": "d", "p_min": "high"}, "p_min must be a number"),
        ({"method": "draft_model", "model": "d", "n_min": 1.5}, "n_min must be a whole number"),
        ({"method": "ngram", "spec_type": "draft-mtp"}, "does not go with method 'ngram'"),
        ({"method": "ngram", "spec_type": "ngram-cache9"}, "spec_type must be one of"),
        ({"method": "suffix"}, "llama.cpp studies support method"),
        ({"method": "draft_model", "model": "d", "bogus": 1}, "unknown field 'bogus'"),
    ],
)
def test_fields_that_do_not_apply_are_refused_by_name(fields, message) -> None:
    with pytest.raises(ConfigError, match=message):
        spec(**fields)


def test_a_study_opens_p_min_and_renders_every_configuration_for_the_build() -> None:
    search = SearchSpace(
        num_speculative_tokens=(2, 3),
        fixed={"method": "draft_model", "model": "d.gguf"},
        open={"p_min": (0.0, 0.6)},
    )
    engine = engine_info("llama.cpp")
    space = build_space(
        search, temperature=0.8, engine_has_draft_sample_method=engine.has_draft_sample_method,
        validate=engine.validate_spec, samples_drafts=engine.drafts_from_a_distribution,
    )  # fmt: skip
    # off, then k 2..3 x greedy/probabilistic x p_min 0.0/0.6
    assert space.size() == 1 + 2 * 2 * 2
    configs = [c.spec for c in space.configurations()[1:]]
    assert {(c.num_speculative_tokens, c.draft_sample_method, c.extra["p_min"]) for c in configs} == {
        (k, m, p) for k in (2, 3) for m in ("greedy", "probabilistic") for p in (0.0, 0.6)
    }
    check_spec_args(space, engine, "s.toml", help_flags=NEW)
    with pytest.raises(ConfigError, match=r"^s\.toml: \[search\] this llama-server build lists no --spec-draft-samp"):
        check_spec_args(space, engine, "s.toml", help_flags=OLD)
    # a stored config reads back with llama.cpp's fields
    assert all(SpeculativeConfig.from_json(c.to_json()) == c for c in configs)


def test_lookup_drafters_have_no_draft_sampling_to_search() -> None:
    """n-gram lookup drafts the same tokens whichever draft method is named: one server, one key."""
    engine = engine_info("llama.cpp")
    search = SearchSpace(num_speculative_tokens=(2, 4), fixed={"method": "ngram", "prompt_lookup_min": 3})
    space = build_space(
        search, temperature=0.8, engine_has_draft_sample_method=True,
        validate=engine.validate_spec, samples_drafts=engine.drafts_from_a_distribution,
    )  # fmt: skip
    assert space.size() == 1 + 3
    vllm_space = build_space(SearchSpace(num_speculative_tokens=(2, 4), fixed={"method": "ngram"}), temperature=0.8,
                             engine_has_draft_sample_method=True)  # fmt: skip
    assert vllm_space.size() == 1 + 3
    assert build_space(SearchSpace(num_speculative_tokens=(2, 4), fixed={"method": "dspark"}), temperature=0.8,
                       engine_has_draft_sample_method=True).size() == 1 + 3 * 2  # fmt: skip


def test_draft_sampling_is_searched_only_where_llama_cpp_reads_it() -> None:
    """--spec-draft-sampling is read by draft-simple and draft-mtp only (common/speculative.cpp);
    eagle3, dflash and dspark take the top token: one server either way, and the study says so."""
    engine = engine_info("llama.cpp")
    for method, sampled in (("draft_model", True), ("mtp", True), ("eagle3", False), ("dspark", False)):
        search = SearchSpace(num_speculative_tokens=(1, 3), fixed={"method": method, "model": "d.gguf"})
        space = build_space(
            search, temperature=0.8, engine_has_draft_sample_method=True,
            validate=engine.validate_spec, samples_drafts=engine.drafts_from_a_distribution,
        )  # fmt: skip
        assert space.size() == 1 + 3 * (2 if sampled else 1), method
        notes = space.notes()
        assert bool(notes) is not sampled
        if notes:
            (line,) = notes
            assert line.startswith(f"draft_sample_method is not searched for {method}:")
        args = [engine.spec_args(c.spec) for c in space.configurations()]
        assert all(("--spec-draft-sampling" in a) is sampled for a in args if a)


def test_n_gram_sizes_are_llama_cpps_own_unless_a_study_sets_them() -> None:
    """llama.cpp's lookup defaults are 12 (ngram-simple, map) and 24 (ngram-mod), not vLLM's 5:
    without prompt_lookup_min no size flag is passed. ngram-mod's n_min (48 by default) is set
    to 0 so drafts shorter than k are kept; an n_min above k is refused."""
    simple = llamacpp.validate_spec_config({"method": "ngram", "num_speculative_tokens": 6})
    assert simple.prompt_lookup_min is None
    assert llamacpp.render_spec_args(simple) == ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", "6"]
    mod = llamacpp.validate_spec_config({"method": "ngram", "spec_type": "ngram-mod", "num_speculative_tokens": 8})
    assert llamacpp.render_spec_args(mod) == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8", "--spec-ngram-mod-n-min", "0",
    ]  # fmt: skip
    with pytest.raises(ConfigError, match=r"n_min \(9\) is above num_speculative_tokens \(8\)"):
        llamacpp.validate_spec_config({"method": "ngram", "spec_type": "ngram-mod", "num_speculative_tokens": 8,
                                       "n_min": 9})  # fmt: skip
    old = llamacpp.validate_spec_config({"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": 5})
    assert "--spec-ngram-simple-size-n" in llamacpp.render_spec_args(old)


def test_ngram_simple_below_its_lookup_length_never_drafts_and_the_space_says_so() -> None:
    """common_ngram_simple_draft copies the k tokens after a match only when they are at least as
    many as the lookup n-gram: below it ngram-simple runs as speculation off (llama.cpp's default
    lookup is 12). The other types draft at any k; a space that cannot draft at all says what to set."""

    def spec(**fields):
        return llamacpp.validate_spec_config({"method": "ngram", **fields})

    assert [k for k in range(1, 14) if llamacpp.never_drafts(spec(num_speculative_tokens=k))] == list(range(1, 12))
    lookup_3 = [spec(num_speculative_tokens=k, prompt_lookup_min=3) for k in range(1, 6)]
    assert [s.num_speculative_tokens for s in lookup_3 if llamacpp.never_drafts(s)] == [1, 2]
    for spec_type in ("ngram-map-k", "ngram-map-k4v", "ngram-mod"):
        assert llamacpp.never_drafts(spec(spec_type=spec_type, num_speculative_tokens=1)) is None
    assert llamacpp.never_drafts(llamacpp.validate_spec_config({"method": "draft_model", "model": "d",
                                                                "num_speculative_tokens": 1})) is None  # fmt: skip
    engine = engine_info("llama.cpp")

    def notes(fixed):
        return build_space(
            SearchSpace(num_speculative_tokens=(1, 8), fixed=fixed), temperature=0.0,
            engine_has_draft_sample_method=True, validate=engine.validate_spec,
            samples_drafts=engine.drafts_from_a_distribution, never_drafts=engine.never_drafts,
        ).notes()  # fmt: skip

    (line,) = notes({"method": "ngram", "prompt_lookup_min": 3})
    assert line.startswith("k = 1, 2: llama.cpp's ngram-simple drafts nothing below its lookup length (3:")
    assert "nothing in this space drafts" not in line
    (line,) = notes({"method": "ngram"})
    assert line.startswith("k = 1, 2, 3, 4, 5, 6, 7, 8:") and "(12:" in line
    assert line.endswith("nothing in this space drafts, so the study would measure speculation off alone.")
    assert notes({"method": "ngram", "spec_type": "ngram-mod"}) == []


def test_only_the_n_gram_types_look_their_drafts_up() -> None:
    """eagle3, dflash and dspark take the draft's top token (their draft sampling changes nothing)
    but draft at every step: their step time is a line in k, and the search predicts it; the n-gram
    types look drafts up in the text, and vLLM's ngram and suffix do too."""
    for spec_type in llamacpp.NGRAM_TYPES:
        spec = llamacpp.validate_spec_config({"method": "ngram", "spec_type": spec_type, "num_speculative_tokens": 4})
        assert llamacpp.looks_up(spec), spec_type
    for method in ("eagle3", "dspark", "dflash", "draft_model", "mtp"):
        spec = llamacpp.validate_spec_config({"method": method, "model": "d.gguf", "num_speculative_tokens": 2})
        assert not llamacpp.looks_up(spec), method
    assert engine_info("vllm").looks_up(SpeculativeConfig(method="suffix", num_speculative_tokens=3))
    assert not engine_info("vllm").looks_up(SpeculativeConfig(method="eagle3", model="m", num_speculative_tokens=3))


@pytest.mark.parametrize("method", ["draft_model", "eagle3", "dflash", "dspark"])
def test_draft_types_without_a_draft_model_are_refused(method: str) -> None:
    """b11434 creates no eagle3, dflash or dspark drafter without a draft context: the server would
    run with speculation silently off (speculative.cpp lines 2704 to 2707)."""
    with pytest.raises(ConfigError, match=r"needs (speculative_config\.model|a draft .model.)"):
        llamacpp.validate_spec_config({"method": method, "num_speculative_tokens": 3})
    assert llamacpp.validate_spec_config({"method": "mtp", "num_speculative_tokens": 3}).model is None


def test_the_paste_speaks_the_build_the_study_read() -> None:
    """A study that read an old build's --help pastes that build's names, not the 2026 ones."""
    from specsweep.report.snippets import render_snippet

    draft = llamacpp.validate_spec_config({"method": "draft_model", "model": "d.gguf", "num_speculative_tokens": 4})
    assert "--draft-max" in render_snippet(draft, "llama.cpp", help_flags=OLD).split()
    assert "--spec-draft-n-max" in render_snippet(draft, "llama.cpp", help_flags=NEW).split()


def test_a_draft_length_llama_server_caps_fails_the_trial_with_the_reason() -> None:
    """A dflash or dspark draft caps --spec-draft-n-max at its trained block size and says so in
    its log (common/speculative.cpp lines 1076 to 1081, the line below as b11434 prints it): that
    trial would measure another k under this k's name."""
    log = (
        "common_speculative_impl_draft_dflash: requested draft size (n_max=8, n_min=0) exceeds the trained "
        "block size 6 -- clamping to 5\n"
    )
    reason = engine_info("llama.cpp").boot_refusal(log, None)
    assert reason == (
        "llama-server runs --spec-draft-n-max 8 as 5: the draft's trained block size is 6; "
        "keep search.num_speculative_tokens at or below 5."
    )
    assert engine_info("llama.cpp").boot_refusal("srv  load_model: loading model\n", None) is None
    assert engine_info("vllm").boot_refusal(log, None) is None
