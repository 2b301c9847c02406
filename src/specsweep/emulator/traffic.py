"""Traffic schedules: which content mix and how many concurrent streams the emulator serves, and
when; and the truth of every window (the rate each configuration would get on it).

A schedule is a TOML file of windows in modelled seconds (docs/watch.md#the-emulators-traffic-and-the-truth):

    name = "day-night"
    max_tokens = 600           # every request asks for this many tokens
    repeat = true              # start over after the last window
    # temperature = 0.6        # default: the profile's reference temperature
    [prompt_tokens]            # per content class; default: the bundled workload's mean
    [[window]]
    name = "day"
    duration_s = 900
    streams = 4                # closed-loop streams: each sends its next request when one ends
    mix = { prose = 0.8, technical = 0.2 }   # shares of requests per content class

``specsweep emulate --traffic FILE`` drives its own engine with it (emulator/self_load.py): no
client, no HTTP. The truth of a window is the closed-loop rate of its streams
(model.closed_loop_tokens_per_s) with the acceptance of its mix: a mix's steps are its classes'
steps, so its S_i are the classes' S_i weighted by their share of steps, r_c / E_c(k) (requests
of class c take (M - 1) / E_c(k) decode steps each). With a per-batch-size table the shares are
taken at its largest k: an approximation where the table's k's differ.

Pure: records, parsing and arithmetic, no I/O but reading the file.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from specsweep.emulator.model import (
    acceptance_curve,
    closed_loop_tokens_per_s,
    mean_context_tokens,
    workload_prompt_tokens,
)
from specsweep.emulator.profile import Profile
from specsweep.errors import ConfigError
from specsweep.toml_records import NAMES_TABLE, RecordTable
from specsweep.types import SpeculativeConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficWindow:
    """A stretch of modelled time with one mix and one number of streams."""

    name: str = ""
    duration_s: float = 0.0  # modelled seconds
    streams: int = 1
    mix: dict[str, float] = field(default_factory=dict, metadata=NAMES_TABLE)  # class -> share of requests


@dataclass(frozen=True, slots=True, kw_only=True)
class TrafficSchedule:
    """Windows one after the other from the moment the emulator is ready."""

    name: str = ""
    description: str = ""
    max_tokens: int = 600
    temperature: float | None = None  # None: the profile's reference temperature
    repeat: bool = True
    prompt_tokens: dict[str, int] = field(default_factory=dict, metadata=NAMES_TABLE)
    window: tuple[TrafficWindow, ...] = ()

    @property
    def period_s(self) -> float:
        return sum(w.duration_s for w in self.window)

    def window_at(self, modelled_s: float) -> tuple[int, TrafficWindow] | None:
        """The window in force ``modelled_s`` after the start (None after the end without repeat)."""
        if modelled_s < 0 or not self.window:
            return None
        if self.repeat:
            modelled_s %= self.period_s
        elapsed = 0.0
        for index, window in enumerate(self.window):
            elapsed += window.duration_s
            if modelled_s < elapsed:
                return index, window
        return None

    def prompt_tokens_of(self, content_class: str) -> int:
        return self.prompt_tokens.get(content_class) or workload_prompt_tokens(content_class)


def bundled_schedule_names() -> list[str]:
    folder = resources.files("specsweep.emulator") / "schedules"
    return sorted(p.name.removesuffix(".toml") for p in folder.iterdir() if p.name.endswith(".toml"))


def load_schedule(name_or_path: str | Path) -> TrafficSchedule:
    """A bundled schedule by name, or a TOML file; ConfigError naming the key that is wrong."""
    path = Path(name_or_path)
    if str(name_or_path) in bundled_schedule_names():
        text = (resources.files("specsweep.emulator") / "schedules" / f"{name_or_path}.toml").read_text("utf-8")
        source = f"traffic schedule {name_or_path}"
    else:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            known = ", ".join(bundled_schedule_names())
            raise ConfigError(
                f"cannot read traffic schedule {path}: {exc.strerror or exc}; bundled ones: {known}."
            ) from None
        source = str(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{source} is not valid TOML: {exc}") from None
    return parse_schedule(data, source=source)


def parse_schedule(data: dict, *, source: str = "<traffic>") -> TrafficSchedule:
    """A schedule from parsed TOML (keys as in the module doc)."""
    allowed = {"name", "description", "max_tokens", "temperature", "repeat", "prompt_tokens", "window"}
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ConfigError(f"{source}: unknown key {unknown[0]!r}; a schedule has {', '.join(sorted(allowed))}.")
    table = RecordTable(values=data, path="traffic", record=TrafficSchedule, source=source)
    temperature = table.get("temperature", float, default=None)
    if temperature is not None and not 0.0 <= temperature <= 2.0:
        raise ConfigError(f"{source}: temperature must be in 0..2 (got {temperature}).")
    max_tokens = table.get("max_tokens", int)
    if max_tokens < 2:
        raise ConfigError(f"{source}: max_tokens must be at least 2 (got {max_tokens}).")
    prompts = data.get("prompt_tokens", {})
    if not isinstance(prompts, dict) or not all(isinstance(v, int) and v > 0 for v in prompts.values()):
        raise ConfigError(f"{source}: prompt_tokens maps content classes to whole numbers above 0.")
    raw_windows = data.get("window")
    if not isinstance(raw_windows, list) or not raw_windows:
        raise ConfigError(f"{source}: a schedule needs at least one [[window]].")
    windows = tuple(_window(raw, f"window[{i}]", source) for i, raw in enumerate(raw_windows))
    return TrafficSchedule(
        name=table.get("name", str),
        description=table.get("description", str),
        max_tokens=max_tokens,
        temperature=temperature,
        repeat=table.get("repeat", bool),
        prompt_tokens=dict(prompts),
        window=windows,
    )


def _window(raw: object, path: str, source: str) -> TrafficWindow:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: {path} must be a table.")
    unknown = sorted(set(raw) - {"name", "duration_s", "streams", "mix"})
    if unknown:
        raise ConfigError(f"{source}: {path}.{unknown[0]} is not a window key (name, duration_s, streams, mix).")
    table = RecordTable(values=raw, path=path, record=TrafficWindow, source=source)
    duration = table.get("duration_s", float)
    streams = table.get("streams", int)
    if duration <= 0 or streams < 0:
        raise ConfigError(f"{source}: {path} needs duration_s > 0 and streams >= 0.")
    mix = raw.get("mix", {})
    if not isinstance(mix, dict) or not all(isinstance(v, int | float) and v >= 0 for v in mix.values()):
        raise ConfigError(f"{source}: {path}.mix maps content classes to shares >= 0.")
    total = float(sum(mix.values()))
    if streams and total <= 0:
        raise ConfigError(f"{source}: {path}.mix must give at least one class a share above 0.")
    shares = {str(k): float(v) / total for k, v in mix.items() if v > 0} if total else {}
    return TrafficWindow(name=table.get("name", str) or path, duration_s=duration, streams=streams, mix=shares)


def check_schedule(schedule: TrafficSchedule, profile: Profile) -> None:
    """Refuse a schedule that names a content class the profile does not model."""
    for window in schedule.window:
        for name in window.mix:
            if name not in profile.classes:
                raise ConfigError(
                    f"traffic window {window.name!r} names content class {name!r}; profile {profile.name!r} "
                    "has: " + ", ".join(profile.classes) + "."
                )


# -- the truth ---------------------------------------------------------------------------------


def mix_per_position(
    profile: Profile,
    spec: SpeculativeConfig | None,
    temperature: float,
    mix: Mapping[str, float],
    *,
    by: str = "requests",
    context_tokens: float = 0.0,
) -> list[float]:
    """S_1..S_k of a mix of classes: each class's S_i weighted by its share of decode steps.

    ``mix`` gives shares of requests (``by="requests"``), or of steps already (``by="steps"``)."""
    if spec is None or not spec.num_speculative_tokens:
        return []
    curves = {name: acceptance_curve(profile, name, spec, temperature, context_tokens=context_tokens) for name in mix}
    per_request = {name: share / (1.0 + sum(curves[name])) for name, share in mix.items()}
    steps = dict(mix) if by == "steps" else per_request
    total = sum(steps.values())
    k = spec.num_speculative_tokens
    return [sum(steps[name] * curves[name][i] for name in mix) / total for i in range(k)]


def window_tokens_per_s(
    profile: Profile, schedule: TrafficSchedule, window: TrafficWindow, spec: SpeculativeConfig | None
) -> float:
    """The expected output tok/s of one window's closed loop under ``spec`` (0 with no streams)."""
    if not window.streams or not window.mix:
        return 0.0
    temperature = profile.reference_temperature if schedule.temperature is None else schedule.temperature
    prompt = round(sum(share * schedule.prompt_tokens_of(name) for name, share in window.mix.items()))
    context = mean_context_tokens(prompt, schedule.max_tokens)
    curve = mix_per_position(profile, spec, temperature, window.mix, context_tokens=context)
    return closed_loop_tokens_per_s(
        profile, spec, curve, window.streams, max_tokens=schedule.max_tokens, prompt_tokens=prompt
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Segment:
    """Part of a schedule window inside a span of modelled time."""

    window: TrafficWindow
    index: int
    duration_s: float


def segments_between(schedule: TrafficSchedule, start_s: float, end_s: float) -> list[Segment]:
    """The schedule's windows in [start_s, end_s) of modelled time since its start, with their overlap."""
    out: list[Segment] = []
    if not schedule.window or end_s <= start_s:
        return out
    period = schedule.period_s
    cycle = int(start_s // period) if schedule.repeat else 0
    while True:
        offset = cycle * period
        if offset >= end_s or (not schedule.repeat and cycle > 0):
            break
        elapsed = offset
        for index, window in enumerate(schedule.window):
            lo, hi = max(start_s, elapsed), min(end_s, elapsed + window.duration_s)
            if hi > lo:
                out.append(Segment(window=window, index=index, duration_s=hi - lo))
            elapsed += window.duration_s
        cycle += 1
    return out


def span_tokens_per_s(
    profile: Profile, schedule: TrafficSchedule, segments: Sequence[Segment], spec: SpeculativeConfig | None
) -> float:
    """The time-weighted mean rate of ``spec`` over segments (what a window of watch sees)."""
    total = sum(s.duration_s for s in segments)
    if total <= 0:
        return 0.0
    return sum(s.duration_s * window_tokens_per_s(profile, schedule, s.window, spec) for s in segments) / total


def best_draft_lengths(
    profile: Profile,
    schedule: TrafficSchedule,
    segments: Sequence[Segment],
    specs: Mapping[int, SpeculativeConfig | None],
) -> dict[int, dict[int, float]]:
    """Per number of streams in the segments: each k's time-weighted true rate (``specs``: k -> config,
    0 for speculation off). The best config for the span runs each stream count's best k (a
    per-batch-size table when they differ)."""
    out: dict[int, dict[int, float]] = {}
    for streams in sorted({s.window.streams for s in segments if s.window.streams}):
        mine = [s for s in segments if s.window.streams == streams]
        out[streams] = {k: span_tokens_per_s(profile, schedule, mine, spec) for k, spec in specs.items()}
    return out
