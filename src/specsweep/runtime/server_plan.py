"""What a trial's server would run, nothing run: the commands ``study --dry-run`` shows.

Rendered by the code a run uses (``TrialServer.start_argv``, ``stop_argv`` and ``wait_free_argv``
in runtime/trial_server.py), so what is shown is what would run: each word shell-quoted on its
own, secrets masked, PORT where a free port is picked at each start (server.port 0).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from specsweep.runtime.trial_server import PORT_FREE_WAIT_S, STOP_COMMAND_EXTRA_S, WAIT_FREE_EVERY_S, TrialServer
from specsweep.secrets import MASK, mask_argv
from specsweep.types import SpeculativeConfig

PORT = "PORT"  # stands for the free port picked at each start


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedStop:
    """How a trial's server would be stopped, and what the next start waits for (``TrialServer.stop``
    and ``start``): commands shell-quoted, secrets masked."""

    stop: str | None  # commands mode's server.stop (None: none)
    stop_timeout_s: float  # how long it may run
    signals: bool  # then SIGTERM to the start command's process group, SIGKILL after grace_s (not in attach mode)
    grace_s: float
    wait_free: str | None  # server.wait_free, run until it succeeds (None: none)
    wait_every_s: float  # run again this long after it failed
    wait_timeout_s: float  # the study stops waiting after this long
    port: str | None  # the port the next start waits to be free (None: a free one is picked, or attach mode)
    port_wait_s: float


def planned_words(server: TrialServer, spec: SpeculativeConfig | None, *, trial: int) -> tuple[str, ...]:
    """The words of the command a trial with ``spec`` would start its server with (empty in attach mode)."""
    config = server.config
    if config.mode == "attach":
        return ()
    values = server.values_for(spec, port=config.port or PORT, trial=trial)
    argv = server.start_argv(values, spec, port=config.port, trial=trial)
    if config.mode == "emulator" and not config.port:
        argv[argv.index("--port") + 1] = PORT
    return _shown(server, argv)


def planned_command(server: TrialServer, spec: SpeculativeConfig | None, *, trial: int) -> str:
    """``planned_words`` as one line; in attach mode the flags to restart the server with by hand."""
    if server.config.mode == "attach":
        spec_args = server.engine.spec_args(spec, help_flags=server.help_flags)
        return "restart by hand with: " + (" ".join(shlex.quote(a) for a in spec_args) or "no spec flags")
    return " ".join(planned_words(server, spec, trial=trial))


def planned_stop(server: TrialServer, spec: SpeculativeConfig | None, *, trial: int) -> PlannedStop:
    """How the server of a trial with ``spec`` would be stopped and the next start wait."""
    config = server.config
    values = server.values_for(spec, port=config.port or PORT, trial=trial)
    stop, wait_free = server.stop_argv(values), server.wait_free_argv(values)
    return PlannedStop(
        stop=" ".join(_shown(server, stop)) if stop else None,
        stop_timeout_s=config.stop_grace_s + STOP_COMMAND_EXTRA_S,
        signals=config.mode != "attach",
        grace_s=config.stop_grace_s,
        wait_free=" ".join(_shown(server, wait_free)) if wait_free else None,
        wait_every_s=WAIT_FREE_EVERY_S,
        wait_timeout_s=config.ready_timeout_s,
        port=str(config.port) if config.port and config.mode != "attach" else None,
        port_wait_s=min(PORT_FREE_WAIT_S, config.ready_timeout_s),
    )


def _shown(server: TrialServer, argv: list[str]) -> tuple[str, ...]:
    """Each word shell-quoted, secrets masked (PORT and the mask left bare)."""
    return tuple(a if a in (PORT, MASK) else shlex.quote(a) for a in mask_argv(argv, server.secrets))
