"""The engines specsweep knows, by name, and how to tell them apart from their metrics."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specsweep.engines import llamacpp, sglang, vllm
from specsweep.errors import ConfigError
from specsweep.types import BootFacts, CounterNames, SpeculativeConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineInfo:
    """What the measuring side needs to know about one engine."""

    name: str
    metric_prefix: str
    counters: CounterNames
    render_spec_args: Callable[[SpeculativeConfig | None], list[str]]
    parse_boot_facts: Callable[[str], BootFacts] = vllm.parse_boot_facts
    has_draft_sample_method: bool = True
    extra_body: dict[str, Any] = field(default_factory=dict)


ENGINES = {
    "vllm": EngineInfo(
        name="vllm", metric_prefix="vllm:", counters=vllm.COUNTERS, render_spec_args=vllm.render_spec_args
    ),
    # The emulator speaks vLLM.
    "emulator": EngineInfo(
        name="emulator", metric_prefix="vllm:", counters=vllm.COUNTERS, render_spec_args=vllm.render_spec_args
    ),
    "llama.cpp": EngineInfo(
        name="llama.cpp",
        metric_prefix=llamacpp.METRIC_PREFIX,
        counters=llamacpp.COUNTERS,
        render_spec_args=llamacpp.render_spec_args,
        has_draft_sample_method=False,
        extra_body=llamacpp.EXTRA_BODY,
    ),
    "sglang": EngineInfo(
        name="sglang",
        metric_prefix=sglang.METRIC_PREFIX,
        counters=sglang.COUNTERS,
        render_spec_args=sglang.render_spec_args,
        has_draft_sample_method=False,
        extra_body=sglang.EXTRA_BODY,
    ),
}


def engine_info(name: str) -> EngineInfo:
    """The engine called ``name``; ConfigError listing the known ones otherwise."""
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; choose one of: " + ", ".join(ENGINES) + ".") from None


def engine_from_metric_names(names: set[str]) -> EngineInfo | None:
    """The engine whose metric prefix appears among ``names``, if any."""
    for info in ENGINES.values():
        if info.name == "emulator":
            continue
        if any(name.startswith(info.metric_prefix) for name in names):
            return info
    return None
