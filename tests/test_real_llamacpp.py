"""Real llama.cpp `llama-server` with Gemma 3 270M and a real Q2_K draft model, on the CPU.

Built and cached by scripts/setup-real-engines; skipped locally when missing (run with
SPECSWEEP_SKIP_REAL_ENGINES unset to build), required in CI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import pairwise
from pathlib import Path

import optuna
import pytest

from specsweep.config import parse_study_config
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.runtime.measure import MeasureSettings, run_measure
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths
from specsweep.workload import load_workload

from .conftest import draft_methods_alike_p_value

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


def test_measured_acceptance_matches_the_servers_own_timings(real_engines, tmp_path: Path) -> None:
    port = free_port()
    spec_args = ["-md", real_engines.draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    with ServerProcess(real_engines.server_argv(port, spec_args), log_path=tmp_path / "llama.log") as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=120)
        settings = MeasureSettings(
            endpoint=f"http://127.0.0.1:{port}", api="completions", concurrency=(1,), requests=3, warmup=1,
            max_tokens=64, temperature=0.0,
        )  # fmt: skip
        measurement = run_measure(settings, load_workload("prose"))
    assert measurement.engine == "llama.cpp"
    level = measurement.levels[0]
    summary = level.summary
    assert summary.errors == 0, level.notes
    assert all(r.completion_tokens == 64 or r.stopped_early for r in level.records)
    # Counter differences over the window and the per-request timings agree exactly.
    client = summary.client_acceptance
    assert client is not None and client.drafted_tokens > 0
    assert level.delta.num_draft_tokens == client.drafted_tokens
    assert level.delta.num_accepted_tokens == client.accepted_tokens
    assert summary.acceptance.draft_acceptance_rate == pytest.approx(client.draft_acceptance_rate)
    per_position = summary.acceptance.per_position
    assert len(per_position) == 4 and all(b <= a for a, b in pairwise(per_position))
    assert summary.acceptance.mean_acceptance_length == pytest.approx(
        1 + level.delta.num_accepted_tokens / level.delta.num_drafts
    )
    # llama.cpp streams one token per chunk even under speculation: usage and chunks agree here.
    assert sum(r.num_chunks for r in level.records) == sum(r.completion_tokens for r in level.records)


@pytest.mark.parametrize(
    ("fixed", "k_range"),
    [
        ({"method": "draft_model"}, [2, 4]),
        ({"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3}, [2, 6]),
    ],
    ids=["draft-model", "ngram"],
)
def test_study_sweeps_draft_length_on_real_llama_server(real_engines, tmp_path: Path, fixed: dict, k_range) -> None:
    if fixed["method"] == "draft_model":
        fixed = {**fixed, "model": real_engines.draft}
    data = {
        "study": {"name": "llama", "sampler": "grid", "max_consecutive_failures": 2},
        "server": {
            "engine": "llama.cpp",
            "mode": "process",
            "api": "completions",
            "ready_timeout_s": 120,
            "stop_grace_s": 10,
            "start": real_engines.server_argv("{port}", ["{spec_args}"]),
        },
        "search": {"num_speculative_tokens": k_range, "fixed": fixed},
        "workloads": {"technical": 1.0},
        "measure": {"concurrency": [1], "requests": 2, "warmup": 1, "max_tokens": 48, "temperature": 0.0},
    }
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    complete = [t for t in outcome.study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert {t.user_attrs["key"] for t in complete} >= {"off"}
    assert len(complete) == 1 + k_range[1] - k_range[0] + 1, [
        t.user_attrs.get("fail_reason") for t in outcome.study.trials
    ]
    for trial in complete:
        row = trial.user_attrs["results"]["technical"]["1"]
        assert row["output_tokens_per_s"] > 0 and row["errors"] == 0
        k = trial.params["num_speculative_tokens"]
        argv = trial.user_attrs["argv"]
        # the start's prefill speed is kept, and a start is compared on it with off's only where its
        # first token costs what off's does: an n-gram lookup's, not a draft model's (which prefills too)
        assert row["prefill_tokens_per_s"] > 0
        assert trial.user_attrs["first_token_as_off"] == (k == 0 or fixed["method"] == "ngram")
        if k:
            # the server ran with the draft length the trial asked for, and drafted
            flag = "--spec-draft-n-max" if fixed["method"] == "draft_model" else "--spec-ngram-simple-size-m"
            assert argv[argv.index(flag) + 1] == str(k)
            if fixed["method"] == "draft_model":
                assert row["num_drafts"] and len(row["per_position"]) == k
            elif row["num_drafts"]:  # n-gram lookup drafts only where the text repeats itself
                assert len(row["per_position"]) == k
        else:
            assert "--spec-type" not in argv and row["per_position"] is None


def test_cli_measure_on_real_llama_server(real_engines, tmp_path: Path) -> None:
    port = free_port()
    spec_args = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4"]
    with ServerProcess(real_engines.server_argv(port, spec_args), log_path=tmp_path / "llama.log") as server:
        server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=120)
        result = subprocess.run(
            [sys.executable, "-m", "specsweep", "measure", "--endpoint", f"http://127.0.0.1:{port}",
             "--workload", "technical", "--api", "completions", "--concurrency", "1", "--requests", "2",
             "--max-tokens", "48"],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "engine llama.cpp" in result.stdout and "single stream" in result.stdout
    assert "per-request timings" in result.stdout


def _llama_study(real_engines, tmp_path: Path, name: str, search: dict, measure: dict, workload: Path):
    data = {
        "study": {"name": name, "sampler": "grid", "max_consecutive_failures": 2},
        "server": {
            "engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
            "stop_grace_s": 10, "start": real_engines.server_argv("{port}", ["{spec_args}"]),
        },
        "search": {**search, "fixed": {"method": "draft_model", "model": real_engines.draft}},
        "workloads": {str(workload): 1.0},
        "measure": {"concurrency": [1], "warmup": 1, **measure},
    }  # fmt: skip
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    trials = outcome.study.trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    return complete, [t.user_attrs.get("fail_reason") for t in trials]


# Five and three starts with the draft model: about three and one minutes on an idle 2-core machine.
@pytest.mark.timeout(900)
def test_study_sweeps_draft_length_and_draft_sampling_on_real_llama_server(
    real_engines, short_prompts: Path, tmp_path: Path
) -> None:
    """k x draft sampling with the Q2_K draft at temperature 0.8: the build's --spec-draft-sampling
    is passed, and the two methods' accepted lengths differ beyond chance."""
    complete, reasons = _llama_study(
        real_engines, tmp_path, "llama-sampling",
        {"num_speculative_tokens": [2, 3], "draft_sample_method": ["greedy", "probabilistic"]},
        {"requests": 8, "max_tokens": 64, "temperature": 0.8}, short_prompts,
    )  # fmt: skip
    assert len(complete) == 1 + 2 * 2, reasons  # off, and every k with every method
    rows: dict[int, dict[str, dict]] = {}
    for trial in complete:
        row = trial.user_attrs["results"][str(short_prompts)]["1"]
        assert row["output_tokens_per_s"] > 0 and row["errors"] == 0
        argv = trial.user_attrs["argv"]
        if not trial.user_attrs["spec"]:
            assert "--spec-type" not in argv
            continue
        spec = json.loads(trial.user_attrs["spec"])
        method = spec.get("draft_sample_method", "greedy")
        assert argv[argv.index("--spec-draft-sampling") + 1] == method
        assert argv[argv.index("--spec-draft-n-max") + 1] == str(spec["num_speculative_tokens"])
        assert len(row["per_position"]) == spec["num_speculative_tokens"] and row["num_drafts"] > 0
        rows.setdefault(spec["num_speculative_tokens"], {})[method] = row
    # The same server under two names would accept alike; p < 0.001 says the flag changed drafting.
    p_value = draft_methods_alike_p_value(rows)
    assert p_value < 0.001, (p_value, {k: {m: r["per_position"] for m, r in v.items()} for k, v in rows.items()})


@pytest.mark.timeout(600)
def test_study_opens_p_min_on_real_llama_server(real_engines, short_prompts: Path, tmp_path: Path) -> None:
    """p_min, llama.cpp's confidence cut-off, opened in a study: without it every draft runs to k
    tokens (bar the end of a completion); with a high cut-off drafts stop early and what is drafted
    is accepted more often."""
    complete, reasons = _llama_study(
        real_engines, tmp_path, "llama-p-min",
        {"num_speculative_tokens": [4, 4], "open": {"p_min": [0.0, 0.9]}},
        {"requests": 3, "max_tokens": 64, "temperature": 0.0}, short_prompts,
    )  # fmt: skip
    assert len(complete) == 3, reasons
    by_p_min = {}
    for trial in complete:
        spec = json.loads(trial.user_attrs["spec"] or "null")
        if spec is None:
            continue
        argv = trial.user_attrs["argv"]
        assert float(argv[argv.index("--spec-draft-p-min") + 1]) == spec["p_min"]
        record = json.loads((tmp_path / "llama-p-min" / trial.user_attrs["record"]).read_text())
        level = record["workloads"][str(short_prompts)]["levels"][0]
        drafted = level["client_acceptance"]["drafted_tokens"]
        by_p_min[spec["p_min"]] = (
            drafted / level["acceptance"]["num_drafts"],
            level["client_acceptance"]["accepted_tokens"] / drafted,
        )
    (length_0, rate_0), (length_9, rate_9) = by_p_min[0.0], by_p_min[0.9]
    assert 3.5 <= length_0 <= 4.0 and length_9 < length_0 - 1, by_p_min
    assert rate_9 > rate_0, by_p_min
