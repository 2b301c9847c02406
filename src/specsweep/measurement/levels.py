"""One measured concurrency level, summarized: client-side rates and latencies, server counters.

Aggregate output tok/s is client-side and wall clock: the exact completion tokens (from
``usage``) of every successful request, over the time from the first request sent to the last
stream closed. The server's own generation throughput over the same window is reported beside
it, with their ratio: the server's runs higher because it leaves out TTFT and scheduling.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from specsweep.measurement.counters import AcceptanceSummary, CounterDelta, summarize_acceptance
from specsweep.types import RequestRecord


@dataclass(frozen=True, slots=True, kw_only=True)
class Spread:
    """Distribution of one quantity over requests."""

    p50: float
    p95: float
    min: float
    max: float
    mean: float
    n: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Latency:
    """A latency's median and 99th percentile, in seconds, over ``n`` values."""

    p50_s: float
    p99_s: float
    n: int


def latency(values: Sequence[float]) -> Latency | None:
    """p50 and p99 of a list of seconds (None when empty)."""
    if not values:
        return None
    array = np.asarray(values, dtype=float)
    return Latency(p50_s=float(np.percentile(array, 50)), p99_s=float(np.percentile(array, 99)), n=len(values))


def inter_token_gaps(record: RequestRecord) -> list[float]:
    """Seconds between consecutive streamed chunks that carried tokens (the inter-token latency as
    a client sees it: with speculation a chunk carries every token of one verification step)."""
    times = record.chunk_times_s or ()
    return [b - a for a, b in itertools.pairwise(times)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientAcceptance:
    """Acceptance from what each response carried, summed over requests (no per-position detail).

    llama.cpp's ``timings`` give drafted and accepted tokens; SGLang's ``spec_verify_ct`` gives
    verification steps, so tokens per step = completion tokens / steps.
    """

    drafted_tokens: int | None
    accepted_tokens: int | None
    draft_acceptance_rate: float | None
    verify_steps: int | None
    mean_acceptance_length: float | None


@dataclass(frozen=True, slots=True, kw_only=True)
class LevelSummary:
    """Everything measured at one concurrency level."""

    concurrency: int
    requests: int
    errors: int
    error_reasons: dict[str, int]
    stopped_early: int
    wall_s: float
    output_tokens: int
    output_tokens_per_s: float | None  # all tokens over the whole wall-clock window
    saturated_output_tokens_per_s: float | None  # while every stream was busy (no ramp-down tail)
    decode_tokens_per_s_per_stream: Spread | None
    ttft_s: Spread | None
    prefill_tokens_per_s: Spread | None
    tokens_per_chunk: float | None
    chunks_per_request: float | None
    server_generation_tokens_per_s: float | None
    server_to_client_ratio: float | None
    foreign_tokens: float | None  # server-counted tokens the tool's own requests do not explain
    acceptance: AcceptanceSummary | None  # from server counters over the window
    client_acceptance: ClientAcceptance | None  # from per-request fields (llama.cpp, SGLang)
    gauge_accept_length: float | None  # SGLang's accept-length gauge after the level
    # drafts the server's counters counted over the window: 0 when a drafter drafted nothing
    # (acceptance is then None), None when the server has no draft counters
    counted_drafts: float | None = None
    cut_requests: int = 0  # in flight when the level stopped, closed mid-stream (not in ``requests``)
    # time per output token after the first, per request; the gap between token-carrying chunks
    tpot: Latency | None = None
    itl: Latency | None = None


def spread(values: Sequence[float]) -> Spread | None:
    """p50/p95/min/max/mean of a list (None when empty)."""
    if not values:
        return None
    array = np.asarray(values, dtype=float)
    return Spread(
        p50=float(np.percentile(array, 50)),
        p95=float(np.percentile(array, 95)),
        min=float(array.min()),
        max=float(array.max()),
        mean=float(array.mean()),
        n=len(values),
    )


def summarize_level(
    records: Sequence[RequestRecord],
    *,
    concurrency: int,
    wall_s: float,
    delta: CounterDelta | None,
    gauge_accept_length: float | None = None,
    window: tuple[float, float] | None = None,
    cut: Sequence[RequestRecord] = (),
    itl: bool = True,
) -> LevelSummary:
    """Fold a level's request records and its counter delta into a LevelSummary. ``cut`` are the
    requests closed mid-stream when the level stopped: their tokens before the cut count in the
    saturated window, and the server's counters include them. ``itl``: whether the gaps between
    chunks resolve the server's steps (not on an emulator running too fast to tell them apart)."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    reasons = dict(Counter((record.error or "unknown").split(":")[0] for record in failed))
    output_tokens = sum(r.completion_tokens or 0 for r in ok)
    decode = [v for r in ok if (v := r.decode_tokens_per_s) is not None]
    ttft = [r.ttft_s for r in ok if r.ttft_s is not None]
    prefill = [r.prompt_tokens / r.ttft_s for r in ok if r.prompt_tokens and r.ttft_s is not None and r.ttft_s > 0]
    chunks = sum(r.num_chunks for r in ok)
    server_rate = None
    foreign = None
    if delta is not None and delta.generation_tokens is not None and delta.window_s > 0:
        server_rate = delta.generation_tokens / delta.window_s
        # Every token the server generated for this tool, failed requests and the first attempts
        # of retried ones included, is at most what the requests asked for; growth beyond that
        # came from someone else.
        asked = sum(
            ((r.completion_tokens if r.ok else r.max_tokens) or 0) + (r.max_tokens if r.retried else 0)
            for r in (*records, *cut)
        )
        foreign = max(0.0, delta.generation_tokens - asked)
    client_rate = output_tokens / wall_s if wall_s > 0 and ok else None
    return LevelSummary(
        concurrency=concurrency,
        requests=len(records),
        errors=len(failed),
        error_reasons=reasons,
        stopped_early=sum(r.stopped_early for r in ok),
        wall_s=wall_s,
        output_tokens=output_tokens,
        output_tokens_per_s=client_rate,
        saturated_output_tokens_per_s=saturated_rate([*ok, *cut], window) if window else None,
        decode_tokens_per_s_per_stream=spread(decode),
        ttft_s=spread(ttft),
        prefill_tokens_per_s=spread(prefill),
        tokens_per_chunk=output_tokens / chunks if chunks else None,
        chunks_per_request=chunks / len(ok) if ok else None,
        server_generation_tokens_per_s=server_rate,
        server_to_client_ratio=server_rate / client_rate if server_rate is not None and client_rate else None,
        foreign_tokens=foreign,
        acceptance=summarize_acceptance(delta) if delta is not None else None,
        client_acceptance=client_acceptance(ok),
        gauge_accept_length=gauge_accept_length,
        counted_drafts=delta.num_drafts if delta is not None else None,
        cut_requests=len(cut),
        tpot=latency([1.0 / v for v in decode if v > 0]),
        itl=latency([gap for r in ok for gap in inter_token_gaps(r)]) if itl else None,
    )


def saturated_rate(records: Sequence[RequestRecord], window: tuple[float, float]) -> float | None:
    """Tokens that arrived inside ``window`` (perf_counter times) per second of it.

    A closed loop of N streams runs at full concurrency from its start until the first stream
    runs out of requests; after that the remaining streams finish one by one, a ramp-down tail
    that the server's steady state does not have. Needs per-chunk token counts (continuous usage)
    of every record that streamed content; one that streamed none (cut before its first token)
    adds nothing.
    """
    start, end = window
    records = [r for r in records if r.num_chunks]
    if end <= start or not records or any(r.chunk_times_s is None or r.chunk_tokens is None for r in records):
        return None
    tokens = 0
    for record in records:
        for offset, count in zip(record.chunk_times_s or (), record.chunk_tokens or (), strict=True):
            if start <= record.started_at + offset <= end:
                tokens += count
    return tokens / (end - start)


def client_acceptance(records: Sequence[RequestRecord]) -> ClientAcceptance | None:
    """Acceptance from per-request fields; None when no request carried any."""
    drafted = [r for r in records if r.draft_n is not None]
    verified = [r for r in records if r.spec_verify_ct]
    if not drafted and not verified:
        return None
    drafted_tokens = sum(r.draft_n or 0 for r in drafted) if drafted else None
    accepted_tokens = sum(r.draft_n_accepted or 0 for r in drafted) if drafted else None
    steps = sum(r.spec_verify_ct or 0 for r in verified) if verified else None
    return ClientAcceptance(
        drafted_tokens=drafted_tokens,
        accepted_tokens=accepted_tokens,
        draft_acceptance_rate=(accepted_tokens or 0) / drafted_tokens if drafted_tokens else None,
        verify_steps=steps,
        mean_acceptance_length=sum(r.completion_tokens or 0 for r in verified) / steps if steps else None,
    )


def acceptance_by_subcategory(
    records: Sequence[RequestRecord], subcategory_of: Mapping[str, str]
) -> dict[str, dict[str, float]]:
    """Per workload subcategory, the sums that give its tokens per verification step: ``tokens``
    over ``steps`` (SGLang's per-request verification steps where a response says them, else one
    step per streamed chunk after the first: with speculation a chunk carries one step's
    tokens), and llama.cpp's ``drafted`` and ``accepted`` tokens where responses carry them.
    Sums, so levels and trials add up. Requests whose prompt has no subcategory are left out."""
    out: dict[str, dict[str, float]] = {}
    for record in records:
        tag = subcategory_of.get(record.prompt_id, "")
        if not tag or not record.ok:
            continue
        if record.spec_verify_ct:
            tokens, steps = float(record.completion_tokens or 0), float(record.spec_verify_ct)
        else:
            tokens, steps = float((record.completion_tokens or 0) - 1), float(record.num_chunks - 1)
        if steps <= 0:
            continue
        sums = out.setdefault(tag, {"requests": 0.0, "tokens": 0.0, "steps": 0.0})
        sums["requests"] += 1
        sums["tokens"] += tokens
        sums["steps"] += steps
        if record.draft_n:
            sums["drafted"] = sums.get("drafted", 0.0) + record.draft_n
            sums["accepted"] = sums.get("accepted", 0.0) + (record.draft_n_accepted or 0)
    return out


def tokens_per_step(
    mean_acceptance_length: float | None, num_drafts: float | None, completion_tokens: Sequence[float]
) -> float | None:
    """Tokens per decode step over every step, drafted or not: the counters' mean acceptance length
    is per drafting step, and the requests' M - 1 decode tokens took (M - 1) - accepted steps in
    all (a lookup drafter leaves the steps where the text did not match undrafted)."""
    if not mean_acceptance_length or not num_drafts:
        return None
    accepted = (float(mean_acceptance_length) - 1.0) * float(num_drafts)
    decode = sum(float(m) - 1.0 for m in completion_tokens)
    steps = decode - accepted
    if steps <= 0 or steps < float(num_drafts) * 0.999:
        return float(mean_acceptance_length)  # every step drafted (or counts from another window): the counters' own
    return decode / steps


def draft_share(
    num_drafts: float | None, completion_tokens: Sequence[float], per_step: float | None, counted_drafts: float | None
) -> float | None:
    """Drafts per decode step: 0 when the counters ran and counted none, None when not known."""
    if not num_drafts:
        return 0.0 if counted_drafts == 0 else None
    decode = sum(float(m) - 1.0 for m in completion_tokens)
    if not per_step or decode <= 0:
        return None
    return min(1.0, float(num_drafts) * per_step / decode)


# A drafter whose counted drafts reach this share of its decode steps drafts at every step: the
# counters' window and the requests' tokens differ by a few percent, not by a tenth.
EVERY_STEP_SHARE = 0.9


def level_drafted_share(records: Sequence[RequestRecord], summary: LevelSummary) -> float | None:
    """The share of a level's decode steps that drafted, where the counters show a drafter that
    drafts only at some steps (a lookup that drafts where the text matches); None where every
    step drafted, or nothing says."""
    acceptance = summary.acceptance
    completion = [float(r.completion_tokens or 0) for r in records if r.ok]
    num_drafts = acceptance.num_drafts if acceptance else None
    mean_length = acceptance.mean_acceptance_length if acceptance else None
    per_step = tokens_per_step(mean_length, num_drafts, completion)
    share = draft_share(num_drafts, completion, per_step, summary.counted_drafts)
    return None if share is None or share >= EVERY_STEP_SHARE else share
