"""vLLM: the ``--speculative-config`` rules by version and the Prometheus metric names.

Validation follows the vocabulary of the server's version (:data:`VOCABULARIES`, read from
vLLM 0.32's and 0.33's ``vllm/config/speculative.py``; docs/engines.md gives the lines): unknown
keys and illegal values are refused with the reason, as vLLM refuses them at startup.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, TypeGuard

from specsweep.engines.versions import VersionChoice, choose_vocabulary
from specsweep.errors import ConfigError
from specsweep.types import BatchSizeRange, BootFacts, CounterNames, SpeculativeConfig

METHODS = (
    "ngram",
    "ngram_gpu",
    "eagle",
    "eagle3",
    "mtp",
    "draft_model",
    "suffix",
    "dflash",
    "dspark",
    "custom_class",
)
# Model-specific MTP names that vLLM accepts and rewrites to "mtp".
MTP_ALIASES = (
    "deepseek_mtp",
    "qwen3_next_mtp",
    "glm4_moe_mtp",
    "ernie_mtp",
    "mimo_mtp",
    "longcat_flash_mtp",
)
REMOVED_METHODS = ("medusa", "mlp_speculator")
# The flag that bounds prompt and completion tokens of one request (engine/arg_utils.py, EngineArgs.max_model_len).
CONTEXT_FLAGS = ("--max-model-len",)
# The KV pool a command fixes: blocks (CacheConfig.num_gpu_blocks_override) of block_size tokens
# each (CacheConfig.block_size; 16 where the command does not set it, as on CUDA).
KV_BLOCKS_FLAG = "--num-gpu-blocks-override"
BLOCK_SIZE_FLAG = "--block-size"
DEFAULT_BLOCK_SIZE = 16
METHODS_NEEDING_MODEL = ("draft_model", "eagle", "eagle3", "dflash", *REMOVED_METHODS)
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
REJECTION_SAMPLE_METHODS = ("standard", "synthetic", "block", "fly")
# Fields accepted and passed through without a rule of their own here (each a field of
# SpeculativeConfig in 0.32 and 0.33; speculative_token_tree is in neither).
PASSTHROUGH_FIELDS = (
    "quantization",
    "max_model_len",
    "revision",
    "code_revision",
    "disable_padded_drafter_batch",
    "parallel_drafting",
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)
FIELDS = (
    "method",
    "model",
    "num_speculative_tokens",
    "draft_sample_method",
    "rejection_sample_method",
    "synthetic_acceptance_rates",
    "synthetic_acceptance_length",
    "prompt_lookup_max",
    "prompt_lookup_min",
    "draft_tensor_parallel_size",
    "num_speculative_tokens_per_batch_size",
    *PASSTHROUGH_FIELDS,
)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmVocabulary:
    """What one vLLM version's ``--speculative-config`` takes (``vllm/config/speculative.py``)."""

    version: str
    methods: tuple[str, ...]  # SpeculativeMethod, MTP aliases aside
    rejection_sample_methods: tuple[str, ...]  # RejectionSampleMethod


VOCABULARIES = {
    # 0.32.0: SpeculativeMethod lines 73 to 83 (medusa and mlp_speculator still there),
    # RejectionSampleMethod line 84.
    "0.32": VllmVocabulary(
        version="0.32",
        methods=(*METHODS, *REMOVED_METHODS),
        rejection_sample_methods=("standard", "synthetic", "block"),
    ),
    # 0.33.0: SpeculativeMethod lines 74 to 82, RejectionSampleMethod line 83 ("fly" added).
    "0.33": VllmVocabulary(version="0.33", methods=METHODS, rejection_sample_methods=REJECTION_SAMPLE_METHODS),
}
NEWEST = "0.33"
# Shorthand flags (0.22+) that set one spec-config key each; with the same key in
# --speculative-config vLLM refuses to start (engine/arg_utils.py 0.33 lines 2108 to 2121).
SHORTHAND_FLAGS = {"--spec-method": "method", "--spec-model": "model", "--spec-tokens": "num_speculative_tokens"}


def vocabulary_for(version: str | None) -> VersionChoice[VllmVocabulary]:
    """The vocabulary a vLLM server of ``version`` speaks (the newest known, with a note, if unknown)."""
    return choose_vocabulary("vLLM", VOCABULARIES, version)


def shorthand_flags_in(argv: list[str] | tuple[str, ...]) -> list[str]:
    """The ``--spec-method/--spec-model/--spec-tokens`` flags a server command line carries."""
    return [a.split("=", 1)[0] for a in argv if a.split("=", 1)[0] in SHORTHAND_FLAGS]


# Prometheus names (counters without their ``_total`` suffix, as prometheus_client names them).
SPEC_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_NUM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
SPEC_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
GENERATION_TOKENS = "vllm:generation_tokens"
PROMPT_TOKENS = "vllm:prompt_tokens"
REQUEST_SUCCESS = "vllm:request_success"
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
TTFT_SECONDS = "vllm:time_to_first_token_seconds"
ITL_SECONDS = "vllm:inter_token_latency_seconds"
E2E_SECONDS = "vllm:e2e_request_latency_seconds"

COUNTERS = CounterNames(
    generation_tokens=GENERATION_TOKENS + "_total",
    prompt_tokens=PROMPT_TOKENS + "_total",
    num_drafts=SPEC_NUM_DRAFTS + "_total",
    num_draft_tokens=SPEC_NUM_DRAFT_TOKENS + "_total",
    num_accepted_tokens=SPEC_NUM_ACCEPTED + "_total",
    accepted_per_position=SPEC_ACCEPTED_PER_POS + "_total",
)

# Bucket edges vLLM uses for its latency histograms.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


