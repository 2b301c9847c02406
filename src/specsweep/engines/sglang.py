"""SGLang: its speculative flags per algorithm, metric names and the per-request acceptance fields.

Checked line by line against SGLang 0.5.23's source (the wheel on PyPI; no real SGLang serves here:
its CPU backend needs sgl-kernel's CPU ops, which no registry package ships, docs/real-engines.md;
its server-argument parsing and speculative hooks do run, and tests/test_engine_contracts.py hands
every paste to them):

- ``sglang:prompt_tokens_total`` and ``sglang:generation_tokens_total``: counters, labelled also
  by ``is_streaming`` (``srt/observability/metrics_collector.py`` lines 1856 and 1861).
- ``sglang:spec_accept_length`` and ``sglang:spec_accept_rate``: gauges (same file, lines 512
  and 518), set from the last logged decode batches; gauges cannot be differenced, so they are
  read once after a measured level. Published with ``--enable-metrics``.
- Per request, ``"return_spec_tokens_details": true`` (``srt/entrypoints/openai/protocol.py``
  line 393 for completions, 961 for chat) brings ``sglext.spec_tokens_details`` (a
  ``SpecTokensDetails``, line 456, with ``spec_verify_ct`` at line 465; a list when n > 1), sent
  in a streamed chunk of its own with no choices (``serving_completions.py`` lines 444 to 476).
- Flags (``srt/arg_groups/field_order.py`` lines 264 to 271, named by ``arg_utils.py`` line 290):
  ``--speculative-algorithm`` (``srt/speculative/spec_info.py`` lines 39 to 47: DFLASH, UNO,
  DSPARK, EAGLE, EAGLE3, FROZEN_KV_MTP, STANDALONE, NGRAM; NEXTN is an alias of EAGLE,
  ``spec_registry.py`` line 183), ``--speculative-draft-model-path``, ``--speculative-num-steps``,
  ``--speculative-eagle-topk``, ``--speculative-num-draft-tokens``.
- The server's version: ``/server_info`` (``http_server.py`` line 888; ``runtime/identity.py``).

Per algorithm, as ``srt/arg_groups/speculative_hook.py`` resolves them (k = the draft length):

==========  ==========================================================================
method      flags
==========  ==========================================================================
eagle       EAGLE, a chain: --speculative-num-steps k --speculative-eagle-topk 1
            --speculative-num-draft-tokens k+1 (``_handle_eagle_family``, lines 1072 to 1266)
eagle3      EAGLE3, the same chain
mtp         EAGLE, the same chain. NEXTN is only an alias of EAGLE (``spec_registry.py`` line
            183, ``speculative_hook.py`` line 116), and DeepSeek-V4's hook asserts EAGLE or DSPARK
            before the alias resolves (``deepseek_v4_hook.py`` lines 148 to 157; it runs at
            ``pipeline.py`` line 225, the speculative hook at 306)
draft_model STANDALONE, the same chain
dspark      DSPARK --speculative-dspark-block-size k: one step forced, draft tokens = block
            size + 1 (``_handle_dspark``, lines 757 to 850)
dflash      DFLASH --speculative-dflash-block-size k+1: one step forced, the block size is the
            verify window, the draft tokens (lines 334 to 387)
ngram       NGRAM --speculative-num-draft-tokens k+1 --speculative-ngram-max-bfs-breadth 1: the
            hook overwrites topk with the BFS breadth (lines 1309 to 1313), so breadth 1 is the chain
==========  ==========================================================================

Other methods (ngram_gpu, suffix, custom_class) have no SGLang name and are refused before any
start. Of vLLM's other fields, ``revision`` and ``quantization`` are the draft's
``--speculative-draft-model-revision`` and ``--speculative-draft-model-quantization``
(``srt/arg_groups/fields/spec.py`` lines 47 and 216, its choices ``arg_groups/choices.py`` lines 32
to 67); every other one SGLang has no flag for is refused before any start (:data:`UNEXPRESSED`).

A per-batch-size choice is SGLang's adaptive config (``srt/speculative/adaptive_spec_params.py``):
``--speculative-adaptive --speculative-adaptive-config FILE``, a JSON of batch-size lower bounds
each with its ``candidate_steps``; one candidate pins a range. It drives EAGLE and EAGLE3 with
topk 1 only (line 61; other algorithms fall back to static steps with a warning), so with the
other methods the paste runs one k (analysis/snippet_plan.py).
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

from specsweep.engines.versions import choose_vocabulary, refuse_unexpressed
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.types import BatchSizeRange, CounterNames, SpeculativeConfig

METRIC_PREFIX = "sglang:"
# The flag that bounds prompt and completion tokens of one request (srt/server_args.py, context_length).
CONTEXT_FLAGS = ("--context-length",)
COUNTERS = CounterNames(generation_tokens="sglang:generation_tokens_total", prompt_tokens="sglang:prompt_tokens_total")
ACCEPT_LENGTH_GAUGE = "sglang:spec_accept_length"
ACCEPT_RATE_GAUGE = "sglang:spec_accept_rate"
# Gauges of the running batch and the queue (metrics_collector.py, beside the acceptance gauges).
NUM_RUNNING_REQS = "sglang:num_running_reqs"
NUM_QUEUE_REQS = "sglang:num_queue_reqs"
EXTRA_BODY = {"return_spec_tokens_details": True}

VERSION = "0.5.23"
# vLLM method names -> SGLang's --speculative-algorithm (the table in this module's docstring)
ALGORITHMS = {
    "eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "EAGLE", "draft_model": "STANDALONE",
    "dspark": "DSPARK", "dflash": "DFLASH", "ngram": "NGRAM",
}  # fmt: skip
CHAINS = ("EAGLE", "EAGLE3", "STANDALONE")
# What the adaptive config drives (adaptive_spec_params.py line 61).
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")
ADAPTIVE_FLAGS = ("--speculative-adaptive", "--speculative-adaptive-config")
# The file a paste names when no study folder is given.
ADAPTIVE_CONFIG_NAME = "sglang-adaptive.json"
# vLLM fields SGLang has a flag for: the draft model's revision and quantization.
DRAFT_FLAGS = {
    "revision": "--speculative-draft-model-revision",
    "quantization": "--speculative-draft-model-quantization",
}
# --speculative-draft-model-quantization's choices (srt/arg_groups/choices.py lines 32 to 67).
QUANTIZATIONS = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt", "modelopt_fp8",
    "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8", "moe_wna16", "w4afp8",
    "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim", "mxfp_w4a8", "quark",
    "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)  # fmt: skip
_VLLM_ONLY = "a vLLM setting"
_LOOKUP = "its NGRAM matches any suffix up to --speculative-ngram-max-trie-depth: it has no lookup length"
# vLLM fields SGLang 0.5.23 has no flag for (srt/arg_groups/fields/spec.py), and why.
UNEXPRESSED = {
    "rejection_sample_method": "its own --speculative-use-block-verification and --speculative-use-rejection-"
    "sampling are not checked against vLLM's rules",
    "prompt_lookup_max": _LOOKUP,
    "prompt_lookup_min": _LOOKUP,
    "draft_tensor_parallel_size": "no --speculative-* flag sets the draft's tensor parallel size",
    "max_model_len": "no --speculative-* flag sets the draft's context length",
    "code_revision": _VLLM_ONLY,
    "disable_padded_drafter_batch": _VLLM_ONLY,
    "parallel_drafting": _VLLM_ONLY,
    "suffix_decoding_max_tree_depth": _VLLM_ONLY,
    "suffix_decoding_max_cached_requests": _VLLM_ONLY,
    "suffix_decoding_max_spec_factor": _VLLM_ONLY,
    "suffix_decoding_min_token_prob": _VLLM_ONLY,
}


def algorithm_of(method: str | None) -> str:
    """SGLang's --speculative-algorithm for a vLLM method name; ConfigError if it has none."""
    if (method or "eagle") not in ALGORITHMS:
        raise ConfigError(
            f"SGLang {VERSION} has no speculative algorithm for method {method!r}; use one of "
            + ", ".join(ALGORITHMS)
            + " (set it in search.fixed)."
        )
    return ALGORITHMS[method or "eagle"]


