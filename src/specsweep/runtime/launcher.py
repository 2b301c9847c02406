"""Starting, waiting for and stopping server processes.

A server runs from an argv list (no shell) in its own process group, with its output going to
a log file. Readiness is polled over HTTP; a process that exits before it is ready ends the
wait at once with the tail of its log as the reason. Stopping sends SIGTERM to the whole group,
waits, then SIGKILLs what is left.

On Linux the server also gets SIGTERM from the kernel when the thread that started it dies
(``PR_SET_PDEATHSIG``), so a specsweep killed with SIGKILL leaves no server behind; the lease
file (``runtime/lease.py``) covers what that cannot reach (detached servers, other systems).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx

from specsweep.config import EmulatorServer
from specsweep.errors import LaunchError, ReadyTimeoutError, ServerCrashedError
from specsweep.runtime.store import open_log

# Where free ports are looked for when the kernel's ephemeral range is known: below it, so no
# outgoing connection (a health poll, a scrape) can take the port as its own local port in the
# minutes between choosing it and the server binding it.
_LISTEN_PORTS_FROM = 20000
_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on ``host``, outside the kernel's ephemeral range where
    that range is known (Linux), else one the kernel picks."""
    for port in _ports_to_try():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise LaunchError(f"no free TCP port on {host}; set the server's port in the study file")


def _ports_to_try() -> list[int]:
    try:
        low = int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    if low - _LISTEN_PORTS_FROM < 1000:
        return [0]
    return [*random.sample(range(_LISTEN_PORTS_FROM, low), 200), 0]


_ERROR_LINE = re.compile(r"\b[\w.]*(?:Error|Exception): .+")


def failure_reason(path: Path) -> str:
    """The error lines of a log that explain a failure (the first is usually the root cause), or its tail."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    errors: list[str] = []
    for line in text.splitlines():
        if "WARNING" in line:  # warnings quote errors that did not happen
            continue
        match = _ERROR_LINE.search(line)
        if match and match.group(0) not in errors:
            errors.append(match.group(0).strip())
    if not errors:
        return log_tail(path)
    return errors[0] if len(errors) == 1 else f"{errors[0]} | {errors[-1]}"


def describe_exit(code: int) -> str:
    """How a process ended, in words: ``killed by signal 9 (SIGKILL)`` or ``exited with code 1``."""
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"was killed by signal {-code} ({name})"
    return f"exited with code {code}"


def log_tail(path: Path, lines: int = 8) -> str:
    """The last lines of a log file, joined with ' | ' (one line for an error message)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept) or "(empty log)"


class ServerProcess:
    """One server process and its log."""

    def __init__(self, argv: Sequence[str], *, log_path: Path, env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        """Start the process in a new process group (session), output to the log file."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **(self.env or {})}
        with open_log(self.log_path) as log:  # readable by the user only: see open_log
            try:
                self.process = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    # One prctl call between fork and exec; specsweep starts servers from its main
                    # thread with no other thread holding locks, which is what the rule guards against.
                    preexec_fn=_parent_death_signal(),  # noqa: PLW1509
                )
            except OSError as exc:
                raise LaunchError(f"cannot start {self.argv[0]!r}: {exc.strerror or exc}.") from None
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        return None if self.process is None else self.process.poll()

    def wait_ready(self, url: str, *, timeout_s: float, poll_s: float = 0.1) -> float:
        """Poll ``url`` until it answers 200; return seconds since start (see wait_until_ready)."""

        def exited() -> str | None:
            code = self.exit_code()
            if code is None:
                return None
            return f"the server {describe_exit(code)} before it was ready: {failure_reason(self.log_path)}"

        wait_until_ready(url, timeout_s=timeout_s, poll_s=poll_s, dead=exited, log_path=self.log_path)
        return time.monotonic() - (self.started_at or time.monotonic())

    def stop(self, *, grace_s: float = 10.0) -> int | None:
        """SIGTERM the process group, wait up to ``grace_s``, then SIGKILL; return the exit code."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10.0)
        # Children that outlived their leader still belong to the group.
        _signal_group(self.process.pid, signal.SIGKILL)
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# How long a readiness path may answer "not found" before the wait ends (see wait_until_ready).
NOT_SERVED_S = 15.0


def wait_until_ready(
    url: str,
    *,
    timeout_s: float,
    poll_s: float = 0.1,
    dead: Callable[[], str | None] = lambda: None,
    log_path: Path | None = None,
) -> None:
    """Poll ``url`` until it answers 200.

    Connection refused and 503 both mean "not yet" (vLLM refuses until ready; llama.cpp and
    SGLang answer 503 while loading). ``dead`` returning a reason ends the wait at once. A
    server that answers 404 or 405 for ``NOT_SERVED_S`` on end is up but does not serve the
    path: waiting longer cannot help, so that ends the wait too (a proxy that answers 404 until
    its backend registers gets that long).
    """
    started = time.monotonic()
    deadline = started + timeout_s
    not_served_since: float | None = None
    with httpx.Client(timeout=5.0) as http:
        while True:
            reason = dead()
            if reason is not None:
                raise ServerCrashedError(reason)
            try:
                status = http.get(url).status_code
            except httpx.HTTPError:
                status = None
            if status == 200:
                return
            now = time.monotonic()
            not_served_since = (not_served_since or now) if status in (404, 405) else None
            if not_served_since is not None and now - not_served_since >= min(NOT_SERVED_S, timeout_s / 2):
                path = httpx.URL(url).path
                raise ReadyTimeoutError(
                    f"{url} answered HTTP {status} for {now - not_served_since:.0f} s: the server is up but does "
                    f"not serve {path}; set server.ready_path to a path it answers 200 on when ready (vLLM, SGLang "
                    "and llama-server serve /health)."
                )
            if now >= deadline:
                tail = f": {log_tail(log_path, 3)}" if log_path is not None else ""
                raise ReadyTimeoutError(
                    f"the server was not ready after {timeout_s:.0f} s ({url}); raise the ready timeout or "
                    f"check its log{tail}"
                )
            time.sleep(poll_s)


_PR_SET_PDEATHSIG = 1


def _parent_death_signal() -> Callable[[], None] | None:
    """A preexec_fn that asks Linux to SIGTERM the child when its parent dies; None elsewhere.

    libc's prctl is looked up here, in the parent, so the child only makes one system call
    between fork and exec. If the parent died before the call took effect, the child stops itself.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def emulator_argv(
    *,
    port: int,
    host: str = "127.0.0.1",
    speculative_config: str | None = None,
    profile: str | None = None,
    time_scale: float = 1.0,
    seed: int = 0,
    extra: Sequence[str] = (),
) -> list[str]:
    """The argv that runs ``specsweep emulate`` with this Python."""
    argv = [sys.executable, "-m", "specsweep", "emulate", "--host", host, "--port", str(port)]
    if speculative_config is not None:
        argv += ["--speculative-config", speculative_config]
    if profile is not None:
        argv += ["--profile", profile]
    argv += ["--time-scale", repr(time_scale), "--seed", str(seed), *extra]
    return argv


def study_emulator_argv(
    emulator: EmulatorServer, *, host: str, port: int, speculative_config: str | None, extra: Sequence[str] = ()
) -> list[str]:
    """The argv of a study's emulator (``server.emulator`` of a study file), ``extra`` before its own."""
    return emulator_argv(
        host=host, port=port, speculative_config=speculative_config, profile=emulator.profile,
        time_scale=emulator.time_scale, seed=emulator.seed, extra=[*extra, *emulator.extra_args],
    )  # fmt: skip