def parse_speculative_config(
    text: str, *, target_tensor_parallel_size: int = 1, version: str | None = None
) -> SpeculativeConfig:
    """Parse and validate the JSON given to ``--speculative-config`` the way vLLM ``version`` does."""
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--speculative-config is not valid JSON ({exc.msg} at char {exc.pos}).") from None
    except (RecursionError, ValueError):  # nested past the parser's recursion; an integer too long to read
        raise ConfigError(
            "--speculative-config is not JSON that can be read (nested too deeply, or a number too long)."
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError("--speculative-config must be a JSON object, e.g. '{\"num_speculative_tokens\": 3}'.")
    return validate_speculative_config(raw, target_tensor_parallel_size=target_tensor_parallel_size, version=version)


def validate_speculative_config(
    raw: dict[str, Any], *, target_tensor_parallel_size: int = 1, version: str | None = None
) -> SpeculativeConfig:
    """Validate a speculative config given as a mapping, as vLLM ``version`` (None: the newest
    known) does at startup; raise ConfigError naming the field."""
    vocabulary = vocabulary_for(version).vocabulary
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise ConfigError(
            f"speculative_config has unknown field {unknown[0]!r}; valid fields are: " + ", ".join(FIELDS[:11]) + "."
        )
    method = raw.get("method")
    if method is not None:
        if not isinstance(method, str):
            raise ConfigError("speculative_config.method must be a string.")
        if method in REMOVED_METHODS and method not in vocabulary.methods:
            raise ConfigError(f"speculative_config.method {method!r} was removed in vLLM 0.33.")
        if method in MTP_ALIASES:
            method = "mtp"
        if method not in vocabulary.methods:
            raise ConfigError(
                f"speculative_config.method {method!r} is not supported by vLLM {vocabulary.version}; choose one of "
                + ", ".join(vocabulary.methods)
                + "."
            )
        if method in METHODS_NEEDING_MODEL and not raw.get("model"):
            raise ConfigError(f"speculative_config.method {method!r} needs a draft 'model'.")
        if method == "custom_class" and not raw.get("model"):
            # config/speculative.py 0.32 lines 1179-1186, 0.33 lines 1284-1291
            raise ConfigError(
                "speculative_config.method 'custom_class' needs 'model': the import path of the proposer class "
                "(e.g. 'my_module.MyProposer')."
            )

    k = raw.get("num_speculative_tokens")
    if k is not None and (not _is_int(k) or k <= 0):
        raise ConfigError(f"speculative_config.num_speculative_tokens must be an integer > 0, got {k!r}.")
    if k is None and method not in ("mtp", None):
        raise ConfigError(f"speculative_config.num_speculative_tokens is required for method {method!r}.")
    if k is None and method is None and not raw.get("model"):
        raise ConfigError("speculative_config needs num_speculative_tokens (and usually a method).")

    draft_sample = raw.get("draft_sample_method", "greedy")
    if draft_sample not in DRAFT_SAMPLE_METHODS:
        raise ConfigError(
            f"speculative_config.draft_sample_method must be 'greedy' or 'probabilistic', got {draft_sample!r}."
        )
    rejection = raw.get("rejection_sample_method", "standard")
    if rejection not in vocabulary.rejection_sample_methods:
        raise ConfigError(
            f"speculative_config.rejection_sample_method must be one of (vLLM {vocabulary.version}) "
            + ", ".join(vocabulary.rejection_sample_methods)
            + f", got {rejection!r}."
        )
    if rejection == "fly" and k is not None and k < 2:
        # 0.33 config/speculative.py lines 2014-2022
        raise ConfigError(
            f"speculative_config.rejection_sample_method 'fly' needs num_speculative_tokens >= 2, got {k}."
        )
    rates, length = _validate_synthetic(raw, rejection, k)
    lookup_max, lookup_min = _validate_prompt_lookup(raw, method)

    draft_tp = raw.get("draft_tensor_parallel_size")
    if draft_tp is not None and (not _is_int(draft_tp) or draft_tp not in (1, target_tensor_parallel_size)):
        raise ConfigError(
            "speculative_config.draft_tensor_parallel_size must be 1 or the target's tensor "
            f"parallel size ({target_tensor_parallel_size}), got {draft_tp!r}."
        )
    per_batch = _validate_per_batch_size(raw.get("num_speculative_tokens_per_batch_size"))

    model = raw.get("model")
    if model is not None and not isinstance(model, str):
        raise ConfigError("speculative_config.model must be a string (a path or model name).")
    return SpeculativeConfig(
        method=method,
        model=model,
        num_speculative_tokens=k,
        draft_sample_method=draft_sample,
        rejection_sample_method=rejection,
        synthetic_acceptance_rates=rates,
        synthetic_acceptance_length=length,
        prompt_lookup_max=lookup_max,
        prompt_lookup_min=lookup_min,
        draft_tensor_parallel_size=draft_tp,
        num_speculative_tokens_per_batch_size=per_batch,
        extra={key: raw[key] for key in PASSTHROUGH_FIELDS if key in raw},
    )


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _validate_synthetic(
    raw: dict[str, Any], rejection: str, k: int | None
) -> tuple[tuple[float, ...] | None, float | None]:
    rates = raw.get("synthetic_acceptance_rates")
    length = raw.get("synthetic_acceptance_length")
    if rejection != "synthetic":
        if rates is not None or length is not None:
            raise ConfigError(
                "speculative_config.synthetic_acceptance_rates/_length need rejection_sample_method 'synthetic'."
            )
        return None, None
    if (rates is None) == (length is None):
        raise ConfigError(
            "rejection_sample_method 'synthetic' needs exactly one of "
            "synthetic_acceptance_rates or synthetic_acceptance_length."
        )
    if rates is not None:
        if not isinstance(rates, list) or not all(_is_number(r) for r in rates):
            raise ConfigError("speculative_config.synthetic_acceptance_rates must be a list of numbers.")
        if k is not None and len(rates) != k:
            raise ConfigError(
                f"speculative_config.synthetic_acceptance_rates must have num_speculative_tokens "
                f"({k}) entries, got {len(rates)}."
            )
        if any(not 0.0 <= r <= 1.0 for r in rates):
            raise ConfigError("speculative_config.synthetic_acceptance_rates must each be in 0..1.")
        if any(b > a for a, b in pairwise(rates)):
            raise ConfigError("speculative_config.synthetic_acceptance_rates must be non-increasing.")
        return tuple(float(r) for r in rates), None
    if not _is_number(length) or k is None or not 1.0 <= length <= k + 1:
        raise ConfigError(f"speculative_config.synthetic_acceptance_length must be a number in 1..{(k or 0) + 1}.")
    return None, float(length)


def _validate_prompt_lookup(raw: dict[str, Any], method: str | None) -> tuple[int | None, int | None]:
    lookup_max = raw.get("prompt_lookup_max")
    lookup_min = raw.get("prompt_lookup_min")
    if lookup_max is None and lookup_min is None:
        return (5, 5) if method in ("ngram", "ngram_gpu") else (None, None)
    if method not in ("ngram", "ngram_gpu"):
        raise ConfigError("speculative_config.prompt_lookup_max/min apply only to method 'ngram'.")
    lookup_max = lookup_min if lookup_max is None else lookup_max
    lookup_min = lookup_max if lookup_min is None else lookup_min
    if not (_is_int(lookup_max) and _is_int(lookup_min)) or lookup_min < 1:
        raise ConfigError("speculative_config.prompt_lookup_max/min must be integers >= 1.")
    if lookup_min > lookup_max:
        raise ConfigError(
            f"speculative_config.prompt_lookup_min ({lookup_min}) must be <= prompt_lookup_max ({lookup_max})."
        )
    return lookup_max, lookup_min


def _validate_per_batch_size(value: Any) -> tuple[BatchSizeRange, ...] | None:
    """vLLM's rules for the table (``v1/spec_decode/dynamic/utils.py`` lines 16 to 74, the same in
    0.32 and 0.33): positive inclusive ranges, no overlap, the first starting at batch size 1, each
    K >= 0. A K above num_speculative_tokens is not refused there: it runs as num_speculative_tokens
    (:meth:`SpeculativeConfig.k_for_batch_size`)."""
    if value is None:
        return None
    where = "speculative_config.num_speculative_tokens_per_batch_size"
    if not isinstance(value, list) or not value:
        raise ConfigError(f"{where} must be a non-empty list of [start_bs, end_bs, K] rows.")
    rows: list[BatchSizeRange] = []
    for row in value:
        if not (isinstance(row, list) and len(row) == 3 and all(_is_int(x) for x in row)):
            raise ConfigError(f"{where}: each row must be three integers [start_bs, end_bs, K], got {row!r}.")
        start, end, row_k = row
        if start < 1 or end < start:
            raise ConfigError(f"{where}: row {row!r} needs 1 <= start_bs <= end_bs.")
        if row_k < 0:
            raise ConfigError(f"{where}: row {row!r} needs K >= 0.")
        rows.append(BatchSizeRange(start=start, end=end, num_speculative_tokens=row_k))
    rows.sort(key=lambda r: r.start)
    for before, after in pairwise(rows):
        if after.start <= before.end:
            raise ConfigError(f"{where}: ranges {before.start}-{before.end} and {after.start}-{after.end} overlap.")
    if rows[0].start != 1:
        raise ConfigError(
            f"{where}: the first row starts at batch size {rows[0].start}; vLLM needs it to start at 1 so every "
            "batch size has a K."
        )
    return tuple(rows)


# Drafters that look tokens up instead of sampling them: draft_sample_method changes nothing there.
LOOKUP_METHODS = ("ngram", "ngram_gpu", "suffix")


def looks_up(spec: SpeculativeConfig) -> bool:
    """Whether the drafter looks its drafts up in the text (it drafts only where the text matches)."""
    return spec.method in LOOKUP_METHODS


def drafts_from_a_distribution(spec: SpeculativeConfig) -> bool:
    """Whether the drafter samples its drafts, so that greedy and probabilistic drafting differ."""
    return not looks_up(spec)


def render_spec_args(spec: SpeculativeConfig | None) -> list[str]:
    """vLLM's command-line flags for a spec config (none: speculation off)."""
    return [] if spec is None else ["--speculative-config", spec.to_json()]


_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_MAX_CONCURRENCY = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")
_SUGGESTION = re.compile(r"is equivalent to --gpu-memory-utilization=([\d.]+)")
_FP8_WARNING = "Using default W8A8 Block FP8 kernel config"
# logged once CUDA graphs are captured (v1/worker/gpu_model_runner.py; a CPU build captures none)
_GRAPHS_CAPTURED = "Graph capturing finished"


def parse_boot_facts(log: str) -> BootFacts:
    """Boot facts from a vLLM startup log (substrings, not line starts: the prefix changed in 0.31).

    Older versions print KV size and maximum concurrency on two lines; both shapes are read.
    """
    tokens = _KV_TOKENS.search(log)
    concurrency = _MAX_CONCURRENCY.search(log)
    return BootFacts(
        kv_cache_tokens=int(tokens.group(1).replace(",", "")) if tokens else None,
        max_concurrency=float(concurrency.group(1)) if concurrency else None,
        memory_suggestions=tuple(float(x) for x in _SUGGESTION.findall(log)),
        fp8_default_kernel_warning=_FP8_WARNING in log,
        graphs_captured=_GRAPHS_CAPTURED in log,
    )
