"""Records that cross layers."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeVar

Event = TypeVar("Event")

# Progress reported while something runs: each layer defines its own event records and names their
# union (runtime.measure.MeasureEvent, tuning.events.StudyEvent); a callback receives them one at a
# time, as EventCallback[MeasureEvent] or EventCallback[StudyEvent].
EventCallback = Callable[[Event], None]

# What a measurement's times and rates are: the emulator's modelled hardware (runtime/modelled_time.py)
# or the server's own wall clock.
ClockName = Literal["modelled", "wall clock"]


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchSizeRange:
    """One row of vLLM's ``num_speculative_tokens_per_batch_size``: k for batch sizes start..end."""

    start: int
    end: int
    num_speculative_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class SpeculativeConfig:
    """A validated speculative-decoding configuration, in vLLM's vocabulary."""

    method: str | None = None
    model: str | None = None
    num_speculative_tokens: int | None = None
    draft_sample_method: str = "greedy"
    rejection_sample_method: str = "standard"
    synthetic_acceptance_rates: tuple[float, ...] | None = None
    synthetic_acceptance_length: float | None = None
    prompt_lookup_max: int | None = None
    prompt_lookup_min: int | None = None
    draft_tensor_parallel_size: int | None = None
    num_speculative_tokens_per_batch_size: tuple[BatchSizeRange, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def k_for_batch_size(self, batch_size: int) -> int:
        """The draft length used when ``batch_size`` sequences decode together (0 = no drafting).

        As vLLM expands a per-batch-size table (``v1/spec_decode/dynamic/utils.py`` lines 98 to
        146, 0.32 and 0.33): a batch size in a gap takes the row before it, one past the last row
        the last row's K, and no K exceeds ``num_speculative_tokens``."""
        if self.num_speculative_tokens is None:
            return 0
        k = self.num_speculative_tokens
        for row in sorted(self.num_speculative_tokens_per_batch_size or (), key=lambda r: r.start):
            if row.start > batch_size:
                break
            k = min(self.num_speculative_tokens, row.num_speculative_tokens)
        return k

    @classmethod
    def from_json(cls, text: str) -> SpeculativeConfig:
        """A spec config written by :meth:`to_json`, read back as it was written (it was validated
        against its engine when it was made); fields it does not name go to ``extra``."""
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise ValueError(f"a speculative config is a JSON object, got {text!r}")
        known = {f.name for f in fields(cls)} - {"extra", "num_speculative_tokens_per_batch_size"}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k in known}
        rows = raw.get("num_speculative_tokens_per_batch_size")
        table = None
        if rows:
            table = tuple(BatchSizeRange(start=a, end=b, num_speculative_tokens=k) for a, b, k in rows)
        extra = {k: v for k, v in raw.items() if k not in known and k != "num_speculative_tokens_per_batch_size"}
        return cls(**values, num_speculative_tokens_per_batch_size=table, extra=extra)

    def to_json(self) -> str:
        """The compact JSON that ``--speculative-config`` takes, keys in a stable order."""
        out: dict[str, Any] = {}
        for name in (f.name for f in fields(self)):
            if name in ("extra", "num_speculative_tokens_per_batch_size"):
                continue
            value = getattr(self, name)
            if value is None:
                continue
            if name == "draft_sample_method" and value == "greedy":
                continue
            if name == "rejection_sample_method" and value == "standard":
                continue
            out[name] = list(value) if isinstance(value, tuple) else value
        if self.num_speculative_tokens_per_batch_size:
            out["num_speculative_tokens_per_batch_size"] = [
                [r.start, r.end, r.num_speculative_tokens] for r in self.num_speculative_tokens_per_batch_size
            ]
        out.update(self.extra)
        return json.dumps(out, separators=(",", ":"))


OFF_KEY = "off"  # the key of speculation off


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Configuration:
    """One configuration of a study: the server a start runs, from the study file's search space
    to the paste. Equal keys are equal configurations (the same server), whatever parameters
    named them: both draft samplings of a drafter that samples nothing are one configuration."""

    spec: SpeculativeConfig | None  # None: speculation off
    # the optuna parameters it came from (tuning/space.py); empty when read back from a spec alone
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """Its canonical name, as a study stores it: ``off``, or the spec config's JSON."""
        return OFF_KEY if self.spec is None else self.spec.to_json()

    @classmethod
    def from_key(cls, key: str) -> Configuration:
        """The configuration a stored key names (:attr:`key` read back)."""
        return cls(spec=None if key == OFF_KEY else SpeculativeConfig.from_json(key))

    @property
    def num_speculative_tokens(self) -> int:
        """Its draft length (0: speculation off)."""
        return 0 if self.spec is None else int(self.spec.num_speculative_tokens or 0)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Configuration) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)


