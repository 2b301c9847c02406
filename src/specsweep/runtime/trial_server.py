"""One trial's server: render its command, start it, wait until ready, read its boot facts, stop it.

Modes (``server.mode``):
- ``emulator``: the built-in emulator as a local process.
- ``process``: a local process from an argv template (no shell), in its own process group.
- ``commands``: a start command and a stop command, for servers in containers, on other hosts
  or on a Ray cluster; the start command may stay in the foreground (its output is the log).
- ``attach``: the user restarts the server by hand when asked and presses Enter.

Placeholders such as ``{port}`` and ``{spec_args}`` are filled in by ``specsweep.templates``,
which also checked the templates when the study file was read: element by element in argv
templates (so no value can become a second argument or a command), shell-quoted in a
shell-string template.

Once ready, the server is asked what it is (``runtime/identity.py``): a started server carries
what a study counts of it (its boot on its own clock, its time scale, the most sequences it
batches), so nothing above ``runtime/`` needs to know which program it started.

Before a start the port must be free: a server still answering there (a stale one, or someone
else's) would otherwise pass the readiness check and be measured in place of the trial's.
With ``lease_path`` the running server is recorded (``runtime/lease.py``) until it is stopped.

The server is run with its command as rendered; what is kept of it (``StartedServer.argv``, the
planned commands of a dry run (``runtime/server_plan.py``), a failure's reason) has its secrets masked
(``specsweep.secrets``).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from specsweep.config import ServerConfig
from specsweep.engines.registry import EngineInfo, max_num_seqs_flag
from specsweep.engines.sglang import adaptive_line
from specsweep.errors import LaunchError, ReadyTimeoutError
from specsweep.runtime.identity import ServerIdentity, read_server_identity
from specsweep.runtime.launcher import (
    ServerProcess,
    describe_exit,
    failure_reason,
    free_port,
    study_emulator_argv,
    wait_until_ready,
)
from specsweep.runtime.lease import clear_lease, lease_for, write_lease
from specsweep.runtime.modelled_time import ServerClock
from specsweep.runtime.store import open_log, write_atomic
from specsweep.secrets import mask_argv, mask_text, secrets_in
from specsweep.templates import CommandTemplate, Values, has_placeholder
from specsweep.types import BootFacts, SpeculativeConfig


def placeholder_values(
    *, host: str, port: int, spec: SpeculativeConfig | None, spec_args: list[str], model: str | None, trial: int
) -> dict[str, str | list[str]]:
    """The value of every placeholder (``templates.PLACEHOLDERS``) for one trial's commands."""
    return {
        "host": host,
        "port": str(port),
        "spec_args": spec_args,
        "speculative_config": spec.to_json() if spec is not None else "",
        "num_speculative_tokens": str(spec.num_speculative_tokens or 0) if spec is not None else "0",
        "draft_sample_method": spec.draft_sample_method if spec is not None else "",
        "method": (spec.method or "") if spec is not None else "",
        "model": model or "",
        "trial": str(trial),
    }


def server_secrets(config: ServerConfig) -> frozenset[str]:
    """The secret values in a study's server commands and env table, to mask wherever they turn up
    (a failure's reason quoting the server's log, say)."""
    return secrets_in(
        commands=(config.start, config.stop, config.wait_free, config.emulator.extra_args), env=config.env
    )


def render_command(template: tuple[str, ...] | str, values: Values) -> list[str]:
    """The argv to run for a template as ``ServerConfig`` holds it (checked when the study file was read)."""
    return CommandTemplate(text=template).render(values)


STOP_COMMAND_EXTRA_S = 30.0  # server.stop may run for stop_grace_s plus this
WAIT_FREE_EVERY_S = 2.0  # server.wait_free is run again this long after it failed
PORT_FREE_WAIT_S = 10.0  # a start waits at most this long for its port to be free


