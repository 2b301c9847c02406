"""``study --context-from PATH`` (``measure.context_from``): the context levels a study measures,
and their shares of the objective, from the lengths of the user's own traffic.

PATH is a file of the user's prompts (any format ``workload.load_workload`` reads: each prompt's
tokens as ``workload.count_tokens`` counts them) or what ``specsweep watch --out`` wrote (its
folder or its ``results.json``: per window, the served prompt tokens per finished request,
weighted by the finished requests). ``context_shares.shares_from_lengths`` makes the levels;
the study then measures them as ``measure.context`` levels, weighed by ``measure.context_shares``,
and the paste's context mix weighs them alike.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specsweep.config import StudyConfig
from specsweep.context_prompts import own_tokens
from specsweep.context_shares import ContextShares, prompt_lengths, shares_from_lengths
from specsweep.errors import ConfigError
from specsweep.watch.report import served_lengths
from specsweep.workload import load_workload

WATCH_RESULTS = "results.json"  # what watch --out writes, beside its report


def read_lengths(path: Path, *, where: str) -> tuple[list[tuple[float, float]], str]:
    """(length in tokens, weight) pairs from a prompt file or a watch results.json, and what they
    count in words ("1,240 prompts", "12 windows of 3,400 requests")."""
    try:
        path = path / WATCH_RESULTS if path.is_dir() else path
        found = path.is_file()
    except OSError as exc:  # a name too long, say
        raise ConfigError(f"{where}: cannot read {str(path)[:80]!r}: {exc.strerror or exc}.") from None
    if not found:
        raise ConfigError(f"{where}: {path} is not a file; give a file of prompts or a watch --out folder.")
    if path.suffix.lower() == ".json":
        try:
            served = served_lengths(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, UnicodeDecodeError, ValueError):
            served = None  # not JSON watch wrote: read as prompts (a ShareGPT array, say), which says why not
        if served is not None:
            if not served:
                raise ConfigError(
                    f"{where}: {path} has no window with served prompt tokens and finished requests (a watch "
                    "of this version writes them; watch the server again with --out)."
                )
            requests = sum(w for _, w in served)
            return served, f"{len(served):,} windows of {requests:,.0f} requests"
    workload = load_workload(path)
    return prompt_lengths(workload), f"{len(workload.prompts):,} prompts"


def study_own_tokens(config: StudyConfig) -> float:
    """The study's workloads' own prompts in tokens: the mean of each workload's mean."""
    means = [own_tokens(load_workload(name)) for name in config.workloads]
    return sum(means) / len(means)


def shares_text(shares: ContextShares) -> str:
    """'16k (22%), 64k (9%); 69% at the workloads' own prompts', or why there is no level."""
    if not shares.levels:
        return shares.note or "no context level"
    pairs = zip(shares.levels, shares.shares, strict=True)
    levels = ", ".join(f"{level // 1024}k ({100 * share:.0f}%)" for level, share in pairs)
    return f"{levels}; {100 * shares.own_share:.0f}% at the workloads' own prompts"


def apply_context_from(config: StudyConfig, path: str, *, where: str) -> tuple[StudyConfig, str]:
    """``config`` measuring the levels PATH implies, weighed by their shares; and the line that says
    them (``where``: the flag or the key that named PATH, for errors)."""
    sample, counted = read_lengths(Path(path), where=where)
    shares = shares_from_lengths(sample, study_own_tokens(config))
    measure = replace(
        config.measure, context=shares.levels, context_shares=shares.shares, context_weight=0.0, context_from=path
    )
    return replace(config, measure=measure), f"context levels from {path}: {shares_text(shares)} ({counted})"
