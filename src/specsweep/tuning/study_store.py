"""Opening a study: its folder and storage, creating it or joining it, and its sampler.

Optuna is the source of truth: every trial's parameters, objective, constraints and figures
live in its storage (through tuning/records.py); the full per-trial measurement is a JSON file
beside it. On a shared storage (a database server or a journal file) several workers run the
same study: each creates it if it is missing and joins it otherwise.
"""

from __future__ import annotations

import re
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import optuna

from specsweep.config import StudyConfig
from specsweep.engines.registry import engine_info
from specsweep.errors import ConfigError
from specsweep.names import check_name
from specsweep.runtime.run_owner import RunLock, RunOwner, hold_run_lock, owner_is_dead, this_run
from specsweep.runtime.store import make_folder
from specsweep.tuning import records, study_settings
from specsweep.tuning.space import Space
from specsweep.tuning.storage import (
    GRACE_HEARTBEATS,
    default_worker,
    fail_stale_trials,
    has_heartbeats,
    is_shared,
    journal_path,
    open_storage,
    redact_password,
    requeue_stale_trial,
    storage_kind,
)
from specsweep.tuning.workloads import study_workloads
from specsweep.types import StudySettings

optuna.logging.set_verbosity(optuna.logging.WARNING)


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyPaths:
    """Where a study keeps its files."""

    folder: Path
    storage: str

    @property
    def logs(self) -> Path:
        return self.folder / "logs"

    @property
    def leases(self) -> Path:
        """Lease files of running servers (runtime/lease.py)."""
        return self.folder / "servers"


def study_paths(config: StudyConfig, studies_dir: Path, storage: str | None = None) -> StudyPaths:
    """The study folder, and the storage URL (SQLite in the folder unless one is given); the folder is
    always one name inside ``studies_dir``."""
    folder = studies_dir / check_name(config.name, what="the study's name")
    url = storage or config.storage or f"sqlite:///{(folder / 'study.db').as_posix()}"
    return StudyPaths(folder=folder, storage=url)


def run_lock_path(paths: StudyPaths, worker: str) -> Path | None:
    """The lock file a run holds while it uses a study on local storage: the study folder's
    ``run.lock`` for SQLite; on a journal file, one per worker name (workers of other names join
    the study). None on a shared database, where every run joins as a worker."""
    kind = storage_kind(paths.storage)
    if kind == "rdb":
        return None
    if kind == "journal":
        return paths.folder / f"run-{re.sub(r'[^A-Za-z0-9._-]', '_', worker)}.lock"
    return paths.folder / "run.lock"


def hold_study(name: str, paths: StudyPaths, worker: str) -> RunLock | None:
    """Hold the study for this run (None: a shared database needs no lock), or refuse in one line,
    before anything is changed, if another live run holds it."""
    path = run_lock_path(paths, worker)
    if path is None:
        return None
    journal = storage_kind(paths.storage) == "journal"

    def refusal(holder: RunOwner | None) -> str:
        who = f"another specsweep run ({holder.describe()})" if holder else "another specsweep run"
        stop = f"stop it (kill {holder.pid} on {holder.host})" if holder else "stop it"
        if journal:
            return (
                f"worker {worker!r} of study {name!r} is in use by {who}: wait for it to finish, {stop}, "
                "or give this run another --worker name."
            )
        return f"study {name!r} is in use by {who}: wait for it to finish, {stop}, or choose another --study-name."

    return hold_run_lock(path, refusal)


def check_study_free(name: str, paths: StudyPaths, worker: str) -> None:
    """Refuse at once if another live run holds the study (the run takes the lock itself when it
    opens it). Creates nothing: without a lock file no run holds it."""
    path = run_lock_path(paths, worker)
    if path is None or not path.is_file():
        return
    lock = hold_study(name, paths, worker)
    if lock is not None:
        lock.release()


def study_exists(name: str, storage: str | optuna.storages.BaseStorage) -> bool:
    """Whether ``storage`` already holds a study called ``name`` (a missing SQLite or journal file holds none)."""
    if isinstance(storage, str):
        if storage.startswith("sqlite:///") and not Path(storage.removeprefix("sqlite:///")).exists():
            return False
        if storage_kind(storage) == "journal" and not journal_path(storage).exists():
            return False
        storage = open_storage(storage, heartbeat_s=None)
    return name in {s.study_name for s in optuna.get_all_study_summaries(storage)}


