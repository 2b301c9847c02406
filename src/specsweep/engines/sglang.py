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
topk 1 only (line 61; other algorithms fall back to static steps with a warning), and some of the
server's other flags turn it off the same way or stop the server from starting
(:func:`table_refusal`): there the paste runs one k (analysis/snippet_plan.py). ``/server_info``
says whether it runs (:func:`adaptive_state`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import PurePosixPath
from typing import Any, Literal

from specsweep.engines.versions import VLLM_ONLY, VLLM_ONLY_FIELDS, choose_vocabulary, refuse_unexpressed
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
# Flags under which 0.5.23 turns adaptive mode off (adaptive_spec_params.py lines 85 to 99); attention
# data parallelism is read from its size; a platform worker (line 66) shows only in /server_info.
ADAPTIVE_OFF_FLAGS = {
    "--enable-two-batch-overlap": "two-batch overlap",
    "--enable-pdmux": "pdmux",
    "--enable-multi-layer-eagle": "multi-layer EAGLE",
}
# Flags under which 0.5.23 refuses to start with adaptive mode at all.
ADAPTIVE_REFUSING_FLAGS = {"--enable-lora": "LoRA", "--lora-paths": "LoRA", "--enable-hisparse": "HiSparse"}
AdaptiveState = Literal["on", "off", "turned off"]  # "turned off": asked for, and SGLang turned it off
# Where a paste writes the adaptive config on the server when no workload names it.
ADAPTIVE_CONFIG_PATH = PurePosixPath("/tmp/sglang-adaptive.json")
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
_LOOKUP = "its NGRAM matches any suffix up to --speculative-ngram-max-trie-depth: it has no lookup length"
# vLLM fields SGLang 0.5.23 has no flag for (srt/arg_groups/fields/spec.py), and why.
UNEXPRESSED = {
    "rejection_sample_method": "its own --speculative-use-block-verification and --speculative-use-rejection-"
    "sampling are not checked against vLLM's rules",
    "prompt_lookup_max": _LOOKUP,
    "prompt_lookup_min": _LOOKUP,
    "draft_tensor_parallel_size": "no --speculative-* flag sets the draft's tensor parallel size",
    "max_model_len": "no --speculative-* flag sets the draft's context length",
    "code_revision": VLLM_ONLY,
    **VLLM_ONLY_FIELDS,
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


def table_refusal(
    spec: SpeculativeConfig, server_args: Sequence[str] | None = None, version: str | None = None
) -> str | None:
    """Why SGLang cannot take a per-batch-size choice with ``spec`` on a server started with
    ``server_args`` (its flags, spec flags aside; None: not known). None: its adaptive config can."""
    algorithm = algorithm_of(spec.method)
    if algorithm not in ADAPTIVE_ALGORITHMS:
        return f"SGLang's adaptive config drives EAGLE and EAGLE3 only, not {algorithm}"
    args = tuple(server_args or ())
    off = adaptive_off_reason(args)
    if off is not None:
        return f"SGLang turns adaptive mode off under {off} and runs one k"
    return adaptive_start_refusal(args)


def adaptive_off_reason(args: Sequence[str]) -> str | None:
    """What in a command line makes SGLang turn adaptive mode off, warning in its log only, and run
    static steps (``adaptive_unsupported_reason``, adaptive_spec_params.py lines 56 to 100, called
    by ``_maybe_disable_adaptive``, speculative_hook.py lines 261 to 262 and 1374 to 1390)."""
    for flag, what in ADAPTIVE_OFF_FLAGS.items():
        if _given(args, flag):
            return f"{what} ({flag})"
    attention_dp = _number(args, ("--attn-dp-size", "--attention-data-parallel-size"))
    replicas = _number(args, ("--dp-size", "--data-parallel-size"))
    # The old spelling --dp-size N --enable-dp-attention is --attn-dp-size N (parallel_hook.py 39 to 61).
    if attention_dp is None and _given(args, "--enable-dp-attention"):
        attention_dp = replicas
    if attention_dp is not None and attention_dp > 1:
        return f"attention data parallelism (--attn-dp-size {attention_dp})"
    return None


def adaptive_start_refusal(args: Sequence[str]) -> str | None:
    """Why SGLang refuses to start at all with adaptive mode under a command line (None: it starts):
    LoRA (``check_lora_speculative_compatibility``, lora_hook.py lines 240 to 303, adaptive at 278)
    and HiSparse (hisparse_hook.py lines 123 to 127)."""
    for flag, what in ADAPTIVE_REFUSING_FLAGS.items():
        if _given(args, flag):
            return f"SGLang {VERSION} refuses to start with --speculative-adaptive and {what} ({flag})"
    return None


def _given(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def _number(args: Sequence[str], flags: Sequence[str]) -> int | None:
    """The whole-number value of the first of ``flags`` (``--flag N`` or ``--flag=N``)."""
    for index, arg in enumerate(args):
        name, eq, attached = arg.partition("=")
        if name in flags:
            value = attached if eq else (args[index + 1] if index + 1 < len(args) else "")
            if value.isdigit():
                return int(value)
    return None


def adaptive_state(info: dict[str, Any]) -> AdaptiveState | None:
    """What a server says of its adaptive mode in its ``/server_info``: the resolved arguments
    (``build_server_info``, utils/common.py line 3589), where ``_maybe_disable_adaptive`` has set
    ``speculative_adaptive`` false, and ``launch_command``, what it was asked (http_server.py
    lines 863 to 870). None: it runs no speculation, or does not say."""
    algorithm, runs = info.get("speculative_algorithm"), info.get("speculative_adaptive")
    if not algorithm or str(algorithm).upper() == "NONE" or not isinstance(runs, bool):
        return None
    if runs:
        return "on"
    command = info.get("launch_command")
    asked = isinstance(command, str) and ADAPTIVE_FLAGS[0] in command.split()
    return "turned off" if asked else "off"


def adaptive_line(state: AdaptiveState) -> str:
    """One line saying what a server's adaptive state means for the draft length it runs."""
    if state == "on":
        return (
            "SGLang's adaptive mode runs (/server_info: speculative_adaptive true): its config picks k per batch size"
        )
    if state == "turned off":
        return (
            "SGLang was started with --speculative-adaptive and turned it off (/server_info: speculative_adaptive "
            "false; its log says why): it runs --speculative-num-steps at every batch size"
        )
    return "SGLang runs one k at every batch size (/server_info: speculative_adaptive false)"


def adaptive_config(table: tuple[BatchSizeRange, ...]) -> dict[str, dict[str, list[int]]]:
    """The adaptive config that pins each row's k from its first batch size on (one candidate
    per range; a batch size is routed to the largest key at or below it, line 356)."""
    return {str(row.start): {"candidate_steps": [row.num_speculative_tokens]} for row in table}


def adaptive_config_text(table: tuple[BatchSizeRange, ...]) -> str:
    """The adaptive config as JSON, one range a line (short enough to read in a paste)."""
    rows = [f"  {json.dumps(start)}: {json.dumps(entry)}" for start, entry in adaptive_config(table).items()]
    return "{\n" + ",\n".join(rows) + "\n}\n"


def adaptive_config_file(spec: SpeculativeConfig | None) -> str | None:
    """The adaptive config a start with ``spec`` reads (None: ``spec`` has no per-batch-size table)."""
    table = spec.num_speculative_tokens_per_batch_size if spec is not None else None
    return adaptive_config_text(table) if table else None


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
        args += [ADAPTIVE_FLAGS[0], ADAPTIVE_FLAGS[1], adaptive_config_path or str(ADAPTIVE_CONFIG_PATH)]
    return args
