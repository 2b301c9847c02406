"""The study loop: choose a configuration, claim it, run its trial, until a stop condition holds.

The parts it composes: tuning/study_store.py opens or joins the study; tuning/strategy.py (the
"model" sampler) or optuna's sampler chooses; tuning/claims.py keeps two workers off one
configuration; tuning/trial.py runs one trial. A duplicate of a measured one reuses its figures.
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, replace
from functools import partial

import optuna

from specsweep.config import StudyConfig
from specsweep.engines.registry import EngineInfo, engine_info
from specsweep.errors import ConfigError
from specsweep.runtime.client import api_key_from_env
from specsweep.runtime.lease import reclaim_leases
from specsweep.runtime.measure import thin_levels
from specsweep.runtime.run_owner import this_run
from specsweep.runtime.stop_signals import check_interrupt, no_interrupt, sigterm_as_interrupt
from specsweep.runtime.trial_server import read_help_flags
from specsweep.tuning import records
from specsweep.tuning.budget import start_budget
from specsweep.tuning.claims import claim, key_states
from specsweep.tuning.events import (
    MeasuredElsewhere,
    Note,
    Planned,
    StartsLeft,
    StudyEvent,
    TrialFailed,
    TrialReused,
    Waiting,
)
from specsweep.tuning.interrupts import INTERRUPTED, stopped_by_user
from specsweep.tuning.records import TrialOutcome
from specsweep.tuning.search_words import Leaders
from specsweep.tuning.space import (
    Space,
    build_space,
    check_space,
    check_spec_args,
    check_start_command,
)
from specsweep.tuning.storage import (
    Heartbeat,
    default_worker,
    fail_stale_trials,
    has_heartbeats,
    open_storage,
)
from specsweep.tuning.strategy import Phase, SearchDecision, decide_next
from specsweep.tuning.study_settings import stored_captured_widths, with_server_facts, write_engine_flags
from specsweep.tuning.study_store import StudyPaths, hold_study, open_study, settings_of
from specsweep.tuning.study_time import StudyTime, study_time
from specsweep.tuning.trial import TrialRunner, level_targets
from specsweep.tuning.trial_files import trial_file
from specsweep.tuning.workloads import load_study_workloads
from specsweep.types import Configuration, EventCallback
from specsweep.workload import Workload, too_small

# Trials that measure a configuration chosen by hand: never stopped for being behind (a search's
# repeat is a contender too: the trial says so itself).
PLANNED = "planned"


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyOutcome:
    """How a run of the study ended."""

    study: optuna.Study
    space: Space
    stop_reason: str
    new_trials: int
    starts: int  # server starts this run
    ties: tuple[Leaders, ...] = ()  # leaders the search could not separate, and what would
    time: StudyTime | None = None  # where this run's time went


class StudyRunner:
    """Runs trials until the budget, the space, the search or the patience runs out."""

    def __init__(
        self,
        config: StudyConfig,
        paths: StudyPaths,
        *,
        resume: bool = False,
        on_event: EventCallback[StudyEvent] | None = None,
        ask_user: Callable[[str], None] | None = None,
        worker: str | None = None,
        queue_initial: bool = True,
    ) -> None:
        self.config = config
        self.paths = paths
        self.worker = worker or default_worker()
        self.emit: EventCallback[StudyEvent] = on_event or (lambda event: None)
        self.engine: EngineInfo = engine_info(config.server.engine)
        self.space = build_space(
            config.search,
            temperature=config.measure.temperature,
            engine_has_draft_sample_method=self.engine.has_draft_sample_method,
            validate=self.engine.validate_spec,
            samples_drafts=self.engine.drafts_from_a_distribution,
            never_drafts=self.engine.never_drafts,
            looks_up=self.engine.looks_up,
        )
        check_space(self.space, config.source, config.search.baseline)
        check_start_command(config.server.start, config.server.engine, config.source)
        # An engine whose flags differ by build (llama.cpp): every configuration is rendered for the
        # build at hand now, so a setting it cannot express stops the study before any server starts.
        help_flags = read_help_flags(config.server, self.engine)
        check_spec_args(self.space, self.engine, config.source, help_flags=help_flags, server=config.server)
        workloads: dict[str, Workload] = load_study_workloads(config)
        api_key = api_key_from_env(config.server.api_key_env)
        # One live run per study on local storage: a second one stops here, before it changes anything.
        lock = hold_study(config.name, paths, self.worker)
        if lock is not None:
            weakref.finalize(self, lock.release)
        self.storage = open_storage(paths.storage, heartbeat_s=config.heartbeat_s)
        self.study = open_study(
            config, paths, resume=resume, space=self.space, storage=self.storage, worker=self.worker,
            queue_initial=queue_initial,
        )  # fmt: skip
        self.trials = TrialRunner(
            config, paths, self.engine, workloads, api_key=api_key, worker=self.worker, emit=self.emit,
            ask_user=ask_user, help_flags=help_flags,
        )  # fmt: skip
        write_engine_flags(self.study, help_flags)
        # the server's max_num_seqs and captured widths as a server of this study said them, if one
        # did (else after the first start that does)
        self.settings = with_server_facts(settings_of(config, self.space), self.study)
        self.ties: tuple[Leaders, ...] = ()  # leaders the search could not separate (said at its stop)
        self._engine_version: str | None = None  # what the measured server said it is
        self._trial_wall_s = 0.0  # wall clock inside trials this run (the rest is idle)
        self._asked: set[int] = set()  # trials this runner asked for: an interrupt fails those still running
        # While other workers measure the last configurations, look again this often.
        self.poll_s = min(5.0, config.heartbeat_s / 2)

    def run(self, *, max_trials: int | None = None) -> StudyOutcome:
        """Run trials until a stop condition holds; the outcome says which."""
        config = self.config
        run_started = time.monotonic()
        self._trial_wall_s = 0.0
        budget = max_trials if max_trials is not None else config.trials
        deadline = time.monotonic() + config.wall_time_s if config.wall_time_s else None
        # Configurations that fail in this run (in any worker) are not retried in it.
        before = frozenset(t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished())
        space_keys = {c.key for c in self.space.configurations()}
        new_trials = starts = failures = 0
        stop_reason = ""
        waiting = False
        if self.space.methods_collapsed and len(config.search.draft_sample_method) > 1:
            self.emit(Note(text=self._collapse_note()))
        for line in self.space.notes():
            self.emit(Note(text=line))
        thin = config.measure.requests and thin_levels(config.measure.concurrency, config.measure.requests)
        if thin:
            self.emit(Note(text=thin))
        for workload in (w for name, w in self.trials.workloads.items() if name in config.workloads):
            for note in (too_small(workload, config.measure.most_requests), *workload.notes):  # not a context level's
                if note:
                    self.emit(Note(text=note))
        for note in reclaim_leases(self.paths.leases, grace_s=config.server.stop_grace_s):
            self.emit(Note(text=note))
        with (
            sigterm_as_interrupt(),
            Heartbeat(self.storage, interval_s=self.config.heartbeat_s) as heartbeat,
            stopped_by_user(self.study, self._asked, before, self.paths.storage),
        ):
            while True:
                check_interrupt()
                if budget is not None and new_trials >= budget:
                    stop_reason = f"trial budget reached ({budget})"
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    stop_reason = f"wall-time budget reached ({config.wall_time_s:.0f} s)"
                    break
                fail_stale_trials(self.study)
                keys = key_states(self.study, before)
                queued = self._queued()
                if not queued and config.sampler != "model":
                    if space_keys <= keys.settled():
                        stop_reason = (
                            f"every configuration in the space was tried ({len(keys.measured)} measured, "
                            f"{len(keys.failed)} failed)"
                        )
                        break
                    if space_keys <= keys.settled() | set(keys.running):
                        elsewhere = tuple(sorted(n for claims in keys.running.values() for n, _ in claims))
                        if not has_heartbeats(self.storage):
                            # Without heartbeats a dead worker's trial would be waited for forever.
                            stop_reason = (
                                f"the rest of the space is being measured by other workers (trials {list(elsewhere)})"
                            )
                            break
                        # Other workers measure what is left: wait for them (one may die, and its
                        # configuration come back to the queue).
                        if not waiting:
                            self.emit(Waiting(trials=elsewhere))
                        waiting = True
                        time.sleep(self.poll_s)
                        continue
                decision = None
                if config.sampler == "model" and not queued:
                    decision = self._decide(exclude=keys.failed)
                    if decision.configuration is None and decision.phase == Phase.WAIT and has_heartbeats(self.storage):
                        if not waiting:
                            self.emit(Note(text=decision.reason))
                        waiting = True
                        time.sleep(self.poll_s)
                        continue
                    if decision.configuration is None:
                        stop_reason = decision.reason
                        self.ties = decision.ties
                        break
                    self.study.enqueue_trial(
                        dict(decision.configuration.params),
                        user_attrs=records.decision_attrs(decision.phase, repeat=decision.repeat),
                    )
                waiting = False
                new_trials += 1
                self._say_starts_left(decision, len(space_keys))
                trial = self._ask()
                heartbeat.follow(trial._trial_id)
                outcome = self._run_kept(trial, before)
                if outcome is TrialOutcome.INVALID:
                    failures += 1
                elif outcome is TrialOutcome.FAILED:
                    starts += 1
                    failures += 1
                    if failures >= config.max_consecutive_failures:
                        last = records.read_trial(self.study.trials[trial.number]).fail_reason
                        stop_reason = f"{failures} trials in a row failed; the last: {last}"
                        break
                elif outcome is TrialOutcome.MEASURED:
                    starts += 1
                    failures = 0
        mine = [t for t in records.read_trials(self.study) if t.number not in before and t.worker == self.worker]
        spent = study_time(
            mine, config, grid_configurations=self.space.size(), run_wall_s=time.monotonic() - run_started,
            trial_wall_s=self._trial_wall_s,
        )  # fmt: skip
        return StudyOutcome(
            study=self.study, space=self.space, stop_reason=stop_reason, new_trials=new_trials, starts=starts,
            ties=self.ties, time=spent,
        )  # fmt: skip

    def measure(self, configuration: Configuration) -> TrialOutcome:
        """Measure one configuration of the space now, unless the study has it (SKIPPED: already
        measured, or failed in this run)."""
        before = frozenset(t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished())
        if configuration.key in key_states(self.study, before).measured:
            return TrialOutcome.SKIPPED
        self.study.enqueue_trial(dict(configuration.params), user_attrs=records.decision_attrs(PLANNED))
        with (
            sigterm_as_interrupt(),
            Heartbeat(self.storage, interval_s=self.config.heartbeat_s) as heartbeat,
            stopped_by_user(self.study, self._asked, before, self.paths.storage),
        ):
            trial = self._ask()
            heartbeat.follow(trial._trial_id)
            return self._run_kept(trial, before)

    def _run_kept(self, trial: optuna.Trial, before: frozenset[int]) -> TrialOutcome:
        """Run the trial; if something else ended it in the storage meanwhile (a script, a run of an
        older specsweep that took it for dead), say so in one line and go on: its measurement is
        in its trial file, written before the storage is told."""
        try:
            return self._run_next(trial, before)
        except optuna.exceptions.UpdateFinishedTrialError:
            stored = records.read_trial(self.study.trials[trial.number])
            why = f"{stored.state.name}: {stored.fail_reason}" if stored.fail_reason else stored.state.name
            kept = self.paths.folder / trial_file(trial.number)
            where = f"its measurement is kept in {kept}" if kept.is_file() else "it had measured nothing yet"
            self.emit(
                TrialFailed(trial=trial.number, reason=f"ended in the storage by another process ({why}); {where}")
            )
            return TrialOutcome.FAILED

    def _run_next(self, trial: optuna.Trial, before: frozenset[int]) -> TrialOutcome:
        """Claim the trial's configuration and run it."""
        records.record_claim(trial, worker=self.worker)
        repeat = records.is_repeat(trial)
        params = {name: trial.suggest_categorical(name, values) for name, values in self.space.grid().items()}
        try:
            configuration = self.space.configuration(params)
        except ConfigError as exc:
            self.trials.fail(self.study, trial, f"invalid spec config: {exc}")
            return TrialOutcome.INVALID
        key, spec = configuration.key, configuration.spec
        records.record_config(trial, configuration)
        # Read again now that this trial claims the key in the storage: another worker may have
        # measured it, or be measuring it, since the look above.
        seen = claim(self.study, trial.number, key, before)
        if key in seen.states.measured and not repeat:
            self._reuse(trial, seen.states.measured[key])
            return TrialOutcome.SKIPPED
        if key in seen.states.failed:
            self._prune(trial, f"failed in trial {seen.states.failed[key]}; not retried in this run")
            return TrialOutcome.SKIPPED
        if seen.owner is not None:
            self._prune(trial, f"trial {seen.owner[0]} (worker {seen.owner[1]}) measures it")
            self.emit(MeasuredElsewhere(trial=trial.number, source=seen.owner[0], worker=seen.owner[1]))
            return TrialOutcome.SKIPPED
        phase = records.trial_phase(trial)
        largest = spec is not None and spec.num_speculative_tokens == max(self.space.k_values)
        targets = level_targets(
            self.config, records.measured_configs(self.study), key=key, spec=spec,
            contender=repeat or phase == PLANNED,
            acceptance_run=phase in (Phase.LARGEST_K, Phase.SIBLING) or (phase is None and largest),
            looks_up=spec is not None and self.engine.looks_up(spec),
            captured_widths=stored_captured_widths(self.study),
        )  # fmt: skip
        trial_started = time.monotonic()
        try:
            value = self.trials.run(self.study, trial, configuration, targets)
        except KeyboardInterrupt:
            with no_interrupt():
                # a Ctrl-C while the finished trial's line is printed: it is told already, and kept
                if self.study.trials[trial.number].state == optuna.trial.TrialState.RUNNING:
                    self.trials.fail(self.study, trial, INTERRUPTED)
            raise
        finally:
            self._trial_wall_s += time.monotonic() - trial_started
        check_interrupt()  # a Ctrl-C the measurement swallowed stops the run now, its trial kept
        self._adopt_version(self.trials.engine_version)
        self.settings = with_server_facts(self.settings, self.study)
        return TrialOutcome.FAILED if value is None else TrialOutcome.MEASURED

    def _adopt_version(self, version: str | None) -> None:
        """Once a server has said its version, validate the rest of the study for it: say so if
        specsweep does not know that version's vocabulary, and stop (one line, measured trials
        kept) if a configuration of the space is one that version refuses."""
        if version is None or version == self._engine_version:
            return
        self._engine_version = version
        note = self.engine.vocabulary_note(version)
        if note is not None:
            self.emit(Note(text=note))
        self.space = replace(self.space, validate=partial(self.engine.validate_spec, version=version))
        check_space(self.space, f"{self.config.source} (for {self.engine.name} {version})", self.config.search.baseline)

    def _decide(self, *, exclude: Collection[str]) -> SearchDecision:
        """The model-guided search's next configuration (or why none), from every trial in storage."""
        decision = decide_next(records.read_trials(self.study), self.space, self.settings, exclude=exclude)
        if decision.phase != Phase.WAIT:  # a wait is said once, by the loop
            self.emit(Planned(phase=decision.phase, reason=decision.reason, configuration=decision.configuration))
        return decision

    def _say_starts_left(self, decision: SearchDecision | None, grid: int) -> None:
        """Before a start: which start it is, of at most how many, and the time that leaves."""
        left = decision.budget if decision is not None else start_budget(records.read_trials(self.study), grid)
        self.emit(
            StartsLeft(
                starts=left.starts, cap=left.cap, expected=left.expected, left_s=left.left_s,
                start_s=left.start_s, modelled=left.modelled,
            )
        )  # fmt: skip

    def _collapse_note(self) -> str:
        if not self.engine.has_draft_sample_method:
            return f"{self.engine.name} has no draft sampling choice: draft_sample_method is not searched."
        return (
            "temperature is 0: greedy and probabilistic drafting are identical there, so draft_sample_method "
            "is not searched (no start is spent telling them apart)."
        )

    def _queued(self) -> bool:
        return any(t.state == optuna.trial.TrialState.WAITING for t in self.study.get_trials(deepcopy=False))

    def _ask(self) -> optuna.Trial:
        with warnings.catch_warnings():
            # optuna expects heartbeats with Study.optimize; this loop records them itself (Heartbeat).
            warnings.filterwarnings("ignore", message="Heartbeat of storage")
            trial = self.study.ask()
        self._asked.add(trial.number)
        records.record_owner(trial, this_run())
        return trial

    def _reuse(self, trial: optuna.Trial, source_number: int) -> None:
        source = self.study.trials[source_number]
        records.record_reuse(trial, source)
        self.study.tell(trial, source.value)
        self.emit(TrialReused(trial=trial.number, source=source_number))

    def _prune(self, trial: optuna.Trial, reason: str) -> None:
        records.record_failure(trial, reason)
        self.study.tell(trial, state=optuna.trial.TrialState.PRUNED)