def check_resumable(name: str, paths: StudyPaths, studies_dir: Path) -> None:
    """Refuse ``--resume`` of a study the storage does not hold, before any file is created; the
    message names the studies that ``studies_dir`` does hold."""
    if study_exists(name, paths.storage):
        return
    held = sorted(p.parent.name for p in studies_dir.glob("*/study.db")) if studies_dir.is_dir() else []
    there = f" ({studies_dir} holds {', '.join(held)})" if held else ""
    raise ConfigError(
        f"there is no study {name!r} in {redact_password(paths.storage)} to resume{there}: drop --resume to start "
        "it, or pass --study-name of one that exists."
    )


def sampler_for(config: StudyConfig, worker: str | None = None) -> optuna.samplers.BaseSampler:
    """The optuna sampler behind the study's asks.

    "grid" enqueues every distinct configuration once (see open_study) rather than using optuna's
    GridSampler, which counts duplicates (speculation off with each draft method) and calls
    Study.stop(), which ask/tell loops may not. "model" enqueues each configuration the
    model-guided search chooses; the sampler only serves trials nobody enqueued. Workers of a
    shared study each seed by their name, or they would all draw the same configurations.
    """
    # optuna's samplers take seeds 0 to 2**32 - 1 (numpy's): any other whole number is folded into them
    seed = config.seed % 2**32 if worker is None else zlib.crc32(f"{config.seed}:{worker}".encode())
    if config.sampler == "tpe":
        return optuna.samplers.TPESampler(seed=seed, constraints_func=_constraints)
    return optuna.samplers.RandomSampler(seed=seed)


def _constraints(trial: optuna.trial.FrozenTrial) -> list[float]:
    return list(records.read_trial(trial).constraints) or [0.0]


def settings_of(config: StudyConfig, space: Space) -> StudySettings:
    """What the study records about itself when it is created. The server's max_num_seqs and
    captured widths are not known yet: the first server started says them, or its command's
    --max-num-seqs does (``TrialRunner`` adopts them, tuning/study_settings.py keeps them)."""
    baseline = None
    if config.search.baseline is not None:
        baseline = space.configuration(space.params_for(config.search.baseline))
    return StudySettings(
        workload_weights=study_workloads(config),
        concurrency_levels=tuple(config.measure.concurrency),
        objective_concurrency=config.objective.concurrency,
        k_range=config.search.num_speculative_tokens,
        baseline=baseline,
        engine=config.server.engine,
        temperature=config.measure.temperature,
        max_tokens=config.measure.max_tokens,
        config_source=config.source,
        tolerance=config.tolerance,
        noise_prior=engine_info(config.server.engine).noise,
        max_itl_p99_s=config.objective.max_itl_p99_s,
    )


