"""Context levels and their shares from the user's own lengths (``study --context-from``).

The rule (context_shares.py, docs/workloads.md) is checked against cases worked by hand; the
study's weights and the paste's context mix against the shares; and a study on the emulator
against the levels its file of prompts implies.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specsweep.analysis.context_mix import context_members, mix_weights
from specsweep.cli.context_from import apply_context_from, read_lengths
from specsweep.config import parse_study_config
from specsweep.context_shares import length_summary, prompt_lengths, shares_from_lengths
from specsweep.errors import ConfigError
from specsweep.tuning.workloads import study_workloads
from specsweep.watch.report import served_lengths
from specsweep.workload import count_tokens, load_workload

from .builders import emulator_study, specsweep, write_study

WORDS = ("the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "it", "reads", "long")


def _prompt(tokens: int) -> str:
    """A prompt of about ``tokens`` tokens, as count_tokens counts them (each word here is one)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(tokens))


def _prompt_file(path: Path, lengths: list[int]) -> Path:
    path.write_text("".join(json.dumps({"prompt": _prompt(n)}) + "\n" for n in lengths), encoding="utf-8")
    return path


def test_a_two_mode_sample_gives_its_two_modes_with_their_shares() -> None:
    sample = [(400.0, 60.0), (16384.0, 25.0), (65536.0, 15.0)]
    shares = shares_from_lengths(sample, own_tokens=400)
    assert shares.levels == (16384, 65536)
    assert shares.shares == pytest.approx((0.25, 0.15)) and shares.own_share == pytest.approx(0.6)
    assert shares.note is None


def test_the_worked_example_of_the_docs() -> None:
    """docs/workloads.md: ten prompts, own prompts of 400 tokens."""
    lengths = [400, 450, 380, 900, 1300, 6000, 7000, 16000, 17000, 60000]
    shares = shares_from_lengths([(x, 1.0) for x in lengths], own_tokens=400)
    # 1,300 is within 1,024 of 400; the long five cut at their terciles (7,000 and 17,000):
    # {6,000, 7,000} median 6,500 -> 6k; {16,000, 17,000} 16,500 -> 16k; {60,000} -> 59k
    assert shares.levels == (6 * 1024, 16 * 1024, 59 * 1024)
    assert shares.shares == pytest.approx((0.2, 0.2, 0.1)) and shares.own_share == pytest.approx(0.5)
    text = (Path(__file__).parents[1] / "docs" / "workloads.md").read_text(encoding="utf-8")
    assert "6k (20%), 16k (20%), 59k (10%); 50% at the workloads' own prompts" in " ".join(text.split())


def test_everything_short_gives_no_level_and_says_why_in_one_line() -> None:
    shares = shares_from_lengths([(300.0, 1.0), (1400.0, 1.0), (1424.0, 2.0)], own_tokens=400)
    assert shares.levels == () and shares.shares == () and shares.own_share == 1.0
    assert shares.note == (
        "every length is within 1,024 tokens of the workloads' own prompts (400 tokens): no context level"
    )
    assert shares_from_lengths([], own_tokens=400).note == "no lengths to go by: no context level"


def test_a_narrow_long_part_is_one_level() -> None:
    shares = shares_from_lengths([(16000.0 + i, 1.0) for i in range(0, 600, 10)] + [(400.0, 60.0)], own_tokens=400)
    assert shares.levels == (16384,) and shares.shares == pytest.approx((0.5,))


def test_a_wide_single_mode_is_one_level_not_three_close_ones() -> None:
    """Prompts spread evenly over 14k to 18k tokens: their terciles' medians round to 14k, 16k and
    17k, each under 1.5 times the one before, so they are measured as one level at the whole
    part's median (16,000 tokens -> 16k); a part past 1.5 times stays its own level."""
    wide = [(14000.0 + 100 * i, 1.0) for i in range(41)]
    shares = shares_from_lengths(wide, own_tokens=400)
    assert shares.levels == (16 * 1024,) and shares.shares == pytest.approx((1.0,))
    far = shares_from_lengths([*wide, (40000.0, 20.0)], own_tokens=400)
    assert far.levels[-1] == 39 * 1024 and len(far.levels) == 2
    assert all(b >= 1.5 * a for a, b in zip(far.levels, far.levels[1:], strict=False))


