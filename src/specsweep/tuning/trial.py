"""One trial: start the server with a spec config, measure every workload, record, stop it.

The trial's figures go into the study (tuning/records.py), its full measurement into
``trials/trial-NNNN.json`` beside it, its server log into ``logs/`` (as the server wrote it, so
readable by its owner only; what the study keeps has secrets masked: ``specsweep.secrets``). A server that does not
start, dies, or measures nothing makes a failed trial with a one-line reason; what was measured
before that is kept in the trial file.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna

from specsweep.analysis.drafters import candidate_of
from specsweep.analysis.noise import run_to_run_noise
from specsweep.analysis.study import measured_rates
from specsweep.analysis.throughput import cell_group_requests
from specsweep.config import StudyConfig
from specsweep.engines.registry import EngineInfo, engine_info, server_args_without_spec
from specsweep.errors import ConfigError, LaunchError, SpecsweepError
from specsweep.measurement.stopping import LevelTarget
from specsweep.runtime.measure import MeasureEvent, Measurement, MeasureSettings, run_measure
from specsweep.runtime.trial_server import StartedServer, TrialServer, server_secrets
from specsweep.secrets import mask_text
from specsweep.tuning import records, study_settings
from specsweep.tuning.events import (
    MeasuringWorkload,
    StudyEvent,
    TrialDone,
    TrialFailed,
    TrialProgress,
    TrialReady,
    TrialStarting,
)
from specsweep.tuning.study_store import StudyPaths
from specsweep.tuning.trial_files import write_trial_file
from specsweep.tuning.workloads import study_workloads
from specsweep.types import (
    CapturedWidths,
    Configuration,
    EventCallback,
    LevelFigures,
    MeasuredConfig,
    SpeculativeConfig,
)
from specsweep.workload import Workload

ACCEPTANCE_MIN_REQUESTS = 3  # a drafter's acceptance run collects drafts for every shorter k's fit


def level_targets(
    config: StudyConfig,
    measured: Sequence[MeasuredConfig],
    *,
    key: str,
    spec: SpeculativeConfig | None,
    contender: bool,
    acceptance_run: bool,
    looks_up: bool = False,
    captured_widths: CapturedWidths = CapturedWidths(),
) -> dict[str, dict[int, LevelTarget]] | None:
    """What each level of the next trial must settle (None: a fixed budget, ``measure.requests``).

    ``contender``: a configuration measured again on purpose (the noise, tied leaders, a
    recommendation to confirm): it is not stopped for being behind. ``acceptance_run``: the
    drafter's largest k so far, whose counters fit the acceptance of every shorter draft.
    ``looks_up``: its drafter looks its drafts up (n-gram, suffix), so its levels take the whole
    budget: its rate moves with each prompt's text, and the first prompts of a level's order are
    not a sample of the workload (docs/search.md). Each level's errors pair with the requests of
    the levels of its cell group measured before (``spec``'s drafter at that concurrency).
    ``captured_widths``: the study's, so the noise is the search's model's. Rates are the rig's
    (modelled on the emulator), as the measurement gives them.
    """
    m = config.measure
    if m.requests is not None:
        return None
    out: dict[str, dict[int, LevelTarget]] = {}
    names = list(study_workloads(config))
    for workload in names:
        engine = engine_info(config.server.engine)
        noise = run_to_run_noise(measured, workload, engine.noise, workloads=names, captured_widths=captured_widths)
        groups = cell_group_requests(measured, workload)
        levels = {}
        for level in m.concurrency:
            shared = groups.get((level, candidate_of(spec, level).drafter), {})
            rivals = [r for r in measured_rates(measured, workload, level) if r.key != key]
            least = m.max_requests if looks_up else max(ACCEPTANCE_MIN_REQUESTS if acceptance_run else 2, level)
            levels[level] = LevelTarget(
                concurrency=level,
                min_requests=min(least, m.max_requests),
                max_requests=m.max_requests,
                precision=m.precision,
                best_tokens_per_s=rivals[0].tokens_per_s if rivals and not contender else None,
                best_noise=noise.relative_sd if noise is not None else None,
                shared=tuple(shared.values()),
            )
        out[workload] = levels
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class Objective:
    """A trial's objective (None: not met) and its constraint values (<= 0 is feasible)."""

    value: float | None
    constraints: list[float]
    reason: str | None  # why there is no value


def trial_objective(config: StudyConfig, results: dict[str, dict[int, LevelFigures]]) -> Objective:
    """Weighted aggregate tok/s at the objective's concurrency, and the constraints (a workload of
    weight 0, a context level that only reports, is not part of either)."""
    objective = config.objective
    level = objective.concurrency
    total = weight_sum = 0.0
    constraints: list[float] = []
    for name, weight in study_workloads(config).items():
        if weight <= 0:
            continue
        row = results.get(name, {}).get(level)
        if row is None or row.output_tokens_per_s is None:
            reason = f"no successful requests for workload {name} at concurrency {level}"
            return Objective(value=None, constraints=[1.0], reason=reason)
        total += weight * row.output_tokens_per_s
        weight_sum += weight
        constraints.append(float(row.errors - objective.max_errors))
        if objective.max_ttft_p95_s is not None:
            constraints.append(float((row.ttft_p95_s or 0.0) - objective.max_ttft_p95_s))
    return Objective(value=total / weight_sum, constraints=constraints, reason=None)


def captured_widths_of(
    engine: EngineInfo, started: StartedServer, spec: SpeculativeConfig | None, version: str | None, k_max: int
) -> CapturedWidths:
    """What a started server captured graphs for: as it says (the emulator), else, once its log
    says it captured graphs, per draft length 0..``k_max`` from its engine's rule for its command,
    version and spec config with each k (engines/vllm_graphs.py for vLLM). Empty where neither
    says (a CPU build, llama.cpp, SGLang; or a first start with speculation off)."""
    if started.captured_widths or not started.boot.graphs_captured or spec is None:
        return CapturedWidths(every_k=started.captured_widths)
    argv = server_args_without_spec(engine.name, started.argv)
    by_k = []
    for k in range(0, k_max + 1):
        one = None if k == 0 else replace(spec, num_speculative_tokens=k, num_speculative_tokens_per_batch_size=None)
        try:
            widths = engine.graph_widths(version, argv, one)
        except ConfigError:
            widths = None
        if widths is None:
            return CapturedWidths(unknown=True)  # graphs captured, and the engine's rule does not say them all
        by_k.append((k, widths))
    return CapturedWidths(by_k=tuple(by_k))


class TrialRunner:
    """Runs trials of one study: everything a trial needs that does not change between them."""

    def __init__(
        self,
        config: StudyConfig,
        paths: StudyPaths,
        engine: EngineInfo,
        workloads: dict[str, Workload],
        *,
        api_key: str | None,
        worker: str,
        emit: EventCallback[StudyEvent],
        ask_user: Callable[[str], None] | None = None,
        help_flags: frozenset[str] | None = None,
    ) -> None:
        self.config = config
        self.paths = paths
        self.engine = engine
        self.workloads = workloads
        self.api_key = api_key
        self.secrets = server_secrets(config.server)  # masked in every reason a failed trial keeps
        self.worker = worker
        self.emit = emit
        self.ask_user = ask_user
        self.help_flags = help_flags  # what the server binary's --help lists (llama.cpp builds differ)
        self.engine_version: str | None = None  # what the last server started said it is
        self.max_num_seqs: int | None = None  # the most sequences the servers started batch, once one said
        self.captured_widths = CapturedWidths()  # the verified widths they captured graphs for, once known

    def run(
        self,
        study: optuna.Study,
        trial: optuna.Trial,
        configuration: Configuration,
        targets: Mapping[str, Mapping[int, LevelTarget]] | None = None,
    ) -> float | None:
        """Measure ``configuration`` in ``trial`` and tell the study; the objective, or None if the trial failed.

        ``targets``: per workload and level, what adaptive measurement must settle (None: the
        fixed budget)."""
        trial_started = time.monotonic()
        number, spec = trial.number, configuration.spec
        self.paths.logs.mkdir(parents=True, exist_ok=True)
        log_path = self.paths.logs / f"trial-{number:04d}.log"
        server = TrialServer(
            self.config.server, self.engine, log_path=log_path, ask_user=self.ask_user,
            lease_path=self.paths.leases / f"{os.getpid()}.json", help_flags=self.help_flags,
        )  # fmt: skip
        self.emit(TrialStarting(trial=number, configuration=configuration))
        header: dict[str, Any] = {
            "worker": self.worker,
            "spec": None if spec is None else spec.to_json(),
            "log": str(log_path),
        }
        measurements: dict[str, Measurement] = {}
        try:
            try:
                started = server.start(spec, trial=number)
            except LaunchError as exc:
                # no server said what its boot took: the failed one is timed on the clock it would have run on
                times = self._times(server.clock.seconds(time.monotonic() - trial_started), server.modelled, {})
                self.fail(study, trial, f"server did not start: {exc}", times)
                return None
            header |= {
                "startup_s": started.startup_s,
                "argv": list(started.argv),
                "boot": records.boot_to_stored(started.boot),
            }
            # What the server says it is (engine, version, model): a rig made from this study keeps it.
            identity = started.identity
            self.engine_version = identity.engine_version or self.engine_version
            self._adopt_max_num_seqs(study, started.max_num_seqs)
            self._adopt_captured_widths(
                study,
                captured_widths_of(
                    self.engine, started, spec, self.engine_version, self.config.search.num_speculative_tokens[1]
                ),
            )
            records.record_boot(
                trial, argv=tuple(started.argv), startup_s=started.startup_s, boot=started.boot, server=identity,
                first_token_as_off=spec is None or self.engine.looks_up(spec),
            )  # fmt: skip
            self.emit(TrialReady(trial=number, startup_s=started.startup_s, boot=started.boot))
            for name, workload in self.workloads.items():
                self.emit(MeasuringWorkload(trial=number, workload=name))
                settings = self._measure_settings(started.url, server.api_engine, (targets or {}).get(name))
                measurements[name] = run_measure(settings, workload, on_event=self._relay(number, name))
                crashed = server.crashed()
                if crashed or measurements[name].error:
                    write_trial_file(self.paths.folder, number, header=header, measurements=measurements)
                    times = self._times(started.boot_s, started.modelled, measurements)
                    self.fail(study, trial, crashed or f"measurement failed: {measurements[name].stop_line()}", times)
                    return None
        finally:
            with contextlib.suppress(SpecsweepError):
                server.stop()
        # The file first: whatever happens to the trial in the storage from here, the measurement is kept.
        record_file = write_trial_file(self.paths.folder, number, header=header, measurements=measurements)
        times = self._times(started.boot_s, started.modelled, measurements)
        records.record_times(trial, times)
        results = {
            name: records.level_figures(m, subcategories={p.id: p.subcategory for p in self.workloads[name].prompts})
            for name, m in measurements.items()
        }
        objective = trial_objective(self.config, results)
        records.record_results(trial, results=results, constraints=objective.constraints, record_file=record_file)
        if objective.value is None:
            self.fail(study, trial, objective.reason or "no successful requests")
            return None
        study.tell(trial, objective.value)
        self.emit(
            TrialDone(
                trial=number, value=objective.value, configuration=configuration, results=results, boot_s=times.boot_s,
                measure_s=times.measure_s, modelled=times.modelled,
            )
        )  # fmt: skip
        return objective.value

    def fail(
        self, study: optuna.Study, trial: optuna.Trial, reason: str, times: records.TrialTimes | None = None
    ) -> None:
        if times is not None:
            records.record_times(trial, times)
        reason = mask_text(reason, self.secrets)  # it may quote the server's log
        records.record_failure(trial, reason)
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        self.emit(TrialFailed(trial=trial.number, reason=reason))

    def _adopt_max_num_seqs(self, study: optuna.Study, max_num_seqs: int | None) -> None:
        """The first server that says how many sequences it batches sets the study's (once)."""
        if max_num_seqs is None or self.max_num_seqs is not None:
            return
        self.max_num_seqs = max_num_seqs
        study_settings.adopt_max_num_seqs(study, max_num_seqs)

    def _adopt_captured_widths(self, study: optuna.Study, widths: CapturedWidths) -> None:
        """The first server that says the widths it captured graphs for sets the study's (once):
        the search's next decision and the report pad each step to them."""
        if not widths or self.captured_widths:
            return
        self.captured_widths = widths
        study_settings.adopt_captured_widths(study, widths)

    def _times(self, boot_s: float, modelled: bool, measurements: Mapping[str, Measurement]) -> records.TrialTimes:
        """Where a trial's time went: booting (``boot_s``, until ready, on the server's clock) and sending
        requests (warm-ups and measured windows, on that clock as the measurement gives them);
        ``modelled``: that clock is a modelled hardware's."""
        measure = sum(level.measuring_s for m in measurements.values() for level in m.levels)
        return records.TrialTimes(boot_s=boot_s, measure_s=measure, modelled=modelled)

    def _relay(self, number: int, workload: str) -> EventCallback[MeasureEvent]:
        def relay(event: MeasureEvent) -> None:
            self.emit(TrialProgress(trial=number, workload=workload, event=event))

        return relay

    def _measure_settings(self, url: str, engine: str, targets: Mapping[int, LevelTarget] | None) -> MeasureSettings:
        m = self.config.measure
        return MeasureSettings(
            endpoint=url,
            model=self.config.server.model,
            engine=engine,
            api=self.config.server.api,
            concurrency=m.concurrency,
            requests=m.most_requests,
            targets=targets,
            warmup=m.warmup,
            max_tokens=m.max_tokens,
            temperature=m.temperature,
            api_key=self.api_key,
            seed=self.config.seed,
            timeout_s=m.timeout_s,
        )
