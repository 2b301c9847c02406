"""Emulator profiles: TOML files that describe a modelled rig (hardware, model, drafter).

A profile fixes everything the emulator's stochastic model needs; docs/emulator.md documents
each key. Bundled profiles live in ``specsweep/emulator/profiles``; any path works too.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from importlib import resources
from itertools import pairwise
from pathlib import Path
from typing import Any

from specsweep.emulator.context import ContextCost, parse_context
from specsweep.errors import ConfigError
from specsweep.toml_records import NOT_IN_FILE, RecordTable, record_keys

CONTENT_CLASSES = ("prose", "technical")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassAcceptance:
    """Acceptance for one content class at the reference temperature, probabilistic drafting."""

    per_position: tuple[float, ...]  # S_1..S_n; positions past n repeat the last conditional rate


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTiming:
    """Modelled seconds per engine step and per prefill.

    T(k, B) = (base_s + per_sequence_s*B + verify_token_s*W(B*(k+1))
               + draft_position_s*k*(1 + draft_batch_slope*(B-1)) + draft_fixed_s [k > 0]) * method factor
    prefill = prompt_tokens / prefill_tokens_per_s (added to the step that admits the request)

    W(n) is n, or, with ``captured_widths``, the smallest captured width that holds n (a step
    runs the graph captured for it, padded), so T is step-shaped in k; ``draft_fixed_s`` is a
    drafting step's fixed cost (a draft model's own launch and sampling), so drafting at k = 1
    costs more than a line from speculation off says. Both are rigs whose step time is not a line
    through the off point.
    """

    base_s: float
    per_sequence_s: float
    verify_token_s: float
    draft_position_s: float
    draft_batch_slope: float = 0.0
    probabilistic_factor: float = 1.0
    prefill_tokens_per_s: float = 3000.0
    request_overhead_s: float = 0.005
    jitter: float = 0.0  # relative standard deviation of each step's time
    # Run-to-run variation, as real servers on shared or throttling hardware show it:
    start_variation: float = 0.0  # relative sd of a factor on every step time, drawn once per start
    drift: float = 0.0  # relative amplitude of a slow sine drift of the step time
    drift_period_s: float = 900.0  # its period in modelled seconds (its phase is drawn per start)
    draft_fixed_s: float = 0.0  # a fixed cost of every step that drafts
    captured_widths: tuple[int, ...] = ()  # verified widths with a captured graph (empty: none, no padding)

    def verified_width(self, tokens: int) -> int:
        """The width a step of ``tokens`` verified tokens runs at: padded to a captured width."""
        return next((w for w in self.captured_widths if w >= tokens), tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Faults:
    """Failures the emulator can be told to produce (all off by default)."""

    boot_fail_above_k: int | None = None  # out of memory at boot when k exceeds this
    hang_at_boot: bool = False  # never becomes ready
    crash_after_requests: int | None = None  # the engine dies while serving request N+1
    drop_stream_every: int | None = None  # every Nth request's stream is cut mid-response
    malformed_sse_every: int | None = None  # every Nth streamed request carries a truncated JSON event
    omit_usage: bool = False  # streams never carry usage, whatever stream_options asks
    http_500_every: int | None = None  # every Nth request answers HTTP 500 (vLLM's error body)
    metrics_404: bool = False  # /metrics answers 404, as a server started without metrics
    metrics_without_spec: bool = False  # /metrics lacks the spec-decode counters even with speculation on
    startup_s: float | None = field(default=None, metadata=NOT_IN_FILE)  # set by `emulate --startup-s`: a slow start


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One modelled rig."""

    name: str
    description: str
    served_model_name: str
    version: str
    max_model_len: int
    max_num_seqs: int
    tensor_parallel_size: int
    methods: tuple[str, ...]  # drafting methods this rig has; the first is the default
    reference_temperature: float
    temperature_logit_slope: float
    greedy_logit_penalty: float
    classes: dict[str, ClassAcceptance]
    timing: StepTiming
    startup_s: float
    kv_tokens_at_zero_k: int
    kv_tokens_per_draft_token: int
    gpu_memory_utilization: float
    rank_memory_suggestions: tuple[float, ...]
    fp8_default_kernel_warning: bool
    output_median_tokens: int
    output_sigma: float
    faults: Faults = field(default_factory=Faults)
    context: ContextCost = field(default_factory=ContextCost)  # what a sequence's context costs (off without [context])

    def with_faults(self, **changes: Any) -> Profile:
        """A copy with some fault knobs changed (None leaves a knob as the profile set it)."""
        given = {key: value for key, value in changes.items() if value is not None and value is not False}
        return replace(self, faults=replace(self.faults, **given))

    def with_variation(self, *, start_variation: float | None, drift: float | None) -> Profile:
        """A copy with the run-to-run variation knobs changed (None leaves a knob as the profile set it)."""
        changes: dict[str, Any] = {
            k: v for k, v in (("start_variation", start_variation), ("drift", drift)) if v is not None
        }
        return replace(self, timing=replace(self.timing, **changes)) if changes else self

    @property
    def boot_s(self) -> float:
        """The modelled seconds this rig takes to start: a slow start it was told to make, else its own."""
        return self.faults.startup_s if self.faults.startup_s is not None else self.startup_s

    def kv_cache_tokens(self, k: int) -> int:
        """The KV pool in tokens when drafting k tokens (the drafter's buffers shrink it)."""
        return max(0, self.kv_tokens_at_zero_k - self.kv_tokens_per_draft_token * k)