@dataclass(frozen=True, slots=True, kw_only=True)
class MetricsSnapshot:
    """One scrape of a Prometheus endpoint: sample name -> [(labels, value)], and when."""

    taken_at: float  # time.perf_counter() when the scrape finished
    samples: dict[str, tuple[tuple[dict[str, str], float], ...]]

    def values(self, name: str, **match: str) -> list[tuple[dict[str, str], float]]:
        """Samples of ``name`` whose labels include ``match``."""
        return [
            (labels, value)
            for labels, value in self.samples.get(name, ())
            if all(labels.get(key) == wanted for key, wanted in match.items())
        ]

    def total(self, name: str, **match: str) -> float | None:
        """Sum over every series of ``name`` (e.g. over vLLM engines); None if absent."""
        found = self.values(name, **match)
        return sum(value for _, value in found) if found else None


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """What one streamed request did, timed on the client (seconds from its start)."""

    prompt_id: str
    started_at: float  # time.perf_counter() when the request was sent
    max_tokens: int
    ttft_s: float | None = None  # first chunk with content
    last_token_s: float | None = None  # last chunk with content
    latency_s: float | None = None  # end of the stream
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    num_chunks: int = 0  # chunks that carried content
    chunk_tokens: tuple[int, ...] | None = None  # tokens per content chunk (continuous usage)
    chunk_times_s: tuple[float, ...] | None = None  # arrival of each content chunk, from the start
    finish_reason: str | None = None
    draft_n: int | None = None  # llama.cpp timings: drafted tokens
    draft_n_accepted: int | None = None  # llama.cpp timings: accepted drafted tokens
    spec_verify_ct: int | None = None  # SGLang: verification steps of this request
    response_id: str | None = None  # the server's id of the completion
    error: str | None = None
    # closed the stream on purpose mid-response: its level had measured enough (runtime/driver.py);
    # it has no usage, only the per-chunk counts of what arrived before
    cut: bool = False
    # sent twice: the first attempt's connection dropped before any byte of its response; the
    # server may have generated up to max_tokens for that attempt too
    retried: bool = False

    @property
    def ok(self) -> bool:
        return self.error is None and self.completion_tokens is not None and not self.cut

    @property
    def stopped_early(self) -> bool:
        """Finished before max_tokens (EOS or a stop string): flagged, it distorts rates."""
        return self.ok and (self.completion_tokens or 0) < self.max_tokens

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first, over the time from first to last token."""
        if not self.ok or self.ttft_s is None or self.last_token_s is None:
            return None
        span = self.last_token_s - self.ttft_s
        if span <= 0 or (self.completion_tokens or 0) < 2:
            return None
        return ((self.completion_tokens or 0) - 1) / span


@dataclass(frozen=True, slots=True, kw_only=True)
class CounterNames:
    """An engine's Prometheus sample names for the counters specsweep differences."""

    generation_tokens: str
    prompt_tokens: str
    num_drafts: str | None = None
    num_draft_tokens: str | None = None
    num_accepted_tokens: str | None = None
    accepted_per_position: str | None = None  # labelled by ``position`` ("0".."k-1")