def vocabulary_note(version: str | None) -> str | None:
    """The line to say when the server is not SGLang 0.5.23, the one version read here."""
    return choose_vocabulary("SGLang", {VERSION: VERSION}, version).note


def validate_spec_config(raw: dict[str, Any], *, version: str | None = None) -> SpeculativeConfig:
    """vLLM's field rules, a method SGLang has a name for, and only the fields SGLang has a flag for
    (:data:`UNEXPRESSED`; refused before any start)."""
    spec = validate_speculative_config(raw)
    algorithm_of(spec.method)
    refuse_unexpressed(raw, f"SGLang {VERSION}", UNEXPRESSED)
    if spec.draft_sample_method != "greedy":
        raise ConfigError("SGLang has no draft sampling choice: leave draft_sample_method out of an SGLang study.")
    quantization = spec.extra.get("quantization")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise ConfigError(
            f"SGLang {VERSION} has no draft quantization {quantization!r} (--speculative-draft-model-quantization "
            "takes " + ", ".join(QUANTIZATIONS[:8]) + ", ...); name one of its choices."
        )
    # vLLM's lookup default (5) is no SGLang setting: it is not part of the configuration's key.
    return replace(spec, prompt_lookup_max=None, prompt_lookup_min=None)


def table_refusal(spec: SpeculativeConfig) -> str | None:
    """Why SGLang cannot take a per-batch-size choice with ``spec`` (None: its adaptive config can)."""
    algorithm = algorithm_of(spec.method)
    if algorithm in ADAPTIVE_ALGORITHMS:
        return None
    return f"SGLang's adaptive config drives EAGLE and EAGLE3 only, not {algorithm}"


