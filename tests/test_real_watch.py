"""`specsweep watch` on a real llama.cpp `llama-server` (Gemma 3 270M with a Q2_K draft model, k=4):
its metric names, read live, against the server's own per-request timings as the truth."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from specsweep.runtime.launcher import ServerProcess, free_port

pytestmark = [pytest.mark.real_engine, pytest.mark.slow]

DRAFTED = "llamacpp:spec_decode_num_draft_tokens_total"
ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"


def test_live_watch_reads_llama_server_counters_and_its_slot_gauge(real_engines, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    spec_args = ["-md", real_engines.draft, "--spec-type", "draft-simple", "--spec-draft-n-max", "4"]
    with ServerProcess(real_engines.server_argv(port, spec_args), log_path=tmp_path / "llama.log") as server:
        server.wait_ready(url + "/health", timeout_s=120)
        command = [sys.executable, "-m", "specsweep", "watch", "--endpoint", url, "--interval", "0.5s",
                   "--window", "1h", "--json"]  # fmt: skip
        watcher = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
        try:
            first = watcher.stdout.readline()  # watch has read twice before the first request
            assert first, watcher.stderr.read()
            timings = []
            for prompt in ("Write a short story about a lighthouse keeper.", "Explain how tides work."):
                body = {"prompt": prompt, "n_predict": 64, "temperature": 0.0, "cache_prompt": False}
                answer = httpx.post(url + "/completion", json=body, timeout=300).json()
                timings.append(answer["timings"])
            done_at = time.time()
            seen = [first]
            while json.loads(seen[-1])["end"] < done_at + 1.0:  # watch has read after the last one ended
                seen.append(watcher.stdout.readline())
        finally:
            watcher.send_signal(subprocess.signal.SIGINT)  # Ctrl-C: the summary and the span line follow
            try:
                out, err = watcher.communicate(timeout=60)
            finally:
                if watcher.poll() is None:  # no watch process outlives the test
                    watcher.kill()
                    watcher.communicate()
    assert watcher.returncode == 0, err
    lines = [json.loads(line) for line in [*seen, *out.splitlines()]]
    intervals, span = lines[:-1], lines[-1]
    assert span["kind"] == "span" and span["engine"] == "llama.cpp"
    # the counters' growth over the watch is what the server's own per-request timings say
    drafted = sum(line["growth"].get(DRAFTED, 0.0) for line in intervals)
    accepted = sum(line["growth"].get(ACCEPTED, 0.0) for line in intervals)
    assert drafted == sum(t["draft_n"] for t in timings) > 0
    assert accepted == sum(t["draft_n_accepted"] for t in timings)
    acceptance = span["span"]["acceptance"]
    assert acceptance["running_k"] == 4
    if acceptance["source"] == "per_position":  # builds that publish per-position counters
        assert [p["source"] for p in acceptance["per_position"][:4]] == ["measured"] * 4
    else:
        assert acceptance["source"] == "aggregate" and "mean acceptance length only" in err
    # one slot, busy only while a request ran: the gauge showed batch 1 and idle, nothing else
    assert set(span["span"]["concurrency"]) <= {"0", "1"} and span["span"]["concurrency"].get("1", 0) > 0
    assert "no rig: acceptance and load only" in err
