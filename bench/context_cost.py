"""The cost of ignoring context: the configuration picked at short prompts, run at long ones.

    python bench/context_cost.py [--profiles NAME,...] [--decode]

Cases: sweep_efficiency's (the 2 bundled emulator profiles and the 6 in bench/profiles/, each
with its own objective concurrency; the prose and technical workloads), at concurrency 1 and the
objective's. Configurations: draft lengths 1..8 with both draft sampling methods and speculation
off, the first drafting method of the profile, at its reference temperature, 600-token
generations.

Truth: ``compute_truth`` (what ``specsweep emulate --print-truth --context N`` prints) with
every request's prompt N tokens long: short (the bundled workload's own prompt length), 4k, 16k,
32k (the limit of half the profiles), 64k and 128k tokens. A request must fit the profile's
``max_model_len`` with its 600 generated tokens: a context beyond it is skipped (``-``), one at
it (the 16k of a 16,384-token model) is run at the longest prompt that fits,
``max_model_len - 600``, and marked ``*``.

Per cell: the best configuration at that context (closed-loop output tok/s at that concurrency,
k with ``p`` for probabilistic and ``g`` for greedy draft sampling) and the regret of the short
pick there, ``1 - rate(short pick) / rate(best)``, in percent. ``--decode`` ranks by the decode
rate alone (``B * E(k) / T``: a long prompt's prefill left out, which otherwise dilutes every
difference). Pure arithmetic on the emulator's model: a few seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from specsweep.config import SearchSpace
from specsweep.emulator.model import compute_truth, workload_prompt_tokens
from specsweep.emulator.profile import Profile, load_profile
from specsweep.engines.vllm import validate_speculative_config
from specsweep.tuning.space import build_space
from specsweep.types import SpeculativeConfig

sys.path.insert(0, str(Path(__file__).parent))
from sweep_efficiency import K_MAX, MAX_TOKENS, PROFILES

CONTEXTS = (("short", 0), ("4k", 4096), ("16k", 16384), ("32k", 32768), ("64k", 65536), ("128k", 131072))
WORKLOADS = ("prose", "technical")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One context of one row: its best configuration and what the short pick loses there."""

    label: str  # short, 4k, ...
    prompt_tokens: int  # each request's prompt, as run
    capped: bool  # the context was the model's limit: run at the longest prompt that fits
    best: str  # configuration key ("off" or the spec config's JSON)
    best_rate: float  # true closed-loop output tok/s of the best
    pick_rate: float  # the same for the short pick
    pick_step_s: float  # the short pick's mean decode step at this context

    @property
    def regret(self) -> float:
        return 1.0 - self.pick_rate / self.best_rate


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    profile: str
    workload: str
    concurrency: int
    pick: str  # the best configuration at the short context
    cells: tuple[Cell | None, ...]  # one per CONTEXTS entry; None: beyond max_model_len


def configurations(profile: Profile) -> dict[str, SpeculativeConfig | None]:
    """Every configuration of the grid, keyed, with ``off`` for speculation off (as sweep_efficiency's cases)."""
    fixed = {"method": profile.methods[0]}
    if profile.methods[0] in ("eagle", "eagle3", "draft_model"):
        fixed["model"] = f"bench/{profile.methods[0]}-drafter"
    space = build_space(
        SearchSpace(num_speculative_tokens=(1, K_MAX), fixed=fixed),
        temperature=profile.reference_temperature,
        engine_has_draft_sample_method=True,
    )
    found: dict[str, SpeculativeConfig | None] = {"off": None}
    found.update({c.key: c.spec for c in space.configurations() if c.spec is not None})
    return found


def prompt_for(profile: Profile, workload: str, tokens: int) -> tuple[int, bool] | None:
    """The prompt a context is run at, and whether it was capped; None when beyond the model."""
    if not tokens:
        return workload_prompt_tokens(workload), False
    if tokens > profile.max_model_len:
        return None
    fits = profile.max_model_len - MAX_TOKENS
    return min(tokens, fits), tokens > fits


Rates = dict[str, dict[int, tuple[float, float]]]  # configuration key -> level -> (tok/s, step seconds)


def truth_at(profile: Profile, specs: dict[str, SpeculativeConfig | None], workload: str, prompt: int,
             levels: list[int], rate: str) -> Rates:  # fmt: skip
    """Every configuration's true rate (``rate``: a LevelTruth field) and step at each level, at one prompt length."""
    rates: Rates = {}
    for key, spec in specs.items():
        truth = compute_truth(profile, spec, profile.reference_temperature, levels,
                              max_tokens=MAX_TOKENS, prompt_tokens={workload: prompt})  # fmt: skip
        rates[key] = {lv.concurrency: (getattr(lv, rate), lv.step_time_s) for lv in truth[workload].levels}
    return rates


