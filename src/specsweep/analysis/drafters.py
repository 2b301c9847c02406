"""The vocabulary every comparison speaks: a drafter, a candidate (a drafter at k, or speculation
off), and how each, and a configuration (types.Configuration), is named in output.

A drafter is everything in a spec config but its draft length: the method with any other field a
study sets or opens (``model``, ``prompt_lookup_max``, ...) and the draft sampling. Acceptance
and step time belong to a drafter; k picks a point on its curves.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from specsweep.errors import ConfigError
from specsweep.types import Configuration, SpeculativeConfig

# Fields of a spec config that say how long or how drafts are drawn, not which drafter runs.
_NOT_DRAFTER_FIELDS = ("num_speculative_tokens", "draft_sample_method", "num_speculative_tokens_per_batch_size")


@dataclass(frozen=True, slots=True, kw_only=True, order=True)
class Drafter:
    """A draft method as vLLM names it (with any other fields that set it apart), and how drafted
    tokens are sampled. Drafters sort by method, then draft sampling."""

    method: str
    draft_sample_method: str = "greedy"

    @property
    def label(self) -> str:
        """``dspark (probabilistic)``."""
        return f"{self.method} ({self.draft_sample_method})"


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """One configuration to compare: a drafter at draft length k, or speculation off (k = 0)."""

    drafter: Drafter | None
    num_speculative_tokens: int

    @property
    def off(self) -> bool:
        return self.num_speculative_tokens == 0 or self.drafter is None

    @property
    def label(self) -> str:
        """``k=2 dspark (probabilistic)``, or ``speculation off``."""
        if self.off or self.drafter is None:
            return "speculation off"
        return f"k={self.num_speculative_tokens} {self.drafter.label}"

    @property
    def short_label(self) -> str:
        """``k=2 probabilistic`` (where the method goes without saying), or ``speculation off``."""
        if self.off or self.drafter is None:
            return "speculation off"
        return f"k={self.num_speculative_tokens} {self.drafter.draft_sample_method}"


OFF = Candidate(drafter=None, num_speculative_tokens=0)


def drafter_label(drafter: Drafter | None) -> str:
    """A drafter's label, or ``speculation off`` for none."""
    return "speculation off" if drafter is None else drafter.label


def drafter_of(spec: SpeculativeConfig | None) -> Drafter | None:
    """The drafter a spec config runs: everything but its draft length (None: speculation off)."""
    if spec is None or not spec.num_speculative_tokens:
        return None
    fields = {k: v for k, v in json.loads(spec.to_json()).items() if k not in _NOT_DRAFTER_FIELDS}
    method = str(fields.pop("method", None) or "draft")
    if fields:
        method += " " + ",".join(f"{k}={json.dumps(v, separators=(',', ':'))}" for k, v in sorted(fields.items()))
    return Drafter(method=method, draft_sample_method=spec.draft_sample_method)


def candidate_of(spec: SpeculativeConfig | None, concurrency: int = 1) -> Candidate:
    """The candidate a spec config is at a concurrency (a per-batch-size table picks its k there)."""
    drafter = drafter_of(spec)
    k = spec.k_for_batch_size(concurrency) if spec is not None else 0
    return Candidate(drafter=drafter if k else None, num_speculative_tokens=k if drafter else 0)


def configuration_label(configuration: Configuration, *, short: bool = False) -> str:
    """How output names a configuration: its candidate's label (``k=2 dspark (probabilistic)``, or
    with ``short`` ``k=2 probabilistic``; ``speculation off``). A per-batch-size table is named by
    its k at one sequence."""
    candidate = candidate_of(configuration.spec)
    return candidate.short_label if short else candidate.label


def drafter_fields(drafter: Drafter) -> dict[str, object]:
    """The spec-config fields a drafter stands for (``drafter_of`` read back): the method, the draft
    sampling and any other field its label carries (``model``, ``prompt_lookup_max``, ...)."""
    method, _, rest = drafter.method.partition(" ")
    fields: dict[str, object] = {} if method == "draft" else {"method": method}
    decoder = json.JSONDecoder()
    while rest:
        name, _, rest = rest.partition("=")
        value, end = decoder.raw_decode(rest)
        fields[name] = value
        rest = rest[end:].removeprefix(",")
    if drafter.draft_sample_method != "greedy":
        fields["draft_sample_method"] = drafter.draft_sample_method
    return fields


def find_drafter(drafters: Sequence[Drafter], name: str | None, *, draft_sample_method: str | None = None) -> Drafter:
    """The one drafter of ``drafters`` that ``name`` names: its label (``dspark (probabilistic)``),
    its method (``dspark``) or its draft sampling (``probabilistic``) where that is unambiguous;
    ``draft_sample_method`` narrows further (a running config says it). No name: the only drafter.
    ConfigError, naming every drafter by its label, when none or several match."""
    listed = ", ".join(repr(d.label) for d in drafters) or "none"
    chosen = list(drafters)
    if name is not None:
        wanted = name.strip()
        chosen = [d for d in chosen if wanted in (d.label, d.method, d.method.split(" ", 1)[0], d.draft_sample_method)]
        if not chosen:
            raise ConfigError(f"the rig has no drafter {name!r}; its drafters are {listed}: name one with --drafter.")
    if draft_sample_method is not None:
        chosen = [d for d in chosen if d.draft_sample_method == draft_sample_method]
        if not chosen:
            raise ConfigError(
                f"the rig has no drafter that drafts {draft_sample_method} as the server does; its drafters are "
                f"{listed}: measure a rig with this one (specsweep study)."
            )
    if len(chosen) == 1:
        return chosen[0]
    if not chosen:
        raise ConfigError("the rig has no drafter: measure a rig with speculation on (specsweep study).")
    several = ", ".join(repr(d.label) for d in chosen)
    raise ConfigError(
        f"the rig has {len(chosen)} drafters that could be the running one ({several}): "
        f"name it, e.g. --drafter '{chosen[-1].label}'."
    )
