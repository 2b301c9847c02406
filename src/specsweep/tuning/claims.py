"""Which worker measures which configuration: a claim protocol over the study's storage alone.

Several workers may share one study. Each configuration (its key, types.Configuration) is measured
once: a worker writes the key into its trial before it reads the storage again, so of two trials
that claim the same key at once, at least one sees the other. The later trial (higher number)
gives way to the earlier one; the earlier one waits briefly for a later one it sees to give way,
and gives way itself if the later one goes on (it had not seen the earlier claim). Either way at
most one of them measures.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass

import optuna

from specsweep.tuning.records import read_trials

CLAIM_PATIENCE_S = 3.0


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyStates:
    """What the storage says about each configuration (key), for every worker of the study."""

    measured: dict[str, int]  # key -> trial that measured it
    failed: dict[str, int]  # key -> trial that failed it since this run began
    running: dict[str, list[tuple[int, str]]]  # key -> (trial, worker) of RUNNING trials, by trial number

    def settled(self) -> set[str]:
        return set(self.measured) | set(self.failed)


@dataclass(frozen=True, slots=True, kw_only=True)
class Claim:
    """The storage as a trial saw it after claiming its key, and who owns the key if not it."""

    states: KeyStates
    owner: tuple[int, str] | None  # (trial, worker) of another trial that measures the key


def key_states(study: optuna.Study, before: Collection[int], *, exclude: int | None = None) -> KeyStates:
    """Measured, failed (not among the trials finished ``before``: earlier runs' failures are tried
    again) and running configurations."""
    measured: dict[str, int] = {}
    failed: dict[str, int] = {}
    running: dict[str, list[tuple[int, str]]] = {}
    states = optuna.trial.TrialState
    for record in read_trials(study):
        key = record.key
        if key is None or record.number == exclude:
            continue
        if record.state == states.COMPLETE and record.reused_from is None:
            measured.setdefault(key, record.number)
        elif record.state == states.FAIL and record.number not in before and record.fail_reason is not None:
            # a trial failed for missed heartbeats has no reason: its configuration is queued again
            failed.setdefault(key, record.number)
        elif record.state == states.RUNNING:
            running.setdefault(key, []).append((record.number, record.worker or "?"))
    return KeyStates(measured=measured, failed=failed, running=running)


def claim(study: optuna.Study, number: int, key: str, before: Collection[int]) -> Claim:
    """Read the storage after trial ``number`` wrote ``key``: who, if anyone else, measures it."""
    give_up = time.monotonic() + CLAIM_PATIENCE_S
    while True:
        states = key_states(study, before, exclude=number)
        claims = states.running.get(key, [])
        earlier = [c for c in claims if c[0] < number]
        if earlier or not claims or key in states.measured or key in states.failed:
            return Claim(states=states, owner=earlier[0] if earlier else None)
        if time.monotonic() >= give_up:
            return Claim(states=states, owner=claims[0])
        time.sleep(0.25)
