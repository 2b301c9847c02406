"""The model-guided search: its decisions on synthetic trials, its stopping rule, resume, and a real study."""

from __future__ import annotations

import json
import random
import re
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest

from specsweep.analysis.drafters import Drafter, configuration_label
from specsweep.analysis.study import analyze_study
from specsweep.analysis.throughput import study_observations
from specsweep.config import SearchSpace, parse_study_config
from specsweep.engines import llamacpp
from specsweep.engines.registry import USUAL_RUN_NOISE
from specsweep.measurement.acceptance import expected_tokens_per_step
from specsweep.measurement.counters import AcceptanceSummary
from specsweep.measurement.levels import level_drafted_share
from specsweep.tuning.events import Planned
from specsweep.tuning.records import read_trial, read_trials
from specsweep.tuning.space import build_space
from specsweep.tuning.strategy import decide_next
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.types import OFF_KEY, Configuration, NoisePriors, RequestRecord, RunNoisePrior, StudySettings

from .builders import emulator_study, picks_of, specsweep, write_study
from .test_study import true_rates

# The user report's dense technical curve (docs/math.md#worked-numbers), and a step time T = T0 (1 + c k).
S = (0.569, 0.347, 0.188, 0.069, 0.035)
T0, C = 0.04, 0.10
SPACE = build_space(
    SearchSpace(num_speculative_tokens=(1, 5), fixed={"method": "dspark"}),
    temperature=0.6,
    engine_has_draft_sample_method=True,
)
DISTRIBUTIONS = {name: optuna.distributions.CategoricalDistribution(values) for name, values in SPACE.grid().items()}


def true_rate(k: int, method: str, *, c: float = C) -> float:
    """Greedy drafting accepts less here (S scaled by 0.85); both cost the same per step."""
    if k == 0:
        return 1.0 / T0
    scale = 1.0 if method == "probabilistic" else 0.85
    return expected_tokens_per_step([s * scale for s in S], k) / (T0 * (1 + c * k))


def best_by_truth() -> tuple[int, str]:
    options = [(k, m) for k in range(1, 6) for m in ("greedy", "probabilistic")]
    return max(options, key=lambda km: true_rate(*km))


def make_trial(
    number: int, k: int, method: str = "probabilistic", *, noise: float = 0.0, seed: int = 0, c: float = C, space=SPACE
):
    """A completed trial as the study loop stores it, at concurrency 1 for the prose workload."""
    rng = np.random.default_rng(seed * 1000 + number)
    params = space.params_for(None if k == 0 else {"num_speculative_tokens": k, "draft_sample_method": method})
    spec = space.config_from_params(params)
    rate = true_rate(k, method, c=c) * (1 + noise * rng.standard_normal())
    row = {"output_tokens_per_s": rate, "errors": 0, "requests": 32}
    if k:
        scale = 1.0 if method == "probabilistic" else 0.85
        counts = [round(5000 * s * scale) for s in S[:k]]
        row |= {"num_drafts": 5000, "accepted_per_position": counts, "mean_acceptance_length": 1 + sum(counts) / 5000}
    trial = optuna.trial.create_trial(
        params=params,
        distributions={name: optuna.distributions.CategoricalDistribution(v) for name, v in space.grid().items()},
        value=rate,
        user_attrs={
            "key": Configuration(spec=spec).key,
            "spec": None if spec is None else spec.to_json(),
            "results": {"prose": {"1": row}},
            "constraints": [0.0],
        },
    )
    trial.number = number  # each its own server start
    return trial


def trials_for(*configs: tuple[int, str], noise: float = 0.0) -> list:
    return [make_trial(i, k, m, noise=noise) for i, (k, m) in enumerate(configs)]


SETTINGS = StudySettings(
    workload_weights={"prose": 1.0}, concurrency_levels=(1,), objective_concurrency=1, k_range=(1, 5),
    baseline=None, noise_prior=NoisePriors(USUAL_RUN_NOISE),
)  # fmt: skip
PROBABILISTIC = Drafter(method="dspark", draft_sample_method="probabilistic")


def decide(trials, **kwargs):
    return decide_next([read_trial(t) for t in trials], SPACE, SETTINGS, **kwargs)


def chosen(decision) -> tuple[int, str] | None:
    if decision.configuration is None:
        return None
    params = decision.configuration.params
    return params["num_speculative_tokens"], params["draft_sample_method"]


