"""bench/context_cost.py, the cost of ignoring context, against arithmetic done apart from it."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

from specsweep.emulator.profile import load_profile

BENCH = Path(__file__).resolve().parents[1] / "bench"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH))  # it imports sweep_efficiency's cases from beside it
    try:
        return importlib.import_module("context_cost")
    finally:
        sys.path.remove(str(BENCH))


def test_the_short_pick_has_no_regret_at_the_short_context_and_none_beyond_the_model(bench) -> None:
    profile = load_profile(str(BENCH / "profiles" / "a100-draft-model.toml"))  # max_model_len 16384
    rows = bench.context_rows(profile, 1)
    assert [(r.workload, r.concurrency) for r in rows] == [("prose", 1), ("technical", 1)]
    for row in rows:
        short, at_4k, at_16k, at_32k, at_64k, at_128k = row.cells
        assert short.best == row.pick and short.regret == 0.0 and not short.capped
        assert short.prompt_tokens == {"prose": 412, "technical": 411}[row.workload]  # the bundled workloads' prompts
        assert (at_4k.prompt_tokens, at_4k.capped) == (4096, False)
        assert (at_16k.prompt_tokens, at_16k.capped) == (16384 - 600, True)  # with its 600 generated tokens
        assert at_32k is at_64k is at_128k is None
        for cell in (at_4k, at_16k):
            assert cell.regret >= 0.0 and cell.best_rate >= cell.pick_rate


def test_on_the_default_profile_the_best_configuration_holds_from_1k_to_256k(bench) -> None:
    """docs/calibration.md#context-on-the-default-profile: V4-Flash's compressed cache is too small a
    read to move k* (prose 3 / 2, technical 2 / 1 at one and four streams)."""
    rows = bench.context_rows(load_profile(), 4, contexts=(("1k", 1024), ("256k", 262144)))
    best = {(r.workload, r.concurrency): [bench.describe(c.best) for c in r.cells] for r in rows}
    assert best == {("prose", 1): ["3p", "3p"], ("prose", 4): ["2p", "2p"],
                    ("technical", 1): ["2p", "2p"], ("technical", 4): ["1p", "1p"]}  # fmt: skip
    assert all(cell.regret == 0.0 for row in rows for cell in row.cells)


def test_a_long_context_costs_the_step_its_kv_and_draft_reads_over_the_bandwidth(bench) -> None:
    """On 8 H200s serving a 70B model (80 layers, 8 KV heads of 128 in BF16: one head per GPU under
    TP = 8) with an EAGLE head of one such layer read per draft position, 16 streams' step at 64k
    tokens exceeds the short one's by 16 x the extra tokens x (40,960 + k x 512) bytes / 4.8 TB/s."""
    profile = load_profile(str(BENCH / "profiles" / "h200x8-70b-eagle-batch.toml"))
    rows = bench.context_rows(profile, 16, contexts=(("short", 0), ("64k", 65536)))
    row = next(r for r in rows if r.workload == "prose" and r.concurrency == 16)
    short, long = row.cells
    assert long.prompt_tokens == 65536 - 600 and long.capped
    k = int(bench.describe(row.pick)[:-1])
    kv, draft = 2 * 80 * 1 * 128 * 2, 2 * 1 * 1 * 128 * 2
    expected = 16 * (long.prompt_tokens - short.prompt_tokens) * (kv + k * draft) / 4.8e12
    assert expected > 0.008  # about 9 ms: a read that is felt, not rounding
    assert long.pick_step_s - short.pick_step_s == pytest.approx(expected, rel=1e-9)
