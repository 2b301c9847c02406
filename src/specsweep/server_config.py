"""A study file's [server] table: how to start, reach and stop the server for each trial.

The records are the one home of the table's keys and defaults (``specsweep.config`` builds the
whole study file on them); command templates are checked by ``specsweep.templates``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from specsweep.errors import ConfigError
from specsweep.templates import parse_command_template
from specsweep.toml_records import RecordTable

ENGINES = ("emulator", "vllm", "sglang", "llama.cpp")
MODES = ("emulator", "process", "commands", "attach")


def default_mode(engine: str) -> str:
    """server.mode when a file leaves it out: the emulator runs as itself, other engines as a process."""
    return "emulator" if engine == "emulator" else "process"


def default_port(mode: str) -> int:
    """server.port when a file leaves it out: 0 (a free port per trial) where specsweep starts the server."""
    return 0 if mode in ("emulator", "process") else 8000


@dataclass(frozen=True, slots=True, kw_only=True)
class EmulatorServer:
    """The built-in emulator as the study's server."""

    profile: str = "dgx-spark-v4-flash"
    time_scale: float = 50.0
    seed: int = 0
    extra_args: tuple[str, ...] = ()

    # The README's first study: 100 times faster than the hardware, so the profile's four-minute
    # start takes 2.4 s of wall clock and the study about a minute on 2 cores.
    DEMO_TIME_SCALE: ClassVar[float] = 100.0

    @classmethod
    def demo(cls, profile: str) -> EmulatorServer:
        """The emulator ``specsweep study`` runs when no study file is given."""
        return cls(profile=profile, time_scale=cls.DEMO_TIME_SCALE)

    def describe(self) -> str:
        return f"profile {self.profile}, running {self.time_scale:g} times faster than the hardware it models"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """How to start, reach and stop the server for each trial."""

    engine: str = "emulator"
    mode: str = default_mode(engine)  # the default engine's; in a file, default_mode(server.engine)
    start: tuple[str, ...] | str | None = None  # argv template (no shell) or a shell command string
    stop: tuple[str, ...] | str | None = None
    wait_free: tuple[str, ...] | str | None = None  # polled after stop until it exits 0
    env: dict[str, str] = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int = default_port(mode)  # the default mode's; in a file, default_port(server.mode)
    ready_timeout_s: float = 900.0
    ready_path: str = "/health"
    stop_grace_s: float = 30.0
    model: str | None = None
    api: str = "chat"
    api_key_env: str | None = None
    emulator: EmulatorServer = field(default_factory=EmulatorServer)


def _command(table: RecordTable, key: str) -> tuple[str, ...] | str | None:
    value = table.values.get(key)
    return None if value is None else parse_command_template(value, where=f"{table.source}: {table.path}.{key}").text


def parse_server(table: RecordTable) -> ServerConfig:
    """The [server] table, validated: every error names the key and the fix."""
    source = table.source
    engine = table.choice("engine", ENGINES)
    mode = table.choice("mode", MODES, default=default_mode(engine))
    if (engine == "emulator") != (mode == "emulator"):
        raise ConfigError(f"{source}: server.mode 'emulator' goes with server.engine 'emulator' and only with it.")
    start = _command(table, "start")
    stop = _command(table, "stop")
    if mode in ("process", "commands") and start is None:
        raise ConfigError(f"{source}: server.start is required in mode {mode!r} (the command that starts the server).")
    if mode == "commands" and stop is None:
        raise ConfigError(f"{source}: server.stop is required in mode 'commands' (the command that stops the server).")
    env = table.raw("env")
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f'{source}: server.env must be a table of strings, e.g. {{ VLLM_LOGGING_LEVEL = "INFO" }}.')
    port = table.get("port", int, default=default_port(mode))
    if not 0 <= port <= 65535 or (port == 0 and mode in ("commands", "attach")):
        raise ConfigError(f"{source}: server.port must be 1..65535 (0, a free port, only in process mode).")
    api = table.get("api", str)
    if api not in ("chat", "completions"):
        raise ConfigError(f"{source}: server.api must be 'chat' or 'completions'.")
    emulator = table.nested("emulator", EmulatorServer)
    time_scale = emulator.get("time_scale", float)
    if time_scale <= 0:
        raise ConfigError(f"{source}: server.emulator.time_scale must be > 0.")
    extra = emulator.raw("extra_args")
    if not isinstance(extra, list) or not all(isinstance(x, str) for x in extra):
        raise ConfigError(f"{source}: server.emulator.extra_args must be a list of strings.")
    ready_timeout = table.get("ready_timeout_s", float)
    stop_grace = table.get("stop_grace_s", float)
    return ServerConfig(
        engine=engine,
        mode=mode,
        start=start,
        stop=stop,
        wait_free=_command(table, "wait_free"),
        env=dict(env),
        host=table.get("host", str),
        port=port,
        ready_timeout_s=check_positive(ready_timeout, "server.ready_timeout_s", source),
        ready_path=_ready_path(table.get("ready_path", str), source),
        stop_grace_s=check_positive(stop_grace, "server.stop_grace_s", source),
        model=table.get("model", str),
        api=api,
        api_key_env=table.get("api_key_env", str),
        emulator=EmulatorServer(
            profile=emulator.get("profile", str),
            time_scale=time_scale,
            seed=emulator.get("seed", int),
            extra_args=tuple(extra),
        ),
    )


def _ready_path(path: str, source: str) -> str:
    """The readiness path, appended to the server's URL as it is: it starts with "/" and holds no
    space or control character."""
    if not path.startswith("/") or any(c.isspace() or not c.isprintable() for c in path):
        raise ConfigError(
            f'{source}: server.ready_path must be a URL path starting with "/" and without spaces, e.g. "/health".'
        )
    return path


def check_positive(value: float, path: str, source: str) -> float:
    """``value`` if above 0, else a ConfigError naming ``path`` in ``source``."""
    if value <= 0:
        raise ConfigError(f"{source}: {path} must be > 0.")
    return value
