"""llama.cpp ``llama-server``: metric names and what its streams carry.

Acceptance comes two ways: ``llamacpp:spec_decode_*`` counters on ``/metrics`` (with
``--metrics``; per position included on late-2026 builds), and ``timings.draft_n`` /
``timings.draft_n_accepted`` in the final streamed chunk of each request.
"""

from __future__ import annotations

from specsweep.types import CounterNames

METRIC_PREFIX = "llamacpp:"
COUNTERS = CounterNames(
    generation_tokens="llamacpp:tokens_predicted_total",
    prompt_tokens="llamacpp:prompt_tokens_total",
    num_drafts="llamacpp:spec_decode_num_drafts_total",
    num_draft_tokens="llamacpp:spec_decode_num_draft_tokens_total",
    num_accepted_tokens="llamacpp:spec_decode_num_accepted_tokens_total",
    accepted_per_position="llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
)
# Its prompt cache persists across requests; specsweep's nonce keeps every prompt unique from
# its first token, and this makes sure no cached prefix is reused.
EXTRA_BODY = {"cache_prompt": False}