def test_speculation_off_first_then_a_drafter_at_its_largest_k_then_its_sibling_where_a_pick_is() -> None:
    """Off, then greedy at its largest k (its counters give every shorter draft's acceptance), then
    probabilistic drafting of the same method at the k greedy's own acceptance is best at (3 here,
    by the truth's rates): that start is likely a pick, where one at k=5 would not be."""
    first = decide([])
    assert first.phase == "speculation off" and first.configuration == Configuration(spec=None)
    second = decide(trials_for((0, "off")))
    assert second.phase == "largest k" and chosen(second) == (5, "greedy")
    assert "acceptance of every shorter draft" in second.reason
    third = decide(trials_for((0, "off"), (5, "greedy")))
    greedy_best = max(range(1, 6), key=lambda k: true_rate(k, "greedy"))
    assert greedy_best == 3
    assert third.phase == "other draft sampling" and chosen(third) == (greedy_best, "probabilistic")


def run_until_stop(measured: list, *, noise: float, most: int = 12) -> tuple[list, object]:
    """Measure what the search asks for (simulated) until it stops: its steps and its stop."""
    steps = []
    decision = decide(trials_for(*measured, noise=noise))
    while decision.configuration is not None and len(steps) < most:
        steps.append(decision)
        measured.append(chosen(decision))
        decision = decide(trials_for(*measured, noise=noise))
    return steps, decision


def test_then_the_start_worth_most_until_none_is_worth_its_cost() -> None:
    """From off and both largest k: the probabilistic drafter inside the range (it accepts more at
    the same cost), each start saying what it is expected to buy, never more starts than the grid, and a stop
    once no start is worth its time, with the true best measured and fewer starts than the grid."""
    measured = [(0, "off"), (5, "greedy"), (5, "probabilistic")]
    first = decide(trials_for(*measured))
    assert first.phase == "worth it" and "expected to buy" in first.reason
    k, method = chosen(first)
    assert method == "probabilistic" and k < 5
    assert first.value is not None and first.value.share >= first.price_share > 0
    steps, stop = run_until_stop(measured, noise=0.01)
    assert stop.phase == "stop", [s.reason for s in steps]
    assert "no start is worth its time" in stop.reason or "more than the tolerance" in stop.reason
    assert all(s.phase == "worth it" and s.value.share >= s.price_share for s in steps[1:])
    # never more starts than the grid; each start counts itself among those expected
    assert all(s.budget.starts < s.budget.cap == SPACE.size() for s in steps)
    assert all(s.budget.starts < s.budget.expected <= SPACE.size() for s in steps)
    assert best_by_truth() in measured
    # The pick is k = 3 (the truth's best) or k = 2, 1.4% behind it: k = 2's one start drew 2.0%
    # high, and a line through three draft lengths is weighed against what they measured (it
    # cannot be tested for a bend), so that draw tips the leaders within the 2% the figures allow.
    pick = stop.picks[("prose", 1)]
    assert pick.drafter == PROBABILISTIC
    assert true_rate(pick.num_speculative_tokens, "probabilistic") >= 0.98 * true_rate(*best_by_truth())
    assert len(measured) <= 7 < SPACE.size()


def test_the_stop_fires_when_no_start_can_change_the_paste() -> None:
    """Every probabilistic k measured with a little noise, the leader twice; greedy accepts 15% less
    at the same cost: no start is worth it, and the noise rests on the repeat, the sibling pair and
    the engine's usual noise."""
    measured = [(0, "off"), (5, "greedy")] + [(k, "probabilistic") for k in range(1, 6)] + [(3, "probabilistic")]
    steps, decision = run_until_stop(measured, noise=0.01)
    assert len(steps) <= 1, [s.reason for s in steps]
    assert decision.phase == "stop", decision.reason
    noise = decision.noise["prose"]
    assert 0.01 <= noise.relative_sd < 0.05 and noise.repeated >= 1 and noise.prior == USUAL_RUN_NOISE
    assert "the engine's usual 2%" in noise.basis
    pick = decision.picks[("prose", 1)]
    assert true_rate(pick.num_speculative_tokens, "probabilistic") >= 0.98 * true_rate(*best_by_truth())


