"""The emulator's prefix cache: a prompt's leading blocks prefilled before cost no prefill again.

As vLLM's automatic prefix caching (on by default in its V1 engine): a prompt is cut into blocks
of ``BLOCK_TOKENS`` tokens (as ``workload.count_tokens`` counts them); each full block is known by
a hash of itself and every block before it, so a block is served from the cache only when the
whole prompt up to its end has been seen before. A request pays prefill for its tokens after its
longest cached run of leading blocks, and at least its last token (vLLM recomputes it to produce
the first output). The cache keeps the blocks of the prompts it has seen, the least recently
used dropped first beyond the rig's KV pool (the running sequences' own use of the pool is not
subtracted: the simplest bound that keeps it finite).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

BLOCK_TOKENS = 16  # vLLM's default block size on CUDA


class PrefixCache:
    """Blocks of prompt tokens already prefilled, least recently used first."""

    def __init__(self, capacity_tokens: int) -> None:
        self._capacity = max(0, capacity_tokens // BLOCK_TOKENS)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def admit(self, tokens: Sequence[str]) -> int:
        """The tokens of this prompt served from the cache (its leading cached blocks, at most all
        but its last token); its full blocks are cached from now on."""
        cached = 0
        chain = 0
        missed = False
        for start in range(0, len(tokens) - BLOCK_TOKENS + 1, BLOCK_TOKENS):
            chain = hash((chain, *tokens[start : start + BLOCK_TOKENS]))
            if not missed and chain in self._blocks:
                cached += BLOCK_TOKENS
                self._blocks.move_to_end(chain)
                continue
            missed = True
            self._blocks[chain] = None
            if len(self._blocks) > self._capacity:
                self._blocks.popitem(last=False)
        return min(cached, max(0, len(tokens) - 1))
