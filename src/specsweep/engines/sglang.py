"""SGLang: metric names and the per-request acceptance fields.

With ``--enable-metrics`` SGLang publishes acceptance as gauges (``sglang:spec_accept_length``,
``sglang:spec_accept_rate``): gauges cannot be differenced, so they are read once after a
measured level. Per request, ``"return_spec_tokens_details": true`` asks for
``spec_verify_ct`` (verification steps) under ``sglext`` (field names not confirmed in code).
"""

from __future__ import annotations

from specsweep.types import CounterNames

METRIC_PREFIX = "sglang:"
COUNTERS = CounterNames(generation_tokens="sglang:generation_tokens_total", prompt_tokens="sglang:prompt_tokens_total")
ACCEPT_LENGTH_GAUGE = "sglang:spec_accept_length"
ACCEPT_RATE_GAUGE = "sglang:spec_accept_rate"
EXTRA_BODY = {"return_spec_tokens_details": True}
