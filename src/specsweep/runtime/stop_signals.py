"""A run stopped by its user: Ctrl-C or SIGTERM stop a study (tuning/interrupts.py) and a live
``watch`` (cli/watch.py) the same way, as a KeyboardInterrupt where the program is.

Both install their handlers explicitly, so a run started with SIGINT ignored (a background job of
a non-interactive shell, ``nohup``) still stops on Ctrl-C or SIGTERM, and says what it has.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def no_interrupt() -> Iterator[None]:
    """A second Ctrl-C while an interrupted run saves what it has waits until it is saved."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the run the way Ctrl-C does (a study: server stopped, trial failed, data kept).

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
