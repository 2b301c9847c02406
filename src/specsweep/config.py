"""Parsing what users write (flags and study files) into frozen records; errors name the fix.

A study file is TOML. ``docs/study-config.md`` documents every key; ``KNOWN_KEYS`` below is the
list a test checks that page against.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsweep.errors import ConfigError
from specsweep.templates import (
    PLACEHOLDERS,  # noqa: F401 (re-exported: callers and tests name it here)
    parse_command_template,
)

ENGINES = ("emulator", "vllm", "sglang", "llama.cpp")
MODES = ("emulator", "process", "commands", "attach")
SAMPLERS = ("model", "grid", "tpe", "random")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,80}$")

# Every key a study file may hold, by table: docs/study-config.md documents exactly these.
KNOWN_KEYS: dict[str, tuple[str, ...]] = {
    "study": (
        "name", "storage", "sampler", "seed", "trials", "wall_time_s", "max_consecutive_failures", "heartbeat_s",
    ),
    "server": (
        "engine", "mode", "start", "stop", "wait_free", "env", "host", "port", "ready_timeout_s", "ready_path",
        "stop_grace_s", "model", "api", "api_key_env",
    ),
    "server.emulator": ("profile", "time_scale", "seed", "extra_args"),
    "search": ("num_speculative_tokens", "draft_sample_method", "fixed", "open", "baseline", "no_speculation"),
    "workloads": (),  # name or path = weight
    "measure": ("concurrency", "requests", "warmup", "max_tokens", "temperature", "timeout_s"),
    "objective": ("concurrency", "max_ttft_p95_s", "max_errors"),
}  # fmt: skip


def parse_concurrency(text: str, *, flag: str = "--concurrency") -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16); each level a whole number >= 1, no repeats."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be whole numbers separated by commas, e.g. 1,4; got {text!r}.") from None
    return _check_levels(list(levels), flag)


def _check_levels(levels: list[Any], where: str) -> tuple[int, ...]:
    if not levels or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in levels):
        raise ConfigError(f"{where} needs whole-number levels >= 1, e.g. 1,4; got {levels!r}.")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"{where} lists a level twice: {levels!r}.")
    return tuple(levels)


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorServer:
    """The built-in emulator as the study's server."""

    profile: str = "dgx-spark-v4-flash"
    time_scale: float = 50.0
    seed: int = 0
    extra_args: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """How to start, reach and stop the server for each trial."""

    engine: str = "emulator"
    mode: str = "emulator"
    start: tuple[str, ...] | str | None = None  # argv template (no shell) or a shell command string
    stop: tuple[str, ...] | str | None = None
    wait_free: tuple[str, ...] | str | None = None  # polled after stop until it exits 0
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = 0  # 0: a free port per trial (process and emulator modes)
    ready_timeout_s: float = 900.0
    ready_path: str = "/health"
    stop_grace_s: float = 30.0
    model: str | None = None
    api: str = "chat"
    api_key_env: str | None = None
    emulator: EmulatorServer = field(default_factory=EmulatorServer)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """What the study may change in the spec config."""

    num_speculative_tokens: tuple[int, int] = (1, 8)  # inclusive range
    draft_sample_method: tuple[str, ...] = DRAFT_SAMPLE_METHODS
    fixed: dict[str, Any] = field(default_factory=dict)  # spec fields held at one value (method, model, ...)
    open: dict[str, tuple[Any, ...]] = field(default_factory=dict)  # other spec fields opened up: choices
    baseline: dict[str, Any] | None = None  # the configuration run today, tried first
    no_speculation: bool = True  # also try speculation off


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasureConfig:
    """How each trial is measured."""

    concurrency: tuple[int, ...] = (1, 4)
    requests: int = 32
    warmup: int | None = None
    max_tokens: int = 600
    temperature: float = 0.0
    timeout_s: float = 600.0


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """What "fastest" means: aggregate output tok/s at one concurrency, under constraints."""

    concurrency: int = 1
    max_ttft_p95_s: float | None = None
    max_errors: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """A whole study file."""

    name: str
    storage: str | None = None  # None: sqlite under studies/NAME/
    sampler: str = "model"
    seed: int = 0
    trials: int | None = None  # None: the whole grid
    wall_time_s: float | None = None
    max_consecutive_failures: int = 3
    heartbeat_s: int = 20  # on a shared database: seconds between a worker's heartbeats
    server: ServerConfig = field(default_factory=ServerConfig)
    search: SearchSpace = field(default_factory=SearchSpace)
    workloads: dict[str, float] = field(default_factory=lambda: {"prose": 1.0})
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    objective: Objective = field(default_factory=Objective)
    source: str = "<defaults>"


