"""SGLang: metric names and the per-request acceptance fields.

Checked line by line against SGLang 0.5.23's source (the wheel on PyPI; no real SGLang runs here:
its CPU backend needs sgl-kernel's CPU ops, which no registry package ships, docs/real-engines.md):

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
"""

from __future__ import annotations

from specsweep.types import CounterNames, SpeculativeConfig

METRIC_PREFIX = "sglang:"
COUNTERS = CounterNames(generation_tokens="sglang:generation_tokens_total", prompt_tokens="sglang:prompt_tokens_total")
ACCEPT_LENGTH_GAUGE = "sglang:spec_accept_length"
ACCEPT_RATE_GAUGE = "sglang:spec_accept_rate"
# Gauges of the running batch and the queue (metrics_collector.py, beside the acceptance gauges).
NUM_RUNNING_REQS = "sglang:num_running_reqs"
NUM_QUEUE_REQS = "sglang:num_queue_reqs"
EXTRA_BODY = {"return_spec_tokens_details": True}

# vLLM method names -> SGLang's --speculative-algorithm
ALGORITHMS = {"eagle": "EAGLE", "eagle3": "EAGLE3", "mtp": "NEXTN", "draft_model": "STANDALONE", "ngram": "NGRAM"}


def render_spec_args(spec: SpeculativeConfig | None) -> list[str]:
    """SGLang's flags: k draft steps, top-k 1 (a chain), k + 1 draft tokens verified."""
    if spec is None or not spec.num_speculative_tokens:
        return []
    k = spec.num_speculative_tokens
    args = [
        "--speculative-algorithm", ALGORITHMS.get(spec.method or "eagle", (spec.method or "EAGLE").upper()),
        "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(k + 1),
    ]  # fmt: skip
    if spec.model:
        args += ["--speculative-draft-model-path", spec.model]
    return args
