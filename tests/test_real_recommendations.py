"""What a study pastes on a real llama-server stays inside what it searched and measured.

Gemma 3 270M with n-gram drafting (lookup 3) on the CPU: this build's ngram-simple drafts nothing
while its draft length is below its lookup length, a dead zone a study's range can leave out.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from specsweep.config import parse_study_config
from specsweep.tuning.records import read_trials
from specsweep.tuning.stored import analyze_stored_study
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

pytestmark = [pytest.mark.real_engine, pytest.mark.slow, pytest.mark.timeout(900)]
NGRAM = {"method": "ngram", "prompt_lookup_min": 3, "prompt_lookup_max": 3}


def llama_study(name: str, start, k_range: list[int]) -> dict:
    return {
        "study": {"name": name, "sampler": "model", "max_consecutive_failures": 3},
        "server": {
            "engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
            "stop_grace_s": 10, "start": start,
        },
        "search": {"num_speculative_tokens": k_range, "fixed": NGRAM},
        "workloads": {"prose": 1.0},  # one workload: each start of a real server costs CI time
        "measure": {"concurrency": [1], "requests": 3, "warmup": 1, "max_tokens": 64, "temperature": 0.0},
    }  # fmt: skip


def pasted_and_measured(outcome) -> tuple[dict, set[int]]:
    """What the paste runs per workload at concurrency 1, and the draft lengths measured."""
    stored = analyze_stored_study(outcome.study)
    measured = {t.num_speculative_tokens for t in read_trials(outcome.study) if t.measured}
    pasted = {w: stored.analysis.snippet(w).choice_by_concurrency[1] for w in stored.analysis.workloads}
    for rec in stored.analysis.recommendations:
        assert rec.choice.off or rec.choice.num_speculative_tokens >= 3, rec.reason  # inside the range
    return pasted, measured


def test_a_range_that_leaves_out_the_dead_zone_is_never_left(real_engines, tmp_path: Path) -> None:
    """k = 3..5 searched: nothing below 3 is recommended or pasted, and every pasted k was measured."""
    config = parse_study_config(llama_study("deadzone", real_engines.server_argv("{port}", ["{spec_args}"]), [3, 5]))
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    pasted, measured = pasted_and_measured(outcome)
    for choice in pasted.values():
        assert choice.off or 3 <= choice.num_speculative_tokens <= 5
        assert choice.num_speculative_tokens in measured


def test_a_server_killed_mid_trial_fails_its_trial_and_nothing_unmeasured_is_pasted(
    real_engines, tmp_path: Path
) -> None:
    """The server of k = 5, the largest k the search always tries first, is killed with SIGKILL a few
    seconds into its trial, every time it starts: the trial fails with the signal named first, the
    search goes on below it, and the paste runs only what was measured."""
    argv = " ".join(shlex.quote(a) for a in real_engines.server_argv("PORT", ["SPEC"]))
    serve = argv.replace("PORT", "{port}").replace("SPEC", "{spec_args}")
    # $$ is the shell, which exec turns into llama-server: the killer hits the server itself. It waits
    # for the server to answer /health and half a second more, so the kill lands inside the trial on a
    # fast machine too (a fixed delay after the start outlived the whole trial on one).
    health = "import sys, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/health' % sys.argv[1], timeout=1)"
    ready = f'python3 -c "{health}" {{port}}'
    killer = f"(until {ready} 2>/dev/null; do sleep 0.2; done; sleep 0.5; kill -9 $$) &"
    start = f"if [ {{num_speculative_tokens}} = 5 ]; then {killer} fi; exec {serve}"
    config = parse_study_config(llama_study("killed", start, [3, 5]))
    outcome = StudyRunner(config, study_paths(config, tmp_path)).run()
    trials = read_trials(outcome.study)
    killed = [t for t in trials if t.num_speculative_tokens == 5 and t.fail_reason]
    assert killed, [(t.num_speculative_tokens, t.state.name, t.fail_reason) for t in trials]
    first = re.compile(r"(server did not start: )?the server was killed by signal 9 \(SIGKILL\)")
    assert all(first.match(t.fail_reason) for t in killed), killed[0].fail_reason
    pasted, measured = pasted_and_measured(outcome)
    assert 5 not in measured
    for choice in pasted.values():
        assert choice.num_speculative_tokens in measured and choice.num_speculative_tokens != 5
