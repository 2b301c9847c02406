"""The paste over a workload's context mix (analysis/context_mix.py) against hand-computed truth,
and each context's cells as the report and results.json/csv keep them."""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from specsweep.analysis.context_mix import (
    context_grids,
    context_members,
    context_tokens,
    mix_recommendation,
    mix_snippets,
    mix_weights,
)
from specsweep.analysis.drafters import OFF, Candidate, Drafter
from specsweep.analysis.rates import RateSample
from specsweep.analysis.recommendation import Recommendation
from specsweep.report.context_report import context_json, heat_map_data
from specsweep.report.study_tables import CSV_FIGURES, CSV_KEYS, results_csv
from specsweep.types import BootFacts, Configuration, LevelFigures, MeasuredConfig, SpeculativeConfig

from .builders import emulator_study, recommendation_of, specsweep, write_study

DRAFTER = Drafter(method="dspark", draft_sample_method="probabilistic")
K2, K4 = Candidate(drafter=DRAFTER, num_speculative_tokens=2), Candidate(drafter=DRAFTER, num_speculative_tokens=4)
MEMBERS = ("w", "w@16k", "w@64k")


def rec(
    workload: str, level: int, rates: dict[Candidate, float], unmeasured: tuple[Candidate, ...] = ()
) -> Recommendation:
    """A cell whose predictions are ``rates`` (measured as predicted, but ``unmeasured``), its
    pick the fastest measured."""
    choice = max((c for c in rates if c not in unmeasured), key=lambda c: rates[c])
    measured = {c: None if c in unmeasured else r for c, r in rates.items()}
    return recommendation_of(level, rates, workload=workload, measured=measured, choice=choice, band=0.1)


# One concurrency level: the plain workload wants k=4, both levels k=2.
RATES = {
    "w": {K2: 100.0, K4: 110.0, OFF: 80.0},
    "w@16k": {K2: 60.0, K4: 58.0, OFF: 50.0},
    "w@64k": {K2: 30.0, K4: 20.0, OFF: 28.0},
}
WEIGHTED = {"w": 0.5, "w@16k": 0.25, "w@64k": 0.25}  # measure.context_weight = 0.5, as study_workloads gives it


def cells(level: int = 1, unmeasured: dict[str, tuple[Candidate, ...]] | None = None) -> dict[str, Recommendation]:
    return {m: rec(m, level, RATES[m], (unmeasured or {}).get(m, ())) for m in MEMBERS}


def sample_of(level: int, rates: dict[Candidate, float]) -> RateSample:
    """Joint draws that know each rate exactly (every draw the same)."""
    values = np.array(list(rates.values()))
    return RateSample(
        concurrency=level, candidates=tuple(rates), tokens_per_step=np.ones(len(rates)), step_time_s=level / values,
        step_time_source=("model",) * len(rates), tokens_per_s=values, draws=np.tile(values, (400, 1)),
    )  # fmt: skip


def samples(level: int = 1) -> dict[str, RateSample]:
    return {m: sample_of(level, RATES[m]) for m in MEMBERS}


def test_the_members_of_a_workload_are_it_then_its_levels_shortest_first() -> None:
    assert context_members(["w", "v", "w@64k", "w@16k", "v@10000"]) == {"w": MEMBERS, "v": ("v", "v@10000")}
    assert context_members(["w", "w@16k", "w", "w@16k"]) == {"w": ("w", "w@16k")}  # a name per cell: once each
    assert context_members(["w", "v"]) == {}


def test_the_mix_weighs_as_the_study_does_or_evenly_when_the_levels_weigh_nothing() -> None:
    assert mix_weights(MEMBERS, WEIGHTED) == ({"w": 0.5, "w@16k": 0.25, "w@64k": 0.25}, False)
    # measure.context_weight = 0: the levels weigh 0 in the objective, every context the same here
    assert mix_weights(MEMBERS, {"w": 1.0, "w@16k": 0.0, "w@64k": 0.0}) == ({m: 1 / 3 for m in MEMBERS}, True)
    # a workload of weight 2 at context_weight 0.5: shares are relative
    assert mix_weights(MEMBERS, {"w": 1.0, "w@16k": 0.5, "w@64k": 0.5})[0] == WEIGHTED


