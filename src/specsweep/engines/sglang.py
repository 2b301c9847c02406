"""SGLang: metric names and the per-request acceptance fields.

With ``--enable-metrics`` SGLang publishes acceptance as gauges (``sglang:spec_accept_length``,
``sglang:spec_accept_rate``): gauges cannot be differenced, so they are read once after a
measured level. Per request, ``"return_spec_tokens_details": true`` asks for
``spec_verify_ct`` (verification steps) under ``sglext`` (field names not confirmed in code).
"""

from __future__ import annotations

from specsweep.types import CounterNames, SpeculativeConfig

METRIC_PREFIX = "sglang:"
COUNTERS = CounterNames(generation_tokens="sglang:generation_tokens_total", prompt_tokens="sglang:prompt_tokens_total")
ACCEPT_LENGTH_GAUGE = "sglang:spec_accept_length"
ACCEPT_RATE_GAUGE = "sglang:spec_accept_rate"
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
