"""The rig file's JSON shape (schema version 1), as pure conversions to and from dicts.

    {"schema": "specsweep-rig", "schema_version": 1,
     "identity": {engine, engine_version, model, server_args, server_facts, specsweep_version},
     "request_shape": {api, temperature, max_tokens, workloads: {name: {prompt_tokens, completion_tokens}}},
     "levels": [{num_speculative_tokens, concurrency, drafter, output_tokens_per_s, tokens_per_step,
                 completion_tokens, decode_span_s, prompt_tokens, requests, workload, trial,
                 draft_share, decode_step_time_s, request_overhead_s}, ...],
     "step_time": {"pooled_relative_sd": ..., "fits": [{concurrency, drafter, intercept_s,
                   slope_s_per_token, relative_sd, residual_df, basis, points: [...]}, ...]}}

``levels`` are the data; ``step_time`` is the model fitted on them, written for readers. Reading
fits the model again from ``levels`` (the fit is deterministic), so a hand-edited fit cannot
disagree with its points.
"""

from __future__ import annotations

from typing import Any

from specsweep.analysis.rig import RIG_SCHEMA_VERSION, LevelTiming, RequestShape, Rig, RigIdentity, fit_rig
from specsweep.analysis.throughput import Drafter
from specsweep.errors import ConfigError

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
                "decode_step_time_s": lv.decode_step_time_s,
                "request_overhead_s": lv.request_overhead_s,
            }
            for lv in rig.levels
        ],
        "step_time": {
            "pooled_relative_sd": rig.model.pooled_relative_sd,
            "fits": [
                {
                    "concurrency": fit.concurrency,
                    "drafter": _drafter(fit.drafter),
                    "intercept_s": fit.intercept_s,
                    "slope_s_per_token": fit.slope_s_per_token,
                    "relative_sd": fit.relative_sd,
                    "residual_df": fit.residual_df,
                    "basis": fit.basis,
                    "points": [
                        {
                            "num_speculative_tokens": p.num_speculative_tokens,
                            "step_time_s": p.step_time_s,
                            "observations": p.observations,
                        }
                        for p in fit.points
                    ],
                }
                for fit in rig.model.fits
            ],
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
            server_args=None if ident.get("server_args") is None else tuple(str(a) for a in ident["server_args"]),
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
            )
            for lv in data["levels"]
        ]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ConfigError(f"{source} is damaged ({type(exc).__name__}: {exc}); write it again.") from None
    return fit_rig(levels, identity=identity, shape=request_shape)
