"""A run stopped by its user: Ctrl-C or SIGTERM anywhere in a study ends it the same way.

The study loop (tuning/study.py) runs inside ``sigterm_as_interrupt`` and ``stopped_by_user``:
the trial being measured fails with ``INTERRUPTED``, everything measured is kept, and
``StudyInterrupted`` says how to continue.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from collections.abc import Collection, Iterator
from typing import Any

import optuna

from specsweep.errors import SpecsweepError
from specsweep.tuning import records
from specsweep.tuning.claims import key_states
from specsweep.tuning.storage import redact_password


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


@contextlib.contextmanager
def stopped_by_user(
    study: optuna.Study, asked: Collection[int], before: Collection[int], storage: str
) -> Iterator[None]:
    """Ctrl-C or SIGTERM anywhere in a run (a boot, a measurement, a decision between trials):
    the trials this run ``asked`` for and left RUNNING fail with the reason said, and
    StudyInterrupted names what is kept in ``storage`` and how to continue."""
    try:
        yield
    except KeyboardInterrupt:
        with no_interrupt():
            for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
                if trial.number in asked:
                    with contextlib.suppress(optuna.exceptions.UpdateFinishedTrialError):
                        records.record_failure_of(study, trial.number, INTERRUPTED)
                        study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            measured = len(key_states(study, before).measured)
        raise StudyInterrupted(
            f"study stopped by the user; {measured} configuration(s) measured are kept in "
            f"{redact_password(storage)} (continue with --resume)."
        ) from None