def bundled_profile_names() -> list[str]:
    """Names of the profiles shipped with specsweep."""
    folder = resources.files("specsweep.emulator") / "profiles"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


DEFAULT_PROFILE = "dgx-spark-v4-flash"


def load_profile(name_or_path: str | Path = DEFAULT_PROFILE) -> Profile:
    """Load a bundled profile by name, or a profile TOML file by path."""
    text_name = str(name_or_path)
    if text_name in bundled_profile_names():
        resource = resources.files("specsweep.emulator") / "profiles" / f"{text_name}.toml"
        return parse_profile(resource.read_text(encoding="utf-8"), source=text_name)
    path = Path(name_or_path)
    if not path.is_file():
        raise ConfigError(
            f"profile {text_name!r} is neither a bundled profile ("
            + ", ".join(bundled_profile_names())
            + ") nor a readable TOML file."
        )
    return parse_profile(path.read_text(encoding="utf-8"), source=str(path))


def parse_profile(text: str, *, source: str = "<profile>") -> Profile:
    """Parse profile TOML text into a Profile; errors name the key to fix."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"profile {source}: not valid TOML ({exc}).") from None
    reader = _Reader(data, source)
    classes: dict[str, ClassAcceptance] = {}
    class_tables = reader.table("classes")
    for name in CONTENT_CLASSES:
        if name not in class_tables:
            raise ConfigError(
                f"profile {source}: [classes.{name}] is missing; every profile needs prose and technical."
            )
    for name, table in class_tables.items():
        sub = _Reader(table, source, f"classes.{name}.")
        rates = tuple(float(x) for x in sub.list_of_numbers("per_position"))
        if not rates:
            raise ConfigError(f"profile {source}: classes.{name}.per_position needs at least one rate.")
        if any(not 0.0 <= r <= 1.0 for r in rates) or any(b > a for a, b in pairwise(rates)):
            raise ConfigError(f"profile {source}: classes.{name}.per_position must be non-increasing rates in 0..1.")
        sub.done()
        classes[name] = ClassAcceptance(per_position=rates)

    timing = _read_record(reader.table("timing"), StepTiming, source, "timing", TIMING_MINIMUMS)
    if timing.base_s + timing.per_sequence_s + timing.verify_token_s <= 0:
        raise ConfigError(f"profile {source}: timing needs a positive step time (base_s > 0).")

    drafter = _Reader(reader.table("drafter"), source, "drafter.")
    methods = tuple(drafter.list_of_strings("methods"))
    if not methods:
        raise ConfigError(f"profile {source}: drafter.methods needs at least one method.")
    reference_temperature = drafter.number("reference_temperature", 0.0, minimum=0.0)
    temperature_logit_slope = drafter.number("temperature_logit_slope", 0.0, minimum=0.0)
    greedy_logit_penalty = drafter.number("greedy_logit_penalty", 0.0, minimum=0.0)
    drafter.done()

    startup = _Reader(reader.table("startup"), source, "startup.")
    startup_s = startup.number("seconds", 1.0, minimum=0.0)
    gpu_util = startup.number("gpu_memory_utilization", 0.9, minimum=0.0)
    suggestions = tuple(float(x) for x in startup.list_of_numbers("rank_memory_suggestions", []))
    fp8_warning = startup.boolean("fp8_default_kernel_warning", False)
    kv_zero = int(startup.number("kv_tokens_at_zero_k", minimum=1))
    kv_per_k = int(startup.number("kv_tokens_per_draft_token", 0, minimum=0))
    startup.done()

    output = _Reader(reader.table("output", {}), source, "output.")
    median_tokens = int(output.number("median_tokens", 1400, minimum=1))
    sigma = output.number("sigma", 0.35, minimum=0.0)
    output.done()

    faults = _read_record(reader.table("faults", {}), Faults, source, "faults", {})
    context = parse_context(reader.table("context", {}), source=source, methods=methods)
    profile = Profile(
        name=reader.string("name"),
        description=reader.string("description", ""),
        served_model_name=reader.string("served_model_name"),
        version=reader.string("version", "0.33.0"),
        max_model_len=int(reader.number("max_model_len", 8192, minimum=1)),
        max_num_seqs=int(reader.number("max_num_seqs", 256, minimum=1)),
        tensor_parallel_size=int(reader.number("tensor_parallel_size", 1, minimum=1)),
        methods=methods,
        reference_temperature=reference_temperature,
        temperature_logit_slope=temperature_logit_slope,
        greedy_logit_penalty=greedy_logit_penalty,
        classes=classes,
        timing=timing,
        startup_s=startup_s,
        kv_tokens_at_zero_k=kv_zero,
        kv_tokens_per_draft_token=kv_per_k,
        gpu_memory_utilization=gpu_util,
        rank_memory_suggestions=suggestions,
        fp8_default_kernel_warning=fp8_warning,
        output_median_tokens=median_tokens,
        output_sigma=sigma,
        faults=faults,
        context=context,
    )
    reader.done()
    if suggestions and len(suggestions) != profile.tensor_parallel_size:
        raise ConfigError(
            f"profile {source}: startup.rank_memory_suggestions needs one value per rank "
            f"(tensor_parallel_size = {profile.tensor_parallel_size})."
        )
    return profile


# The least value of each timing key; every other key's kind and default come from StepTiming.
TIMING_MINIMUMS = {
    "base_s": 0.0, "per_sequence_s": 0.0, "verify_token_s": 0.0, "draft_position_s": 0.0,
    "draft_batch_slope": 0.0, "probabilistic_factor": 0.5, "prefill_tokens_per_s": 1.0,
    "request_overhead_s": 0.0, "jitter": 0.0, "start_variation": 0.0, "drift": 0.0,
    "drift_period_s": 1.0, "draft_fixed_s": 0.0,
}  # fmt: skip


def _read_record(values: dict[str, Any], record: Any, source: str, path: str, minimums: dict[str, float]) -> Any:
    """The table ``path`` as ``record``: its keys are the record's fields, a missing key is the
    field's default, and a field's kind is its annotation's (``int | None``: a whole number or
    absent; ``tuple[int, ...]``: a list of whole numbers, sorted)."""
    table = RecordTable(values=values, path=path, record=record, source=f"profile {source}")
    known = record_keys(record, path)[path]
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ConfigError(f"profile {source}: {path}.{unknown[0]} is not a known key (see docs/emulator.md).")
    filled: dict[str, Any] = {}
    for spec in fields(record):
        if spec.name not in known:
            continue
        if spec.default is MISSING and spec.default_factory is MISSING and spec.name not in values:
            raise ConfigError(f"profile {source}: {path}.{spec.name} is required.")
        filled[spec.name] = _field_value(table, spec.name, str(spec.type), source)
        minimum = minimums.get(spec.name)
        if minimum is not None and filled[spec.name] < minimum:
            raise ConfigError(f"profile {source}: {path}.{spec.name} must be >= {minimum}.")
    return record(**filled)


def _field_value(table: RecordTable, key: str, annotation: str, source: str) -> Any:
    """One key of ``table`` read as its field's annotation says."""
    if annotation == "int | None":
        value = table.raw(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ConfigError(f"profile {source}: {table.path}.{key} must be a whole number >= 0.")
        return value
    if annotation == "tuple[int, ...]":
        value = table.raw(key)
        if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int) for x in value):
            raise ConfigError(f"profile {source}: {table.path}.{key} must be a list of whole numbers.")
        return tuple(sorted(value))
    return table.get(key, {"float": float, "bool": bool, "int": int, "str": str}[annotation])


