"""Where a study's trials live: an optuna storage chosen by its URL, and heartbeats for shared ones.

- ``sqlite:///PATH``: one machine; the default, ``studies/NAME/study.db``.
- ``postgresql://USER@HOST/DB`` (or ``mysql://...``): optuna's RDB storage, shared by workers on
  several machines. Each worker records a heartbeat while a trial runs; a trial whose worker has
  been silent for three heartbeats is failed by whichever worker notices first, and its
  configuration is queued again for the workers still running.
- ``journal:///PATH``: optuna's journal file, for workers that share a filesystem (NFS and the
  like). Optuna keeps no heartbeats there: a worker that dies leaves its trial RUNNING until the
  same worker (same ``--worker`` name) starts again and finds its owner gone.

On local storage (SQLite, a journal file) each trial's run writes its own heartbeat into the
trial (``heartbeat_at``), read only to tell whether a run on another host is gone.

Workers coordinate through the storage alone; nothing else is shared.
"""

from __future__ import annotations

import socket
import threading
import time
import warnings
from pathlib import Path
from types import TracebackType
from typing import Any

import optuna
import sqlalchemy.engine
import sqlalchemy.exc
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from specsweep.errors import ConfigError, SpecsweepError
from specsweep.runtime.store import make_folder
from specsweep.tuning import records
from specsweep.tuning.records import retry_attrs

JOURNAL_PREFIX = "journal:"
GRACE_HEARTBEATS = 3  # a trial is stale once its worker missed this many heartbeats
# For URLs that name no driver: the one specsweep uses (SQLAlchemy's own default changed between versions).
_DRIVERS = {"postgresql": "psycopg"}


class StorageError(SpecsweepError):
    """The study's storage cannot be opened: a missing driver, an unreachable database, a bad URL."""


def storage_kind(url: str) -> str:
    """``sqlite`` (one machine), ``journal`` (a shared file) or ``rdb`` (a shared database server)."""
    if url.startswith(JOURNAL_PREFIX):
        return "journal"
    if url.startswith("sqlite:"):
        return "sqlite"
    return "rdb"


def is_shared(url: str) -> bool:
    """Whether several workers may use the storage at once (anything but SQLite)."""
    return storage_kind(url) != "sqlite"


def journal_path(url: str) -> Path:
    """The file of a ``journal:`` storage: ``journal:///abs/file.log`` or ``journal:rel/file.log``."""
    rest = url.removeprefix(JOURNAL_PREFIX).removeprefix("//")
    if not rest:
        raise ConfigError(f"storage {url!r} names no file; write journal:///shared/path/NAME.log.")
    return Path(rest)


def redact_password(url: str) -> str:
    """The storage URL as printed and stored: any password replaced by ***."""
    if storage_kind(url) == "journal":
        return url
    try:
        return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)
    except (sqlalchemy.exc.ArgumentError, ValueError):
        return url


def default_worker() -> str:
    """This worker's name when ``--worker`` is not given: the host name."""
    return socket.gethostname() or "worker"


def check_storage_url(url: str) -> None:
    """A ConfigError if ``url`` is not in a form any storage takes (nothing is opened)."""
    if storage_kind(url) == "journal":
        journal_path(url)
    elif "://" not in url:
        raise ConfigError(
            f"storage {redact_password(url)!r} is not a storage URL; use sqlite:///PATH, postgresql://USER@HOST/DB "
            "or journal:///PATH.log (docs/study-config.md)."
        )