@dataclass(frozen=True, slots=True, kw_only=True)
class BootFacts:
    """What a server's startup log said about the configuration it booted."""

    kv_cache_tokens: int | None = None
    max_concurrency: float | None = None
    memory_suggestions: tuple[float, ...] = ()  # per rank, in log order
    fp8_default_kernel_warning: bool = False
    graphs_captured: bool = False  # the log says the server captured CUDA graphs (vLLM on a GPU)

    @property
    def binding_memory_suggestion(self) -> float | None:
        """The KV pool is the minimum over ranks, so the largest suggestion binds."""
        return max(self.memory_suggestions) if self.memory_suggestions else None


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelFigures:
    """One workload at one concurrency level of a trial: the figures a study keeps and analyses.

    Rates and times are in the modelled hardware's units on the emulator (its time scale undone).
    """

    concurrency: int
    output_tokens_per_s: float | None  # while all streams were busy when known, else the whole level's
    whole_level_output_tokens_per_s: float | None  # over the whole level, its ramp-down included
    decode_tokens_per_s_p50: float | None
    ttft_p95_s: float | None
    errors: int
    requests: int
    server_generation_tokens_per_s: float | None = None
    per_position: tuple[float, ...] | None = None  # S_1..S_k from the counters
    accepted_per_position: tuple[float, ...] | None = None  # the counts behind them
    num_drafts: float | None = None
    mean_acceptance_length: float | None = None
    notes: tuple[str, ...] = ()
    # the level's relative standard error from its own requests' spread (of its step time, or of its
    # rate where smaller): the part of the run-to-run noise a start shows by itself (None: studies
    # from before it was kept)
    relative_se: float | None = None
    # time per output token and inter-token latency (docs/glossary.md), p50 and p99 over the level
    tpot_p50_s: float | None = None
    tpot_p99_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    # per workload subcategory: requests, tokens, steps (and llama.cpp's drafted, accepted), summed
    # (measurement/levels.acceptance_by_subcategory)
    by_subcategory: dict[str, dict[str, float]] | None = None
    # the share of decode steps that drafted, for a drafter that drafts only at some steps (a
    # lookup drafts where the text matches; measurement/levels.level_drafted_share); None: every step
    drafted_share: float | None = None
    # the mean prompt tokens of the level's answered requests, as the server counted them (usage);
    # a context level's (W@16k) is about its context (None: no usage, or studies from before it was kept)
    prompt_tokens_mean: float | None = None
    # each answered request: its prompt id, its rate (tokens over latency) and its decode step time
    # (None: its fields do not count its steps); what a level's error paired on the prompts it shares
    # with other levels is estimated from (measurement/paired.py; None: studies from before it was kept)
    by_request: tuple[tuple[str, float, float | None], ...] | None = None
    # the mean prefill speed of the level's answered requests: prompt tokens per second of time to
    # first token (None: studies from before it was kept). At one stream nothing queues before a
    # prefill, so it is how fast the start ran a step the configuration does not change
    # (analysis/step_model.py reads it as the start's luck)
    prefill_tokens_per_s: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredConfig:
    """One measured configuration of a study: one trial's start of it."""

    trial: int
    configuration: Configuration
    objective: float
    feasible: bool
    results: dict[str, dict[int, LevelFigures]]  # workload -> concurrency -> figures
    boot: BootFacts
    startup_s: float | None
    # its server's first token costs what speculation off's does: it prefills the target alone and
    # drafts nothing before it (speculation off, a drafter that looks its drafts up); None: not
    # known (studies from before it was kept)
    first_token_as_off: bool | None = None

    @property
    def key(self) -> str:
        return self.configuration.key

    @property
    def spec(self) -> SpeculativeConfig | None:
        return self.configuration.spec

    def level(self, workload: str, concurrency: int) -> LevelFigures | None:
        return self.results.get(workload, {}).get(concurrency)

    def rate(self, workload: str, concurrency: int) -> float | None:
        row = self.level(workload, concurrency)
        return None if row is None else row.output_tokens_per_s