_REQUIRED: Any = object()


class _Reader:
    """Typed access to one TOML table that remembers which keys were read."""

    def __init__(self, data: dict[str, Any], source: str, prefix: str = "") -> None:
        self._data = data
        self._source = source
        self._prefix = prefix
        self._seen: set[str] = set()

    def _fail(self, key: str, what: str) -> ConfigError:
        return ConfigError(f"profile {self._source}: {self._prefix}{key} {what}.")

    def _get(self, key: str, default: Any) -> Any:
        self._seen.add(key)
        if key in self._data:
            return self._data[key]
        if default is _REQUIRED:
            raise self._fail(key, "is required")
        return default

    def table(self, key: str, default: Any = _REQUIRED) -> dict[str, Any]:
        value = self._get(key, default)
        if not isinstance(value, dict):
            raise self._fail(key, "must be a table")
        return value

    def string(self, key: str, default: Any = _REQUIRED) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self._fail(key, "must be a string")
        return value

    def number(self, key: str, default: Any = _REQUIRED, *, minimum: float | None = None) -> float:
        value = self._get(key, default)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._fail(key, "must be a number")
        if minimum is not None and value < minimum:
            raise self._fail(key, f"must be >= {minimum}")
        return float(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self._get(key, default)
        if not isinstance(value, bool):
            raise self._fail(key, "must be true or false")
        return value

    def list_of_numbers(self, key: str, default: Any = _REQUIRED) -> list[float]:
        value = self._get(key, default)
        if not isinstance(value, list) or any(isinstance(x, bool) or not isinstance(x, int | float) for x in value):
            raise self._fail(key, "must be a list of numbers")
        return value

    def list_of_strings(self, key: str) -> list[str]:
        value = self._get(key, _REQUIRED)
        if not isinstance(value, list) or any(not isinstance(x, str) for x in value):
            raise self._fail(key, "must be a list of strings")
        return value

    def done(self) -> None:
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise self._fail(unknown[0], "is not a known key (see docs/emulator.md)")
