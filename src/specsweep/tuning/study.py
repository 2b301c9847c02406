"""The study loop: ask optuna for a config, restart the server with it, measure, tell the result.

Optuna is the source of truth: every trial's parameters, objective, constraints and a compact
summary (``user_attrs``) live in its storage; the full per-trial measurement (every request,
boot facts, notes) is a JSON file beside it, named in the trial's ``record`` attribute.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import warnings
import zlib
from collections.abc import Callable, Collection, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from specsweep.config import StudyConfig
from specsweep.emulator.profile import load_profile
from specsweep.engines.registry import EngineInfo, engine_info
from specsweep.errors import ConfigError, LaunchError, SpecsweepError
from specsweep.runtime.client import api_key_from_env
from specsweep.runtime.identity import read_server_identity
from specsweep.runtime.lease import reclaim_leases
from specsweep.runtime.measure import Measurement, MeasureSettings, run_measure
from specsweep.runtime.store import measurement_to_dict, write_json_atomic
from specsweep.runtime.trial_server import TrialServer, read_help_flags
from specsweep.tuning.space import Space, build_space, check_space, check_spec_args, config_key
from specsweep.tuning.storage import (
    Heartbeat,
    default_worker,
    fail_stale_trials,
    has_heartbeats,
    is_shared,
    journal_path,
    open_storage,
    requeue_stale_trial,
    shown,
    storage_kind,
)
from specsweep.tuning.strategy import SearchDecision, decide_next
from specsweep.types import SpeculativeConfig
from specsweep.workload import Workload, load_workload

EventCallback = Callable[[str, dict[str, Any]], None]
optuna.logging.set_verbosity(optuna.logging.WARNING)


class StudyInterrupted(SpecsweepError):
    """The user stopped the study (Ctrl-C or SIGTERM); everything measured is kept."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyPaths:
    """Where a study keeps its files."""

    folder: Path
    storage: str

    @property
    def trials(self) -> Path:
        return self.folder / "trials"

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    @property
    def leases(self) -> Path:
        """Lease files of running servers (runtime/lease.py)."""
        return self.folder / "servers"


def study_paths(config: StudyConfig, studies_dir: Path, storage: str | None = None) -> StudyPaths:
    """The study folder, and the storage URL (SQLite in the folder unless one is given)."""
    folder = studies_dir / config.name
    url = storage or config.storage or f"sqlite:///{(folder / 'study.db').as_posix()}"
    return StudyPaths(folder=folder, storage=url)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyStates:
    """What the storage says about each configuration (key), for every worker of the study."""

    measured: dict[str, int]  # key -> trial that measured it
    failed: dict[str, int]  # key -> trial that failed it since this run began
    running: dict[str, list[tuple[int, str]]]  # key -> (trial, worker) of RUNNING trials, by trial number

    def settled(self) -> set[str]:
        return set(self.measured) | set(self.failed)


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyOutcome:
    """How a run of the study ended."""

    study: optuna.Study
    space: Space
    stop_reason: str
    new_trials: int
    restarts: int


def _sampler(config: StudyConfig, space: Space, worker: str | None = None) -> optuna.samplers.BaseSampler:
    # "grid" enqueues every distinct configuration once (see open_study) rather than using
    # optuna's GridSampler, which counts duplicates (speculation off with each draft method)
    # and calls Study.stop(), which ask/tell loops may not.
    # "model" enqueues each configuration the model-guided search chooses (StudyRunner.run);
    # the sampler below only serves trials nobody enqueued.
    # Workers of a shared study each seed by their name, or they would all draw the same configs.
    seed = config.seed if worker is None else zlib.crc32(f"{config.seed}:{worker}".encode())
    if config.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constraints_func=_constraints)
    return optuna.samplers.RandomSampler(seed=seed)


def _constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
    return list(trial.user_attrs.get("constraints", [0.0]))


def study_exists(name: str, storage: str | optuna.storages.BaseStorage) -> bool:
    """Whether ``storage`` already holds a study called ``name`` (a missing SQLite or journal file holds none)."""
    if isinstance(storage, str):
        if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
            return False
        if storage_kind(storage) == "journal" and not journal_path(storage).exists():
            return False
        storage = open_storage(storage, heartbeat_s=None)
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage)}


