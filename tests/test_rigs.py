"""Rig files: the pure model and file shape, and measure --rig / study --rig on the emulator."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import optuna
import pytest

from specsweep.analysis.drafters import Candidate, Drafter
from specsweep.emulator.model import acceptance_curve, closed_loop_tokens_per_s, prefill_time_s, step_time_s
from specsweep.emulator.profile import load_profile
from specsweep.engines.registry import server_args_without_spec
from specsweep.engines.vllm import validate_speculative_config
from specsweep.errors import ConfigError
from specsweep.rigs.file import check_identity, rig_from_dict, rig_to_dict
from specsweep.rigs.model import RIG_SCHEMA_VERSION, LevelTiming, RequestShape, RigIdentity, fit_rig
from specsweep.rigs.workload import WorkloadTiming, recommend_with_rig

from .builders import emulator_study, specsweep, write_study

PROFILE = "dgx-spark-v4-flash"
DRAFTER = Drafter(method="dspark", draft_sample_method="probabilistic")
IDENTITY = RigIdentity(
    engine="vllm", engine_version="0.33.0", model="m", server_args=("vllm", "serve", "m", "--max-model-len", "4096")
)
SHAPE = RequestShape(api="chat", temperature=0.6, max_tokens=600, workloads={"prose": {"prompt_tokens": 400.0}})


def spec(k: int):
    return validate_speculative_config(
        {"method": "dspark", "num_speculative_tokens": k, "draft_sample_method": "probabilistic"}
    )


def exact_levels(workload: str, ks=range(0, 6), levels=(1, 4), m: float = 600.0, prompt: int = 400):
    """Levels as the emulator's single-stream model has them (B = 1 exact; B = 4 decode-only)."""
    profile = load_profile(PROFILE)
    out = []
    for b in levels:
        for k in ks:
            curve = acceptance_curve(profile, workload, spec(k) if k else None, 0.6)
            e = 1.0 + sum(curve)
            t = step_time_s(profile, spec(k) if k else None, k, b)
            span = (m - 1) / e * t
            overhead = profile.timing.request_overhead_s + prefill_time_s(profile, prompt)
            rate = b * m / (overhead * b + span)
            out.append(
                LevelTiming(
                    num_speculative_tokens=k,
                    concurrency=b,
                    drafter=DRAFTER if k else None,
                    output_tokens_per_s=rate,
                    tokens_per_step=e,
                    completion_tokens=m,
                    decode_span_s=span,
                    prompt_tokens=prompt,
                    requests=12,
                    workload=workload,
                )
            )
    return out


def test_level_timing_splits_decode_step_from_request_overhead() -> None:
    level = exact_levels("prose", ks=[3], levels=[1])[0]
    profile = load_profile(PROFILE)
    assert level.decode_step_time_s == pytest.approx(step_time_s(profile, spec(3), 3, 1))
    assert level.request_overhead_s == pytest.approx(0.008 + 400 / 3000)


def test_rig_file_round_trips_and_refits_the_same_model() -> None:
    rig = fit_rig(exact_levels("prose"), identity=IDENTITY, shape=SHAPE)
    data = json.loads(json.dumps(rig_to_dict(rig)))
    assert data["schema"] == "specsweep-rig" and data["schema_version"] == RIG_SCHEMA_VERSION
    assert data["identity"]["engine_version"] == "0.33.0"
    assert set(data["step_time"]) == {"pooled_relative_sd", "start_sd", "cell_sd", "basis"}
    assert data["step_time"]["basis"].startswith("one step model over")
    again = rig_from_dict(data)
    assert again.identity == rig.identity and again.shape == rig.shape and again.levels == rig.levels
    assert again.model == rig.model and again.model.basis == rig.model.basis
    assert again.drafters == (DRAFTER,) and again.draft_lengths(DRAFTER) == (1, 2, 3, 4, 5)


def test_rig_file_of_another_schema_version_is_refused() -> None:
    data = rig_to_dict(fit_rig(exact_levels("prose"), identity=IDENTITY, shape=SHAPE))
    with pytest.raises(ConfigError, match="schema version 2"):
        rig_from_dict({**data, "schema_version": 2})
    with pytest.raises(ConfigError, match="not a specsweep rig file"):
        rig_from_dict({"levels": []})
    broken = {**data, "levels": [{"concurrency": 1}]}
    with pytest.raises(ConfigError, match="damaged"):
        rig_from_dict(broken)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"engine": "sglang"}, "engine: rig 'vllm', server 'sglang'"),
        ({"engine_version": "0.34.0"}, "engine_version: rig '0.33.0', server '0.34.0'"),
        ({"model": "other"}, "model: rig 'm', server 'other'"),
        ({"server_args": ("vllm", "serve", "m", "--max-model-len", "8192")}, "only the server has '8192'"),
    ],
)
def test_a_mismatch_is_refused_with_the_field_named(change: dict, named: str) -> None:
    other = RigIdentity(**{**{f: getattr(IDENTITY, f) for f in IDENTITY.__dataclass_fields__}, **change})
    with pytest.raises(ConfigError) as error:
        check_identity(IDENTITY, other, other_name="server")
    assert named in str(error.value)


