"""Parametric curves for conditional acceptance p_i along the draft, and their likelihood.

Data: n_0 = num_drafts steps, n_i = steps that accepted at least i drafted tokens. Each
position is a binomial trial on the steps that reached it: n_i ~ Binomial(n_(i-1), p_i).

Each model maps an unconstrained parameter vector theta (any real numbers, so the optimiser
needs no constraints and a normal approximation around the optimum is sensible) to p_i:

- geometric:       p_i = a                               a = sigmoid(t0)
- logistic:        logit p_i = b0 + b1 (i - 1)           b0 = t0, b1 = t1 (b1 = 0 is geometric)
- exponential:     p_i = a g^(i - 1)                     a = sigmoid(t0), g = sigmoid(t1)
- beta_geometric:  a ~ Beta(alpha, beta) across contexts mean m = sigmoid(t0), size c = exp(t1),
                   S_i = B(alpha + i, beta) / B(alpha, beta), alpha = m c, beta = (1 - m) c
                   so p_i = (alpha + i - 1) / (alpha + beta + i - 1)

The beta-geometric runs on (mean, size) rather than (alpha, beta): its geometric limit is
c -> infinity at fixed m, one parameter on its bound rather than two drifting together. The
exponential never rises (g < 1): a rising one would reach p = 1 and extrapolate as if the drafter
never missed again; curves that rise (easy and hard contexts mixed) are the other two's job.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy.special import expit, gammaln

# Unconstrained parameters stay inside these bounds: far enough that a rate of 0 or 1 (or
# a geometric limit of the beta-geometric) is reached to within 1e-13, near enough to keep
# the optimiser and the Hessian finite.
BOUND = 30.0
SIZE_BOUNDS = (-7.0, 16.0)  # log(alpha + beta)
EPS = 1e-12


@dataclass(frozen=True, slots=True)
class DecayModel:
    """One family of curves p_i(theta)."""

    name: str
    param_names: tuple[str, ...]
    conditional: Callable[[np.ndarray, np.ndarray], np.ndarray]  # (theta[..., m], i[K]) -> p[..., K]
    natural: Callable[[np.ndarray], tuple[float, ...]]  # theta -> the parameters as reported
    bounds: tuple[tuple[float, float], ...]
    starts: Callable[[np.ndarray], list[np.ndarray]]  # empirical p_i -> starting points


def _logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, dtype=float), 1e-6, 1 - 1e-6)
    logit: np.ndarray = np.log(q / (1 - q))
    return logit


def _pooled(rates: np.ndarray) -> float:
    finite = rates[np.isfinite(rates)]
    return float(np.mean(finite)) if finite.size else 0.5


def _geometric(theta: np.ndarray, i: np.ndarray) -> np.ndarray:
    return np.broadcast_to(expit(theta[..., 0:1]), (*theta.shape[:-1], i.size))


def _logistic(theta: np.ndarray, i: np.ndarray) -> np.ndarray:
    return np.asarray(expit(theta[..., 0:1] + theta[..., 1:2] * (i - 1)), dtype=float)


def _exponential(theta: np.ndarray, i: np.ndarray) -> np.ndarray:
    a, g = expit(theta[..., 0:1]), expit(theta[..., 1:2])
    return np.asarray(np.clip(a * g ** (i - 1), EPS, 1 - EPS), dtype=float)


def _beta_geometric(theta: np.ndarray, i: np.ndarray) -> np.ndarray:
    mean, size = expit(theta[..., 0:1]), np.exp(theta[..., 1:2])
    return np.asarray((mean * size + i - 1) / (size + i - 1), dtype=float)


def _alpha_beta(theta: np.ndarray) -> tuple[float, float]:
    mean, size = float(expit(theta[0])), float(np.exp(theta[1]))
    return mean * size, (1.0 - mean) * size


def _first(rates: np.ndarray) -> float:
    return float(rates[0]) if rates.size and np.isfinite(rates[0]) else _pooled(rates)


MODELS: tuple[DecayModel, ...] = (
    DecayModel(
        name="geometric",
        param_names=("a",),
        conditional=_geometric,
        natural=lambda t: (float(expit(t[0])),),
        bounds=((-BOUND, BOUND),),
        starts=lambda r: [np.array([_logit(_pooled(r))])],
    ),
    DecayModel(
        name="logistic",
        param_names=("b0", "b1"),
        conditional=_logistic,
        natural=lambda t: (float(t[0]), float(t[1])),
        bounds=((-BOUND, BOUND), (-10.0, 10.0)),
        starts=lambda r: [np.array([_logit(_pooled(r)), 0.0]), np.array([_logit(_first(r)), -0.3])],
    ),
    DecayModel(
        name="exponential",
        param_names=("a", "g"),
        conditional=_exponential,
        natural=lambda t: (float(expit(t[0])), float(expit(t[1]))),
        bounds=((-BOUND, BOUND), (-BOUND, BOUND)),
        starts=lambda r: [np.array([_logit(_first(r)), 3.0]), np.array([_logit(_first(r)), 0.0])],
    ),
    DecayModel(
        name="beta_geometric",
        param_names=("alpha", "beta"),
        conditional=_beta_geometric,
        natural=_alpha_beta,
        bounds=((-BOUND, BOUND), SIZE_BOUNDS),
        starts=lambda r: [np.array([_logit(_first(r)), np.log(4.0)]), np.array([_logit(_pooled(r)), np.log(40.0)])],
    ),
)

MODEL_NAMES = tuple(m.name for m in MODELS)


def model_named(name: str) -> DecayModel:
    """The model called ``name`` (one of MODEL_NAMES)."""
    for model in MODELS:
        if model.name == name:
            return model
    raise ValueError(f"unknown decay model {name!r}; known: {', '.join(MODEL_NAMES)}")


def log_likelihood(conditional: np.ndarray, counts: np.ndarray) -> float:
    """Binomial log-likelihood of counts n_0..n_K under p_1..p_K, binomial coefficients included."""
    reached, accepted = counts[:-1], counts[1:]
    p = np.clip(conditional, EPS, 1 - EPS)
    log_choose = gammaln(reached + 1) - gammaln(accepted + 1) - gammaln(reached - accepted + 1)
    return float(np.sum(log_choose + accepted * np.log(p) + (reached - accepted) * np.log1p(-p)))


def saturated_conditional(counts: np.ndarray) -> np.ndarray:
    """p_i = n_i / n_(i-1), the maximum-likelihood rate per position (NaN where none reached i)."""
    reached, accepted = counts[:-1], counts[1:]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(reached > 0, accepted / np.where(reached > 0, reached, 1.0), np.nan)


def survival(conditional: np.ndarray) -> np.ndarray:
    """S_i = p_1 ... p_i along the last axis (vectorised over draws)."""
    return np.cumprod(conditional, axis=-1)
