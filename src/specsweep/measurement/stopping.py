"""When a level has been measured enough: the adaptive measurement's stopping rule.

A level of a trial (one workload at one concurrency B) is a closed loop of B streams. After each
answered request the rate is estimated from the requests so far: each request's rate is its
tokens over its latency, B times their mean the aggregate rate R, and their spread gives the
estimate's relative standard error se (never below ``MIN_REQUEST_SD`` / sqrt(n): a handful of
requests that happen to agree say little about the next). The level stops, and cuts the
requests in flight (runtime/driver.py), when

- **it cannot win**: the rate's upper bound R (1 + z se) is below the cell's best measured rate
  (another configuration, measured earlier) at its lower bound, best (1 - z noise), with the
  run-to-run noise of the workload (or ``precision`` before one is measured): a configuration
  this far behind is not worth another request;
- **it is clearly ahead**: its lower bound R (1 - z se) is above the best's upper bound: the new
  leader, which the search measures again anyway (docs/search.md);
- **it is precise enough**: z min(se_T, se) <= ``precision``, the half-width of the 95%
  interval of its decode step time or of its rate, relative to it; finer than the run-to-run
  noise between server starts would buy nothing. se_T is the spread of the requests' own step
  times (decode span over decode steps, the steps counted from the request's own fields): the
  fits take step times, and acceptance is the counters' part. Without counted steps se_T is se.
  A drafter that looks its drafts up is not measured adaptively: tuning/trial.level_targets gives
  its levels the whole budget (docs/search.md says why, with the measured cases);
- or it reached ``max_requests``.

Where the study measured other levels of the same cell group (``LevelTarget.shared``: the same
workload, concurrency and drafter, in earlier starts), se and se_T are paired on the prompts the
level shares with them (measurement/paired.py), the error the step model will give the level:
the prompts' own spread, which every level shares, is not the level's, except for the prompts
it has not sent yet. Otherwise they come from its requests' spread alone.

It never stops before ``min_requests``: one request per stream at B >= 2, two at B = 1, and
more for a drafter's acceptance run (its counters give the acceptance of every shorter draft,
so it collects drafts for the fits). ``z`` = 2 on both sides: a configuration as fast as the best
is stopped as a loser with probability about 2.5% x 2.5%; docs/search.md has the measured rate.

Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.measurement.paired import MIN_REQUEST_SD, Request, paired_errors
from specsweep.types import RequestRecord

Z = 2.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelTarget:
    """What one level must settle, from the study so far."""

    concurrency: int
    min_requests: int
    max_requests: int
    precision: float  # stop when the 95% half-width of the step time or the rate is at most this fraction
    best_tokens_per_s: float | None = None  # the cell's best measured rate, in the client's units (wall clock)
    best_noise: float | None = None  # the relative uncertainty of that best (run-to-run noise)
    # the answered requests of the cell group's levels measured before (the module doc)
    shared: tuple[tuple[Request, ...], ...] = ()

    @property
    def adaptive(self) -> bool:
        return self.min_requests < self.max_requests


@dataclass(frozen=True, slots=True, kw_only=True)
class RateEstimate:
    """The level's aggregate rate from the requests answered so far, its relative se, and the
    relative se of its decode step time (the rate's where the requests do not count their steps)."""

    tokens_per_s: float
    relative_se: float
    step_time_relative_se: float


def estimate_rate(
    records: Sequence[RequestRecord], concurrency: int, shared: Sequence[Sequence[Request]] = ()
) -> RateEstimate | None:
    """B times the mean per-request rate (tokens over latency) of the answered requests, its
    errors paired with the ``shared`` levels' requests where they share prompts (the module doc)."""
    answered = answered_requests(records)
    if not answered:
        return None
    rates = [request_rate(r) for r in answered]
    relative_se = _relative_se(rates)
    steps = [request_step_time_s(r) for r in answered]
    known = [t for t in steps if t is not None]
    step_se = _relative_se(known) if len(known) == len(steps) else relative_se
    if shared:
        paired = paired_errors({-1: request_rows(answered), **dict(enumerate(shared))}).get(-1)
        if paired is not None:
            relative_se = paired.rate
            step_se = paired.step_time if paired.step_time is not None else min(step_se, relative_se)
    return RateEstimate(
        tokens_per_s=concurrency * sum(rates) / len(rates),
        relative_se=relative_se,
        step_time_relative_se=step_se,
    )


def answered_requests(records: Sequence[RequestRecord]) -> list[RequestRecord]:
    """The requests a level's rate is estimated from: answered, with tokens and a latency."""
    return [r for r in records if r.ok and r.completion_tokens and r.latency_s]


def request_rows(records: Sequence[RequestRecord]) -> tuple[Request, ...]:
    """Each answered request's prompt, rate and decode step time, in the order sent: what a
    level keeps of its requests (LevelFigures.by_request) and pairs on."""
    return tuple((r.prompt_id, request_rate(r), request_step_time_s(r)) for r in answered_requests(records))


def request_rate(record: RequestRecord) -> float:
    """An answered request's rate: its tokens over its latency."""
    return (record.completion_tokens or 0) / (record.latency_s or 1.0)


def request_step_time_s(record: RequestRecord) -> float | None:
    """A request's mean decode step time: its first-to-last-token span over its decode steps
    (None where its fields do not count them, or it decoded nothing)."""
    if record.ttft_s is None or record.last_token_s is None or not record.completion_tokens:
        return None
    span = record.last_token_s - record.ttft_s
    if record.spec_verify_ct:
        steps = float(record.spec_verify_ct) - 1.0  # the first token's step is the prefill's
    elif record.draft_n_accepted is not None:
        steps = record.completion_tokens - 1.0 - record.draft_n_accepted
    elif record.chunk_tokens:
        steps = len(record.chunk_tokens) - 1.0
    else:
        return None
    return span / steps if steps >= 1 and span > 0 else None


def _relative_se(values: Sequence[float]) -> float:
    """sd / mean over sqrt(n), the sd never below MIN_REQUEST_SD."""
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return max(sd / mean if mean > 0 else 0.0, MIN_REQUEST_SD) / math.sqrt(len(values))


def stop_reason(target: LevelTarget, records: Sequence[RequestRecord]) -> str | None:
    """Why the level can stop sending requests now, or None to go on."""
    sent = len(records)
    if sent >= target.max_requests:
        return "budget"
    if sent < target.min_requests:
        return None
    estimate = estimate_rate(records, target.concurrency, target.shared)
    if estimate is None:
        return None
    if target.best_tokens_per_s is not None:
        spread = Z * estimate.relative_se
        margin = Z * (target.best_noise if target.best_noise is not None else target.precision)
        if estimate.tokens_per_s * (1 + spread) < target.best_tokens_per_s * (1 - margin):
            return "cannot win"
        if estimate.tokens_per_s * (1 - spread) > target.best_tokens_per_s * (1 + margin):
            return "clearly ahead"
    if Z * min(estimate.step_time_relative_se, estimate.relative_se) <= target.precision:
        return "precise"
    return None