def load_study_config(path: str | Path) -> StudyConfig:
    """Read and validate a study TOML file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read study file {path}: {exc.strerror or exc}.") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"study file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}).") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"study file {path} is not valid TOML ({exc}).") from None
    return parse_study_config(data, source=str(path))


def parse_study_config(data: dict[str, Any], *, source: str = "<study>") -> StudyConfig:
    """Validate a parsed study file; every error names the key path and the fix."""
    _check_keys(data, source)
    study = data.get("study", {})
    name = _get(study, "study.name", str, source, default=None)
    if name is None or not NAME_PATTERN.match(name):
        raise ConfigError(f"{source}: study.name must be letters, digits, '.', '_' or '-' (got {name!r}).")
    sampler = _get(study, "study.sampler", str, source, default="model")
    if sampler not in SAMPLERS:
        raise ConfigError(f"{source}: study.sampler must be one of {', '.join(SAMPLERS)} (got {sampler!r}).")
    trials = _get(study, "study.trials", int, source, default=None)
    if trials is not None and trials < 1:
        raise ConfigError(f"{source}: study.trials must be >= 1.")
    wall = _get(study, "study.wall_time_s", float, source, default=None)
    failures = _get(study, "study.max_consecutive_failures", int, source, default=3)
    if failures < 1:
        raise ConfigError(f"{source}: study.max_consecutive_failures must be >= 1.")
    heartbeat = _get(study, "study.heartbeat_s", int, source, default=20)
    if heartbeat < 1:
        raise ConfigError(f"{source}: study.heartbeat_s must be a whole number of seconds >= 1.")

    config = StudyConfig(
        name=name,
        storage=_get(study, "study.storage", str, source, default=None),
        sampler=sampler,
        seed=_get(study, "study.seed", int, source, default=0),
        trials=trials,
        wall_time_s=wall,
        max_consecutive_failures=failures,
        heartbeat_s=heartbeat,
        server=_parse_server(data.get("server", {}), source),
        search=_parse_search(data.get("search", {}), source),
        workloads=_parse_workloads(data.get("workloads", {"prose": 1.0}), source),
        measure=_parse_measure(data.get("measure", {}), source),
        objective=_parse_objective(data.get("objective", {}), source),
        source=source,
    )
    if config.objective.concurrency not in config.measure.concurrency:
        raise ConfigError(
            f"{source}: objective.concurrency ({config.objective.concurrency}) must be one of "
            f"measure.concurrency {list(config.measure.concurrency)}."
        )
    return config


def _check_keys(data: dict[str, Any], source: str) -> None:
    for table, value in data.items():
        if table not in KNOWN_KEYS:
            raise ConfigError(f"{source}: unknown table [{table}]; known: " + ", ".join(sorted(KNOWN_KEYS)) + ".")
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {table} must be a table ([{table}]).")
        if table == "workloads":
            continue
        for key, sub in value.items():
            path = f"{table}.{key}"
            if path in KNOWN_KEYS:
                if not isinstance(sub, dict):
                    raise ConfigError(f"{source}: {path} must be a table ([{path}]).")
                for inner in sub:
                    if inner not in KNOWN_KEYS[path]:
                        raise ConfigError(f"{source}: unknown key {path}.{inner}; see docs/study-config.md.")
            elif key not in KNOWN_KEYS[table]:
                raise ConfigError(
                    f"{source}: unknown key {path}; valid keys in [{table}]: " + ", ".join(KNOWN_KEYS[table]) + "."
                )


_TYPE_NAMES = {str: "a string", int: "a whole number", float: "a number", bool: "true or false"}


def _get(table: dict[str, Any], path: str, kind: type, source: str, *, default: Any) -> Any:
    key = path.rsplit(".", 1)[-1]
    if key not in table:
        return default
    value = table[key]
    ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok:
        raise ConfigError(f"{source}: {path} must be {_TYPE_NAMES[kind]} (got {value!r}).")
    return value


def _command(value: Any, path: str, source: str) -> tuple[str, ...] | str | None:
    return None if value is None else parse_command_template(value, where=f"{source}: {path}").text


def _parse_server(table: dict[str, Any], source: str) -> ServerConfig:
    engine = _get(table, "server.engine", str, source, default="emulator")
    if engine not in ENGINES:
        raise ConfigError(f"{source}: server.engine must be one of {', '.join(ENGINES)} (got {engine!r}).")
    mode = _get(table, "server.mode", str, source, default="emulator" if engine == "emulator" else "process")
    if mode not in MODES:
        raise ConfigError(f"{source}: server.mode must be one of {', '.join(MODES)} (got {mode!r}).")
    if (engine == "emulator") != (mode == "emulator"):
        raise ConfigError(f"{source}: server.mode 'emulator' goes with server.engine 'emulator' and only with it.")
    start = _command(table.get("start"), "server.start", source)
    stop = _command(table.get("stop"), "server.stop", source)
    if mode in ("process", "commands") and start is None:
        raise ConfigError(f"{source}: server.start is required in mode {mode!r} (the command that starts the server).")
    if mode == "commands" and stop is None:
        raise ConfigError(f"{source}: server.stop is required in mode 'commands' (the command that stops the server).")
    env = table.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f'{source}: server.env must be a table of strings, e.g. {{ VLLM_LOGGING_LEVEL = "INFO" }}.')
    port = _get(table, "server.port", int, source, default=0 if mode in ("emulator", "process") else 8000)
    if not 0 <= port <= 65535 or (port == 0 and mode in ("commands", "attach")):
        raise ConfigError(f"{source}: server.port must be 1..65535 (0, a free port, only in process mode).")
    api = _get(table, "server.api", str, source, default="chat")
    if api not in ("chat", "completions"):
        raise ConfigError(f"{source}: server.api must be 'chat' or 'completions'.")
    emulator_table = table.get("emulator", {})
    time_scale = _get(emulator_table, "server.emulator.time_scale", float, source, default=50.0)
    if time_scale <= 0:
        raise ConfigError(f"{source}: server.emulator.time_scale must be > 0.")
    extra = emulator_table.get("extra_args", [])
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise ConfigError(f"{source}: server.emulator.extra_args must be a list of strings.")
    ready_timeout = _get(table, "server.ready_timeout_s", float, source, default=900.0)
    stop_grace = _get(table, "server.stop_grace_s", float, source, default=30.0)
    return ServerConfig(
        engine=engine,
        mode=mode,
        start=start,
        stop=stop,
        wait_free=_command(table.get("wait_free"), "server.wait_free", source),
        env=dict(env),
        host=_get(table, "server.host", str, source, default="127.0.0.1"),
        port=port,
        ready_timeout_s=_positive(ready_timeout, "server.ready_timeout_s", source),
        ready_path=_get(table, "server.ready_path", str, source, default="/health"),
        stop_grace_s=_positive(stop_grace, "server.stop_grace_s", source),
        model=_get(table, "server.model", str, source, default=None),
        api=api,
        api_key_env=_get(table, "server.api_key_env", str, source, default=None),
        emulator=EmulatorServer(
            profile=_get(emulator_table, "server.emulator.profile", str, source, default="dgx-spark-v4-flash"),
            time_scale=time_scale,
            seed=_get(emulator_table, "server.emulator.seed", int, source, default=0),
            extra_args=tuple(extra),
        ),
    )


def _positive(value: float, path: str, source: str) -> float:
    if value <= 0:
        raise ConfigError(f"{source}: {path} must be > 0.")
    return value


def _parse_search(table: dict[str, Any], source: str) -> SearchSpace:
    k_range = table.get("num_speculative_tokens", [1, 8])
    if (
        not isinstance(k_range, list)
        or len(k_range) != 2
        or not all(isinstance(x, int) and not isinstance(x, bool) for x in k_range)
        or not 1 <= k_range[0] <= k_range[1] <= 64
    ):
        raise ConfigError(
            f"{source}: search.num_speculative_tokens must be an inclusive range [low, high] with "
            f"1 <= low <= high <= 64 (got {k_range!r})."
        )
    methods = table.get("draft_sample_method", list(DRAFT_SAMPLE_METHODS))
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not methods or any(m not in DRAFT_SAMPLE_METHODS for m in methods):
        raise ConfigError(f"{source}: search.draft_sample_method must list 'greedy' and/or 'probabilistic'.")
    fixed = table.get("fixed", {})
    opened = table.get("open", {})
    if not isinstance(fixed, dict) or not isinstance(opened, dict):
        raise ConfigError(f"{source}: search.fixed and search.open must be tables.")
    for key, choices in opened.items():
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{source}: search.open.{key} must be a non-empty list of values to try.")
    clash = {"num_speculative_tokens", "draft_sample_method"} & (set(fixed) | set(opened))
    if clash or set(fixed) & set(opened):
        raise ConfigError(
            f"{source}: search.fixed and search.open may not name {sorted(clash or set(fixed) & set(opened))[0]!r} "
            "(set the range or choices under [search] instead, and name a field in one table only)."
        )
    baseline = table.get("baseline")
    if baseline is not None and (
        not isinstance(baseline, dict)
        or isinstance(baseline.get("num_speculative_tokens"), bool)
        or not isinstance(baseline.get("num_speculative_tokens"), int)
        or baseline["num_speculative_tokens"] < 0
    ):
        raise ConfigError(
            f"{source}: search.baseline must be the spec config you run today, with num_speculative_tokens, "
            'e.g. { num_speculative_tokens = 5, draft_sample_method = "probabilistic" }.'
        )
    no_spec = table.get("no_speculation", True)
    if not isinstance(no_spec, bool):
        raise ConfigError(f"{source}: search.no_speculation must be true or false.")
    return SearchSpace(
        num_speculative_tokens=(k_range[0], k_range[1]),
        draft_sample_method=tuple(methods),
        fixed=dict(fixed),
        open={k: tuple(v) for k, v in opened.items()},
        baseline=dict(baseline) if baseline else None,
        no_speculation=no_spec,
    )


def _parse_workloads(table: Any, source: str) -> dict[str, float]:
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"{source}: [workloads] must map workload names or paths to weights, e.g. technical = 1.0.")
    out: dict[str, float] = {}
    for name, weight in table.items():
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ConfigError(f"{source}: workloads.{name} must be a positive weight (got {weight!r}).")
        out[name] = float(weight)
    return out


def _parse_measure(table: dict[str, Any], source: str) -> MeasureConfig:
    levels = table.get("concurrency", [1, 4])
    if not isinstance(levels, list):
        raise ConfigError(f"{source}: measure.concurrency must be a list, e.g. [1, 4].")
    requests = _get(table, "measure.requests", int, source, default=32)
    max_tokens = _get(table, "measure.max_tokens", int, source, default=600)
    temperature = _get(table, "measure.temperature", float, source, default=0.0)
    warmup = _get(table, "measure.warmup", int, source, default=None)
    if requests < 1 or max_tokens < 1 or not 0 <= temperature <= 2 or (warmup is not None and warmup < 0):
        raise ConfigError(
            f"{source}: [measure] needs requests >= 1, max_tokens >= 1, warmup >= 0 and temperature in 0..2."
        )
    return MeasureConfig(
        concurrency=_check_levels(levels, f"{source}: measure.concurrency"),
        requests=requests,
        warmup=warmup,
        max_tokens=max_tokens,
        temperature=temperature,
        timeout_s=_positive(
            _get(table, "measure.timeout_s", float, source, default=600.0), "measure.timeout_s", source
        ),
    )


def _parse_objective(table: dict[str, Any], source: str) -> Objective:
    concurrency = _get(table, "objective.concurrency", int, source, default=1)
    ttft = _get(table, "objective.max_ttft_p95_s", float, source, default=None)
    errors = _get(table, "objective.max_errors", int, source, default=0)
    if concurrency < 1 or (ttft is not None and ttft <= 0) or errors < 0:
        raise ConfigError(f"{source}: [objective] needs concurrency >= 1, max_ttft_p95_s > 0, max_errors >= 0.")
    return Objective(concurrency=concurrency, max_ttft_p95_s=ttft, max_errors=errors)
