"""What a sequence's context costs a modelled rig: a profile's ``[context]`` table.

A decode step reads each running sequence's KV cache, so its time grows with the tokens that
sequence attends over; a drafter that attends over the context too (a block drafter with its own
cache of the whole context, a sequential draft model) reads it again; a lookup drafter (n-gram)
finds more to propose in a longer context. ``ContextCost`` holds the figures; the step-time and
acceptance formulas that use them are in ``emulator/model.py`` (docs/emulator.md states them).
Every figure defaults to off, so a profile without the table behaves as it did before it existed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specsweep.errors import ConfigError

# Bytes per stored element of each KV cache dtype vLLM's --kv-cache-dtype names ("auto": the model's bf16/fp16).
KV_DTYPE_BYTES = {"auto": 2.0, "bfloat16": 2.0, "bf16": 2.0, "float16": 2.0, "fp16": 2.0, "float32": 4.0,
                  "fp32": 4.0, "fp8": 1.0, "fp8_e4m3": 1.0, "fp8_e5m2": 1.0, "fp4": 0.5}  # fmt: skip
_SHAPE_KEYS = ("layers", "kv_heads", "head_dim", "kv_dtype")


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextScan:
    """A drafter that reads the context each time it drafts, and how much of it."""

    bytes_per_token: float  # bytes read per token of a sequence's context, per pass over it
    per_position: bool = False  # a pass per draft position (sequential drafter), else one per step (block drafter)


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextCost:
    """A rig's context figures; all zero (no effect) unless its profile has a ``[context]`` table."""

    memory_bandwidth_gb_s: float = 0.0  # bytes per second each rank reads, in GB/s (1e9 bytes)
    kv_bytes_per_token: float = 0.0  # what one decode step reads per token of one sequence's context, all layers
    weight_bytes: float = 0.0  # what every step reads besides the KV cache (the floor's other bytes)
    scans: dict[str, ContextScan] = field(default_factory=dict)  # drafting method -> its read of the context
    lookup_logit_slope: float = 0.0  # a lookup drafter's logit gain per doubling of the context
    lookup_reference_tokens: int = 1024  # the context at which the profile's curves hold for a lookup drafter

    def read_s(self, num_bytes: float) -> float:
        """Seconds to read ``num_bytes`` at the rig's bandwidth (0 when it has none)."""
        return num_bytes / (self.memory_bandwidth_gb_s * 1e9) if self.memory_bandwidth_gb_s > 0 else 0.0

    def lookup_logit_shift(self, context_tokens: float) -> float:
        """What a lookup drafter adds to the logit of each conditional rate at this context:
        ``lookup_logit_slope * log2(context / lookup_reference_tokens)``, and nothing below the reference."""
        if not self.lookup_logit_slope or context_tokens <= self.lookup_reference_tokens:
            return 0.0
        return self.lookup_logit_slope * math.log2(context_tokens / self.lookup_reference_tokens)


def parse_context(table: dict[str, Any], *, source: str, methods: tuple[str, ...]) -> ContextCost:
    """The ``[context]`` table of a profile (``source`` names it in errors; ``methods`` are its drafter's)."""
    where = f"profile {source}: context."
    known = {"memory_bandwidth_gb_s", "kv_bytes_per_token", "weight_bytes", "scan", "lookup_logit_slope",
             "lookup_reference_tokens", "kv_tensors", *_SHAPE_KEYS}  # fmt: skip
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"{where}{unknown[0]} is not a known key (see docs/emulator.md).")
    numbers = {key: _number(table, key, where) for key in known - {"scan", "kv_dtype"} if key in table}
    kv_bytes = numbers.get("kv_bytes_per_token", 0.0)
    shape = [key for key in _SHAPE_KEYS if key in table]
    if shape and "kv_bytes_per_token" in table:
        raise ConfigError(f"{where}kv_bytes_per_token is given whole: drop {', '.join(shape)} (or it).")
    if shape:
        missing = [key for key in _SHAPE_KEYS if key not in table]
        if missing:
            raise ConfigError(f"{where}{missing[0]} is missing: layers, kv_heads, head_dim and kv_dtype go together.")
        dtype = table["kv_dtype"]
        if dtype not in KV_DTYPE_BYTES:
            raise ConfigError(f"{where}kv_dtype must be one of {', '.join(KV_DTYPE_BYTES)}; got {dtype!r}.")
        tensors = numbers.get("kv_tensors", 2.0)
        kv_bytes = tensors * numbers["layers"] * numbers["kv_heads"] * numbers["head_dim"] * KV_DTYPE_BYTES[dtype]
    elif "kv_tensors" in table:
        raise ConfigError(f"{where}kv_tensors goes with layers, kv_heads, head_dim and kv_dtype.")
    scans = _scans(table.get("scan", {}), where, methods)
    bandwidth = numbers.get("memory_bandwidth_gb_s", 0.0)
    if bandwidth <= 0 and (kv_bytes or numbers.get("weight_bytes") or scans):
        raise ConfigError(f"{where}memory_bandwidth_gb_s is required (> 0) to turn bytes into time.")
    reference = numbers.get("lookup_reference_tokens", 1024.0)
    if reference < 1 or reference != int(reference):
        raise ConfigError(f"{where}lookup_reference_tokens must be a whole number >= 1.")
    return ContextCost(
        memory_bandwidth_gb_s=bandwidth,
        kv_bytes_per_token=kv_bytes,
        weight_bytes=numbers.get("weight_bytes", 0.0),
        scans=scans,
        lookup_logit_slope=numbers.get("lookup_logit_slope", 0.0),
        lookup_reference_tokens=int(reference),
    )


def _number(table: dict[str, Any], key: str, where: str) -> float:
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where}{key} must be a number >= 0.")
    return float(value)


def _scans(table: Any, where: str, methods: tuple[str, ...]) -> dict[str, ContextScan]:
    if not isinstance(table, dict):
        raise ConfigError(f"{where}scan must be a table of drafting methods, e.g. [context.scan.dflash].")
    scans: dict[str, ContextScan] = {}
    for method, entry in table.items():
        path = f"{where}scan.{method}"
        if method not in methods:
            raise ConfigError(f"{path}: {method!r} is not one of drafter.methods ({', '.join(methods)}).")
        if (
            not isinstance(entry, dict)
            or "bytes_per_token" not in entry
            or set(entry) - {"bytes_per_token", "per_position"}
        ):
            raise ConfigError(f"{path} needs bytes_per_token (and optionally per_position), nothing else.")
        per_position = entry.get("per_position", False)
        if not isinstance(per_position, bool):
            raise ConfigError(f"{path}.per_position must be true or false.")
        scans[method] = ContextScan(bytes_per_token=_number(entry, "bytes_per_token", path + "."),
                                    per_position=per_position)  # fmt: skip
    return scans