def test_the_search_stops_on_the_model_the_report_draws() -> None:
    """One observation builder and one acceptance fit: the step-time model the search decided on is
    the report's, and so is each drafter's chosen decay model and its parameters."""
    measured = [(0, "off"), (5, "greedy")] + [(k, "probabilistic") for k in range(1, 6)] + [(3, "probabilistic")]
    _, decision = run_until_stop(measured, noise=0.01)
    assert decision.phase == "stop"
    trials = trials_for(*measured, noise=0.01)
    configs = [read_trial(t).measured_config() for t in trials]
    analysis = analyze_study(
        configs, workloads=["prose"], concurrency_levels=[1], objective_concurrency=1, k_max=5,
        noise_prior=NoisePriors(USUAL_RUN_NOISE),
    )  # fmt: skip
    searched = decision.models["prose"]
    assert searched.throughput == analysis.models["prose"]
    reported = {a.drafter: a.fit for a in analysis.acceptance if a.workload == "prose"}
    assert set(searched.fits) == set(reported) and len(reported) == 2
    for drafter, fit in searched.fits.items():
        assert fit.chosen == reported[drafter].chosen
        assert fit.model(fit.chosen).params == reported[drafter].model(fit.chosen).params


def test_the_stop_does_not_fire_while_an_untried_config_can_beat_the_pick() -> None:
    # The line is pinned (k = 1, 2, 5), but the true best k = 3 is untried.
    assert best_by_truth() == (3, "probabilistic")  # docs/math.md#worked-numbers: technical, c = 0.10
    measured = [(0, "off"), (5, "greedy"), (5, "probabilistic"), (2, "probabilistic"), (1, "probabilistic")]
    decision = decide(trials_for(*measured, noise=0.01))
    assert decision.configuration is not None and chosen(decision) in ((3, "probabilistic"), (4, "probabilistic"))
    assert not decision.repeat and decision.value.share >= decision.price_share


def test_no_repeat_is_spent_where_the_data_already_has_the_noise() -> None:
    """Before any repeat the noise is the step model's start effect over the five starts, drawn
    toward the engine's usual one; at 1% noise the search reaches its stop without measuring
    anything twice."""
    measured = [(0, "off"), (5, "greedy"), (5, "probabilistic"), (1, "greedy"), (1, "probabilistic")]
    decision = decide(trials_for(*measured, noise=0.01))
    noise = decision.noise["prose"]
    assert noise.repeated == 0 and noise.starts == 5 and noise.prior is not None
    steps, stop = run_until_stop(measured, noise=0.01)
    assert stop.phase == "stop" and not any(s.repeat for s in steps), [s.reason for s in steps]


def test_leaders_that_matter_are_measured_again_when_it_is_worth_it() -> None:
    """Five configurations measured once under 8% run-to-run noise: the leaders are a few percent
    apart; every start is one worth its price (a repeat saying what it is expected to buy), never
    more than two starts each, never more starts than the grid's eleven, and the pick ends within
    2% of the truth's best."""
    measured = [(0, "off")] + [(k, "probabilistic") for k in (1, 3, 5)] + [(5, "greedy")]
    steps, decision = run_until_stop(measured, noise=0.08)
    again = [s for s in steps if s.repeat]
    assert all(" again: expected to buy" in s.reason for s in again), [s.reason for s in steps]
    assert all(s.value.share >= s.price_share for s in steps)
    assert decision.phase == "stop"
    starts = {c: measured.count(c) for c in set(measured)}
    assert max(starts.values()) <= 2 and len(measured) <= SPACE.size()
    pick = decision.picks[("prose", 1)]
    assert true_rate(pick.num_speculative_tokens, pick.drafter.draft_sample_method) >= 0.98 * true_rate(
        *best_by_truth()
    )


def test_both_draft_samplings_on_one_line_need_no_repeat_at_four_percent() -> None:
    """Nine of the eleven configurations measured once under 4% noise: both draft samplings share
    one step-time line with one factor (they run the same passes), so every start informs each
    leader and none is worth a second start; the pick is within 2% of the truth's best."""
    measured = [(0, "off")] + [(k, "probabilistic") for k in range(1, 6)] + [(k, "greedy") for k in (1, 3, 5)]
    steps, decision = run_until_stop(measured, noise=0.04)
    assert decision.phase == "stop" and not any(s.repeat for s in steps), [s.reason for s in steps]
    model = decision.models["prose"].throughput.posterior
    assert model.methods == model.sampled_methods == ("dspark",)  # one set of costs, one factor between them
    pick = decision.picks[("prose", 1)]
    assert true_rate(pick.num_speculative_tokens, pick.drafter.draft_sample_method) >= 0.98 * true_rate(
        *best_by_truth()
    )


