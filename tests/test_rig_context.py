"""A rig at context levels: a rig built from levels at several contexts keeps them, a workload
measured at a context (``W@64k``) is answered from the one step model read there, and a rig
that measured no context level refuses to answer one in one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from specsweep.analysis.drafters import Drafter
from specsweep.analysis.fits import fit_acceptance
from specsweep.context_prompts import load_workload_or_level
from specsweep.errors import ConfigError
from specsweep.rigs.file import rig_from_dict, rig_to_dict, write_rig
from specsweep.rigs.model import LevelTiming, RequestShape, Rig, RigIdentity, check_rig_context, fit_rig
from specsweep.rigs.stored import level_timings
from specsweep.rigs.workload import recommend_with_rig, workload_timing

from .builders import specsweep

DRAFTER = Drafter(method="dspark", draft_sample_method="probabilistic")
IDENTITY = RigIdentity(engine="vllm", engine_version="0.33.0", model="m", server_args=("vllm", "serve", "m"))
SHAPE = RequestShape(api="chat", temperature=0.0, max_tokens=600, workloads={})
K_MAX = 6
M = 600.0  # completion tokens per request
OVERHEAD_S = 0.05  # a request's time outside its decode steps
# The rig's own workload, and the one answered on it: a drafter that matches three tokens, then rarely.
RIG_ACCEPTANCE = (0.7, 0.5, 0.35, 0.2, 0.1, 0.05)
ANSWERED = (0.9, 0.8, 0.7, 0.12, 0.08, 0.05)


def truth_step_s(b: int, k: int, c: int) -> float:
    """A step's seconds from what a server does: weights, each sequence, each verified and drafted
    token, and each sequence's KV cache read over its context (1 us per 1,000 tokens)."""
    return 0.020 + 0.001 * b + 0.0006 * b * (k + 1) + 0.02 * k + 1e-6 * b * c


def tokens_per_step(acceptance: tuple[float, ...], k: int) -> float:
    return 1.0 + sum(acceptance[:k])


def truth_rate(b: int, k: int, c: int, acceptance: tuple[float, ...] = ANSWERED) -> float:
    """Aggregate tok/s of B closed-loop streams: B M / (c + (M - 1) T / E)."""
    return b * M / (OVERHEAD_S + (M - 1.0) * truth_step_s(b, k, c) / tokens_per_step(acceptance, k))


def truth_best(b: int, c: int) -> int:
    return max(range(K_MAX + 1), key=lambda k: truth_rate(b, k, c))


def level(b: int, k: int, c: int, acceptance: tuple[float, ...], *, workload: str, trial: int) -> LevelTiming:
    e = tokens_per_step(acceptance, k)
    return LevelTiming(
        num_speculative_tokens=k, concurrency=b, drafter=DRAFTER if k else None,
        output_tokens_per_s=truth_rate(b, k, c, acceptance), tokens_per_step=e, completion_tokens=M,
        decode_span_s=(M - 1.0) * truth_step_s(b, k, c) / e, prompt_tokens=400.0 + c, requests=12,
        workload=workload, trial=trial, context_tokens=c,
    )  # fmt: skip


def rig_at(contexts: tuple[int, ...]) -> Rig:
    """Off and k = 1..6 of the rig's workload at 1 and 4 streams, each k one start measuring every
    context level (its W@C levels after W's, as a study measures them)."""
    levels = [
        level(b, k, c, RIG_ACCEPTANCE, workload="technical" if not c else f"technical@{c // 1024}k", trial=k)
        for k in range(K_MAX + 1)
        for c in contexts
        for b in (1, 4)
    ]
    return fit_rig(levels, identity=IDENTITY, shape=SHAPE)


def answer(rig: Rig, context: int) -> dict[int, int]:
    """The recommended k per concurrency for the answered workload, measured once at the running
    k = 6 at this context (every position counted, so no acceptance is extrapolated)."""
    drafts = 100000.0
    fit = fit_acceptance(num_drafts=drafts, accepted_per_position=[s * drafts for s in ANSWERED], k_max=K_MAX)
    name = "prose" if not context else f"prose@{context // 1024}k"
    running = [level(b, K_MAX, context, ANSWERED, workload=name, trial=None) for b in (1, 4)]  # type: ignore[arg-type]
    timing = workload_timing(name, running)
    assert timing.context_tokens == context
    results = recommend_with_rig(rig, {DRAFTER: fit}, timing, k_max=K_MAX)
    return {r.recommendation.concurrency: r.recommendation.choice.num_speculative_tokens for r in results}