def open_study(
    config: StudyConfig,
    paths: StudyPaths,
    *,
    resume: bool,
    space: Space,
    storage: optuna.storages.BaseStorage | None = None,
    worker: str | None = None,
    queue_initial: bool = True,
) -> optuna.Study:
    """Create the study, or load it with ``resume``; trials left RUNNING by a run that is provably
    gone are failed (``_fail_interrupted``), a live run's are left alone.

    The caller holds the study first (``hold_study``) on local storage. On a shared storage other
    workers' trials are left to their heartbeats. A new study queues speculation off, the
    baseline and (sampler "grid") every distinct configuration, unless ``queue_initial`` is off.
    """
    if paths.storage.startswith("sqlite:///"):
        make_folder(paths.folder)
    shared = is_shared(paths.storage)
    worker = worker or default_worker()
    storage = storage if storage is not None else open_storage(paths.storage, heartbeat_s=config.heartbeat_s)
    exists = study_exists(config.name, storage)
    where = redact_password(paths.storage)
    if exists and not resume and not shared:
        raise ConfigError(
            f"study {config.name!r} already exists in {where}; add --resume to continue it, "
            "or choose another --study-name."
        )
    if resume and not exists:
        raise ConfigError(f"there is no study {config.name!r} in {where} to resume.")
    sampler = sampler_for(config, worker if shared else None)
    created = not exists
    try:
        study = optuna.create_study(
            study_name=config.name, storage=storage, direction="maximize", sampler=sampler, load_if_exists=exists
        )
    except optuna.exceptions.DuplicatedStudyError:  # another worker created it a moment ago
        study = optuna.load_study(study_name=config.name, storage=storage, sampler=sampler)
        created = False
    settings = settings_of(config, space)
    if shared and not created and (difference := study_settings.check_joinable(study, settings)):
        raise ConfigError(
            f"study {config.name!r} in {where} {difference}; give every worker the same [workloads], [measure] "
            "and [objective] (each its own [server]), or choose another --study-name."
        )
    changed = [] if created else space_changes(study, space)
    if not created and not shared:
        changed = study_settings.changed_settings(study, settings) + changed
    if changed:  # before any trial is failed, asked or queued: the study is left as it was
        raise ConfigError(
            f"study {config.name!r} in {where} was created with other settings than this run's: "
            f"{'; '.join(changed)}; put them back to continue it, or choose another --study-name."
        )
    _fail_interrupted(
        study, shared=shared, heartbeats=has_heartbeats(storage), worker=worker,
        stale_s=GRACE_HEARTBEATS * config.heartbeat_s,
    )  # fmt: skip
    if created:
        study_settings.write_study_settings(study, settings)
        if queue_initial:
            _queue_initial(study, config, space)
    elif settings.max_itl_p99_s is not None and study.user_attrs.get("max_itl_p99_s") != settings.max_itl_p99_s:
        study_settings.write_itl_limit(study, settings.max_itl_p99_s)  # a latency target given on --resume
    return study


def space_changes(study: optuna.Study, space: Space) -> list[str]:
    """Each search parameter whose choices differ from those the study's trials were asked with
    (optuna refuses to ask a parameter with other choices), as ``search.NAME [...] (now [...])``."""
    stored: dict[str, optuna.distributions.BaseDistribution] = {}
    for trial in study.get_trials(deepcopy=False):
        for name, distribution in trial.distributions.items():
            stored.setdefault(name, distribution)
    changed = []
    for name, choices in space.grid().items():
        before = stored.get(name)
        if before is None or before == optuna.distributions.CategoricalDistribution(choices):
            continue
        was = list(before.choices) if isinstance(before, optuna.distributions.CategoricalDistribution) else before
        key = name.removeprefix("open.")
        changed.append(f"search.{'open.' if key != name else ''}{key} choices {was!r} (now {list(choices)!r})")
    return changed


def _fail_interrupted(study: optuna.Study, *, shared: bool, heartbeats: bool, worker: str, stale_s: float) -> None:
    """Fail the trials left RUNNING by a run that is provably gone; on shared storage, queue them again.

    On a shared database heartbeats decide (fail_stale_trials); on a journal file only this
    worker's trials are looked at. A trial's run is gone when runtime/run_owner.py's rule says so;
    a trial stored before runs were kept with their trials (no owner) is taken as gone.
    """
    fail_stale_trials(study)
    if heartbeats:
        return
    now, mine = time.time(), this_run()
    for stale in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        record = records.read_trial(stale)
        if shared and record.worker != worker:
            continue
        age = None if record.heartbeat_at is None else now - record.heartbeat_at
        owner = record.owner
        # This process's own trial was left by an earlier runner in it (a run measures its trials
        # one at a time, so none is being measured while a study opens).
        if owner is not None and owner != mine and not owner_is_dead(owner, heartbeat_age_s=age, stale_s=stale_s):
            continue
        try:
            records.record_failure_of(study, stale.number, "interrupted: the run that measured it died")
            study.tell(stale.number, state=optuna.trial.TrialState.FAIL)
        except optuna.exceptions.UpdateFinishedTrialError:
            continue  # its run finished it a moment ago: it was alive after all
        if shared and record.key is not None:
            requeue_stale_trial(study, stale, "died and started again")


def _queue_initial(study: optuna.Study, config: StudyConfig, space: Space) -> None:
    if config.search.no_speculation:
        study.enqueue_trial(space.params_for(None))
    if config.search.baseline is not None:
        study.enqueue_trial(space.params_for(config.search.baseline))
    if config.sampler == "grid":
        for configuration in space.configurations():
            study.enqueue_trial(dict(configuration.params), skip_if_exists=True)