def test_leaders_within_the_tolerance_are_never_separated() -> None:
    """k = 3 and k = 4 0.03% apart in truth (at c = 0.036), measured twice each with the rest of the
    probabilistic line on a steady engine: at a 1% tolerance no start separates them and the stop
    says either is fine; at a 0.1% tolerance the data cannot say that of them."""
    c = 0.036
    line = [(k, "probabilistic") for k in range(1, 6)]
    measured = [(0, "off"), (5, "greedy"), *line, *line]
    trials = [read_trial(make_trial(i, k, m, c=c)) for i, (k, m) in enumerate(measured)]
    assert 0 < 1 - true_rate(3, "probabilistic", c=c) / true_rate(4, "probabilistic", c=c) < 0.001
    steady_engine = NoisePriors(RunNoisePrior(relative_sd=0.01, df=20, source="a steady engine"))
    steady = replace(SETTINGS, noise_prior=steady_engine)
    loose = decide_next(trials, SPACE, steady)
    assert loose.phase == "stop", loose.reason
    first = loose.ties[0].line
    assert "k=3 probabilistic" in first and "k=4 probabilistic" in first
    assert first.endswith("either is fine") or "a start of it is expected to buy 0.0" in first
    assert all(len("leaders: " + tie.short) <= 100 for tie in loose.ties)  # the console's one line
    strict = decide_next(trials, SPACE, replace(steady, tolerance=0.001))
    assert not any("either is fine" in tie.line for tie in strict.ties)
    # What it says instead: how much faster the rival could be, how likely, and what a start buys.
    rivals = [tie.line for tie in strict.ties if " could be up to " in tie.line]
    said = r"\([\d.]+% upper end; (<1|\d+)% likely to be more than 0\.1% faster\); a start of it is expected to buy"
    assert rivals and all(re.search(said, tie) for tie in rivals), rivals


def test_a_configuration_that_failed_in_this_run_is_never_measured_again() -> None:
    """A repeat or a tie to separate whose server start failed (a crash, a lost node) is not chosen
    again in the run: the study loop turns such a trial away, and choosing it again looped forever."""
    measured = [(0, "off")] + [(k, "probabilistic") for k in (1, 3, 5)] + [(5, "greedy")]
    steps, _ = run_until_stop(list(measured), noise=0.08)
    step = next((s for s in steps if s.repeat), steps[0]) if steps else decide(trials_for(*measured))
    failed = {step.configuration.key if step.configuration is not None else None}
    trials = trials_for(*measured, noise=0.08)
    for _ in range(11 - len(measured) + 1):  # the grid has 11: at most 6 more starts, then a stop
        decision = decide(trials, exclude=failed)
        if decision.configuration is None:
            break
        assert decision.configuration.key not in failed, decision.reason
        trials.append(make_trial(len(trials), *chosen(decision), noise=0.08))
    else:
        raise AssertionError("the search did not stop")


def test_a_failed_largest_k_moves_the_acceptance_run_down() -> None:
    failed = SPACE.configuration(SPACE.params_for({"num_speculative_tokens": 5})).key
    decision = decide(trials_for((0, "off")), exclude={failed})
    assert decision.phase == "largest k" and chosen(decision) == (4, "greedy")