def open_storage(url: str, *, heartbeat_s: int | None) -> BaseStorage:
    """The optuna storage for ``url``; database servers expect heartbeats every ``heartbeat_s`` s."""
    kind = storage_kind(url)
    if kind == "journal":
        path = journal_path(url)
        if not path.parent.is_dir():
            raise StorageError(f"the folder of journal storage {path} does not exist; create it or fix the path.")
        try:
            return JournalStorage(JournalFileBackend(str(path)))
        except OSError as exc:
            raise StorageError(f"cannot open journal storage {path}: {exc.strerror or exc}.") from None
    check_storage_url(url)
    if kind == "sqlite" and url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        make_folder(Path(url.removeprefix("sqlite:///")).parent)
    engine_url = _with_driver(url)
    options: dict[str, Any] = {}
    if kind == "rdb":
        options["engine_kwargs"] = {"pool_pre_ping": True}  # a connection dropped by the server is replaced
    if kind == "rdb" and heartbeat_s is not None:
        options |= {
            "heartbeat_interval": heartbeat_s,
            "grace_period": GRACE_HEARTBEATS * heartbeat_s,
            "heartbeat_stale_trial_callback": requeue_stale_trial,
        }
    last: Exception | None = None
    for attempt in range(3):
        # Workers started together on an empty database race to create optuna's tables; the
        # losers' next attempt finds them.
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                return RDBStorage(engine_url, **options)
        except sqlalchemy.exc.SQLAlchemyError as exc:
            last = exc
            time.sleep(0.5 * (attempt + 1))
    reason = str(getattr(last, "orig", None) or last).strip().splitlines()[0]
    raise StorageError(
        f"cannot open the study database {redact_password(url)}: {reason}; check the URL and that the server "
        "runs and accepts this user."
    )


def _with_driver(url: str) -> str:
    """``url`` with specsweep's driver named when it names none; a missing driver is a one-line error."""
    try:
        parsed = sqlalchemy.engine.make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise ConfigError(f"storage {redact_password(url)!r} is not a valid database URL.") from None
    driver = _DRIVERS.get(parsed.drivername)
    if driver is None:
        return url  # a driver named in the URL, or another database: SQLAlchemy reports what is missing
    try:
        __import__(driver)
    except ImportError:
        raise StorageError(
            f"a {parsed.drivername} storage needs the {driver} driver: pip install 'specsweep[postgres]'."
        ) from None
    return parsed.set(drivername=f"{parsed.drivername}+{driver}").render_as_string(hide_password=False)


def requeue_stale_trial(study: optuna.Study, trial: optuna.trial.FrozenTrial, why: str = "") -> None:
    """Queue the configuration of a trial whose worker died again (called once per such trial)."""
    attrs = retry_attrs(trial, why or "stopped sending heartbeats")
    if attrs is not None:
        study.enqueue_trial(dict(trial.params), user_attrs=attrs)


def fail_stale_trials(study: optuna.Study) -> None:
    """Fail the trials whose worker stopped sending heartbeats (a no-op without heartbeats)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


def has_heartbeats(storage: BaseStorage | str) -> bool:
    return isinstance(storage, RDBStorage) and storage.get_heartbeat_interval() is not None


class Heartbeat:
    """Records the heartbeat of the worker's current trial from a thread.

    On a shared database it is optuna's own (``record_heartbeat``, read by fail_stale_trials);
    on local storage (SQLite, a journal file) it is the trial's ``heartbeat_at`` attribute, which
    tells a run on another host whether the trial's owner is alive (runtime/run_owner.py).
    ``follow`` names the trial just asked for; a finished trial may go on beating until the next
    one is followed, which is harmless: only RUNNING trials can go stale, and a beat refused by
    a finished trial is dropped.
    """

    def __init__(self, storage: BaseStorage, *, interval_s: float) -> None:
        self._storage = storage
        self._optuna = storage if isinstance(storage, RDBStorage) and has_heartbeats(storage) else None
        self._interval_s = float(self._optuna.get_heartbeat_interval() or 1) if self._optuna else interval_s
        self._trial_id: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self, trial_id: int) -> None:
        self._trial_id = trial_id
        self._beat_once(trial_id)  # at once: a trial without a heartbeat is never stale

    def _beat_once(self, trial_id: int) -> None:
        try:
            if self._optuna is not None:
                self._optuna.record_heartbeat(trial_id)
            else:
                records.record_heartbeat(self._storage, trial_id, time.time())
        except Exception:  # one missed beat (a busy database, a finished trial): the stale limit covers it
            return

    def _beat(self) -> None:
        while not self._stop.wait(self._interval_s):
            trial_id = self._trial_id
            if trial_id is not None:
                self._beat_once(trial_id)

    def __enter__(self) -> Heartbeat:
        self._thread = threading.Thread(target=self._beat, name="specsweep-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
