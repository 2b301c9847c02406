"""Which run owns a study or a trial: the process a run is, and the lock it holds on its study.

A run is its process: pid, host name and start time (clock ticks after boot, from ``/proc``;
a pid reused by another program has another start time). Each trial keeps the run that
measures it, so a later run fails a trial left RUNNING only when that run is provably gone:

- on this host, its pid no longer runs, or runs a process that started at another time;
- on another host, its last heartbeat is older than the stale limit (without a heartbeat
  nothing proves it gone).

A run also holds an exclusive lock file for as long as it uses a study on local storage
(``flock``: the kernel drops it when the process ends, however it ends, SIGKILL included). The
file says who holds it, so a second run refuses with the holder's pid and host before it
changes anything. One process may hold a lock several times (a study opened again in the same
run); it is released when the last holder lets go.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specsweep.errors import OutputError, StudyInUseError
from specsweep.runtime.lease import process_alive, process_start_ticks
from specsweep.runtime.store import make_folder


@dataclass(frozen=True, slots=True, kw_only=True)
class RunOwner:
    """One specsweep process: what a trial and a lock file keep of the run that holds them."""

    pid: int
    host: str
    started: int | None  # clock ticks after boot (/proc/PID/stat field 22); None off Linux

    def to_stored(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_stored(stored: Any) -> RunOwner | None:
        """The owner a trial attribute or lock file holds (None: none, or not readable)."""
        if not isinstance(stored, dict):
            return None
        try:
            started = stored.get("started")
            return RunOwner(
                pid=int(stored["pid"]), host=str(stored["host"]), started=None if started is None else int(started)
            )
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def this_host() -> str:
    return socket.gethostname() or "localhost"


def this_run() -> RunOwner:
    """The run of this process."""
    pid = os.getpid()
    return RunOwner(pid=pid, host=this_host(), started=process_start_ticks(pid))


def owner_is_dead(owner: RunOwner, *, heartbeat_age_s: float | None, stale_s: float) -> bool:
    """Whether the run that owns a trial is provably gone (see the module docstring).

    ``heartbeat_age_s``: seconds since the trial's last heartbeat (None: it has none)."""
    if owner.host == this_host():
        return not process_alive(owner.pid, owner.started)
    return heartbeat_age_s is not None and heartbeat_age_s > stale_s


class RunLock:
    """An exclusive lock file held by this process (see hold_run_lock)."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd
        self._holders = 1

    def release(self) -> None:
        """Let go once; the last release empties the file and unlocks it."""
        self._holders -= 1
        if self._holders > 0 or self._fd is None:
            return
        _HELD.pop(self.path, None)
        fd, self._fd = self._fd, None
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
        os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_HELD: dict[Path, RunLock] = {}
_HOLDER_WAIT_S = 1.0  # a lock just taken: how long its holder may take to write its name


def hold_run_lock(path: Path, refusal: Callable[[RunOwner | None], str]) -> RunLock:
    """Take the lock file ``path`` for this process, or raise StudyInUseError with
    ``refusal(holder)`` (holder None: the file does not say who holds it)."""
    path = path.absolute()
    held = _HELD.get(path)
    if held is not None:
        held._holders += 1
        return held
    fd = _open_lock_file(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read_holder(fd)
        os.close(fd)
        raise StudyInUseError(refusal(holder)) from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(this_run().to_stored()).encode(), 0)
    lock = _HELD[path] = RunLock(path, fd)
    return lock


def _open_lock_file(path: Path) -> int:
    """The lock file's descriptor, its folder made if missing (an OutputError naming what cannot
    be written). A symlink planted at ``path`` is removed and the file made in its place, as the
    logs and the atomic writers do: the holder's name is never written through a link."""
    make_folder(path.parent)
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        try:
            return os.open(path, flags, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP or not path.is_symlink():
                raise
            path.unlink()  # the link itself; whatever it points at is left as it was
            return os.open(path, flags, 0o644)
    except OSError as exc:
        raise OutputError(f"cannot write the lock file {path}: {exc.strerror or exc}.") from None


def _read_holder(fd: int) -> RunOwner | None:
    """Who holds a lock, as its file says (it writes its name just after taking it)."""
    deadline = time.monotonic() + _HOLDER_WAIT_S
    while True:
        try:
            owner = RunOwner.from_stored(json.loads(os.pread(fd, 4096, 0) or b"null"))
        except (OSError, ValueError):
            owner = None
        if owner is not None or time.monotonic() >= deadline:
            return owner
        time.sleep(0.05)
