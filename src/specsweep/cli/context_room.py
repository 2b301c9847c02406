"""Whether a study's context levels fit the server, checked before anything starts.

A context level (``measure.context``) sends requests of about that many prompt tokens, each
asking for ``measure.max_tokens`` more. A level the server could not hold is refused in one
line: beyond its max model length where that is known (the emulator's profile, or the start
command's flag), or, where its KV pool is known (the emulator's profile at the search's largest
draft length, or vLLM's ``--num-gpu-blocks-override`` times its ``--block-size``), when the
highest concurrency's sequences at that context would not fit in the pool together.
"""

from __future__ import annotations

import shlex

from specsweep.config import ServerConfig, StudyConfig
from specsweep.emulator.profile import load_profile
from specsweep.engines import vllm
from specsweep.engines.registry import flag_number
from specsweep.errors import ConfigError


def known_kv_pool(server: ServerConfig, k_max: int) -> tuple[int, str] | None:
    """The server's KV pool in tokens where it is known before a start, and where it comes from."""
    if server.mode == "emulator":
        profile = load_profile(server.emulator.profile)
        return profile.kv_cache_tokens(k_max), f"profile {server.emulator.profile} at k={k_max}"
    if server.engine != "vllm" or server.start is None:
        return None
    argv = shlex.split(server.start) if isinstance(server.start, str) else list(server.start)
    blocks = flag_number(argv, (vllm.KV_BLOCKS_FLAG,))
    if blocks is None or blocks[0] < 1:
        return None
    size = flag_number(argv, (vllm.BLOCK_SIZE_FLAG,))
    block_size = size[0] if size else vllm.DEFAULT_BLOCK_SIZE
    return blocks[
        0
    ] * block_size, f"{blocks[0]:,} blocks of {block_size} tokens ({vllm.KV_BLOCKS_FLAG} in server.start)"


def refuse_context_levels(config: StudyConfig, max_model_len: tuple[int, str] | None, *, key: str) -> None:
    """Refuse, before any start, a context level whose requests the server could not hold (``key``:
    where the levels were set, ``measure.context`` or ``--context``)."""
    m = config.measure
    if not m.context:
        return
    where = key if key.startswith("--") else f"{config.source}: {key}"
    longest = max(m.context)
    if max_model_len is not None and longest + m.max_tokens > max_model_len[0]:
        raise ConfigError(
            f"{where}: context level {longest:,} and max_tokens {m.max_tokens:,} pass the server's max model "
            f"length ({max_model_len[0]:,}, {max_model_len[1]}): every request would be refused; lower the level."
        )
    pool = known_kv_pool(config.server, config.search.num_speculative_tokens[1])
    streams = max(m.concurrency)
    if config.server.mode == "emulator":  # streams beyond max_num_seqs wait, holding no KV
        streams = min(streams, load_profile(config.server.emulator.profile).max_num_seqs)
    if pool is not None and streams * (longest + m.max_tokens) > pool[0]:
        raise ConfigError(
            f"{where}: {streams} sequences at context level {longest:,} (with max_tokens {m.max_tokens:,}) need "
            f"{streams * (longest + m.max_tokens):,} KV tokens, more than the server's pool ({pool[0]:,}, {pool[1]}); "
            "lower the level or the concurrency."
        )
