"""A throwaway Prometheus server for tests: Debian's prometheus binary (scripts/setup-prometheus),
on a free loopback port, with a config and data folder of its own, stopped by PID afterwards."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from specsweep.runtime.launcher import ServerProcess, free_port


def prometheus_binary() -> str:
    """The prometheus binary, or a skip (a failure where the setup scripts ran, SPECSWEEP_REQUIRE_REAL_ENGINES=1)."""
    found = shutil.which("prometheus")
    if found is None:
        message = "Prometheus is not installed: scripts/setup-prometheus (scripts/test runs it)"
        if os.environ.get("SPECSWEEP_REQUIRE_REAL_ENGINES") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found


@contextmanager
def running_prometheus(
    folder: Path,
    targets: Sequence[str],
    *,
    scrape_interval: str = "250ms",
    drop: Sequence[str] = (),
    job: str = "emulator",
) -> Iterator[str]:
    """Prometheus scraping ``targets`` (host:port) every ``scrape_interval`` under one job; ``drop``:
    sample names its metric_relabel_configs throw away (a server that does not publish them)."""
    binary = prometheus_binary()
    folder.mkdir(parents=True, exist_ok=True)
    scrape: dict = {"job_name": job, "static_configs": [{"targets": list(targets)}]}
    if drop:
        scrape["metric_relabel_configs"] = [{"source_labels": ["__name__"], "regex": "|".join(drop), "action": "drop"}]
    config = {
        "global": {"scrape_interval": scrape_interval, "scrape_timeout": scrape_interval},
        "scrape_configs": [scrape],
    }
    (folder / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    port = free_port()
    argv = [
        binary, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn",
    ]  # fmt: skip
    server = ServerProcess(argv, log_path=folder / "prometheus.log")
    server.start()
    try:
        server.wait_ready(f"http://127.0.0.1:{port}/-/ready", timeout_s=60)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop(grace_s=10)
