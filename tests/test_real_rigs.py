"""A rig from a real llama-server study, used by `measure --rig` on a second workload.

The 3%-of-the-exhaustive-sweep figure takes about 10 minutes on 2 cores: bench/rig_real_llamacpp.py
(docs/rigs.md has its numbers). This test is the smaller check CI runs in about a minute and a half.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from specsweep.config import parse_study_config
from specsweep.engines import llamacpp
from specsweep.rigs.file import RIG_FILE, write_rig
from specsweep.rigs.stored import build_rig
from specsweep.runtime.launcher import ServerProcess, free_port
from specsweep.tuning.study import StudyRunner
from specsweep.tuning.study_store import study_paths

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]


NGRAM = ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4"]


@pytest.mark.timeout(900)  # a real llama-server study and a measurement: 45 s idle, far more when loaded
def test_measure_with_a_real_rig_recommends_and_refuses_other_flags(real_engines, tmp_path: Path) -> None:
    data = {
        "study": {"name": "llama-rig", "sampler": "grid", "max_consecutive_failures": 2},
        "server": {"engine": "llama.cpp", "mode": "process", "api": "completions", "ready_timeout_s": 120,
                   "stop_grace_s": 10, "start": [*real_engines.server_argv("{port}"), "{spec_args}"]},
        "search": {"num_speculative_tokens": [2, 4], "fixed": {"method": "ngram", "prompt_lookup_min": 3}},
        "workloads": {"prose": 1.0},
        "measure": {"concurrency": [1], "requests": 2, "warmup": 1, "max_tokens": 64, "temperature": 0.0},
    }  # fmt: skip
    config = parse_study_config(data)
    paths = study_paths(config, tmp_path)
    outcome = StudyRunner(config, paths).run()
    rig = build_rig(outcome.study, paths.folder, server=config.server)
    write_rig(paths.folder / RIG_FILE, rig)
    stored = json.loads((paths.folder / RIG_FILE).read_text())
    assert stored["identity"]["engine"] == "llama.cpp"
    assert stored["identity"]["engine_version"]  # /props build_info
    assert stored["identity"]["model"] == Path(real_engines.target).name
    assert "--spec-type" not in stored["identity"]["server_args"] and "--port" not in stored["identity"]["server_args"]
    assert stored["identity"]["server_facts"] == {"n_ctx": 4096, "total_slots": 1}
    # n-gram lookup drafts only where the text repeats itself: short prose may draft nothing at some k
    measured = {lv["num_speculative_tokens"] for lv in stored["levels"]}
    assert 0 in measured and measured - {0}, measured
    assert all(lv["decode_step_time_s"] > 0 for lv in stored["levels"])
    # ngram-simple drafts nothing while its draft length (2) is below its lookup length (3): the
    # counters ran and counted no draft, so the rig keeps k = 2 as a level that decodes one token per step
    by_k = {lv["num_speculative_tokens"]: lv for lv in stored["levels"]}
    assert by_k[2]["draft_share"] == 0.0 and by_k[2]["tokens_per_step"] == 1.0, by_k[2]
    assert all(0.0 < by_k[k]["draft_share"] <= 1.0 for k in (3, 4) if k in by_k)
    # which is the rule specsweep reads from llama.cpp's source (engines/llamacpp.py, never_drafts)
    for k in by_k.keys() - {0}:
        spec = llamacpp.validate_spec_config({"method": "ngram", "prompt_lookup_min": 3, "num_speculative_tokens": k})
        assert bool(llamacpp.never_drafts(spec)) is (by_k[k]["draft_share"] == 0.0), k

    port = free_port()
    argv = real_engines.server_argv(port) + NGRAM
    with ServerProcess(argv, log_path=tmp_path / "running.log") as server:
        url = f"http://127.0.0.1:{port}"
        server.wait_ready(url + "/health", timeout_s=120)
        common = ["-m", "specsweep", "measure", "--endpoint", url, "--workload", "technical", "--api", "completions",
                  "--requests", "2", "--max-tokens", "64", "--rig", str(paths.folder / RIG_FILE)]  # fmt: skip
        ok = subprocess.run([sys.executable, *common, "--server-args", shlex.join(argv)], capture_output=True,
                            text=True, timeout=300, check=False)  # fmt: skip
        other = [a if a != "4096" else "2048" for a in argv]
        refused = subprocess.run([sys.executable, *common, "--server-args", shlex.join(other)], capture_output=True,
                                 text=True, timeout=300, check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert "measured at the running k=4" in ok.stdout
    assert "concurrency 1: recommended " in ok.stdout and "expected gain over the running k=4" in ok.stdout
    assert "unchecked" not in ok.stdout
    assert "on the rig this drafter drafted nothing at k=2" in ok.stdout
    assert refused.returncode == 1
    assert "server_args: only the rig has '4096', only the server has '2048'" in refused.stderr