def test_the_truths_best_k_moves_with_context() -> None:
    """What the tests below rest on: a rig read at no context would pick the wrong k at 64k."""
    assert {b: truth_best(b, 0) for b in (1, 4)} == {1: 0, 4: 1}
    assert {b: truth_best(b, 65536) for b in (1, 4)} == {1: 3, 4: 3}


def test_a_workload_at_a_measured_context_gets_the_truths_best_k_there() -> None:
    rig = rig_at((0, 16384, 65536))
    assert rig.context_levels == (16384, 65536) and rig.model.posterior.reads_context
    for context in (0, 65536):
        assert answer(rig, context) == {b: truth_best(b, context) for b in (1, 4)}, context


def test_a_context_the_rig_did_not_measure_is_read_linearly_and_said_once() -> None:
    rig = rig_at((0, 16384, 65536))
    assert answer(rig, 32768) == {b: truth_best(b, 32768) for b in (1, 4)}
    note = check_rig_context(rig, [0, 32768], what="workload prose@32k")
    assert note is not None and "context 32k was not measured on the rig (it measured 16k, 64k)" in note
    assert check_rig_context(rig, [0, 65536], what="workload prose@64k") is None


def test_a_rig_without_context_levels_refuses_one() -> None:
    rig = rig_at((0,))
    assert rig.context_levels == () and not rig.model.posterior.reads_context
    assert check_rig_context(rig, [0], what="workload prose") is None
    with pytest.raises(ConfigError, match="the rig measured no context level") as error:
        check_rig_context(rig, [65536], what="workload prose@64k")
    assert "measure.context" in str(error.value) and "study --context" in str(error.value)


def test_the_rig_file_keeps_each_levels_context_and_an_old_file_reads_as_context_0() -> None:
    rig = rig_at((0, 65536))
    data = json.loads(json.dumps(rig_to_dict(rig)))
    again = rig_from_dict(data)
    assert again.levels == rig.levels and again.context_levels == (65536,)
    assert again.model.context_tokens == 0 and again.model.posterior.reads_context
    plain = rig_at((0,))
    old = rig_to_dict(plain)
    for lv in old["levels"]:
        del lv["context_tokens"]  # as rig files were written before they kept context levels
    assert rig_from_dict(old).levels == plain.levels


def test_a_stored_context_levels_timings_carry_its_context() -> None:
    records = [{"completion_tokens": 101, "prompt_tokens": 16000, "ttft_s": 0.5, "last_token_s": 2.5}] * 4
    stored = {"workload": "prose@16k", "levels": [{"concurrency": 1, "output_tokens_per_s": 150.0, "records": records}]}
    (timing,) = level_timings(stored, None)
    assert timing.context_tokens == 16384 and timing.workload == "prose@16k"


def test_measure_reads_a_context_level_by_its_name() -> None:
    loaded = load_workload_or_level("prose@8k")
    assert loaded.name == "prose@8k" and loaded.prompts[0].shared_prefix


def test_measure_with_a_rig_without_context_levels_refuses_a_context_level_in_one_line(tmp_path: Path) -> None:
    """Refused before the server is asked anything: nothing listens at the endpoint."""
    write_rig(tmp_path / "rig.json", rig_at((0,)))
    done = specsweep("measure", "--endpoint", "http://127.0.0.1:9", "--workload", "prose@64k",
                     "--rig", str(tmp_path / "rig.json"), cwd=tmp_path)  # fmt: skip
    assert done.returncode != 0
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert "Traceback" not in done.stderr
    assert "workload prose@64k asks for context 64k, but the rig measured no context level" in lines[0]


def test_the_rig_shows_its_context_levels() -> None:
    from rich.console import Console

    from specsweep.cli.rig_printers import describe_rig, print_rig

    rig = rig_at((0, 65536))
    assert "concurrency [1, 4], context levels 64k," in describe_rig(rig)
    assert "context levels" not in describe_rig(rig_at((0,)))
    out = Console(record=True, width=400)
    print_rig(out, rig)
    shown = out.export_text()
    assert "concurrency 4 at context 64k, dspark (probabilistic): decode step ms k=1" in shown
    assert "concurrency 4, speculation off: decode step ms k=0" in shown


