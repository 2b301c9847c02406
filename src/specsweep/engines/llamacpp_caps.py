"""Where llama-server runs a shorter draft than ``--spec-draft-n-max`` asks (llama.cpp b11434).

Two caps in ``common/speculative.cpp``:

- draft-dflash and draft-dspark cap n_max at the draft's trained block size and say so in the
  log (lines 1073 to 1082, "clamping"): :func:`boot_refusal` reads that line once a server is up.
- chained draft-mtp caps n_max at the number of MTP layers and says nothing (lines 1439 and 1481
  to 1486): the MTP context's model is the ``-md`` GGUF if given, else the target itself
  (lines 2619 to 2650), its layer count the GGUF key ``ARCH.nextn_predict_layers``
  (``src/llama-model.cpp`` line 1331, ``src/llama-arch.cpp`` line 227). The heads are chained
  when there are more than one and the draft does not share the target's memory (only
  ``gemma4-assistant`` does: ``src/llama-context.cpp`` lines 146 to 156). Before any start
  :func:`mtp_cap_refusal` reads the layer count from the model file's header; once a server is up,
  :func:`boot_refusal` reads it from the header dump llama.cpp's loader logs
  (``src/llama-model-loader.cpp`` line 816) for a model no file path named.

A study past either cap would measure one server under two keys, so it is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from specsweep.engines.llamacpp import BUILD, spec_type_of
from specsweep.types import SpeculativeConfig

MTP_LAYERS_KEY = "{arch}.nextn_predict_layers"
# Architectures whose MTP draft shares the target's memory and runs every head in one graph: no cap.
SHARED_MEMORY_ARCHS = ("gemma4-assistant",)
TARGET_FLAGS = ("-m", "--model")


def target_model(argv: Sequence[str] | None) -> str | None:
    """The target GGUF a llama-server command loads (``-m PATH``, ``--model PATH`` or ``--model=PATH``),
    if it names a file (not a placeholder)."""
    for index, arg in enumerate(argv or ()):
        name, eq, value = arg.partition("=")
        if name not in TARGET_FLAGS:
            continue
        if not eq:
            value = argv[index + 1] if argv is not None and index + 1 < len(argv) else ""
        return value if value and "{" not in value else None
    return None


def mtp_chain_cap(metadata: Mapping[str, Any]) -> int | None:
    """How many tokens chained draft-mtp drafts at most with a model of this header (None: no cap)."""
    arch = metadata.get("general.architecture")
    layers = metadata.get(MTP_LAYERS_KEY.format(arch=arch))
    if not isinstance(arch, str) or arch in SHARED_MEMORY_ARCHS or not isinstance(layers, int):
        return None
    return layers if layers > 1 else None


def _refusal(k: int, cap: int, model: str) -> str:
    return (
        f"llama.cpp build {BUILD} chains draft-mtp over the {cap} MTP layers of {model} and drafts at most "
        f"{cap} tokens, without a word: k = {k} would run as k = {cap} under another key; keep "
        f"search.num_speculative_tokens at or below {cap}."
    )


def mtp_cap_refusal(
    spec: SpeculativeConfig | None,
    start_argv: Sequence[str] | None,
    read_metadata: Callable[[str], Mapping[str, Any] | None],
) -> str | None:
    """Why llama-server would not run ``spec``'s draft length, from the header of the model its
    MTP heads come from (``read_metadata``: a GGUF path -> its scalar keys, None if unreadable);
    None where it would, or where the model cannot be read before a start."""
    k = spec.num_speculative_tokens if spec is not None else None
    if spec is None or not k or spec_type_of(spec.method, spec.extra.get("spec_type")) != "draft-mtp":
        return None
    model = spec.model or target_model(start_argv)
    metadata = read_metadata(model) if model else None
    cap = mtp_chain_cap(metadata) if metadata is not None else None
    return _refusal(k, cap, model or "the model") if cap is not None and k > cap else None


# common/speculative.cpp lines 1076 to 1081: dflash and dspark cap the draft at the trained block.
_CLAMPED = re.compile(
    r"requested draft size \(n_max=(\d+), n_min=\d+\) exceeds the trained block size (\d+) -- clamping to (\d+)"
)
_LOADED = "llama_model_loader: loaded meta data with"
_KV = re.compile(r"llama_model_loader: - kv +\d+: +(\S+) +\S+ += (.*)$", re.MULTILINE)


def boot_refusal(log: str, spec: SpeculativeConfig | None = None) -> str | None:
    """Why a started llama-server does not run the configuration asked (None: it does): a dflash or
    dspark draft capped ``--spec-draft-n-max`` at its block size, or chained draft-mtp at its MTP
    layers, so the trial would measure another k under this one's name."""
    match = _CLAMPED.search(log)
    if match is not None and int(match.group(1)) > int(match.group(3)):  # n_min alone capped: k still runs
        asked, block, runs = match.groups()
        return (
            f"llama-server runs --spec-draft-n-max {asked} as {runs}: the draft's trained block size is {block}; "
            f"keep search.num_speculative_tokens at or below {runs}."
        )
    # The MTP context runs on the -md model, loaded after the target; else on the target, loaded first.
    headers = log.split(_LOADED)[1:]
    if spec is None or not headers:
        return None
    header = headers[-1] if spec.model else headers[0]
    metadata: dict[str, Any] = {}
    for key, value in _KV.findall(header):
        metadata[key] = int(value) if value.strip().isdigit() else value.strip()
    return mtp_cap_refusal(spec, ("-m", "the target model"), lambda path: metadata)