def test_the_mix_picks_the_highest_weighted_mean_rate() -> None:
    weights, _ = mix_weights(MEMBERS, WEIGHTED)
    mixed = mix_recommendation("w", cells(), samples(), weights)
    # k=2: 0.5*100 + 0.25*60 + 0.25*30 = 72.5; k=4: 0.5*110 + 0.25*58 + 0.25*20 = 74.5; off: 40 + 12.5 + 7 = 59.5
    rates = {row.candidate: row.tokens_per_s for row in mixed.candidates}
    assert rates == pytest.approx({K2: 72.5, K4: 74.5, OFF: 59.5})
    assert mixed.choice == K4 and mixed.tokens_per_s == pytest.approx(74.5) and mixed.measured
    assert mixed.workload == "w" and mixed.concurrency == 1


def test_even_weights_move_the_pick_to_the_long_contexts_k() -> None:
    weights, even = mix_weights(MEMBERS, {"w": 1.0, "w@16k": 0.0, "w@64k": 0.0})
    mixed = mix_recommendation("w", cells(), samples(), weights)
    # k=2: (100 + 60 + 30) / 3 = 63.33; k=4: (110 + 58 + 20) / 3 = 62.67: k=2, where the plain workload alone takes k=4
    assert even and mixed.choice == K2
    assert mixed.tokens_per_s == pytest.approx(190 / 3)


def test_a_k_not_measured_at_every_context_is_not_pasted() -> None:
    weights, _ = mix_weights(MEMBERS, WEIGHTED)
    mixed = mix_recommendation("w", cells(unmeasured={"w@64k": (K4,)}), samples(), weights)
    # k=4 is predicted fastest over the mix (74.5) but 64k never ran it: k=2 (72.5), measured everywhere
    assert mixed.choice == K2 and mixed.measured
    assert next(r for r in mixed.candidates if r.candidate == K4).measured_tokens_per_s is None


def test_a_configuration_the_engine_runs_as_speculation_off_is_no_candidate_of_the_mix() -> None:
    weights, _ = mix_weights(MEMBERS, WEIGHTED)
    mixed = mix_recommendation("w", cells(), samples(), weights, idle=(K4,))
    assert mixed.choice == K2 and K4 not in {row.candidate for row in mixed.candidates}


def test_contexts_that_share_no_candidate_keep_the_first_contexts_pick() -> None:
    other = Candidate(drafter=Drafter(method="ngram", draft_sample_method="greedy"), num_speculative_tokens=3)
    plain = rec("w", 1, {K2: 100.0, K4: 110.0})
    drawn = {"w": sample_of(1, {K2: 100.0, K4: 110.0}), "w@16k": sample_of(1, {other: 50.0})}
    mixed = mix_recommendation(
        "w", {"w": plain, "w@16k": rec("w@16k", 1, {other: 50.0})}, drawn, {"w": 0.5, "w@16k": 0.5}
    )
    assert mixed.choice == K4 and mixed.workload == "w"


def _config(
    trial: int, spec: SpeculativeConfig | None, rates: dict[str, dict[Candidate, float]], k: int
) -> MeasuredConfig:
    candidate = OFF if spec is None else Candidate(drafter=DRAFTER, num_speculative_tokens=k)
    results = {
        m: {
            1: LevelFigures(
                concurrency=1,
                output_tokens_per_s=rates[m][candidate],
                whole_level_output_tokens_per_s=None,
                decode_tokens_per_s_p50=None,
                ttft_p95_s=None,
                errors=0,
                requests=4,
                prompt_tokens_mean=400.0 if m == "w" else None,
            )
        }
        for m in MEMBERS
    }
    return MeasuredConfig(
        trial=trial, configuration=Configuration(spec=spec), objective=0.0, feasible=True, results=results,
        boot=BootFacts(), startup_s=None,
    )  # fmt: skip


def _configs() -> list[MeasuredConfig]:
    spec = SpeculativeConfig(method="dspark", num_speculative_tokens=2, draft_sample_method="probabilistic")
    return [
        _config(0, None, RATES, 0),
        _config(1, spec, RATES, 2),
        _config(2, SpeculativeConfig(method="dspark", num_speculative_tokens=4, draft_sample_method="probabilistic"),
                RATES, 4),
    ]  # fmt: skip