def test_a_watch_window_weighs_its_finished_requests() -> None:
    results = {"windows": [
        {"prompt_tokens": 200_000, "finished_requests": 10},  # 20,000 tokens a request
        {"prompt_tokens": 15_000, "finished_requests": 30},  # 500
        {"prompt_tokens": None, "finished_requests": 5},  # not counted: left out
        {"prompt_tokens": 10, "finished_requests": 0},
    ]}  # fmt: skip
    sample = served_lengths(results)
    assert sample == [(20000.0, 10.0), (500.0, 30.0)]
    shares = shares_from_lengths(sample, own_tokens=400)
    assert shares.levels == (20 * 1024,) and shares.shares == pytest.approx((0.25,))
    assert served_lengths([{"prompt": "x"}]) is None and served_lengths({"engine": "vllm"}) is None


@given(
    st.lists(
        st.tuples(st.floats(min_value=1, max_value=200_000), st.integers(min_value=1, max_value=50)),
        min_size=1,
        max_size=60,
    ),
    st.floats(min_value=10, max_value=4000),
)
def test_shares_sum_to_one_and_count_the_weight_in_each_part(sample: list[tuple[float, int]], own: float) -> None:
    shares = shares_from_lengths([(x, float(w)) for x, w in sample], own_tokens=own)
    total = sum(w for _, w in sample)
    assert sum(shares.shares) + shares.own_share == pytest.approx(1.0)
    assert shares.own_share == pytest.approx(sum(w for x, w in sample if x <= own + 1024) / total)
    assert len(shares.levels) <= 3 and list(shares.levels) == sorted(set(shares.levels))
    assert all(b >= 1.5 * a for a, b in zip(shares.levels, shares.levels[1:], strict=False))
    assert all(level % 1024 == 0 and level >= 1024 for level in shares.levels)
    # each share is a whole number of the sample's weights: a part holds whole lengths
    assert all(abs(s * total - round(s * total)) < 1e-6 for s in shares.shares)


def test_a_file_is_counted_prompt_by_prompt(tmp_path: Path) -> None:
    path = _prompt_file(tmp_path / "mine.jsonl", [30] * 6 + [8192] * 3 + [8300])
    sample, counted = read_lengths(path, where="--context-from")
    assert counted == "10 prompts"
    assert sample == prompt_lengths(load_workload(path)) and sample[6] == (8192.0, 1.0)
    assert count_tokens(_prompt(8192)) == 8192
    assert length_summary(sample) == (30.0, 8192.0, 8300.0)
    with pytest.raises(ConfigError, match=r"^--context-from: .*nowhere is not a file"):
        read_lengths(tmp_path / "nowhere", where="--context-from")
    (tmp_path / "watched").mkdir()
    (tmp_path / "watched" / "results.json").write_text(json.dumps({"windows": []}), encoding="utf-8")
    with pytest.raises(ConfigError, match="no window with served prompt tokens"):
        read_lengths(tmp_path / "watched", where="--context-from")


# -- the shares as the study's weights ----------------------------------------------------------


def test_the_shares_are_the_objectives_weights_and_the_context_mixs() -> None:
    data = emulator_study("w", workloads={"prose": 2.0})
    data["measure"] |= {"context": [8192, 16384], "context_shares": [0.3, 0.2]}
    weights = study_workloads(parse_study_config(data))
    assert weights == pytest.approx({"prose": 1.0, "prose@8k": 0.6, "prose@16k": 0.4})
    members = context_members(weights)["prose"]
    mix, even = mix_weights(members, weights)
    assert not even and mix == pytest.approx({"prose": 0.5, "prose@8k": 0.3, "prose@16k": 0.2})


def test_the_levels_of_a_file_fill_the_study(tmp_path: Path) -> None:
    path = _prompt_file(tmp_path / "mine.jsonl", [30] * 6 + [8192] * 3 + [8300])
    config = parse_study_config(emulator_study("w", workloads={"prose": 1.0}))
    filled, said = apply_context_from(config, str(path), where="--context-from")
    assert filled.measure.context == (8192,) and filled.measure.context_shares == pytest.approx((0.4,))
    assert said == f"context levels from {path}: 8k (40%); 60% at the workloads' own prompts (10 prompts)"
    assert study_workloads(filled) == pytest.approx({"prose": 0.6, "prose@8k": 0.4})


