"""Shared fixtures: emulator processes on free loopback ports, stopped by PID after each test."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"


@dataclass
class RunningEmulator:
    url: str
    port: int
    process: ServerProcess
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text()


@pytest.fixture
def start_emulator(tmp_path: Path) -> Iterator[Callable[..., RunningEmulator]]:
    """Start `specsweep emulate` (startup time 0 unless given) and wait until it is ready."""
    started: list[ServerProcess] = []

    def start(
        *,
        speculative_config: str | None = None,
        profile: str | None = None,
        time_scale: float = 50.0,
        seed: int = 0,
        extra: list[str] | None = None,
        wait: bool = True,
        startup_seconds: float = 0.0,
    ) -> RunningEmulator:
        port = free_port()
        argv = emulator_argv(
            port=port,
            speculative_config=speculative_config,
            profile=profile,
            time_scale=time_scale,
            seed=seed,
            extra=["--startup-seconds", str(startup_seconds), *(extra or [])],
        )
        log_path = tmp_path / f"emulator-{port}.log"
        server = ServerProcess(argv, log_path=log_path)
        server.start()
        started.append(server)
        if wait:
            server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        return RunningEmulator(url=f"http://127.0.0.1:{port}", port=port, process=server, log_path=log_path)

    yield start
    for server in started:
        server.stop(grace_s=5)


def print_truth(*args: str) -> dict:
    """`specsweep emulate --print-truth ...` as parsed JSON (runs the real command)."""
    out = subprocess.run(
        [sys.executable, "-m", "specsweep", "emulate", "--print-truth", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)