def test_the_paste_of_a_workload_with_context_levels_runs_the_mix_and_says_what_each_context_gives_up() -> None:
    from specsweep.analysis.snippet_plan import plan_snippet

    configs = _configs()
    recs = list(cells().values())
    by_cell = {(m, 1): sample for m, sample in samples().items()}
    own = [plan_snippet(m, [r], {DRAFTER: configs[1].spec}, max_num_seqs=8) for m, r in cells().items()]  # type: ignore[dict-item]
    plans = {p.workload: p for p in mix_snippets(recs, by_cell, own, configs, WEIGHTED, max_num_seqs=8)}
    assert plans["w"].choice_by_concurrency == {1: K4}
    assert plans["w"].spec is not None and plans["w"].spec.num_speculative_tokens == 4
    assert plans["w@16k"] is own[1]  # a level's own plan is kept as it was
    notes = plans["w"].notes
    assert "over the context mix of w (400 tokens) 50%, w@16k 25%, w@64k 25% (the study's context_weight" in notes[0]
    assert notes[1] == "w (400 tokens) gives up nothing: its own pick at every concurrency"
    # 1 - 58/60 = 3.3%; 1 - 20/30 = 33.3%
    assert notes[2] == "w@16k gives up, predicted: 3.3% at 1 (k=4 probabilistic, its own k=2 probabilistic)"
    assert notes[3] == "w@64k gives up, predicted: 33.3% at 1 (k=4 probabilistic, its own k=2 probabilistic)"
    even = {p.workload: p for p in mix_snippets(recs, by_cell, own, configs, {"w": 1.0}, max_num_seqs=8)}["w"]
    assert even.choice_by_concurrency == {1: K2}
    assert "w (400 tokens) 33%, w@16k 33%, w@64k 33% (measure.context_weight is 0: weighed evenly)" in even.notes[0]


def test_every_cell_is_in_the_grid_the_heat_map_results_json_and_csv() -> None:
    configs = _configs()
    recs = [r for level in (1, 4) for r in cells(level).values()]
    assert context_tokens(configs, "w") == 400.0 and context_tokens(configs, "w@16k") == 16384.0
    (grid,) = context_grids(recs, configs)
    assert grid.workload == "w" and grid.concurrency_levels == (1, 4)
    assert [row.label for row in grid.rows] == ["w (400 tokens)", "w@16k", "w@64k"]
    data = heat_map_data(grid)
    assert data.row_labels == ("400 tokens (w)", "16,384 tokens (w@16k)", "65,536 tokens (w@64k)")
    assert data.k == ((4, 4), (2, 2), (2, 2))
    assert data.text[2][0] == "k=2\n30.0 tok/s"
    (entry,) = json.loads(json.dumps(context_json_of(recs, configs)))
    assert [c["context_tokens"] for c in entry["contexts"]] == [400.0, 16384.0, 65536.0]
    assert [[cell["num_speculative_tokens"] for cell in c["cells"]] for c in entry["contexts"]] == [
        [4, 4],
        [2, 2],
        [2, 2],
    ]
    rows = list(csv.reader(io.StringIO(results_csv(configs))))
    assert rows[0] == [*CSV_KEYS, *CSV_FIGURES, "context"]  # the columns before it as they were
    assert {(r[3], r[-1]) for r in rows[1:]} == {("w", "400"), ("w@16k", "16384"), ("w@64k", "65536")}


def context_json_of(recs: list[Recommendation], configs: list[MeasuredConfig]) -> list[dict[str, object]]:
    """results.json's ``context`` of an analysis holding only these recommendations."""
    from specsweep.analysis.study import StudyAnalysis

    analysis = StudyAnalysis(
        workloads=MEMBERS, concurrency_levels=(1, 4), objective_concurrency=1, k_max=4, acceptance=(), models={},
        predictions=(), recommendations=tuple(recs), snippets=(), notes=(),
    )  # fmt: skip
    return context_json(analysis, configs, WEIGHTED)


