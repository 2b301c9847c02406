"""A user's stop of a study run: Ctrl-C or SIGTERM, wherever the run is.

The run stops the way it does at its end: the server stopped, the trial it was measuring
failed with the reason said, everything measured kept (tuning/study.py).
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from specsweep.errors import SpecsweepError


class StudyInterrupted(SpecsweepError):
    """The user stopped the study (Ctrl-C or SIGTERM); everything measured is kept."""


INTERRUPTED = "interrupted by the user"


@contextlib.contextmanager
def no_interrupt() -> Iterator[None]:
    """A second Ctrl-C while an interrupted trial is being recorded waits until it is recorded."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the study the way Ctrl-C does: server stopped, trial failed, data kept.

    Ctrl-C gets a handler of its own too: with Python's default one, asyncio.run (each
    measurement) turns the first Ctrl-C into a cancel of its task, and drops it when the task has
    just finished. This one raises KeyboardInterrupt where the program is, and notes it, so an
    interrupt that Python swallows anyway (one landing in a finalizer is "Exception ignored in
    ...") is raised again where the loop next looks (check_interrupt)."""

    def handler(signum: int, frame: object) -> None:
        _interrupted.set()
        raise KeyboardInterrupt

    def unraisable(info: Any) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt):
            hook(info)

    _interrupted.clear()
    previous_term = signal.signal(signal.SIGTERM, handler)
    previous_int = signal.signal(signal.SIGINT, handler)
    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous_term)
        signal.signal(signal.SIGINT, previous_int)
        sys.unraisablehook = hook


_interrupted = threading.Event()


def check_interrupt() -> None:
    """Raise an interrupt that was swallowed before it stopped the run (see sigterm_as_interrupt)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt
