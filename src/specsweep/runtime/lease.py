"""Lease files: which server a run started, so that the next run can stop it if this one died.

While a trial's server runs, the study folder holds ``servers/<owner pid>.json`` naming the
specsweep process that owns it, the server's process (pid, process group, start time) and, in
``commands`` mode, the rendered stop command. A run that ends normally removes it. A run
killed outright (SIGKILL, power loss of the terminal, OOM killer) cannot; the next run in the
same folder finds the lease, sees that its owner is gone, and stops the server before it
starts anything. Start times (from ``/proc``) guard against a pid reused by another program.
The stop command is kept as it will be run, secrets and all, so a lease is readable by its
owner only (0600).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from specsweep.errors import SpecsweepError
from specsweep.runtime.store import open_log, write_json_atomic
from specsweep.secrets import mask_text, secrets_in


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLease:
    """One running server and the run that owns it."""

    owner_pid: int
    owner_started: int | None  # clock ticks after boot (/proc/PID/stat field 22); None off Linux
    trial: int
    pid: int | None  # the start command's process (None in attach mode)
    pgid: int | None
    started: int | None
    stop: tuple[str, ...] | None = None  # the rendered stop command (commands mode)
    log: str = ""


def process_start_ticks(pid: int) -> int | None:
    """When a process started (clock ticks after boot), or None if it is gone or this is not Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (IndexError, ValueError):
        return None


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (Linux; elsewhere: exists)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        pass
    except IndexError:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not Path("/proc").is_dir()


def process_alive(pid: int | None, started: int | None) -> bool:
    """Whether ``pid`` runs and is the process that started at ``started`` (not a reused pid)."""
    if pid is None:
        return False
    if started is not None:
        return process_start_ticks(pid) == started
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_members(pgid: int, not_before: int | None) -> list[int]:
    """Processes of a process group started no earlier than its leader (so not a reused id)."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and (not_before is None or int(fields[19]) >= not_before):
            members.append(int(entry.name))
    return members


def lease_for(*, trial: int, pid: int | None, stop: list[str] | None = None, log: Path | str = "") -> ServerLease:
    """A lease owned by this process for a server just started as ``pid`` (its own process group)."""
    owner = os.getpid()
    return ServerLease(
        owner_pid=owner,
        owner_started=process_start_ticks(owner),
        trial=trial,
        pid=pid,
        pgid=pid,
        started=process_start_ticks(pid) if pid is not None else None,
        stop=tuple(stop) if stop else None,
        log=str(log),
    )


def write_lease(path: Path, lease: ServerLease) -> None:
    write_json_atomic(path, asdict(lease), private=True)


def clear_lease(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def reclaim_leases(folder: Path, *, grace_s: float = 10.0) -> list[str]:
    """Stop every server whose owning run is gone; one note per lease found."""
    notes: list[str] = []
    if not folder.is_dir():
        return notes
    for path in sorted(folder.glob("*.json")):
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            lease = ServerLease(**{**raw, "stop": tuple(raw["stop"]) if raw.get("stop") else None})
        except (OSError, ValueError, TypeError, KeyError):
            clear_lease(path)
            notes.append(f"removed an unreadable lease file {path.name}")
            continue
        if lease.owner_pid != os.getpid() and process_alive(lease.owner_pid, lease.owner_started):
            notes.append(
                f"another specsweep run (pid {lease.owner_pid}) is using this study folder; its server is left alone"
            )
            continue
        notes.append(_stop_leased(lease, grace_s))
        clear_lease(path)
    return notes


def _stop_leased(lease: ServerLease, grace_s: float) -> str:
    stopped: list[str] = []
    if lease.stop:
        try:
            with open_log(Path(lease.log)) if lease.log else open(os.devnull, "ab") as log:
                code = subprocess.run(
                    list(lease.stop), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    timeout=grace_s + 30, check=False,
                ).returncode  # fmt: skip
            stopped.append(f"ran its stop command (exit code {code})")
        except (OSError, SpecsweepError, subprocess.TimeoutExpired) as exc:
            stopped.append(mask_text(f"its stop command failed ({exc})", secrets_in(commands=[lease.stop])))
    if lease.pgid is not None:
        members = _group_members(lease.pgid, lease.started) if Path("/proc").is_dir() else []
        leader_alive = process_alive(lease.pid, lease.started)
        if leader_alive or members:
            _terminate_group(lease.pgid, members, grace_s)
            stopped.append(f"stopped its process group {lease.pgid}")
    what = "; ".join(stopped) or "it had already exited"
    return f"a server left by an earlier run that died (trial {lease.trial}, pid {lease.pid}): {what}"


def _terminate_group(pgid: int, members: list[int], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not any(_running(pid) for pid in [pgid, *members]):
                return
            time.sleep(0.05)
