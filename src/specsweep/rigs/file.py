"""The rig file: its JSON form, reading and writing it, and whether a server is the rig's.

    {"schema": "specsweep-rig", "schema_version": 1,
     "identity": {engine, engine_version, model, server_args, server_facts, specsweep_version},
     "request_shape": {api, temperature, max_tokens, workloads: {name: {prompt_tokens, completion_tokens}}},
     "levels": [{num_speculative_tokens, concurrency, drafter, output_tokens_per_s, tokens_per_step,
                 completion_tokens, decode_span_s, prompt_tokens, requests, workload, trial,
                 draft_share, context_tokens, decode_step_time_s, request_overhead_s}, ...],
     "step_time": {"pooled_relative_sd": ..., "start_sd": ..., "cell_sd": ..., "basis": "..."}}

``levels`` are the data; ``step_time`` is the model fitted on them, written for readers. Reading
fits the model again from ``levels`` (the fit is deterministic), so a hand-edited fit cannot
disagree with its points. A level's ``context_tokens`` is the context level it was measured at
(``W@16k``: 16384); a file written before rigs kept context levels has none, and reads as 0.

A rig was measured on one setup (engine, version, model, flags, server facts). A server, or a
study's server config, that differs in any of them is refused with every difference named;
what one side does not know is reported as unchecked.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep import __version__
from specsweep.analysis.drafters import Drafter
from specsweep.config import ServerConfig
from specsweep.engines.registry import server_args_without_spec
from specsweep.errors import ConfigError
from specsweep.rigs.model import RIG_SCHEMA_VERSION, LevelTiming, RequestShape, Rig, RigIdentity, fit_rig
from specsweep.runtime.identity import ServerIdentity
from specsweep.runtime.store import write_json_atomic
from specsweep.runtime.trial_server import template_argv
from specsweep.secrets import mask_argv

RIG_FILE = "rig.json"

SCHEMA_NAME = "specsweep-rig"


def _drafter(drafter: Drafter | None) -> dict[str, str] | None:
    return None if drafter is None else {"method": drafter.method, "draft_sample_method": drafter.draft_sample_method}


def rig_to_dict(rig: Rig) -> dict[str, Any]:
    """The rig as JSON-ready data."""
    identity = rig.identity
    return {
        "schema": SCHEMA_NAME,
        "schema_version": rig.schema_version,
        "identity": {
            "engine": identity.engine,
            "engine_version": identity.engine_version,
            "model": identity.model,
            "server_args": None if identity.server_args is None else list(identity.server_args),
            "server_facts": dict(identity.server_facts),
            "specsweep_version": identity.specsweep_version,
        },
        "request_shape": {
            "api": rig.shape.api,
            "temperature": rig.shape.temperature,
            "max_tokens": rig.shape.max_tokens,
            "workloads": {name: dict(values) for name, values in rig.shape.workloads.items()},
        },
        "levels": [
            {
                "num_speculative_tokens": lv.num_speculative_tokens,
                "concurrency": lv.concurrency,
                "drafter": _drafter(lv.drafter),
                "output_tokens_per_s": lv.output_tokens_per_s,
                "tokens_per_step": lv.tokens_per_step,
                "completion_tokens": lv.completion_tokens,
                "decode_span_s": lv.decode_span_s,
                "prompt_tokens": lv.prompt_tokens,
                "requests": lv.requests,
                "workload": lv.workload,
                "trial": lv.trial,
                "draft_share": lv.draft_share,
                "context_tokens": lv.context_tokens,
                "decode_step_time_s": lv.decode_step_time_s,
                "request_overhead_s": lv.request_overhead_s,
            }
            for lv in rig.levels
        ],
        "step_time": {
            "pooled_relative_sd": rig.model.posterior.run_sd,
            "start_sd": rig.model.posterior.start_sd,
            "cell_sd": rig.model.posterior.cell_sd,
            "basis": rig.model.basis,
        },
    }


def rig_from_dict(data: Any, *, source: str = "the rig file") -> Rig:
    """A rig from its JSON data; ConfigError naming what is wrong (schema, version, a field)."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA_NAME:
        raise ConfigError(f'{source} is not a specsweep rig file (no "schema": "{SCHEMA_NAME}").')
    version = data.get("schema_version")
    if version != RIG_SCHEMA_VERSION:
        raise ConfigError(
            f"{source} has rig schema version {version!r}; this specsweep reads version {RIG_SCHEMA_VERSION}: "
            "write the rig again with this version (specsweep rig STUDY_FOLDER)."
        )
    try:
        ident = data["identity"]
        shape = data["request_shape"]
        identity = RigIdentity(
            engine=str(ident["engine"]),
            engine_version=ident.get("engine_version"),
            model=ident.get("model"),
            # masked again: a rig written before specsweep masked secrets may hold them
            server_args=None if ident.get("server_args") is None else mask_argv([str(a) for a in ident["server_args"]]),
            server_facts=dict(ident.get("server_facts") or {}),
            specsweep_version=str(ident.get("specsweep_version", "")),
        )
        request_shape = RequestShape(
            api=str(shape["api"]),
            temperature=float(shape["temperature"]),
            max_tokens=int(shape["max_tokens"]),
            workloads={str(k): {a: float(b) for a, b in v.items()} for k, v in shape.get("workloads", {}).items()},
        )
        levels = [
            LevelTiming(
                num_speculative_tokens=int(lv["num_speculative_tokens"]),
                concurrency=int(lv["concurrency"]),
                drafter=None if lv.get("drafter") is None else Drafter(**lv["drafter"]),
                output_tokens_per_s=float(lv["output_tokens_per_s"]),
                tokens_per_step=float(lv["tokens_per_step"]),
                completion_tokens=float(lv["completion_tokens"]),
                decode_span_s=float(lv["decode_span_s"]),
                prompt_tokens=float(lv.get("prompt_tokens") or 0.0),
                requests=int(lv["requests"]),
                workload=str(lv.get("workload", "")),
                trial=lv.get("trial"),
                draft_share=None if lv.get("draft_share") is None else float(lv["draft_share"]),
                context_tokens=int(lv.get("context_tokens") or 0),
            )
            for lv in data["levels"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{source} is damaged ({type(exc).__name__}: {exc}); write it again.") from None
    return fit_rig(levels, identity=identity, shape=request_shape)


def write_rig(path: Path, rig: Rig) -> None:
    write_json_atomic(path, rig_to_dict(rig))


def load_rig(path: Path) -> Rig:
    """A rig file; ConfigError that says what to do when it is missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(
            f"cannot read rig file {path}: {exc.strerror or exc}; write one with specsweep rig."
        ) from None
    except ValueError as exc:
        raise ConfigError(f"rig file {path} is not JSON ({str(exc).split(';')[0]}).") from None
    except RecursionError:
        raise ConfigError(f"rig file {path} is nested too deeply to be a rig file.") from None
    return rig_from_dict(data, source=str(path))


def server_identity_as_rig(identity: ServerIdentity, *, server_args: Sequence[str] | None) -> RigIdentity:
    """A running server's identity in the rig's terms (its flags only when the user gives them)."""
    engine = identity.engine or "unknown"
    return RigIdentity(
        engine=engine,
        engine_version=identity.engine_version,
        model=identity.model,
        server_args=None if server_args is None else server_args_without_spec(engine, list(server_args)),
        server_facts={k: v for k, v in identity.facts.items() if v is not None},
        specsweep_version=__version__,
    )


def check_server_against_rig(
    rig: Rig, identity: ServerIdentity, *, server_args: Sequence[str] | None
) -> tuple[str, ...]:
    """Refuse a server that is not the rig's (ConfigError naming the difference); the unchecked fields."""
    return check_identity(rig.identity, server_identity_as_rig(identity, server_args=server_args), other_name="server")


def template_server_args(server: ServerConfig) -> tuple[str, ...] | None:
    """The flags a study's server config starts every server with (spec part, host and port left out)."""
    argv = template_argv(server)
    return None if argv is None else server_args_without_spec(server.engine, argv)


@dataclass(frozen=True, slots=True, kw_only=True)
class IdentityDifference:
    """One field where a rig and a server (or a study's server config) differ."""

    field: str
    rig: Any
    other: Any

    def describe(self, other_name: str) -> str:
        """The difference in words, the rig's side first."""
        if self.field == "server_args":
            mine, theirs = list(self.rig), list(self.other)
            only_rig = [a for a in mine if a not in theirs]
            only_other = [a for a in theirs if a not in mine]
            parts = [f"only the rig has {' '.join(only_rig)!r}"] if only_rig else []
            parts += [f"only the {other_name} has {' '.join(only_other)!r}"] if only_other else []
            return "server_args: " + (", ".join(parts) or "the same flags in another order")
        return f"{self.field}: rig {self.rig!r}, {other_name} {self.other!r}"


IDENTITY_FIELDS = ("engine", "engine_version", "model", "server_args")


def compare_identities(rig: RigIdentity, other: RigIdentity) -> tuple[tuple[IdentityDifference, ...], tuple[str, ...]]:
    """(differences, fields that could not be checked because one side does not know them).

    Facts (``server_facts``) are compared where both sides report them.
    """
    differences: list[IdentityDifference] = []
    unchecked: list[str] = []
    for name in IDENTITY_FIELDS:
        mine, theirs = getattr(rig, name), getattr(other, name)
        if mine is None or theirs is None:
            unchecked.append(name)
        elif mine != theirs:
            differences.append(IdentityDifference(field=name, rig=mine, other=theirs))
    for name in sorted(set(rig.server_facts) & set(other.server_facts)):
        if rig.server_facts[name] != other.server_facts[name]:
            differences.append(
                IdentityDifference(field=name, rig=rig.server_facts[name], other=other.server_facts[name])
            )
    return tuple(differences), tuple(unchecked)


def check_identity(rig: RigIdentity, other: RigIdentity, *, other_name: str) -> tuple[str, ...]:
    """The fields left unchecked; ConfigError naming every difference when there is one."""
    differences, unchecked = compare_identities(rig, other)
    if differences:
        shown = "; ".join(d.describe(other_name) for d in differences)
        raise ConfigError(
            f"the rig was measured on another setup ({shown}); measure this setup with specsweep study "
            "to make a rig of its own."
        )
    return unchecked