def test_watch_reads_traffic_at_the_workloads_own_prompts_whatever_the_rigs_context_levels_cost() -> None:
    """Watch predicts served traffic at context 0: a rig's context levels, whose requests also pay
    their long prompt's prefill (2 s here), move neither the overhead it carries to the traffic nor
    its predicted rates (against the same rig without them)."""
    from specsweep.watch.prediction import predict_traffic

    def slow_prefill(lv: LevelTiming) -> LevelTiming:
        if not lv.context_tokens:
            return lv
        return replace(lv, output_tokens_per_s=lv.concurrency * M / (2.0 + lv.decode_span_s))

    plain = rig_at((0,))
    with_context = fit_rig([slow_prefill(lv) for lv in rig_at((0, 16384)).levels], identity=IDENTITY, shape=SHAPE)
    fit = fit_acceptance(num_drafts=1e5, accepted_per_position=[s * 1e5 for s in ANSWERED], k_max=K_MAX)
    rates = [
        predict_traffic(
            rig, DRAFTER, fit, weights={1: 0.5, 2: 0.5}, completion_tokens=M, running=None, k_max=K_MAX, seed=1
        )
        for rig in (plain, with_context)
    ]
    for batch in (1, 2):
        assert rates[1].samples[batch].tokens_per_s == pytest.approx(rates[0].samples[batch].tokens_per_s, rel=0.01)


@pytest.mark.parametrize("context", [0, 32768, 65536])
def test_watch_reads_the_rig_at_the_served_context_and_gets_the_truths_best_k_there(context: int) -> None:
    """Served prompts of 400 + C tokens: watch reads the rig's one step model at C (the context
    beyond the rig's own prompts, from the prompt-token counter over finished requests), at a
    batch size the rig measured (1) and one it carries between its levels (2)."""
    from specsweep.analysis.drafters import OFF, Candidate
    from specsweep.watch.prediction import predict_traffic, served_context

    rig = rig_at((0, 16384, 65536))
    # the rig's own prompts are its workload's as it is, not its context levels' (16k, 64k long)
    own = {"technical": {"prompt_tokens": 400.0}, "technical@16k": {"prompt_tokens": 16784.0}}
    rig = replace(rig, shape=replace(SHAPE, workloads=own))
    read, note = served_context((400.0 + context) * 30, 30, rig)
    assert read == context
    assert (note is None) if context == 0 else f"read at the served context: {context:,} tokens" in (note or "")
    fit = fit_acceptance(num_drafts=1e5, accepted_per_position=[s * 1e5 for s in ANSWERED], k_max=K_MAX)
    prediction = predict_traffic(
        rig, DRAFTER, fit, weights={1: 1.0}, completion_tokens=M, running=None, k_max=K_MAX, context_tokens=read
    )
    sample = prediction.samples[1]
    best = sample.candidates[int(np.argmax(sample.tokens_per_s))]
    k = 0 if best == OFF else best.num_speculative_tokens
    assert k == truth_best(1, context)
    assert isinstance(best, Candidate) and prediction.context_tokens == context


def test_watch_says_where_served_prompts_are_long_and_the_rig_cannot_read_a_context() -> None:
    plain = replace(rig_at((0,)), shape=replace(SHAPE, workloads={"technical": {"prompt_tokens": 400.0}}))
    assert served_context_of(plain, 450.0) == (0, None)  # as long as the rig's own: nothing to say
    read, note = served_context_of(plain, 20400.0)
    assert read == 0 and note is not None and "20,000 beyond the rig's own" in note
    assert "measured no context level" in note and "--context 20k" in note  # 20,000 tokens: about 20k
    # with --out, watch names the study that measures the contexts served, from what it wrote
    from specsweep.watch.report import context_from_line

    said = context_from_line(SimpleNamespace(windows=[SimpleNamespace(notes=(note,))]), Path("seen"))  # type: ignore[arg-type]
    assert said == "measure at the contexts served: specsweep study --context-from seen"
    assert context_from_line(SimpleNamespace(windows=[SimpleNamespace(notes=())]), Path("seen")) is None  # type: ignore[arg-type]


def served_context_of(rig: Rig, prompt_tokens: float) -> tuple[int, str | None]:
    from specsweep.watch.prediction import served_context

    return served_context(prompt_tokens * 10, 10, rig)