def adaptive_config(table: tuple[BatchSizeRange, ...]) -> dict[str, dict[str, list[int]]]:
    """The adaptive config that pins each row's k from its first batch size on (one candidate
    per range; a batch size is routed to the largest key at or below it, line 356)."""
    return {str(row.start): {"candidate_steps": [row.num_speculative_tokens]} for row in table}


def adaptive_config_text(table: tuple[BatchSizeRange, ...]) -> str:
    return json.dumps(adaptive_config(table), indent=2) + "\n"


def render_spec_args(spec: SpeculativeConfig | None, *, adaptive_config_path: str | None = None) -> list[str]:
    """SGLang's flags for ``spec`` (the table in this module's docstring). A per-batch-size table
    becomes the adaptive flags naming ``adaptive_config_path`` (the caller writes the file,
    :func:`adaptive_config_text`); ConfigError where SGLang cannot run it."""
    if spec is None or not spec.num_speculative_tokens:
        return []
    algorithm = algorithm_of(spec.method)
    k = spec.num_speculative_tokens
    args = ["--speculative-algorithm", algorithm]
    if algorithm in CHAINS:
        args += ["--speculative-num-steps", str(k), "--speculative-eagle-topk", "1"]
        args += ["--speculative-num-draft-tokens", str(k + 1)]
    elif algorithm == "DSPARK":
        args += ["--speculative-dspark-block-size", str(k)]
    elif algorithm == "DFLASH":
        args += ["--speculative-dflash-block-size", str(k + 1)]
    elif algorithm == "NGRAM":
        args += ["--speculative-num-draft-tokens", str(k + 1), "--speculative-ngram-max-bfs-breadth", "1"]
    if spec.model:
        args += ["--speculative-draft-model-path", spec.model]
    for name, flag in DRAFT_FLAGS.items():
        if spec.extra.get(name) is not None:
            args += [flag, str(spec.extra[name])]
    table = spec.num_speculative_tokens_per_batch_size
    if table:
        reason = table_refusal(spec)
        if reason is not None:
            raise ConfigError(f"{reason}: a per-batch-size table cannot be pasted for it.")
        args += [ADAPTIVE_FLAGS[0], ADAPTIVE_FLAGS[1], adaptive_config_path or ADAPTIVE_CONFIG_NAME]
    return args