@dataclass(frozen=True, slots=True)
class CapturedWidths:
    """The verified widths (tokens one step runs) a server captured graphs for, by draft length: a
    step of n verified tokens runs the smallest that holds n. The emulator says one set for every
    k; vLLM rounds its widths to multiples of 1 + k, so they follow from its command per k
    (engines/vllm_graphs.py). Empty: none, steps unpadded; ``unknown`` where the server captured
    graphs at widths no rule specsweep knows says (the step model then allows its physics more miss)."""

    every_k: tuple[int, ...] = ()  # at a draft length ``by_k`` does not name
    by_k: tuple[tuple[int, tuple[int, ...]], ...] = ()  # (k, widths), k = 0: speculation off
    unknown: bool = False  # graphs captured at widths not known: steps may be padded where the model says not

    def at(self, k: int) -> tuple[int, ...]:
        return next((widths for j, widths in self.by_k if j == k), self.every_k)

    def __bool__(self) -> bool:
        return bool(self.every_k) or any(widths for _, widths in self.by_k)

    def to_stored(self) -> list[int] | dict[str, list[int] | bool]:
        """A list when one set holds for every k (as studies stored before widths by k), else k -> list
        (and ``"unknown": true`` where graphs were captured at widths not known)."""
        if not self.by_k and not self.unknown:
            return list(self.every_k)
        out: dict[str, list[int] | bool] = {"*": list(self.every_k), **{str(k): list(w) for k, w in self.by_k}}
        return {**out, "unknown": True} if self.unknown else out

    @classmethod
    def from_stored(cls, value: object) -> CapturedWidths:
        """What ``to_stored`` wrote (anything else: none known)."""

        def widths(v: object) -> tuple[int, ...]:
            if not isinstance(v, list | tuple):
                return ()
            return tuple(sorted({int(w) for w in v if isinstance(w, int | float) and w >= 1}))

        if isinstance(value, dict):
            by_k = tuple(sorted((int(k), widths(v)) for k, v in value.items() if str(k).isdigit()))
            return cls(every_k=widths(value.get("*")), by_k=by_k, unknown=value.get("unknown") is True)
        return cls(every_k=widths(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class RunNoisePrior:
    """What server starts of an engine usually vary by (relative sd of a measured rate), and how
    many measured degrees of freedom that belief weighs as: the run-to-run noise a study assumes
    before its own starts show it."""

    relative_sd: float
    df: int
    source: str  # what the figure rests on, in words


# What server starts usually vary by before a study's own starts show theirs (every engine's, unless
# its vocabulary says otherwise): the one default the step model's start effect is drawn toward.
# An assumption, weighed as two measured degrees of freedom, so the study's repeats and
# greedy/probabilistic pairs take over as they come (analysis/noise.py). Its few degrees of freedom
# keep every rate heavy-tailed (Student's t) until the study's starts show their noise: with 4 or 8
# the search trusted the assumption and, on a rig whose steps are not a line in k, stopped on picks
# more than 2% off in 7 and 8 of 10 runs (bench/sweep_efficiency.py).
USUAL_RUN_NOISE = RunNoisePrior(relative_sd=0.02, df=2, source="assumed until the study's starts show theirs")

# What a real engine's configurations stray from the step model's physics by, before a study's
# own starts show it (tau in docs/math.md). The emulator's rigs miss the physics by under 1%
# (analysis/step_model.TAU_PRIOR); a real server has effects the physics does not carry (kernels
# chosen by shape, its scheduler, its allocator).
REAL_ENGINE_DEVIATION = RunNoisePrior(
    relative_sd=0.04, df=2,
    source="a real llama-server's configurations strayed from the physics by 4.3% (prose) and 5.4% "
    "(technical) over 93 starts of six studies (bench/kept_real_pastes.py); assumed for every real engine "
    "until its own are measured",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class NoisePriors:
    """What an engine's measurements usually stray by before a study's own show it: one server start
    from the next (``start``: sigma_start in docs/math.md), and one configuration's step time from the
    step model's physics (``deviation``: tau; None: the physics' miss on the emulator's own rigs,
    analysis/step_model.TAU_PRIOR). The step model draws both toward these, as far as the study's
    own starts do not outweigh them."""

    start: RunNoisePrior
    deviation: RunNoisePrior | None = None


REAL_ENGINE_NOISE = NoisePriors(USUAL_RUN_NOISE, REAL_ENGINE_DEVIATION)


@dataclass(frozen=True, slots=True, kw_only=True)
class StudySettings:
    """What a study was asked to do, as its storage keeps it."""

    workload_weights: dict[str, float]  # name -> weight in the objective
    concurrency_levels: tuple[int, ...]
    objective_concurrency: int
    k_range: tuple[int, int] | None  # search.num_speculative_tokens
    baseline: Configuration | None  # the configuration run today (None: the study names none)
    engine: str = "vllm"
    temperature: float | None = None
    max_tokens: int | None = None  # measure.max_tokens: every request's output length
    config_source: str | None = None
    max_num_seqs: int | None = None  # the server's, as it said or its --max-num-seqs (bounds a per-batch-size table)
    tolerance: float = 0.01  # differences between configurations under this share of a rate do not matter
    noise_prior: NoisePriors | None = None  # the engine's (engines/registry.py), not stored
    engine_version: str | None = None  # what the measured server said of itself (its vocabulary)
    engine_flags: frozenset[str] | None = None  # the flag names the server binary's --help listed (llama.cpp)
    server_args: tuple[str, ...] | None = None  # the latest measured server's flags, spec flags aside (None: not known)
    max_itl_p99_s: float | None = None  # a latency target the recommendation keeps to (analysis/latency.py)
    # the verified widths the server captured graphs for, per draft length (empty: not known; steps unpadded)
    captured_widths: CapturedWidths = field(default_factory=CapturedWidths)

    @property
    def workloads(self) -> tuple[str, ...]:
        return tuple(self.workload_weights)

    @property
    def k_max(self) -> int | None:
        return None if self.k_range is None else self.k_range[1]