@dataclass(frozen=True, slots=True, kw_only=True)
class StartedServer:
    """A server that answered its readiness check."""

    url: str
    argv: tuple[str, ...]  # what was run, secrets masked (empty in attach mode)
    startup_s: float
    boot: BootFacts
    log_path: Path
    identity: ServerIdentity  # what it says it is, asked once it was ready
    max_num_seqs: int | None  # the most sequences it batches: as it says, else its --max-num-seqs (None: not known)
    # the verified widths it captured graphs for, as it says (the emulator; empty: not known, no
    # real engine's flags and version are read for them yet)
    captured_widths: tuple[int, ...] = ()

    @property
    def clock(self) -> ServerClock:
        """The clock its times run on (the emulator's modelled hardware, else the wall clock)."""
        return self.identity.clock

    @property
    def modelled(self) -> bool:
        """Whether its times are a modelled hardware's (the emulator's, at any time scale)."""
        return self.identity.engine == "emulator"

    @property
    def boot_s(self) -> float:
        """Its boot on its own clock: the modelled startup the emulator reports, else ``startup_s``."""
        return self.identity.boot_s if self.identity.boot_s is not None else self.startup_s


class TrialServer:
    """Start and stop the server for one trial, whatever the mode."""

    def __init__(
        self,
        config: ServerConfig,
        engine: EngineInfo,
        *,
        log_path: Path,
        ask_user: Callable[[str], None] | None = None,
        lease_path: Path | None = None,
        help_flags: frozenset[str] | None = None,
    ) -> None:
        self.config = config
        self.engine = engine
        self.help_flags = help_flags  # what the server binary's --help lists (read_help_flags)
        self.log_path = log_path
        self.lease_path = lease_path
        self.ask_user = ask_user or _ask_on_terminal
        self._process: ServerProcess | None = None
        self._values: dict[str, str | list[str]] = {}
        self.secrets = server_secrets(config)

    def start(self, spec: SpeculativeConfig | None, *, trial: int) -> StartedServer:
        """Start (or have the user start) the server with ``spec``; raise LaunchError subclasses."""
        config = self.config
        port = config.port or free_port(config.host)
        table_text = self.engine.table_file(spec)
        spec_args = self.engine.spec_args(spec, help_flags=self.help_flags, table_path=self._table_path(spec))
        self._values = self.values_for(spec, port=port, trial=trial)
        url = f"http://{config.host}:{port}"
        started = time.monotonic()
        argv: list[str] = []
        if config.mode == "attach":
            shown = " ".join(shlex.quote(a) for a in spec_args) or "(speculation off: no spec flags)"
            table_file = (
                ""
                if table_text is None
                else f"\nwith the table file {spec_args[-1]} on the server holding:\n{table_text}"
            )
            self.ask_user(
                f"Restart the server at {url} with: {shown}{table_file}\nPress Enter when it is starting (or ready)."
            )
        else:
            _check_port_free(config.host, port, wait_s=min(PORT_FREE_WAIT_S, config.ready_timeout_s))
            argv = self.start_argv(self._values, spec, port=port, trial=trial)
            table_path = self._table_path(spec)
            if table_text is not None and table_path is not None:
                write_atomic(Path(table_path), table_text)
            self._process = ServerProcess(argv, log_path=self.log_path, env=config.env)
            self._process.start()
            if self.lease_path is not None:
                stop = self.stop_argv(self._values)
                lease = lease_for(trial=trial, pid=self._process.pid, stop=stop, log=self.log_path)
                write_lease(self.lease_path, lease)
        self._wait_ready(url + config.ready_path)
        startup = time.monotonic() - started
        refusal = self.engine.boot_refusal(self.log(), spec)
        if refusal is not None:
            raise LaunchError(refusal)
        identity = read_server_identity(url, self.engine.name)
        table = spec is not None and bool(spec.num_speculative_tokens_per_batch_size)
        if table and identity.adaptive is not None and identity.adaptive != "on":  # SGLang's adaptive mode is off
            said = adaptive_line(identity.adaptive)
            raise LaunchError(f"the server at {url} does not run the per-batch-size table: {said}")
        return StartedServer(
            url=url,
            argv=mask_argv(argv, self.secrets),
            startup_s=startup,
            boot=self.engine.parse_boot_facts(self.log()),
            log_path=self.log_path,
            identity=identity,
            max_num_seqs=identity.max_num_seqs or max_num_seqs_flag(template_argv(config) or ()),
            captured_widths=identity.captured_widths,
        )

    @property
    def clock(self) -> ServerClock:
        """The clock the server will run on, known before it says so: a start that fails is timed on it."""
        return ServerClock(self.config.emulator.time_scale) if self.modelled else ServerClock()

    @property
    def modelled(self) -> bool:
        """Whether the server's times will be a modelled hardware's (it is the emulator)."""
        return self.config.mode == "emulator"

    @property
    def api_engine(self) -> str:
        """The engine whose API and metrics the server speaks (the emulator speaks vLLM's)."""
        return "vllm" if self.modelled else self.engine.name

    def values_for(self, spec: SpeculativeConfig | None, *, port: int | str, trial: int) -> dict[str, str | list[str]]:
        """The placeholders' values for a trial with ``spec`` on ``port``."""
        config = self.config
        spec_args = self.engine.spec_args(spec, help_flags=self.help_flags, table_path=self._table_path(spec))
        values = placeholder_values(
            host=config.host, port=0, spec=spec, spec_args=spec_args, model=config.model, trial=trial
        )
        return {**values, "port": str(port)}

    def _table_path(self, spec: SpeculativeConfig | None) -> str | None:
        """Where a process-mode start writes the file its engine reads ``spec``'s per-batch-size
        table from: beside the trial's log, so each start reads its own (None: no such file, or the
        user starts the server and it goes where the engine usually reads it)."""
        if self.config.mode != "process" or self.engine.table_file(spec) is None:
            return None
        return str(self.log_path.with_name(f"{self.log_path.stem}-table.json").resolve())

    def start_argv(self, values: Values, spec: SpeculativeConfig | None, *, port: int, trial: int) -> list[str]:
        """The start command of a trial with ``spec`` (not in attach mode, where the user starts it)."""
        config = self.config
        if config.mode == "emulator":
            return study_emulator_argv(
                config.emulator, host=config.host, port=port,
                speculative_config=spec.to_json() if spec is not None else None,
                # each trial is another start: its own run-to-run variation, when the profile has any
                extra=["--start-index", str(trial)],
            )  # fmt: skip
        assert config.start is not None
        return render_command(config.start, values)

    def stop_argv(self, values: Values) -> list[str] | None:
        """Commands mode's server.stop, run before the process group is signalled (None: none)."""
        config = self.config
        return render_command(config.stop, values) if config.mode == "commands" and config.stop else None

    def wait_free_argv(self, values: Values) -> list[str] | None:
        """server.wait_free, run after a stop until it succeeds (None: none)."""
        return render_command(self.config.wait_free, values) if self.config.wait_free is not None else None

    def _wait_ready(self, url: str) -> None:
        process = self._process
        if process is not None and self.config.mode != "commands":
            process.wait_ready(url, timeout_s=self.config.ready_timeout_s)
            return
        if process is None:
            wait_until_ready(url, timeout_s=self.config.ready_timeout_s)  # attach mode: only the URL to watch
            return

        def failed() -> str | None:
            # A start command that exits 0 started a detached server (docker run -d, ssh ... &).
            code = process.exit_code()
            if code is None or code == 0:
                return None
            return f"the start command exited with code {code} before the server was ready: " + failure_reason(
                self.log_path
            )

        wait_until_ready(url, timeout_s=self.config.ready_timeout_s, dead=failed, log_path=self.log_path)

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def crashed(self) -> str | None:
        """A one-line reason if the server process has exited, else None."""
        if self._process is None:
            return None
        code = self._process.exit_code()
        if code is None or (code == 0 and self.config.mode == "commands"):
            return None  # in commands mode a start command may exit 0 and leave the server running
        return f"the server {describe_exit(code)}: {failure_reason(self.log_path)}"

    def stop(self) -> None:
        """Stop the server (stop command, then the process group) and wait until resources are free."""
        config = self.config
        stop = self.stop_argv(self._values)
        if stop is not None:
            _run_bounded(stop, config.stop_grace_s + STOP_COMMAND_EXTRA_S, self.log_path)
        if self._process is not None:
            self._process.stop(grace_s=config.stop_grace_s)
            self._process = None
        if self.lease_path is not None:
            clear_lease(self.lease_path)
        if config.wait_free is not None:
            self._wait_free()

    def _wait_free(self) -> None:
        """Poll the wait_free command until it succeeds (e.g. until GPU memory is released)."""
        argv = self.wait_free_argv(self._values)
        assert argv is not None
        deadline = time.monotonic() + self.config.ready_timeout_s
        while time.monotonic() < deadline:
            if _run_bounded(argv, 60, self.log_path) == 0:
                return
            time.sleep(WAIT_FREE_EVERY_S)
        raise ReadyTimeoutError(
            f"server.wait_free did not succeed within {self.config.ready_timeout_s:.0f} s; the next start could fail."
        )