def open_study(
    config: StudyConfig,
    paths: StudyPaths,
    *,
    resume: bool,
    space: Space,
    storage: optuna.storages.BaseStorage | None = None,
    worker: str | None = None,
) -> optuna.Study:
    """Create the study, or load it with ``resume``; trials left RUNNING by a killed run are failed.

    On a shared storage (a database server or a journal file) several workers run the same
    study: each creates it if it is missing and joins it otherwise, no --resume needed. Only
    trials left RUNNING by this same worker are failed here; other workers' trials are left to
    their heartbeats.
    """
    if paths.storage.startswith("sqlite:///"):
        paths.folder.mkdir(parents=True, exist_ok=True)
    shared = is_shared(paths.storage)
    worker = worker or default_worker()
    storage = storage if storage is not None else open_storage(paths.storage, heartbeat_s=config.heartbeat_s)
    exists = study_exists(config.name, storage)
    if exists and not resume and not shared:
        raise ConfigError(
            f"study {config.name!r} already exists in {shown(paths.storage)}; add --resume to continue it, "
            "or choose another --study-name."
        )
    if resume and not exists:
        raise ConfigError(f"there is no study {config.name!r} in {shown(paths.storage)} to resume.")
    sampler = _sampler(config, space, worker if shared else None)
    created = not exists
    try:
        study = optuna.create_study(
            study_name=config.name, storage=storage, direction="maximize", sampler=sampler, load_if_exists=exists
        )
    except optuna.exceptions.DuplicatedStudyError:  # another worker created it a moment ago
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        created = False
    if shared and not created:
        _check_joinable(study, config, paths)
    fail_stale_trials(study)
    for stale in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if shared and (has_heartbeats(storage) or stale.user_attrs.get("worker") != worker):
            continue
        optuna.trial.Trial(study, stale._trial_id).set_user_attr(
            "fail_reason", "interrupted: the run that measured it died"
        )
        study.tell(stale.number, state=optuna.trial.TrialState.FAIL)
        if shared and "key" in stale.user_attrs:
            requeue_stale_trial(study, stale, "died and started again")
    if created:
        study.set_user_attr("config_source", config.source)
        study.set_user_attr("engine", config.server.engine)
        study.set_user_attr("temperature", config.measure.temperature)
        study.set_user_attr("objective_concurrency", config.objective.concurrency)
        study.set_user_attr("workloads", config.workloads)
        study.set_user_attr("concurrency", list(config.measure.concurrency))
        study.set_user_attr("num_speculative_tokens_range", list(config.search.num_speculative_tokens))
        if config.search.no_speculation:
            study.enqueue_trial(space.params_for(None))
        if config.search.baseline is not None:
            study.enqueue_trial(space.params_for(config.search.baseline))
            baseline = space.config_from_params(space.params_for(config.search.baseline))
            study.set_user_attr("baseline_key", config_key(baseline))
        if config.sampler == "grid":
            for params in space.distinct_params():
                study.enqueue_trial(params, skip_if_exists=True)
    return study


