"""What a study would do, without doing it: ``specsweep study --dry-run``.

The same space, checks and commands a run builds (tuning/study.py), before any storage is
opened or any server started: the configurations, the levels and workloads they are measured
on, and the exact command each configuration's server would be started with.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from specsweep.config import StudyConfig
from specsweep.engines.registry import engine_info
from specsweep.runtime.server_plan import PlannedStop, planned_command, planned_stop, planned_words
from specsweep.runtime.trial_server import TrialServer, read_help_flags
from specsweep.tuning.space import build_space, check_space, check_spec_args
from specsweep.tuning.storage import check_storage_url
from specsweep.tuning.workloads import load_study_workloads, study_workloads
from specsweep.types import Configuration
from specsweep.workload import context_variant_name, too_small


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedConfiguration:
    """One configuration of the space, the command its server would be started with and how it
    would be stopped."""

    configuration: Configuration
    command: str  # the start command as one line (attach mode: the flags to restart with by hand)
    words: tuple[str, ...]  # the start command's words, each shell-quoted: " ".join(words) == command (attach: ())
    stop: PlannedStop
    first: bool  # measured first, before the search chooses: speculation off and the baseline


@dataclass(frozen=True, slots=True, kw_only=True)
class PlannedWorkload:
    name: str
    weight: float
    prompts: int
    subcategories: dict[str, int]


@dataclass(frozen=True, slots=True, kw_only=True)
class StudyPlan:
    """What ``study`` would measure, and how."""

    name: str
    engine: str
    mode: str
    sampler: str
    configurations: tuple[PlannedConfiguration, ...]
    baseline: Configuration | None  # search.baseline, measured first (None: the study names none)
    collapsed: str | None  # why draft sampling is not searched, when it is not
    workloads: tuple[PlannedWorkload, ...]
    concurrency: tuple[int, ...]
    requests: str
    max_tokens: int
    temperature: float
    objective: str
    budget: str
    warnings: tuple[str, ...] = ()
    context: str | None = None  # the context levels each workload is also measured at (None: none)


def plan_study(config: StudyConfig) -> StudyPlan:
    """The plan of ``config``: every check a run makes before its first start, nothing started."""
    engine = engine_info(config.server.engine)
    space = build_space(
        config.search,
        temperature=config.measure.temperature,
        engine_has_draft_sample_method=engine.has_draft_sample_method,
        validate=engine.validate_spec,
        samples_drafts=engine.drafts_from_a_distribution,
        never_drafts=engine.never_drafts,
        looks_up=engine.looks_up,
    )
    check_space(space, config.source, config.search.baseline)
    help_flags = read_help_flags(config.server, engine)  # llama.cpp: the flags this build takes
    check_spec_args(space, engine, config.source, help_flags=help_flags, server=config.server)
    if config.storage is not None:
        check_storage_url(config.storage)
    server = TrialServer(config.server, engine, log_path=Path(os.devnull), help_flags=help_flags)
    baseline = space.configuration(space.params_for(config.search.baseline)) if config.search.baseline else None
    configurations = [
        PlannedConfiguration(
            configuration=c,
            command=planned_command(server, c.spec, trial=trial),
            words=planned_words(server, c.spec, trial=trial),
            stop=planned_stop(server, c.spec, trial=trial),
            first=c.spec is None or c == baseline,
        )
        for trial, c in enumerate(space.configurations())
    ]
    loaded_all = load_study_workloads(config)  # a context level too short for its prompts is refused here
    weights = study_workloads(config)
    workloads = []
    for name in config.workloads:
        loaded, weight = loaded_all[name], weights[name]
        workloads.append(
            PlannedWorkload(
                name=loaded.name, weight=weight, prompts=len(loaded.prompts), subcategories=loaded.subcategories()
            )
        )
    m, objective = config.measure, config.objective
    requests = (
        f"exactly {m.requests} per level"
        if m.requests is not None
        else f"adaptive, {m.max_requests} at most per level, until the rate is known to {100 * m.precision:g}%"
    )
    constraints = [f"at most {objective.max_errors} failed requests"]
    if objective.max_ttft_p95_s is not None:
        constraints.append(f"TTFT p95 at most {objective.max_ttft_p95_s:g} s")
    if objective.max_itl_p99_s is not None:
        constraints.append(f"recommendations within ITL p99 {1000 * objective.max_itl_p99_s:g} ms")
    collapsed = None
    if space.methods_collapsed and len(config.search.draft_sample_method) > 1:
        collapsed = (
            f"{engine.name} has no draft sampling choice"
            if not engine.has_draft_sample_method
            else "temperature 0: greedy and probabilistic drafting are identical, so draft sampling is not searched"
        )
    warnings = [
        note
        for name in config.workloads
        for note in (too_small(loaded_all[name], config.measure.most_requests), *loaded_all[name].notes)
        if note
    ]
    warnings += space.notes()
    if len(configurations) > 1 and len({c.command for c in configurations}) == 1:
        warnings.append(
            "every configuration runs the same command: the start command has no {spec_args} (or "
            "{speculative_config}), so the server would not change between trials"
        )
    budget = f"at most {config.trials} trials" if config.trials else "no trial budget"
    if config.sampler == "model":
        budget += (
            "; the search picks each start and stops by itself once no start is worth its time "
            "(at most one per configuration of the space)"
        )
    elif config.sampler == "grid":
        budget += "; every configuration once"
    return StudyPlan(
        name=config.name, engine=engine.name, mode=config.server.mode, sampler=config.sampler,
        configurations=tuple(configurations), baseline=baseline, collapsed=collapsed, workloads=tuple(workloads),
        concurrency=tuple(m.concurrency), requests=requests, max_tokens=m.max_tokens, temperature=m.temperature,
        objective=f"aggregate output tok/s at concurrency {objective.concurrency}, with {', '.join(constraints)}",
        budget=budget, warnings=tuple(warnings), context=_context_line(config),
    )  # fmt: skip


def _context_line(config: StudyConfig) -> str | None:
    """The context levels in one line: what each workload is also measured as, and their weight."""
    m = config.measure
    if not m.context:
        return None
    first = next(iter(config.workloads))
    names = ", ".join(context_variant_name(first, level) for level in m.context)
    if m.context_shares:
        each = ", ".join(f"{100 * share:.3g}%" for share in m.context_shares)
        weight = f"{each} of each workload's weight, one share per level"
    elif m.context_weight:
        weight = f"{100 * m.context_weight:g}% of each workload's weight, split between them"
    else:
        weight = "weight 0 (measured and reported, not in the objective)"
    return (
        f"{', '.join(f'{level:,}' for level in m.context)} tokens: each workload also as {names}"
        f"{', ...' if len(config.workloads) > 1 else ''} in the same starts, after its plain levels, every "
        f"prompt behind one shared prefix per level; {weight}"
    )
