"""Parsing what users write (flags and study files) into frozen records; errors name the fix.

A study file is TOML. The records below (and the [server] table's, in ``specsweep.server_config``)
are the one home of every key and its default: the parser reads defaults off their fields
(``specsweep.toml_records``), and ``KNOWN_KEYS``, which ``docs/study-config.md`` is checked
against, is derived from them. Names that become paths are checked by ``specsweep.names``.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specsweep.errors import ConfigError
from specsweep.names import check_name
from specsweep.server_config import (  # noqa: F401 (re-exported: callers name them here)
    ENGINES,
    MODES,
    EmulatorServer,
    ServerConfig,
    check_positive,
    default_mode,
    default_port,
    parse_server,
)
from specsweep.templates import PLACEHOLDERS  # noqa: F401 (re-exported: callers and tests name it here)
from specsweep.toml_records import NAMES_TABLE, NOT_IN_FILE, RecordTable, record_default, record_keys

# Differences under this share of a rate do not matter: such leaders are "either is fine" and never
# separated by starts, and an hour of server starts is worth one tolerance of rate. What the one
# rule that picks (analysis/value.pick) is told when a study file or a command does not say.
TOLERANCE = 0.01

SAMPLERS = ("model", "grid", "tpe", "random")
DRAFT_SAMPLE_METHODS = ("greedy", "probabilistic")


def parse_concurrency(text: str, *, flag: str = "--concurrency") -> tuple[int, ...]:
    """'1,4,16' -> (1, 4, 16); each level a whole number >= 1, no repeats."""
    try:
        levels = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise ConfigError(f"{flag} must be whole numbers separated by commas, e.g. 1,4; got {text!r}.") from None
    return _check_levels(list(levels), flag)


def parse_context(text: str, *, flag: str = "--context") -> tuple[int, ...]:
    """'16384,65536' or '16k,64k' -> (16384, 65536): context levels in tokens (``k``: 1,024)."""
    try:
        levels = [
            int(part.strip()[:-1]) * 1024 if part.strip().lower().endswith("k") else int(part)
            for part in text.split(",")
            if part.strip()
        ]
    except ValueError:
        raise ConfigError(
            f"{flag} must be token counts separated by commas, e.g. 16384,65536 or 16k,64k; got {text!r}."
        ) from None
    return _check_levels(levels, flag)


def _check_levels(levels: list[Any], where: str) -> tuple[int, ...]:
    if not levels or any(isinstance(x, bool) or not isinstance(x, int) or x < 1 for x in levels):
        raise ConfigError(f"{where} needs whole-number levels >= 1, e.g. 1,4; got {levels!r}.")
    if len(set(levels)) != len(levels):
        raise ConfigError(f"{where} lists a level twice: {levels!r}.")
    return tuple(levels)


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
    requests: int | None = None  # a fixed budget per level; None: adaptive (measurement/stopping.py)
    max_requests: int = 32  # adaptive: the most one level measures
    precision: float = 0.03  # adaptive: stop at a 95% half-width of this fraction (step time or rate)
    warmup: int | None = None
    max_tokens: int = 600
    temperature: float = 0.0
    timeout_s: float = 600.0
    # Context levels in tokens: each workload W is also measured as W@16k (and so on), after the
    # plain levels of the same start (context_prompts.py). (): the workloads as they are.
    context: tuple[int, ...] = ()
    # The share of each workload's weight its context levels take in the objective, split evenly
    # between them; 0: they are measured and reported but weigh nothing in the search.
    context_weight: float = 0.0
    # Each level's own share of its workload's weight (one per level, summing to at most 1; the
    # plain workload keeps the rest); (): context_weight split evenly. Instead of context_weight.
    context_shares: tuple[float, ...] = ()
    # A file of the user's own prompts (any workload format) or a watch results.json (or its
    # folder): the levels and their shares come from its lengths (context_shares.py), resolved
    # by the study command. Instead of context and context_shares.
    context_from: str | None = None

    @property
    def most_requests(self) -> int:
        """The most requests one level sends: the fixed budget, or the adaptive one's cap."""
        return self.requests if self.requests is not None else self.max_requests


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """What "fastest" means: aggregate output tok/s at one concurrency, under constraints."""

    concurrency: int = 1
    max_ttft_p95_s: float | None = None
    max_itl_p99_s: float | None = None  # the recommendation keeps to configurations within it (analysis/latency.py)
    max_errors: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyConfig:
    """A whole study file: its [study] table, then one table per record below."""

    name: str
    storage: str | None = None  # None: sqlite under studies/NAME/
    sampler: str = "model"
    seed: int = 0
    trials: int | None = None  # None: the whole grid
    wall_time_s: float | None = None
    max_consecutive_failures: int = 3
    heartbeat_s: int = 20  # on a shared database: seconds between a worker's heartbeats
    tolerance: float = TOLERANCE
    server: ServerConfig = field(default_factory=ServerConfig)
    search: SearchSpace = field(default_factory=SearchSpace)
    workloads: dict[str, float] = field(default_factory=lambda: {"prose": 1.0}, metadata=NAMES_TABLE)
    measure: MeasureConfig = field(default_factory=MeasureConfig)
    objective: Objective = field(default_factory=Objective)
    source: str = field(default="<defaults>", metadata=NOT_IN_FILE)


