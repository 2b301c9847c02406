"""vLLM: what a server does with a per-batch-size table, from its flags and version.

Read from vLLM 0.32.0's and 0.33.0's ``config/vllm.py`` (docs/engines.md gives the lines):

- with data parallelism above 1 every version drops the table, with a log warning only, and
  runs ``num_speculative_tokens`` at every batch size (``_maybe_disable_dynamic_sd_for_data_parallel``);
- 0.33 drops it on the V1 model runner for methods other than ngram, eagle, eagle3, mtp,
  draft_model and dflash (``_maybe_disable_dynamic_sd_for_v1``); suffix and custom_class always
  run on V1 (``_get_v2_model_runner_unsupported_features``), so their tables never run;
- on the V1 model runner a table turns full CUDA graphs into PIECEWISE ones
  (``_maybe_override_dynamic_sd_cudagraph_mode``): in 0.32 the methods that need V1 (suffix,
  custom_class, medusa, mlp_speculator) keep their table at that price.

A version not known reads as the newest one read (0.33), as the vocabulary does.
"""

from __future__ import annotations

from collections.abc import Sequence

from specsweep.engines.versions import version_numbers
from specsweep.engines.vllm_graphs import V1_ONLY_METHODS, GraphFlags, graph_mode, read_graph_flags
from specsweep.errors import ConfigError
from specsweep.types import SpeculativeConfig


def _release(version: str | None) -> str:
    return "0.32" if version and version_numbers(version)[:2] == (0, 32) else "0.33"


def _flags(server_args: Sequence[str] | None) -> GraphFlags | None:
    """The graph flags of a command line (None: not known, or not readable here)."""
    if not server_args:
        return None
    try:
        flags = read_graph_flags(server_args)
    except ConfigError:
        return None
    return None if flags.config_file else flags


def table_refusal(
    spec: SpeculativeConfig, server_args: Sequence[str] | None = None, version: str | None = None
) -> str | None:
    """Why a vLLM ``version`` server started with ``server_args`` (spec flags aside; None: not
    known) would drop ``spec``'s per-batch-size table and run one k (None: it runs the table)."""
    release = _release(version)
    if release == "0.33" and spec.method in V1_ONLY_METHODS["0.33"]:
        return f"vLLM 0.33 runs {spec.method} on its V1 model runner, which drops a per-batch-size table"
    flags = _flags(server_args)
    if flags is not None and flags.data_parallel_size > 1:
        return (
            f"vLLM drops a per-batch-size table under data parallelism above 1 "
            f"(--data-parallel-size {flags.data_parallel_size})"
        )
    return None


def paste_notes(
    spec: SpeculativeConfig, server_args: Sequence[str] | None = None, version: str | None = None
) -> tuple[str, ...]:
    """What a table does to the server's CUDA graphs, one line (empty: nothing to say): vLLM 0.32
    runs the methods that need V1 there, where a table turns full graphs into PIECEWISE ones."""
    if not spec.num_speculative_tokens_per_batch_size or _release(version) != "0.32":
        return ()
    if spec.method not in V1_ONLY_METHODS["0.32"] or table_refusal(spec, server_args, version) is not None:
        return ()
    flags = _flags(server_args) or GraphFlags()
    before = graph_mode(flags, model_runner="v1", table=False)
    if "FULL" not in before:
        return ()
    return (
        f"vLLM 0.32 runs {spec.method} on its V1 model runner, where this table turns {before} CUDA graphs "
        "into PIECEWISE ones (_maybe_override_dynamic_sd_cudagraph_mode): decode steps run piecewise graphs",
    )