def test_a_context_study_prints_its_grid_pastes_over_the_mix_and_reports_every_cell(tmp_path: Path) -> None:
    options = dict(
        k=(1, 2), requests=3, max_tokens=40, concurrency=(1, 2), temperature=0.6, time_scale=20,
        study={"sampler": "grid"}, search={"draft_sample_method": ["probabilistic"]},
    )  # fmt: skip
    data = emulator_study("mix", **options)
    data["measure"] |= {"context": [8192], "context_weight": 0.5}
    path = write_study(tmp_path / "mix.toml", data)
    done = specsweep("study", "--config", str(path), "--studies-dir", str(tmp_path / "studies"), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "best k by context for prose" in out
    grid = out.split("best k by context for prose", 1)[1].split("\nnote:", 1)[0].split("\n\n", 1)[0]
    rows = [line for line in grid.splitlines() if line.startswith(("prose (", "prose@8k "))]
    assert len(rows) == 2 and all(len(re.findall(r"(?:k=\d|speculation off)\*? \d+\.\d", r)) == 2 for r in rows), out
    # one paste, over the mix (weighed as measure.context_weight = 0.5 says), with a line per context
    assert "paste for prose:" in out and "paste for prose@8k" not in out
    flat = " ".join(out.split())
    assert re.search(r"context mix of prose \(\d+ tokens\) 50%, prose@8k 50% \(the study's context_weight", flat)
    assert re.search(r"note: prose \(\d+ tokens\) gives up", flat) and "note: prose@8k gives up" in flat

    report = specsweep("report", str(tmp_path / "studies" / "mix"), cwd=tmp_path)
    assert report.returncode == 0, report.stdout + report.stderr
    folder = tmp_path / "studies" / "mix" / "report"
    figure = folder / "figures" / "context-prose.png"
    assert figure.stat().st_size > 10_000 and figure.read_bytes().startswith(b"\x89PNG")
    markdown = (folder / "report.md").read_text(encoding="utf-8")
    table = markdown.split("## prose: best k by context", 1)[1].split("\n\n")[2].splitlines()
    assert table[0] == "| context | concurrency 1 | concurrency 2 |"
    assert [line.split(" | ")[0] for line in table[2:]] == [f"| {rows[0].split(')')[0]})", "| prose@8k"]
    assert all(len(re.findall(r"tok/s", line)) == 2 for line in table[2:]), table
    results = json.loads((folder / "results.json").read_text(encoding="utf-8"))
    tokens = {r["workload"]: r["context_tokens"] for r in results["recommendations"]}
    assert tokens["prose@8k"] == 8192 and tokens["prose"] < 1000  # every recommendation says its context
    (entry,) = results["context"]
    assert entry["weights"] == {"prose": 0.5, "prose@8k": 0.5} and not entry["weighed_evenly"]
    assert [c["context_tokens"] for c in entry["contexts"]][1] == 8192
    assert all(len(c["cells"]) == 2 for c in entry["contexts"])
    assert set(entry["paste_runs"]) == {"1", "2"}
    rows_csv = list(csv.DictReader(io.StringIO((folder / "results.csv").read_text(encoding="utf-8"))))
    assert {r["workload"]: r["context"] for r in rows_csv}["prose@8k"] == "8192"
    assert float({r["workload"]: r["context"] for r in rows_csv}["prose"]) < 1000


def test_the_mix_reads_the_contexts_draws_so_it_names_what_they_cannot_tell_apart() -> None:
    """The pick over the mix is the one rule's, over the contexts' draws mixed draw by draw: where
    every context knows its rates exactly, k = 4 (74.5 over the mix) leads k = 2 (72.5) alone; where
    each context's draws spread by 10%, the mix cannot tell them apart and names k = 2 tied."""
    weights, _ = mix_weights(MEMBERS, WEIGHTED)
    exact = mix_recommendation("w", cells(), samples(), weights)
    assert exact.choice == K4 and K2 not in exact.tied
    rng = np.random.default_rng(0)
    noisy = {}
    for m, sample in samples().items():
        draws = sample.draws * np.exp(rng.normal(0.0, 0.10, sample.draws.shape))
        noisy[m] = RateSample(
            concurrency=1, candidates=sample.candidates, tokens_per_step=sample.tokens_per_step,
            step_time_s=sample.step_time_s, step_time_source=sample.step_time_source,
            tokens_per_s=sample.tokens_per_s, draws=draws,
        )  # fmt: skip
    loose = mix_recommendation("w", cells(), noisy, weights)
    assert {loose.choice, *loose.tied} >= {K2, K4}
    assert loose.reason.startswith("over the context mix (w 50%, w@16k 25%, w@64k 25%): ")