def template_argv(config: ServerConfig) -> list[str] | None:
    """The words of the command a study's server config starts every server with: no spec flags,
    port 0 (None in attach mode, where the user starts it). A shell-string template is split as
    the shell would (one with unbalanced quotes stays ``sh -c SCRIPT``)."""
    if config.mode == "emulator":
        return study_emulator_argv(config.emulator, host=config.host, port=0, speculative_config=None)
    if config.start is None:
        return None
    values = placeholder_values(host=config.host, port=0, spec=None, spec_args=[], model=config.model, trial=0)
    argv = render_command(config.start, values)
    if isinstance(config.start, str):
        with contextlib.suppress(ValueError):
            return shlex.split(argv[-1])
    return argv


def read_help_flags(config: ServerConfig, engine: EngineInfo) -> frozenset[str] | None:
    """The flag names the server program's ``--help`` lists, for an engine whose flags differ by
    build (llama.cpp); None where that does not apply or the program is not known here (a shell
    string, commands or attach mode), and the engine's newest flag names are used unchecked."""
    if engine.parse_help is None or config.mode != "process" or not isinstance(config.start, tuple):
        return None
    program = config.start[0]
    if has_placeholder(program):
        return None
    try:
        done = subprocess.run(
            [program, "--help"], stdin=subprocess.DEVNULL, capture_output=True, text=True, errors="replace",
            timeout=60, env={**os.environ, **config.env}, check=False,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LaunchError(f"cannot run '{program} --help' to read which flags this build takes: {exc}") from None
    return engine.parse_help(done.stdout + done.stderr) or None


def _check_port_free(host: str, port: int, *, wait_s: float = 10.0) -> None:
    """LaunchError if something still accepts connections on host:port after ``wait_s``.

    The wait covers stop commands that return before the old server has closed its socket.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            with socket.create_connection((host, port), timeout=2.0):
                pass
        except OSError:
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    raise LaunchError(
        f"port {port} on {host} is already in use (a server left running, or another program); stop it or "
        "set server.port to a free port (0 picks one per trial in process mode)."
    )


def _run_bounded(argv: list[str], timeout_s: float, log_path: Path) -> int:
    """Run a helper command to completion (output appended to the trial log); its exit code."""
    with open_log(log_path) as log:
        try:
            return subprocess.run(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False
            ).returncode
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(mask_text(f"{argv[0]!r} failed: {exc}", secrets_in(commands=[argv]))) from None


def _ask_on_terminal(message: str) -> None:
    print(message, file=sys.stderr)
    try:
        input()
    except EOFError:
        raise LaunchError("attach mode needs a terminal to press Enter on; none is attached.") from None