def test_what_a_server_cannot_tell_is_unchecked_not_refused() -> None:
    running = RigIdentity(engine="vllm", engine_version="0.33.0", model="m")  # flags unknown
    assert check_identity(IDENTITY, running, other_name="server") == ("server_args",)


def test_server_args_leave_out_spec_flags_host_and_port() -> None:
    argv = ["/opt/bin/llama-server", "-m", "t.gguf", "--host", "127.0.0.1", "--port=8080", "-t", "2",
            "-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]  # fmt: skip
    assert server_args_without_spec("llama.cpp", argv) == ("llama-server", "-m", "t.gguf", "-t", "2")
    vllm = ["vllm", "serve", "m", "--speculative-config", '{"num_speculative_tokens":3}', "--port", "8000"]
    assert server_args_without_spec("vllm", vllm) == ("vllm", "serve", "m")
    emulator = [sys.executable, "-m", "specsweep", "emulate", "--port", "9", "--profile", "p", "--time-scale", "50"]
    assert server_args_without_spec("emulator", emulator) == ("specsweep", "emulate", "--profile", "p")


def test_a_rig_from_prose_recommends_the_true_best_k_for_technical_from_one_running_k() -> None:
    """Exact inputs: the rig from prose, technical measured only at k=3 (its S_4, S_5 from the fit)."""
    from specsweep.analysis.fits import fit_acceptance

    profile = load_profile(PROFILE)
    rig = fit_rig(exact_levels("prose"), identity=IDENTITY, shape=SHAPE)
    running = exact_levels("technical", ks=[3], levels=[1], prompt=300)
    curve = acceptance_curve(profile, "technical", spec(3), 0.6)
    drafts = 20000.0
    fit = fit_acceptance(num_drafts=drafts, accepted_per_position=[s * drafts for s in curve], k_max=5)
    overhead = running[0].request_overhead_s
    timing = WorkloadTiming(
        workload="technical", overhead_s={1: overhead}, completion_tokens={1: 600.0},
        measured={1: (Candidate(drafter=DRAFTER, num_speculative_tokens=3), running[0].output_tokens_per_s)},
    )  # fmt: skip
    (result,) = recommend_with_rig(rig, {DRAFTER: fit}, timing, k_max=5)
    truth = {
        k: closed_loop_tokens_per_s(
            profile,
            spec(k) if k else None,
            acceptance_curve(profile, "technical", spec(5), 0.6),
            1,
            max_tokens=600,
            prompt_tokens=300,
        )
        for k in range(6)
    }
    assert result.recommendation.choice.num_speculative_tokens == max(truth, key=truth.__getitem__) == 2
    assert result.recommendation.gain_over_baseline.predicted == pytest.approx(truth[2] / truth[3] - 1, abs=0.01)
    assert result.measured_positions == 3 and result.extrapolated_positions == ()


NGRAM = Drafter(method="ngram", draft_sample_method="greedy")


def partial_drafter_level(k: int, share: float, accept, *, workload: str) -> LevelTiming:
    """One level of a drafter that drafts at a share of steps and nothing below k = 3, from first
    principles: a drafted step costs T0 (1 + 0.3 k), a plain one T0; a draft's position i is
    accepted with probability accept(i); 0.5 s of overhead per 128-token request, one stream."""
    t0, m, overhead = 0.020, 128.0, 0.5
    q = share if k >= 3 else 0.0
    e = 1.0 + q * sum(accept(i) for i in range(1, k + 1))
    step = (1.0 - q) * t0 + q * t0 * (1.0 + 0.3 * k)
    span = (m - 1.0) / e * step
    return LevelTiming(
        num_speculative_tokens=k, concurrency=1, drafter=NGRAM if k else None,
        output_tokens_per_s=m / (overhead + span), tokens_per_step=e, completion_tokens=m, decode_span_s=span,
        prompt_tokens=300.0, requests=8, workload=workload, draft_share=q if k else None,
    )  # fmt: skip


def technical_at_k5(rig):
    """The rig's recommendation for a workload that drafts at 70% of steps (acceptance 0.85^i per
    position), measured once at k = 5 on one stream."""
    from specsweep.analysis.fits import fit_acceptance

    running = partial_drafter_level(5, 0.7, lambda i: 0.85**i, workload="technical")
    steps = 50000.0  # per-step acceptance: undrafted steps accept nothing
    fit = fit_acceptance(num_drafts=steps, accepted_per_position=[0.7 * 0.85**i * steps for i in range(1, 6)], k_max=5)
    timing = WorkloadTiming(
        workload="technical", overhead_s={1: running.request_overhead_s}, completion_tokens={1: 128.0},
        measured={1: (Candidate(drafter=NGRAM, num_speculative_tokens=5), running.output_tokens_per_s)},
        draft_share={1: 0.7},
    )  # fmt: skip
    (result,) = recommend_with_rig(rig, {NGRAM: fit}, timing, k_max=5)
    return result


def test_a_drafter_that_drafts_at_some_steps_only_carries_its_share_across_k() -> None:
    """The rig's workload drafts at 40% of steps, the new one at 70%; neither drafts below k = 3.
    From one measurement at k = 5, every k's rate must come out as the generating model has it."""

    rig = fit_rig(
        [partial_drafter_level(k, 0.4, lambda i: 0.8**i, workload="prose") for k in range(6)],
        identity=IDENTITY, shape=SHAPE,
    )  # fmt: skip
    truth = {k: partial_drafter_level(k, 0.7, lambda i: 0.85**i, workload="technical") for k in range(6)}
    result = technical_at_k5(rig)
    predicted = {row.candidate.num_speculative_tokens: row.tokens_per_s for row in result.recommendation.candidates}
    for k, level in truth.items():
        assert predicted[k] == pytest.approx(level.output_tokens_per_s, rel=0.005), k
    # k = 1 and 2 draft nothing: as slow as speculation off, not sped up by S_1 and S_2
    assert predicted[2] == pytest.approx(predicted[0], rel=0.005)
    best = max(truth, key=lambda k: truth[k].output_tokens_per_s)
    assert best == 4 and result.recommendation.choice.num_speculative_tokens == best


def test_a_rarely_drafting_level_measured_faster_than_off_predicts_no_negative_rate() -> None:
    """A rig whose workload rarely drafted (5% of steps) and whose k = 3 level measured a step 15%
    below speculation off's (noise, as on a loaded machine). Scaled to a workload drafting at 70%
    of steps, that drafting cost must count as none, never as a negative step time (which made
    `measure --rig` fail on a real llama-server)."""
    from dataclasses import replace

    # the rig's prose drafts at 5% of steps; its k = 3 level measured a step 15% below off's
    levels = [partial_drafter_level(k, 0.05, lambda i: 0.8**i, workload="prose") for k in range(6)]
    e3 = levels[3].tokens_per_step
    levels[3] = replace(levels[3], decode_span_s=0.85 * levels[0].decode_span_s / e3)
    rig = fit_rig(levels, identity=IDENTITY, shape=SHAPE)
    result = technical_at_k5(rig)
    rates = {row.candidate.num_speculative_tokens: row.tokens_per_s for row in result.recommendation.candidates}
    # at k = 3 the workload drafts with no drafting cost: its rate is off's, sped up by its acceptance
    assert 0 < rates[0] < rates[3] <= rates[0] * (1 + 0.7 * sum(0.85**i for i in range(1, 4))) * 1.01


# -- on the emulator, end to end -------------------------------------------------------------


def rig_study(name: str, workload: str, *, requests: int, startup_s: float | None = None, extra=()) -> dict:
    """A grid over k = 1..5 of dspark with probabilistic drafting, at 1 and 4 streams, temperature 0.6."""
    return emulator_study(
        name, time_scale=100, startup_s=startup_s, extra_args=extra, profile="dgx-spark-v4-flash", k=(1, 5),
        workloads={workload: 1.0}, concurrency=(1, 4), requests=requests, max_tokens=600, temperature=0.6,
        study={"sampler": "grid"}, server={"ready_timeout_s": 60}, search={"draft_sample_method": "probabilistic"},
    )  # fmt: skip


@pytest.fixture(scope="module")
def prose_rig(tmp_path_factory) -> Path:
    """A real emulator study on prose (grid off, k=1..5); its rig file."""
    folder = tmp_path_factory.mktemp("rig")
    write_study(folder / "prose.toml", rig_study("prose", "prose", requests=10, startup_s=5))
    result = specsweep("study", "--config", "prose.toml", cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "(step cost per k and concurrency)" in result.stdout
    return folder / "studies" / "prose" / "rig.json"


def recommended(stdout: str) -> dict[int, int]:
    said = " ".join(stdout.split())  # as read: lines wrap at the console's width
    return {int(b): int(k) for b, k in re.findall(r"concurrency (\d+): recommended k=(\d+)", said)}


@pytest.mark.slow
def test_measure_with_a_rig_recommends_the_true_best_for_a_new_workload(prose_rig: Path, start_emulator) -> None:
    data = json.loads(prose_rig.read_text())
    assert data["identity"]["engine"] == "emulator" and data["identity"]["model"].startswith("deepseek-ai/")
    assert data["identity"]["server_args"] == ["specsweep", "emulate", "--profile", PROFILE]
    server = start_emulator(
        speculative_config='{"method":"dspark","num_speculative_tokens":3,"draft_sample_method":"probabilistic"}',
        time_scale=100, seed=7,
    )  # fmt: skip
    result = specsweep("measure", "--endpoint", server.url, "--workload", "technical", "--rig", str(prose_rig),
                       "--requests", "16", "--temperature", "0.6", cwd=prose_rig.parent)  # fmt: skip
    assert result.returncode == 0, result.stderr
    # the emulator's truth for technical at T=0.6 (bench/emulator_studies.truth_rates): k=2 alone, k=1 at 4
    assert recommended(result.stdout) == {1: 2, 4: 1}, result.stdout
    said = " ".join(result.stdout.split())  # as read: lines wrap at the console's width
    assert "measured at the running k=3" in said
    assert "expected gain over the running k=3" in said
    assert "unchecked against the running server: server_args" in said


@pytest.mark.slow
def test_measure_refuses_a_server_the_rig_was_not_measured_on(prose_rig: Path, start_emulator) -> None:
    server = start_emulator(profile="l40s-llama-8b-eagle3", time_scale=100)
    result = specsweep("measure", "--endpoint", server.url, "--workload", "technical", "--rig", str(prose_rig),
                       cwd=prose_rig.parent)  # fmt: skip
    assert result.returncode == 1
    assert "model: rig 'deepseek-ai/DeepSeek-V4-Flash-0731', server 'meta-llama/Llama-3.1-8B-Instruct'" in result.stderr
    assert "profile: rig 'dgx-spark-v4-flash', server 'l40s-llama-8b-eagle3'" in result.stderr
    assert result.stderr.count("\n") == 1  # one line


@pytest.mark.slow
def test_study_with_a_rig_starts_one_server_when_the_rig_answers(prose_rig: Path) -> None:
    folder = prose_rig.parent.parent.parent
    data = rig_study("technical", "technical", requests=10, startup_s=5)
    write_study(folder / "technical.toml", data)
    result = specsweep("study", "--config", "technical.toml", "--rig", str(prose_rig), cwd=folder)
    assert result.returncode == 0, result.stderr
    assert "1 server start(s) this run" in result.stdout
    study = optuna.load_study(study_name="technical", storage=f"sqlite:///{folder}/studies/technical/study.db")
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert [t.params["num_speculative_tokens"] for t in complete] == [5]
    assert recommended(result.stdout) == {1: 2, 4: 1}, result.stdout
    assert (folder / "studies" / "technical" / "rig.json").is_file()


@pytest.mark.slow
def test_study_refuses_a_rig_measured_under_other_flags(prose_rig: Path) -> None:
    folder = prose_rig.parent.parent.parent
    write_study(folder / "flags.toml", rig_study("flags", "technical", requests=4, extra=("--max-num-seqs", "2")))
    result = specsweep("study", "--config", "flags.toml", "--rig", str(prose_rig), cwd=folder)
    assert result.returncode == 1
    assert "server_args: only the study's server has '--max-num-seqs 2'" in result.stderr
    assert not (folder / "studies" / "flags").exists() or not list((folder / "studies" / "flags").glob("logs/*"))


def test_stored_levels_give_the_draft_share_and_keep_a_drafter_that_drafted_nothing() -> None:
    from specsweep.rigs.stored import level_timings

    def stored(acceptance, counted):
        records = [
            {"completion_tokens": 101, "prompt_tokens": 50, "ttft_s": 0.5, "last_token_s": 2.5, "error": None}
        ] * 4
        level = {"concurrency": 1, "output_tokens_per_s": 150.0, "acceptance": acceptance, "counted_drafts": counted,
                 "records": records}  # fmt: skip
        return {"workload": "prose", "levels": [level]}

    ngram = validate_speculative_config({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    (none,) = level_timings(stored(None, 0.0), ngram)  # counters ran, nothing drafted
    assert none.tokens_per_step == 1.0 and none.draft_share == 0.0 and none.drafter is not None
    assert level_timings(stored(None, None), ngram) == []  # no counters: nothing to say about its steps
    # 400 decode tokens, 100 drafts accepting 1 token each: 300 steps, a third of them drafted
    (some,) = level_timings(stored({"mean_acceptance_length": 2.0, "num_drafts": 100}, 100.0), ngram)
    assert some.tokens_per_step == pytest.approx(400 / 300) and some.draft_share == pytest.approx(100 / 300)