def test_resume_decides_from_the_stored_trials(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = optuna.create_study(study_name="s", storage=storage, direction="maximize")
    for trial in trials_for((0, "off"), (5, "greedy"), (5, "probabilistic")):
        study.add_trial(trial)
    before = decide(study.get_trials(deepcopy=False))
    again = optuna.load_study(study_name="s", storage=storage)
    after = decide(again.get_trials(deepcopy=False))
    assert after.phase == before.phase == "worth it" and after.configuration == before.configuration
    assert before.configuration is not None and after.configuration.params == before.configuration.params
    # A worker that is measuring a configuration keeps the others off it.
    running = again.ask(fixed_distributions=DISTRIBUTIONS)
    running.set_user_attr("key", before.configuration.key)
    other = decide(again.get_trials(deepcopy=False))
    assert other.configuration != before.configuration


def small_model_study(name: str, **search) -> dict:
    return emulator_study(
        name, seed=77, workloads={"technical": 1.0}, requests=4, max_tokens=200, study={"sampler": "model"},
        search=search,
    )  # fmt: skip


def test_a_stopped_model_study_resumes_where_its_trials_leave_off(tmp_path: Path) -> None:
    config = parse_study_config(small_model_study("resume"))
    paths = study_paths(config, tmp_path)
    first = StudyRunner(config, paths).run(max_trials=2)
    assert first.starts == 2 and "trial budget" in first.stop_reason
    events = []
    second = StudyRunner(config, paths, resume=True, on_event=events.append).run()
    plans = [e for e in events if isinstance(e, Planned)]
    assert plans and plans[0].phase != "speculation off"  # off and k = 4 are not measured again
    measured = [t for t in read_trials(second.study) if t.measured]
    firsts = [t.key for t in measured if not t.repeat]  # every configuration measured once, repeats aside
    assert len(firsts) == len(set(firsts)) and len(measured) == first.starts + second.starts
    # the grid's size is the cap: never more starts than configurations, and a study that reached it
    # stopped there or on the rule (nothing left worth a start), never on anything else
    assert len(measured) <= second.space.size()
    assert len(measured) < second.space.size() or re.search(
        r"every configuration|as many server starts as there are configurations to measure|no start is worth"
        r"|no start could change",
        second.stop_reason,
    )


def test_model_study_on_the_emulator_picks_within_tolerance_in_fewer_starts_than_a_grid(tmp_path: Path) -> None:
    """Prose on the default profile at its reference temperature: 11 configurations in the grid."""
    config_file = tmp_path / "prose.toml"
    write_study(
        config_file,
        emulator_study(
            "prose-model", seed=11, time_scale=100, startup_s=20, k=(1, 5), requests=12, max_tokens=600,
            temperature=0.6, study={"sampler": "model"}, server={"ready_timeout_s": 60},
        ),
    )  # fmt: skip
    result = specsweep("study", "--config", str(config_file), "--verbose", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "11 configurations" in out
    stop = re.search(r"stopped: (.+?) \((\d+) server starts this run\)", out, re.DOTALL)  # --verbose: in full
    assert stop and ("no start is worth its time" in stop.group(1) or "tolerance" in stop.group(1)), out
    starts = int(stop.group(2))
    assert starts <= 7
    lefts = [int(m) for m in re.findall(r"start \d+ of at most (\d+)[;,]", out)]
    assert lefts == [11] * starts, out
    match = re.fullmatch(r"k=(\d+) (\w+)", picks_of(out)[("prose", 1)])  # the recommendation
    assert match, out
    # The one rule picks the least expected loss against the study's tolerance (1%): the pick is
    # within it of the truth's best, and a pick short of the best names the best among its rivals.
    rates = true_rates("prose", 1, 5)
    best, picked = max(rates, key=rates.__getitem__), (int(match.group(1)), match.group(2))
    assert rates[picked] >= 0.99 * rates[best], out
    assert picked == best or f"k={best[0]} dspark ({best[1]})" in " ".join(out.split()), out
    snippet = re.search(r"--speculative-config '(.+)'", out)
    assert json.loads(snippet.group(1))["num_speculative_tokens"] == int(match.group(1))


@pytest.mark.parametrize("sampler", ["grid", "tpe", "random"])
def test_the_other_samplers_stay_selectable(sampler: str) -> None:
    config = parse_study_config(small_model_study("x") | {"study": {"name": "x", "sampler": sampler}})
    assert config.sampler == sampler
    assert parse_study_config({"study": {"name": "y"}}).sampler == "model"


# An n-gram drafter (llama.cpp's ngram-simple, lookup 3), as on the real server in docs/search.md:
# every draft length near speculation off, except k = 7, which the text's matches favour.
NGRAM_SPACE = build_space(
    SearchSpace(
        num_speculative_tokens=(1, 8), fixed={"method": "ngram", "prompt_lookup_max": 3, "prompt_lookup_min": 3}
    ),
    temperature=0.0,
    engine_has_draft_sample_method=True,
)
NGRAM_RATES = {0: 54.2, 1: 55.5, 2: 55.0, 3: 54.1, 4: 55.3, 5: 54.0, 6: 54.8, 7: 66.7, 8: 50.7}


def ngram_trial(number: int, k: int):
    """A completed trial on the n-gram space: its rate from NGRAM_RATES, acceptance decaying per position."""
    grid = NGRAM_SPACE.grid()
    distributions = {name: optuna.distributions.CategoricalDistribution(values) for name, values in grid.items()}
    params = NGRAM_SPACE.params_for(None if k == 0 else {"num_speculative_tokens": k})
    spec = NGRAM_SPACE.config_from_params(params)
    row = {"output_tokens_per_s": NGRAM_RATES[k], "errors": 0, "requests": 12}
    if k:
        counts = [round(400 * 0.5 * 0.8**i) for i in range(k)]
        row |= {"num_drafts": 400, "accepted_per_position": counts, "mean_acceptance_length": 1 + sum(counts) / 400}
    trial = optuna.trial.create_trial(
        params=params, distributions=distributions, value=NGRAM_RATES[k],
        user_attrs={"key": Configuration(spec=spec).key, "spec": None if spec is None else spec.to_json(),
                    "results": {"prose": {"1": row}}, "constraints": [0.0]},
    )  # fmt: skip
    trial.number = number  # each its own server start
    return trial


def test_a_drafter_that_looks_drafts_up_is_searched_by_the_one_model_in_fewer_starts_than_the_grid() -> None:
    """An n-gram drafter is no branch of the search: from off, k = 8 and k = 3 the one step model
    carries its step times, each start is one worth its price (here, on rates within 2% of each
    other, repeats of the leaders), never more than the grid's nine, with a measured configuration
    picked."""
    ks = [0, 8, 3]
    steps = []
    while len(steps) < NGRAM_SPACE.size():
        trials = [read_trial(ngram_trial(i, k)) for i, k in enumerate(ks)]
        decision = decide_next(trials, NGRAM_SPACE, SETTINGS)
        if decision.configuration is None:
            break
        steps.append(decision)
        ks.append(decision.configuration.num_speculative_tokens)
    assert decision.phase == "stop" and len(ks) <= NGRAM_SPACE.size(), ks
    assert all(s.phase == "worth it" and s.value.share >= s.price_share for s in steps)
    assert decision.picks[("prose", 1)].num_speculative_tokens in ks


def test_draft_lengths_the_engine_says_never_draft_are_not_started() -> None:
    """llama.cpp's ngram-simple copies no draft shorter than its lookup n-gram (3 here), so k = 1 and 2
    run as speculation off: with the engine's rule the same n-gram space spends no start on them,
    and says why k = 1 and 2 were left out."""
    space = replace(NGRAM_SPACE, validate=llamacpp.validate_spec_config, never_drafts=llamacpp.never_drafts)
    assert space.size() == NGRAM_SPACE.size() == 9  # the grid still holds them
    assert any(
        "k = 1, 2: llama.cpp's ngram-simple drafts nothing below its lookup length (3:" in n for n in space.notes()
    )
    ks = [0, 8, 3]
    while True:
        decision = decide_next([read_trial(ngram_trial(i, k)) for i, k in enumerate(ks)], space, SETTINGS)
        if decision.configuration is None:
            break
        ks.append(decision.configuration.num_speculative_tokens)
    assert 1 not in ks and 2 not in ks, ks
    assert len(ks) <= NGRAM_SPACE.size() - 2, ks  # the two starts are saved, not spent on repeats instead
    assert decision.picks[("prose", 1)].num_speculative_tokens in ks


def test_a_drafter_that_takes_its_top_token_is_predicted_not_measured_at_every_k() -> None:
    """llama.cpp's dspark ignores the draft sampling (it takes the draft's top token), but it drafts at
    every step: its step time is a line in k, so after off and its largest k the search predicts the
    rest (no "every k" phase), and stops before measuring every draft length."""
    space = replace(
        SPACE, fixed={"method": "dspark", "model": "d.gguf"}, validate=llamacpp.validate_spec_config,
        samples_drafts=llamacpp.drafts_from_a_distribution, looks_up=llamacpp.looks_up,
    )  # fmt: skip
    assert space.size() == 1 + 5  # one draft sampling: the same server either way
    ks = [0, 5]
    phases = []
    while True:
        trials = [read_trial(make_trial(i, k, "greedy", space=space)) for i, k in enumerate(ks)]
        decision = decide_next(trials, space, SETTINGS)
        if decision.configuration is None:
            break
        phases.append(decision.phase)
        ks.append(decision.configuration.num_speculative_tokens)
    assert "every k" not in phases, phases
    assert len(set(ks)) < space.size(), ks


def test_a_lookup_level_counts_its_undrafted_steps_from_its_counters() -> None:
    """Ten requests of 100 tokens decode 990 tokens after their first; the counters saw 200 drafts
    and 300 accepted tokens (2.5 per drafting step). Each step emits one token plus what it
    accepted, so the requests took 990 - 300 = 690 steps, of which 200 drafted: a share of 200/690,
    and 990/690 tokens per step over all of them, which is what the step model's time is built on."""
    records = [
        RequestRecord(prompt_id=str(i), started_at=0.0, max_tokens=100, completion_tokens=100) for i in range(10)
    ]
    acceptance = AcceptanceSummary(
        per_position=(0.9, 0.6),
        conditional=(0.9, 2 / 3),
        num_drafts=200,
        mean_acceptance_length=2.5,
        draft_acceptance_rate=0.75,
    )
    summary = SimpleNamespace(acceptance=acceptance, counted_drafts=200.0)
    share = level_drafted_share(records, summary)  # type: ignore[arg-type]
    assert share == pytest.approx(200 / 690)
    always = SimpleNamespace(
        acceptance=replace(acceptance, num_drafts=396, mean_acceptance_length=2.5), counted_drafts=396
    )
    assert level_drafted_share(records, always) is None  # type: ignore[arg-type]  # 396 of 396 steps drafted

    trial = ngram_trial(3, 3)
    trial.user_attrs["results"]["prose"]["1"] |= {"mean_acceptance_length": 2.5, "drafted_share": share}
    (observation,) = study_observations([read_trial(trial).measured_config()], "prose")
    assert observation.tokens_per_step == pytest.approx(990 / 690)
    assert observation.drafted_share == pytest.approx(200 / 690)


def test_a_configuration_is_its_key_whatever_parameters_named_it() -> None:
    greedy, probabilistic = (
        NGRAM_SPACE.configuration({"num_speculative_tokens": 2, "draft_sample_method": method})
        for method in ("greedy", "probabilistic")
    )
    # at temperature 0, and for a drafter that samples nothing, both draft samplings are one server
    assert greedy.params != probabilistic.params and greedy == probabilistic and len({greedy, probabilistic}) == 1
    assert greedy.key == '{"method":"ngram","num_speculative_tokens":2,"prompt_lookup_max":3,"prompt_lookup_min":3}'
    assert Configuration.from_key(greedy.key) == greedy and greedy.num_speculative_tokens == 2
    off = NGRAM_SPACE.configuration(NGRAM_SPACE.params_for(None))
    assert off.spec is None and off.key == OFF_KEY == "off" and Configuration.from_key("off") == off
    assert len(NGRAM_SPACE.configurations()) == NGRAM_SPACE.size() == 9  # off and k = 1..8, each once
    assert (configuration_label(greedy), configuration_label(off, short=True)) == (
        'k=2 ngram prompt_lookup_max=3,prompt_lookup_min=3 (greedy)', "speculation off",
    )  # fmt: skip


def test_a_levels_error_in_the_step_model_is_paired_on_the_prompts_the_levels_share() -> None:
    """Three n-gram levels send the same twelve prompts, whose rates spread 20% between prompts
    and by 4% within one: the stored requests (read back from the study's storage form) give each
    level about the 4% over sqrt(12), not the 20% its own spread says; a level that kept no requests, or
    speculation off alone in its group, keeps its own."""
    spread = [1.0 + 0.2 * ((7 * p) % 12 - 5.5) / 5.5 for p in range(12)]
    draw = random.Random(5)
    jitter = [draw.gauss(0.0, 0.04) for _ in range(36)]
    trials = []
    for number, k in enumerate([0, 8, 3, 5]):
        trial = ngram_trial(number, k)
        row = trial.user_attrs["results"]["prose"]["1"]
        rates = [NGRAM_RATES[k] * s * (1 + jitter[(number % 3) * 12 + p]) for p, s in enumerate(spread)]
        row["relative_se"] = 0.2 / 12**0.5
        if k != 5:
            row["by_request"] = [[f"p{p}", rate, None] for p, rate in enumerate(rates)]
        trials.append(trial)
    by_k = {
        o.num_speculative_tokens: o
        for o in study_observations([read_trial(t).measured_config() for t in trials], "prose")
    }
    for k in (8, 3):
        assert by_k[k].relative_se == pytest.approx(0.04 / 12**0.5, rel=0.35)
    assert by_k[0].relative_se == by_k[5].relative_se == pytest.approx(0.2 / 12**0.5)