# -- the command line ----------------------------------------------------------------------------


def test_the_flags_and_keys_that_give_levels_exclude_each_other(tmp_path: Path) -> None:
    path = _prompt_file(tmp_path / "mine.jsonl", [30, 8192])
    both = specsweep("study", "--context", "8k", "--context-from", str(path), "--dry-run", cwd=tmp_path)
    assert both.returncode != 0 and "--context and --context-from both give the context levels" in both.stderr
    assert len(both.stderr.strip().splitlines()) == 1
    # a level from the file is checked as any level: 600k tokens pass the profile's max model length
    watched = tmp_path / "watched"
    watched.mkdir()
    (watched / "results.json").write_text(
        json.dumps({"windows": [{"prompt_tokens": 6_000_000, "finished_requests": 10}]}), encoding="utf-8"
    )
    far = specsweep("study", "--context-from", str(watched), "--dry-run", cwd=tmp_path)
    assert far.returncode == 2 and "--context-from: context level 600,064" in far.stderr, far.stderr
    dry = specsweep("study", "--workload", "prose", "--context-from", str(path), "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    flat = " ".join(dry.stdout.split())
    said = f"context levels from {path}: 8k (50%); 50% at the workloads' own prompts (2 prompts)"
    assert "".join(said.split()) in "".join(flat.split())  # a long path may wrap anywhere
    assert "50% of each workload's weight, one share per level" in flat


def test_a_flag_replaces_the_files_levels_and_their_shares(tmp_path: Path) -> None:
    data = emulator_study("w")
    data["measure"] |= {"context": [8192, 16384], "context_shares": [0.3, 0.2]}
    path = write_study(tmp_path / "w.toml", data)
    dry = specsweep("study", "--config", str(path), "--context", "4k", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert "weight 0 (measured and reported" in " ".join(dry.stdout.split())  # the file's shares went with its levels


def test_workloads_import_says_the_lengths_and_the_study_at_their_mix(tmp_path: Path) -> None:
    path = _prompt_file(tmp_path / "mine.jsonl", [30] * 6 + [8192] * 4)
    done = specsweep("workloads", "import", str(path), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    flat = " ".join(done.stdout.split())
    assert "prompt lengths: p50 30, p90 8,192, max 8,192 tokens" in flat
    out = tmp_path / "out" / "mine.jsonl"
    said = f"measure at this mix (8k (40%); 60% at the workloads' own prompts): specsweep study --context-from {out}"
    assert "".join(said.split()) in "".join(flat.split())  # a long path may wrap anywhere


def test_a_study_measures_the_levels_of_its_file_weighed_by_their_shares(tmp_path: Path) -> None:
    """On the emulator: the levels measured are the file's, and the paste's mix weighs them by its shares."""
    options = dict(
        k=(1, 2), requests=3, max_tokens=40, concurrency=(1,), temperature=0.6, time_scale=20,
        study={"sampler": "grid"}, search={"draft_sample_method": ["probabilistic"]},
    )  # fmt: skip
    _prompt_file(tmp_path / "served.jsonl", [30] * 7 + [8192] * 3)
    data = emulator_study("from", **options)
    data["measure"] |= {"context_from": "served.jsonl"}  # read from the working directory, as [workloads] are
    path = write_study(tmp_path / "from.toml", data)
    done = specsweep("study", "--config", str(path), "--studies-dir", str(tmp_path / "studies"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    flat = " ".join(done.stdout.split())
    assert "context levels from served.jsonl: 8k (30%); 70% at the workloads' own prompts (10 prompts)" in flat
    assert re.search(r"context mix of prose \(\d+ tokens\) 70%, prose@8k 30%", flat), flat

    report = specsweep("report", str(tmp_path / "studies" / "from"), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    results = json.loads((tmp_path / "studies" / "from" / "report" / "results.json").read_text(encoding="utf-8"))
    assert {r["workload"] for r in results["recommendations"]} == {"prose", "prose@8k"}
    (entry,) = results["context"]
    assert entry["weights"] == pytest.approx({"prose": 0.7, "prose@8k": 0.3}) and not entry["weighed_evenly"]