def _check_joinable(study: optuna.Study, config: StudyConfig, paths: StudyPaths) -> None:
    """A worker joining a shared study must measure the way the study does, or results would not compare."""
    attrs = study.user_attrs
    mine = {
        "workloads": config.workloads,
        "temperature": config.measure.temperature,
        "objective_concurrency": config.objective.concurrency,
    }
    for name, value in mine.items():
        if name in attrs and attrs[name] != value:
            raise ConfigError(
                f"study {config.name!r} in {shown(paths.storage)} has {name} {attrs[name]!r}, this config "
                f"{value!r}; give every worker the same [workloads], [measure] and [objective] "
                "(each its own [server]), or choose another --study-name."
            )


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the study the way Ctrl-C does: server stopped, trial failed, data kept."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class StudyRunner:
    """Runs trials until the budget, the grid or the patience runs out."""

    def __init__(
        self,
        config: StudyConfig,
        paths: StudyPaths,
        *,
        resume: bool = False,
        on_event: EventCallback | None = None,
        ask_user: Callable[[str], None] | None = None,
        worker: str | None = None,
    ) -> None:
        self.config = config
        self.paths = paths
        self.worker = worker or default_worker()
        self.emit = on_event or (lambda kind, data: None)
        self.engine: EngineInfo = engine_info(config.server.engine)
        self.space = build_space(
            config.search,
            temperature=config.measure.temperature,
            engine_has_draft_sample_method=self.engine.has_draft_sample_method,
            validate=self.engine.validate_spec,
            samples_drafts=self.engine.drafts_from_a_distribution,
        )
        check_space(self.space, config.source, config.search.baseline)
        # An engine whose flags differ by build (llama.cpp): every configuration is rendered for the
        # build at hand now, so a setting it cannot express stops the study before any server starts.
        self.help_flags = read_help_flags(config.server, self.engine)
        check_spec_args(self.space, self.engine, config.source, help_flags=self.help_flags)
        if config.server.mode == "emulator":
            load_profile(config.server.emulator.profile)  # a wrong profile fails here, not in every trial
        self.workloads: dict[str, Workload] = {name: load_workload(name) for name in config.workloads}
        self.api_key = api_key_from_env(config.server.api_key_env)
        self.storage = open_storage(paths.storage, heartbeat_s=config.heartbeat_s)
        self.study = open_study(
            config, paths, resume=resume, space=self.space, storage=self.storage, worker=self.worker
        )
        # While other workers measure the last configurations, look again this often.
        self.poll_s = min(5.0, config.heartbeat_s / 2)
        self.ask_user = ask_user
        # On the emulator, rates and times are reported in modelled (real-hardware) units.
        self.time_scale = config.server.emulator.time_scale if config.server.mode == "emulator" else 1.0

    def run(self, *, max_trials: int | None = None) -> StudyOutcome:
        config = self.config
        budget = max_trials if max_trials is not None else config.trials
        deadline = time.monotonic() + config.wall_time_s if config.wall_time_s else None
        # Configurations that fail in this run (in any worker) are not retried in it.
        before = frozenset(t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished())
        space_keys = set(self.space.distinct_keys())
        new_trials = restarts = failures = 0
        stop_reason = ""
        waiting = False
        if self.space.methods_collapsed and len(config.search.draft_sample_method) > 1:
            self.emit("note", {"text": self._collapse_note()})
        for note in reclaim_leases(self.paths.leases, grace_s=config.server.stop_grace_s):
            self.emit("note", {"text": note})
        with _sigterm_as_interrupt(), Heartbeat(self.storage) as heartbeat:
            while True:
                if budget is not None and new_trials >= budget:
                    stop_reason = f"trial budget reached ({budget})"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    stop_reason = f"wall-time budget reached ({config.wall_time_s:.0f} s)"
                    break
                fail_stale_trials(self.study)
                keys = self._key_states(before)
                measured, failed = keys.measured, keys.failed
                if not self._queued():
                    if space_keys <= keys.settled():
                        stop_reason = (
                            f"every configuration in the space was tried ({len(measured)} measured, "
                            f"{len(failed)} failed)"
                        )
                        break
                    if space_keys <= keys.settled() | set(keys.running):
                        elsewhere = sorted(n for claims in keys.running.values() for n, _ in claims)
                        if not has_heartbeats(self.storage):
                            # Without heartbeats a dead worker's trial would be waited for forever.
                            stop_reason = (
                                f"the rest of the space is being measured by other workers (trials {elsewhere})"
                            )
                            break
                        # Other workers measure what is left: wait for them (one may die, and its
                        # configuration come back to the queue).
                        if not waiting:
                            self.emit("waiting", {"trials": elsewhere})
                        waiting = True
                        time.sleep(self.poll_s)
                        continue
                if config.sampler == "model" and not self._queued():
                    decision = self._decide(exclude=failed)
                    if decision.params is None and decision.phase == "wait" and has_heartbeats(self.storage):
                        if not waiting:
                            self.emit("note", {"text": decision.reason})
                        waiting = True
                        time.sleep(self.poll_s)
                        continue
                    waiting = False
                    if decision.params is None:
                        stop_reason = decision.reason
                        break
                    self.study.enqueue_trial(decision.params)
                waiting = False
                trial = self._ask()
                heartbeat.follow(trial._trial_id)
                trial.set_user_attr("worker", self.worker)
                params = {name: trial.suggest_categorical(name, values) for name, values in self.space.grid().items()}
                new_trials += 1
                try:
                    spec = self.space.config_from_params(params)
                except ConfigError as exc:
                    self._fail(trial, f"invalid spec config: {exc}")
                    failures += 1
                    continue
                key = config_key(spec)
                trial.set_user_attr("key", key)
                trial.set_user_attr("spec", None if spec is None else spec.to_json())
                # Read again now that this trial claims the key in the storage: another worker
                # may have measured it, or be measuring it, since the look above.
                measured, failed, owner = self._claim(trial.number, key, before)
                if key in measured:
                    self._reuse(trial, measured[key])
                    continue
                if key in failed:
                    trial.set_user_attr("fail_reason", f"failed in trial {failed[key]}; not retried in this run")
                    self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    continue
                if owner is not None:
                    trial.set_user_attr("fail_reason", f"trial {owner[0]} (worker {owner[1]}) measures it")
                    self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
                    self.emit("elsewhere", {"trial": trial.number, "source": owner[0], "worker": owner[1]})
                    continue
                restarts += 1
                try:
                    value = self._run_trial(trial, spec)
                except KeyboardInterrupt:
                    self._fail(trial, "interrupted by the user")
                    raise StudyInterrupted(
                        f"study stopped by the user; {len(measured)} configuration(s) measured are kept in "
                        f"{shown(self.paths.storage)} (continue with --resume)."
                    ) from None
                if value is None:
                    failures += 1
                    if failures >= config.max_consecutive_failures:
                        stop_reason = (
                            f"{failures} trials in a row failed; the last: "
                            f"{self.study.trials[trial.number].user_attrs.get('fail_reason')}"
                        )
                        break
                    continue
                failures = 0
        return StudyOutcome(
            study=self.study, space=self.space, stop_reason=stop_reason, new_trials=new_trials, restarts=restarts
        )

    def _decide(self, *, exclude: Collection[str]) -> SearchDecision:
        """The model-guided search's next configuration (or why none), from every trial in storage."""
        decision = decide_next(
            self.study.get_trials(deepcopy=False),
            self.space,
            concurrency=self.config.objective.concurrency,
            workloads=self.config.workloads,
            exclude=exclude,
        )
        if decision.phase != "wait":  # a wait is said once, by the loop
            self.emit("plan", {"phase": decision.phase, "reason": decision.reason, "params": decision.params})
        return decision

    def _collapse_note(self) -> str:
        if not self.engine.has_draft_sample_method:
            return f"{self.engine.name} has no draft sampling choice: draft_sample_method is not searched."
        return (
            "temperature is 0: greedy and probabilistic drafting are identical there, so draft_sample_method "
            "is not searched (no restart is spent telling them apart)."
        )

    def _queued(self) -> bool:
        return any(t.state == optuna.trial.TrialState.WAITING for t in self.study.get_trials(deepcopy=False))

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            # optuna expects heartbeats with Study.optimize; this loop records them itself (Heartbeat).
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            return self.study.ask()

    def _key_states(self, before: frozenset[int], *, exclude: int | None = None) -> KeyStates:
        """Measured, failed (not among the trials finished ``before``) and running configurations."""
        measured: dict[str, int] = {}
        failed: dict[str, int] = {}
        running: dict[str, list[tuple[int, str]]] = {}
        states = optuna.trial.TrialState
        for trial in self.study.get_trials(deepcopy=False):
            attrs = trial.user_attrs
            key = attrs.get("key")
            if key is None or trial.number == exclude:
                continue
            if trial.state == states.COMPLETE and "reused_from" not in attrs:
                measured.setdefault(key, trial.number)
            elif trial.state == states.FAIL and trial.number not in before and "fail_reason" in attrs:
                # a trial failed for missed heartbeats has no reason: its configuration is queued again
                failed.setdefault(key, trial.number)
            elif trial.state == states.RUNNING:
                running.setdefault(key, []).append((trial.number, str(attrs.get("worker", "?"))))
        return KeyStates(measured=measured, failed=failed, running=running)

    def _claim(
        self, number: int, key: str, before: frozenset[int]
    ) -> tuple[dict[str, int], dict[str, int], tuple[int, str] | None]:
        """Measured and failed keys as the storage has them now, and which other trial owns ``key``.

        Every worker writes the key into its trial before it reads, so of two trials that claim
        the same key at once, at least one sees the other. The later trial (higher number) gives
        way to the earlier one; the earlier one waits briefly for a later one it sees to give
        way, and gives way itself if the later one goes on (it had not seen the earlier claim).
        Either way at most one of them measures.
        """
        give_up = time.monotonic() + 3.0
        while True:
            keys = self._key_states(before, exclude=number)
            claims = keys.running.get(key, [])
            earlier = [c for c in claims if c[0] < number]
            if earlier or not claims or key in keys.measured or key in keys.failed:
                return keys.measured, keys.failed, (earlier[0] if earlier else None)
            if time.monotonic() >= give_up:
                return keys.measured, keys.failed, claims[0]
            time.sleep(0.25)

    def _reuse(self, trial: optuna.Trial, source_number: int) -> None:
        source = self.study.trials[source_number]
        for name, value in source.user_attrs.items():
            if name not in ("key", "spec", "worker"):
                trial.set_user_attr(name, value)
        trial.set_user_attr("reused_from", source_number)
        self.study.tell(trial, source.value)
        self.emit("reused", {"trial": trial.number, "source": source_number})

    def _fail(self, trial: optuna.Trial, reason: str) -> None:
        trial.set_user_attr("fail_reason", reason)
        self.study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.emit("failed", {"trial": trial.number, "reason": reason})

    def _run_trial(self, trial: optuna.Trial, spec: SpeculativeConfig | None) -> float | None:
        config = self.config
        number = trial.number
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.paths.logs / f"trial-{number:04d}.log"
        server = TrialServer(
            config.server, self.engine, log_path=log_path, ask_user=self.ask_user,
            lease_path=self.paths.leases / f"{os.getpid()}.json", help_flags=self.help_flags,
        )  # fmt: skip
        self.emit("starting", {"trial": number, "spec": spec})
        record: dict[str, Any] = {
            "trial": number,
            "worker": self.worker,
            "spec": None if spec is None else spec.to_json(),
            "log": str(log_path),
        }
        try:
            try:
                started = server.start(spec, trial=number)
            except LaunchError as exc:
                self._fail(trial, f"server did not start: {exc}")
                return None
            record["startup_s"] = started.startup_s
            record["argv"] = list(started.argv)
            trial.set_user_attr("argv", list(started.argv))
            boot = {**asdict(started.boot), "binding_memory_suggestion": started.boot.binding_memory_suggestion}
            record["boot"] = boot
            trial.set_user_attr("startup_s", round(started.startup_s, 3))
            trial.set_user_attr("boot", boot)
            # What the server says it is (engine, version, model): a rig made from this study keeps it.
            trial.set_user_attr("server", asdict(read_server_identity(started.url, self.engine.name)))
            self.emit("ready", {"trial": number, "startup_s": started.startup_s, "boot": boot})
            measurements: dict[str, Measurement] = {}
            for name, workload in self.workloads.items():
                self.emit("measuring", {"trial": number, "workload": name})
                measurements[name] = run_measure(
                    self._measure_settings(started.url), workload, on_event=self._relay(number, name)
                )
                record.setdefault("workloads", {})[name] = measurement_to_dict(measurements[name])
                crashed = server.crashed()
                if crashed or measurements[name].error:
                    self._write_record(number, record)
                    self._fail(trial, crashed or f"measurement failed: {measurements[name].error}")
                    return None
        finally:
            with contextlib.suppress(SpecsweepError):
                server.stop()
        self._write_record(number, record)
        trial.set_user_attr("record", f"trials/trial-{number:04d}.json")
        summary = _summarize(measurements, self.time_scale)
        trial.set_user_attr("results", summary)
        objective, constraints, reason = self._objective(summary)
        trial.set_user_attr("constraints", constraints)
        if objective is None:
            self._fail(trial, reason or "no successful requests")
            return None
        self.study.tell(trial, objective)
        self.emit("done", {"trial": number, "value": objective, "spec": spec, "results": summary})
        return objective

    def _relay(self, number: int, workload: str) -> Callable[[str, dict[str, Any]], None]:
        def relay(kind: str, data: dict[str, Any]) -> None:
            self.emit(f"measure.{kind}", {**data, "trial": number, "workload": workload})

        return relay

    def _measure_settings(self, url: str) -> MeasureSettings:
        m = self.config.measure
        return MeasureSettings(
            endpoint=url,
            model=self.config.server.model,
            engine=self.engine.name if self.engine.name != "emulator" else "vllm",
            api=self.config.server.api,
            concurrency=m.concurrency,
            requests=m.requests,
            warmup=m.warmup,
            max_tokens=m.max_tokens,
            temperature=m.temperature,
            api_key=self.api_key,
            seed=self.config.seed,
            timeout_s=m.timeout_s,
        )

    def _objective(self, summary: dict[str, Any]) -> tuple[float | None, list[float], str | None]:
        """Weighted aggregate tok/s at the target concurrency; constraint values (<= 0 is feasible)."""
        objective = self.config.objective
        level = str(objective.concurrency)
        total = weight_sum = 0.0
        constraints: list[float] = []
        for name, weight in self.config.workloads.items():
            row = summary.get(name, {}).get(level)
            if row is None or row["output_tokens_per_s"] is None:
                return None, [1.0], f"no successful requests for workload {name} at concurrency {level}"
            total += weight * row["output_tokens_per_s"]
            weight_sum += weight
            constraints.append(float(row["errors"] - objective.max_errors))
            if objective.max_ttft_p95_s is not None:
                constraints.append(float((row["ttft_p95_s"] or 0.0) - objective.max_ttft_p95_s))
        return total / weight_sum, constraints, None

    def _write_record(self, number: int, record: dict[str, Any]) -> None:
        write_json_atomic(self.paths.trials / f"trial-{number:04d}.json", record)