def context_rows(profile: Profile, objective: int, contexts=CONTEXTS, rate: str = "output_tokens_per_s") -> list[Row]:
    """The rows of one profile: each workload at concurrency 1 and the objective's; ``contexts``
    lists (label, tokens), the first being the one the pick is made at (0: the workload's own)."""
    levels = sorted({1, objective})
    specs = configurations(profile)
    rows = []
    for workload in WORKLOADS:
        prompts = [prompt_for(profile, workload, tokens) for _, tokens in contexts]
        rates = [truth_at(profile, specs, workload, p[0], levels, rate) if p else None for p in prompts]
        short = rates[0]
        assert short is not None, "the pick's context must fit the model"
        for level in levels:
            pick = max(short, key=lambda key: short[key][level][0])
            cells: list[Cell | None] = []
            for (label, _), prompt, at in zip(contexts, prompts, rates, strict=True):
                if prompt is None or at is None:
                    cells.append(None)
                    continue
                best = max(at, key=lambda key: at[key][level][0])
                cells.append(Cell(label=label, prompt_tokens=prompt[0], capped=prompt[1], best=best,
                                  best_rate=at[best][level][0], pick_rate=at[pick][level][0],
                                  pick_step_s=at[pick][level][1]))  # fmt: skip
            rows.append(Row(profile=profile.name, workload=workload, concurrency=level, pick=pick, cells=tuple(cells)))
    return rows


def describe(key: str) -> str:
    """``off``, or k and the draft sampling's initial: ``3p``, ``5g``."""
    if key == "off":
        return "off"
    spec = validate_speculative_config(json.loads(key))
    return f"{spec.num_speculative_tokens}{spec.draft_sample_method[0]}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default="", help="only profiles whose name holds one of these (a,b,...)")
    parser.add_argument("--decode", action="store_true", help="rank by the decode rate alone (no prefill)")
    args = parser.parse_args()
    wanted = [w for w in args.profiles.split(",") if w]
    profiles = [(n, c) for n, c in PROFILES if not wanted or any(w in Path(n).stem for w in wanted)]
    if not profiles:
        parser.error(f"no profile matches {args.profiles!r}")
    print(
        f"best configuration per context (k, p/g: probabilistic/greedy draft sampling) and the regret of the "
        f"short-prompt pick there, %; {'decode' if args.decode else 'closed-loop output'} tok/s, "
        f"{MAX_TOKENS}-token generations; "
        f"- beyond max_model_len, * capped at max_model_len - {MAX_TOKENS}"
    )
    header = f"{'profile':23s} {'workload':9s} {'B':>3s} " + " ".join(f"{label:>11s}" for label, _ in CONTEXTS)
    print(header)
    print("-" * len(header))
    rows = []
    for name, objective in profiles:
        rate = "decode_tokens_per_s" if args.decode else "output_tokens_per_s"
        for row in context_rows(load_profile(name), objective, rate=rate):
            rows.append(row)
            parts = []
            for cell in row.cells:
                if cell is None:
                    parts.append(f"{'-':>11s}")
                else:
                    mark = "*" if cell.capped else " "
                    parts.append(f"{describe(cell.best):>4s} {100 * cell.regret:5.1f}{mark}")
            print(f"{row.profile[:23]:23s} {row.workload:9s} {row.concurrency:3d} " + " ".join(parts))
    print("-" * len(header))
    cells = [(row, cell) for row in rows for cell in row.cells[1:] if cell is not None]
    losing = [(row, cell) for row, cell in cells if cell.regret > 0.01]
    moved = [(row, cell) for row, cell in cells if cell.best != row.pick]
    row, cell = max(cells, key=lambda rc: rc[1].regret)
    print(
        f"{len(cells)} long-context cells: the best configuration moves from the short pick in {len(moved)}, "
        f"{len(losing)} lose more than 1%; worst {100 * cell.regret:.1f}%: {row.profile} {row.workload} "
        f"B={row.concurrency} at {cell.label} ({cell.prompt_tokens} prompt tokens), short pick "
        f"{describe(row.pick)} vs best {describe(cell.best)}"
    )


if __name__ == "__main__":
    main()
