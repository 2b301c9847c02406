"""llama.cpp ``llama-server``: metric names and what its streams carry.

Acceptance comes two ways: ``llamacpp:spec_decode_*`` counters on ``/metrics`` (with
``--metrics``; per position included on late-2026 builds), and ``timings.draft_n`` /
``timings.draft_n_accepted`` in the final streamed chunk of each request.
"""

from __future__ import annotations

from specsweep.errors import ConfigError
from specsweep.types import CounterNames, SpeculativeConfig

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


def render_spec_args(spec: SpeculativeConfig | None) -> list[str]:
    """llama-server's late-2026 flags for a spec config in vLLM's vocabulary.

    ``draft_model`` -> a draft model (``-md``, ``--spec-type draft-simple``, ``--spec-draft-n-max k``);
    ``ngram`` -> ``--spec-type ngram-simple`` with lookup size ``prompt_lookup_min`` (default 3) and
    draft length k. llama.cpp has no draft sampling choice: ``draft_sample_method`` is not used.
    """
    if spec is None or not spec.num_speculative_tokens:
        return []
    k = str(spec.num_speculative_tokens)
    if spec.method == "draft_model":
        if not spec.model:
            raise ConfigError("llama.cpp draft_model needs speculative_config.model: the draft GGUF path.")
        return ["-md", spec.model, "--spec-type", "draft-simple", "--spec-draft-n-max", k]
    if spec.method == "ngram":
        lookup = str(spec.prompt_lookup_min or 3)
        return ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", lookup, "--spec-ngram-simple-size-m", k]
    raise ConfigError(
        f"llama.cpp studies support method 'draft_model' or 'ngram', not {spec.method!r}; set it in search.fixed."
    )