def _summarize(measurements: dict[str, Measurement], time_scale: float = 1.0) -> dict[str, Any]:
    """The compact per-workload, per-concurrency figures kept in the trial's attributes.

    Rates are divided and times multiplied by ``time_scale`` (the emulator's), so they read in
    the modelled hardware's units.
    """

    def rate(value: float | None) -> float | None:
        return None if value is None else value / time_scale

    out: dict[str, Any] = {}
    for name, measurement in measurements.items():
        levels: dict[str, Any] = {}
        for level in measurement.levels:
            s = level.summary
            acceptance = s.acceptance
            decode = s.decode_tokens_per_s_per_stream
            per_pos_counts = level.delta.accepted_per_position if level.delta and acceptance else None
            levels[str(s.concurrency)] = {
                # at full concurrency when known: the ramp-down tail of a closed loop is not the server's
                "output_tokens_per_s": rate(s.saturated_output_tokens_per_s or s.output_tokens_per_s),
                "wall_clock_output_tokens_per_s": rate(s.output_tokens_per_s),
                "decode_tokens_per_s_p50": rate(decode.p50) if decode else None,
                "ttft_p95_s": s.ttft_s.p95 * time_scale if s.ttft_s else None,
                "errors": s.errors,
                "requests": s.requests,
                "server_generation_tokens_per_s": rate(s.server_generation_tokens_per_s),
                "per_position": list(acceptance.per_position) if acceptance else None,
                "accepted_per_position": list(per_pos_counts) if per_pos_counts else None,
                "num_drafts": acceptance.num_drafts if acceptance else None,
                "mean_acceptance_length": acceptance.mean_acceptance_length if acceptance else None,
                "notes": list(level.notes),
            }
        out[name] = levels
    return out