# Every key a study file may hold, by table: docs/study-config.md documents exactly these.
KNOWN_KEYS: dict[str, tuple[str, ...]] = record_keys(StudyConfig, "study")


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

    def table(name: str, record: type) -> RecordTable:
        return RecordTable(values=data.get(name, {}), path=name, record=record, source=source)

    study = table("study", StudyConfig)
    name = check_name(study.get("name", str, default=None), what=f"{source}: study.name")
    sampler = study.choice("sampler", SAMPLERS)
    trials = study.get("trials", int)
    if trials is not None and trials < 1:
        raise ConfigError(f"{source}: study.trials must be >= 1.")
    wall = study.get("wall_time_s", float)
    if wall is not None and wall <= 0:
        raise ConfigError(f"{source}: study.wall_time_s must be > 0 seconds (leave it out for no time limit).")
    failures = study.get("max_consecutive_failures", int)
    if failures < 1:
        raise ConfigError(f"{source}: study.max_consecutive_failures must be >= 1.")
    heartbeat = study.get("heartbeat_s", int)
    if heartbeat < 1:
        raise ConfigError(f"{source}: study.heartbeat_s must be a whole number of seconds >= 1.")
    tolerance = study.get("tolerance", float)
    if not 0 < tolerance < 0.5:
        raise ConfigError(f"{source}: study.tolerance is a share of a rate, above 0 and below 0.5 (0.01 is 1%).")

    config = StudyConfig(
        name=name,
        storage=study.get("storage", str),
        sampler=sampler,
        seed=study.get("seed", int),
        trials=trials,
        wall_time_s=wall,
        max_consecutive_failures=failures,
        heartbeat_s=heartbeat,
        tolerance=tolerance,
        server=parse_server(table("server", ServerConfig)),
        search=_parse_search(table("search", SearchSpace)),
        workloads=_parse_workloads(data.get("workloads", record_default(StudyConfig, "workloads")), source),
        measure=_parse_measure(table("measure", MeasureConfig)),
        objective=_parse_objective(table("objective", Objective)),
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


def _parse_search(table: RecordTable) -> SearchSpace:
    source = table.source
    k_range = table.raw("num_speculative_tokens")
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
    methods = table.raw("draft_sample_method")
    if isinstance(methods, str):
        methods = [methods]
    if not isinstance(methods, list) or not methods or any(m not in DRAFT_SAMPLE_METHODS for m in methods):
        raise ConfigError(f"{source}: search.draft_sample_method must list 'greedy' and/or 'probabilistic'.")
    fixed = table.raw("fixed")
    opened = table.raw("open")
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
    baseline = table.raw("baseline")
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
    no_spec = table.raw("no_speculation")
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
        if isinstance(weight, bool) or not isinstance(weight, int | float) or not 0 < weight < float("inf"):
            raise ConfigError(f"{source}: workloads.{name} must be a positive weight (got {weight!r}).")
        out[name] = float(weight)
    return out


def _parse_measure(table: RecordTable) -> MeasureConfig:
    levels = table.raw("concurrency")
    if not isinstance(levels, list):
        raise ConfigError(f"{table.source}: measure.concurrency must be a list, e.g. [1, 4].")
    kinds = {"requests": int, "max_requests": int, "precision": float, "max_tokens": int, "temperature": float}
    v = {key: table.get(key, kind) for key, kind in (kinds | {"warmup": int}).items()}
    wrong = [v["requests"] is not None and v["requests"] < 1, v["max_requests"] < 1, not 0 < v["precision"] < 1]
    wrong += [v["max_tokens"] < 1, not 0 <= v["temperature"] <= 2, v["warmup"] is not None and v["warmup"] < 0]
    if any(wrong):
        raise ConfigError(
            f"{table.source}: [measure] needs requests >= 1 (or none: adaptive), max_requests >= 1, precision "
            "between 0 and 1, max_tokens >= 1, warmup >= 0 and temperature in 0..2."
        )
    context = table.raw("context")
    if not isinstance(context, list):
        raise ConfigError(f"{table.source}: measure.context must be a list of token counts, e.g. [16384, 65536].")
    context_weight = table.get("context_weight", float)
    if not 0 <= context_weight <= 1:
        raise ConfigError(
            f"{table.source}: measure.context_weight is the share of a workload's weight its context levels "
            f"take, from 0 to 1 (got {context_weight!r})."
        )
    context_from = table.get("context_from", str)
    given = [key for key in ("context", "context_weight", "context_shares") if key in table.values]
    if context_from is not None and given:
        raise ConfigError(
            f"{table.source}: measure.context_from gives the context levels and their shares; leave out "
            f"measure.{given[0]}, or measure.context_from."
        )
    if "context_weight" in table.values and "context_shares" in table.values:
        raise ConfigError(
            f"{table.source}: measure.context_weight and measure.context_shares both weigh the context levels; "
            "keep one (context_shares: one share per level)."
        )
    levels_at = _check_levels(context, f"{table.source}: measure.context") if context else ()
    shares = check_context_shares(table.raw("context_shares"), levels_at, f"{table.source}: measure.context_shares")
    return MeasureConfig(
        concurrency=_check_levels(levels, f"{table.source}: measure.concurrency"),
        timeout_s=check_positive(table.get("timeout_s", float), "measure.timeout_s", table.source),
        context=levels_at,
        context_weight=context_weight,
        context_shares=shares,
        context_from=context_from,
        **v,
    )


def check_context_shares(shares: Any, levels: tuple[int, ...], where: str) -> tuple[float, ...]:
    """Each context level's share of its workload's weight: one per level, none negative, summing
    to at most 1 (the plain workload keeps the rest); [] for none."""
    if not isinstance(shares, list | tuple) or any(
        isinstance(s, bool) or not isinstance(s, int | float) or not math.isfinite(s) for s in shares
    ):
        raise ConfigError(f"{where} must be a list of shares, one per context level, e.g. [0.3, 0.2].")
    if not shares:
        return ()
    if len(shares) != len(levels):
        raise ConfigError(f"{where} has {len(shares)} shares for {len(levels)} context levels; give one per level.")
    if any(s < 0 for s in shares) or sum(shares) > 1 + 1e-9:
        raise ConfigError(
            f"{where} must be shares of 0 or more summing to at most 1 (the plain workload keeps the rest); "
            f"got {list(shares)!r}."
        )
    return tuple(float(s) for s in shares)


def _parse_objective(table: RecordTable) -> Objective:
    concurrency = table.get("concurrency", int)
    ttft = table.get("max_ttft_p95_s", float)
    itl = table.get("max_itl_p99_s", float)
    errors = table.get("max_errors", int)
    if concurrency < 1 or (ttft is not None and ttft <= 0) or (itl is not None and itl <= 0) or errors < 0:
        raise ConfigError(
            f"{table.source}: [objective] needs concurrency >= 1, max_ttft_p95_s > 0, max_itl_p99_s > 0, "
            "max_errors >= 0."
        )
    return Objective(concurrency=concurrency, max_ttft_p95_s=ttft, max_itl_p99_s=itl, max_errors=errors)
