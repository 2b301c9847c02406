"""A study stopped by its user: Ctrl-C or SIGTERM anywhere in a study ends it the same way.

The study loop (tuning/study.py) runs inside ``sigterm_as_interrupt`` (runtime/stop_signals.py)
and ``stopped_by_user``:
the trial being measured fails with ``INTERRUPTED``, everything measured is kept, and
``StudyInterrupted`` says how to continue.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator

import optuna

from specsweep.errors import SpecsweepError
from specsweep.runtime.stop_signals import no_interrupt
from specsweep.tuning import records
from specsweep.tuning.claims import key_states
from specsweep.tuning.storage import redact_password


class StudyInterrupted(SpecsweepError):
    """The user stopped the study (Ctrl-C or SIGTERM); everything measured is kept."""

    exit_code = 130


INTERRUPTED = "interrupted by the user"


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
