"""RouteLLM's measures of a router between a strong and a weak model: the call-performance curve, PGR, APGR and CPT.

A router sends each query either to a strong (costly) model or to a weak (cheap) one. Ong et al. (2024, "RouteLLM:
Learning to Route LLMs with Preference Data", arXiv:2406.18665, §4) measure cost as the share of calls to the strong
model and quality as the accuracy r of the routed system, and summarise the curve of r against that share by:

- **PGR** (performance gap recovered) of a point: `(r - r_weak) / (r_strong - r_weak)`;
- **APGR** (average PGR): the area under PGR against the share of strong calls;
- **CPT(x%)** (call-performance threshold): the share of strong calls needed to recover x % of the gap.

These functions follow RouteLLM's evaluation code (`routellm/evals/benchmarks.py` and `evaluate.py` in lm-sys/RouteLLM
@ 0b64fda) step by step, so the numbers are comparable with the paper's:

- [`call_performance_curve`]: a router's score per query (higher = strong model), thresholds at the quantiles of the
  scores at 0, 1/10, ..., 1 (`pd.qcut(scores, 10)`, linear interpolation); at every threshold but the last a query
  goes to the strong model iff `score >= threshold`, at the last (the maximum) iff `score > threshold`, so the curve
  runs from 100 % to 0 % strong calls. Tied scores move together; where ties make two quantiles equal, RouteLLM's
  `pd.qcut` would raise ("bin edges must be unique") although its comment says duplicates are kept: they are kept
  here, as the comment intends, and add a zero-width point that changes no measure. `num_results=None` thresholds at
  every distinct score instead (the exact curve; not RouteLLM's protocol).
- [`random_router_curve`]: RouteLLM's random router, `uniform(0, 1)` scores averaged point by point over 10 draws
  (same procedure, other random numbers). Its expected PGR at a share f of strong calls is exactly f, so its
  expected APGR is 0.5.
- [`oracle_curve`]: RouteLLM's `get_optimal_accuracy`: with a budget of f·N strong calls, send them to questions the
  weak model gets wrong and the strong one right; its PGR exceeds 1 once the strong model's own mistakes are avoided.
- [`cost_swept_curve`]: a route-only model's accuracy estimates `(a_weak, a_strong)` and prices of a strong call:
  the rule `argmax_j (a_j - c_j)` of `hf_defer` (ties go to the weak, cheaper model) at each price.
- [`apgr`]: `(trapz(r, f) - r_weak (f_max - f_min)) / ((r_strong - r_weak)(f_max - f_min))` over the points sorted by
  the share f, which is RouteLLM's `(AUC - weak_auc) / (strong_auc - weak_auc)`.
- [`cpt`]: RouteLLM's `np.interp(r_weak + x (r_strong - r_weak), r, f)`, which assumes r increases along the curve;
  `method="first_crossing"` gives the smallest share at which the piecewise-linear curve reaches the target, which
  is the same number for an increasing curve and the paper's definition otherwise.

Shares and accuracies are fractions in [0, 1] (RouteLLM prints percentages).

Why this is in the library and not in `research/`: a route-only model (README, "Routing between models") sends each
prompt to one of several LLMs, and whoever trains one to route between a strong and a weak LLM wants the numbers the
routing literature reports, APGR and CPT, computed exactly as RouteLLM computes them so that they can be set beside
RouteLLM's published ones; [`cost_swept_curve`] reads the route-only model's own accuracy estimates. They are measures
of any router, not of one experiment of ours. The experiment that uses them on RouteLLM's MMLU data
(results/mmlu_routing.md) is `research/mmlu_routing.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, Literal

import numpy as np

from .costs import check_array as _array
from ..modeling.surrogate_base import check_expert_costs

__all__ = ["CallPerformanceCurve", "apgr", "call_performance_curve", "cost_swept_curve", "cpt", "oracle_curve",
           "pgr", "random_router_curve", "routing_summary"]


@dataclass(frozen=True)
class CallPerformanceCurve:
    """Accuracy of a routed system against its share of strong-model calls, points sorted by that share."""

    strong_fraction: np.ndarray
    """Share of queries sent to the strong model at each point, ascending."""
    accuracy: np.ndarray
    """Accuracy of the routed system at each point."""
    strong_accuracy: float
    """Accuracy of the strong model alone."""
    weak_accuracy: float
    """Accuracy of the weak model alone."""
    settings: np.ndarray
    """The threshold (or price) that gave each point."""


def _correct(strong_correct: Any, weak_correct: Any) -> tuple[np.ndarray, np.ndarray]:
    strong = _array("strong_correct", strong_correct, 1, dtype=bool)
    weak = _array("weak_correct", weak_correct, 1, dtype=bool)
    if strong.shape != weak.shape or strong.size == 0:
        raise ValueError(f"`strong_correct` and `weak_correct` must have one value per query (N > 0), got shapes "
                         f"{strong.shape} and {weak.shape}.")
    return strong, weak


def _curve(fraction: Sequence[float], accuracy: Sequence[float], settings: Sequence[float], strong: np.ndarray,
           weak: np.ndarray) -> CallPerformanceCurve:
    order = np.argsort(np.asarray(fraction, dtype=np.float64), kind="stable")
    return CallPerformanceCurve(np.asarray(fraction, dtype=np.float64)[order],
                                np.asarray(accuracy, dtype=np.float64)[order], float(strong.mean()),
                                float(weak.mean()), np.asarray(settings, dtype=np.float64)[order])


def _points(score: np.ndarray, strong: np.ndarray, weak: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """Share and accuracy when the queries ranked `starts[i]` and above (by ascending score) go to the strong model."""
    order = np.argsort(score, kind="stable")
    strong_tail = np.concatenate([np.cumsum(strong[order][::-1])[::-1], [0]])  # strong-right among ranks >= i
    weak_head = np.concatenate([[0], np.cumsum(weak[order])])  # weak-right among ranks < i
    n = len(score)
    return (n - starts) / n, (strong_tail[starts] + weak_head[starts]) / n


def call_performance_curve(score: Any, strong_correct: Any, weak_correct: Any,
                           num_results: int | None = 10) -> CallPerformanceCurve:
    """The call-performance curve of a router, thresholded as RouteLLM's MMLU evaluation does.

    Args:
        score (array-like `[N]`): the router's score per query, finite; higher sends a query to the strong model
            (RouteLLM's "strong win rate").
        strong_correct (array-like `[N]`): whether the strong model answered each query correctly (bool or 0/1).
        weak_correct (array-like `[N]`): the same for the weak model.
        num_results (`int` or `None`, *optional*, defaults to 10): thresholds at the quantiles 0, 1/k, ..., 1 of the
            scores (RouteLLM's `--num-results`); `None` for every distinct score.

    Returns:
        [`CallPerformanceCurve`] whose `settings` are the thresholds.

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import call_performance_curve
    >>> curve = call_performance_curve([0.9, 0.1, 0.5, 0.3], [1, 1, 0, 1], [0, 1, 0, 0], num_results=2)
    >>> curve.strong_fraction.tolist(), curve.accuracy.tolist()
    ([0.0, 0.5, 1.0], [0.25, 0.5, 0.75])

    ```
    """
    strong, weak = _correct(strong_correct, weak_correct)
    values = _array("score", score, 1)
    if values.shape != strong.shape:
        raise ValueError(f"`score` must have one value per query ({len(strong)}), got shape {values.shape}.")
    ordered = np.sort(values)
    if num_results is None:
        thresholds = np.unique(values)
        starts = np.searchsorted(ordered, thresholds, side="left")
        thresholds, starts = np.append(thresholds, np.inf), np.append(starts, len(values))  # inf: no query
    else:
        if isinstance(num_results, bool) or not isinstance(num_results, Integral) or num_results < 1:
            raise ValueError(f"`num_results` must be a positive int or None, got {num_results!r}.")
        thresholds = np.quantile(values, np.linspace(0.0, 1.0, int(num_results) + 1))
        starts = np.searchsorted(ordered, thresholds, side="left")
        starts[-1] = np.searchsorted(ordered, thresholds[-1], side="right")  # the last: score > threshold
    fraction, accuracy = _points(values, strong, weak, starts)
    return _curve(fraction, accuracy, thresholds, strong, weak)


def random_router_curve(strong_correct: Any, weak_correct: Any, num_results: int = 10, iterations: int = 10,
                        seed: int = 0) -> CallPerformanceCurve:
    """RouteLLM's random router: `uniform(0, 1)` scores, the curve averaged point by point over `iterations` draws.

    Args:
        strong_correct (array-like `[N]`) / weak_correct (array-like `[N]`): each model's correctness.
        num_results (`int`, *optional*, defaults to 10): see [`call_performance_curve`].
        iterations (`int`, *optional*, defaults to 10): draws averaged (RouteLLM's `--random-iters`).
        seed (`int`, *optional*, defaults to 0): seed of the draws.

    Returns:
        [`CallPerformanceCurve`]; with continuous scores every draw has the same shares, so points average exactly.

    Example:

    ```python
    >>> import numpy as np
    >>> from hf_defer.evaluation.routellm_metrics import apgr, random_router_curve
    >>> rng = np.random.default_rng(0)
    >>> strong, weak = rng.random(5000) < 0.8, rng.random(5000) < 0.6
    >>> round(apgr(random_router_curve(strong, weak, iterations=20)), 1)
    0.5

    ```
    """
    strong, weak = _correct(strong_correct, weak_correct)
    if isinstance(iterations, bool) or not isinstance(iterations, Integral) or iterations < 1:
        raise ValueError(f"`iterations` must be a positive int, got {iterations!r}.")
    rng = np.random.default_rng(seed)
    curves = [call_performance_curve(rng.uniform(size=len(strong)), strong, weak, num_results) for _ in range(iterations)]
    fraction = curves[0].strong_fraction
    if any(not np.array_equal(c.strong_fraction, fraction) for c in curves):  # ties in a draw: average by share
        fraction = np.unique(np.concatenate([c.strong_fraction for c in curves]))
        accuracy = [np.mean([c.accuracy[c.strong_fraction == f].mean() for c in curves if (c.strong_fraction == f).any()])
                    for f in fraction]
    else:
        accuracy = np.mean([c.accuracy for c in curves], axis=0)
    return _curve(fraction, accuracy, np.full(len(fraction), np.nan), strong, weak)


def oracle_curve(strong_correct: Any, weak_correct: Any, strong_fractions: Any = None) -> CallPerformanceCurve:
    """RouteLLM's optimal router: f·N strong calls spent on questions only the strong model answers correctly.

    Args:
        strong_correct (array-like `[N]`) / weak_correct (array-like `[N]`): each model's correctness.
        strong_fractions (array-like, *optional*): the shares of strong calls, in [0, 1]; defaults to 0, 0.1, ..., 1
            (RouteLLM's plot of the optimum).

    Returns:
        [`CallPerformanceCurve`] with accuracy `(#weak right + min(f·N, #(strong right, weak wrong))) / N`.

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import oracle_curve
    >>> oracle_curve([1, 1, 0, 1], [0, 1, 1, 0], strong_fractions=[0, 0.25, 0.5, 1]).accuracy.tolist()
    [0.5, 0.75, 1.0, 1.0]

    ```
    """
    strong, weak = _correct(strong_correct, weak_correct)
    fractions = np.linspace(0.0, 1.0, 11) if strong_fractions is None else _array("strong_fractions", strong_fractions, 1)
    if fractions.size == 0 or ((fractions < 0) | (fractions > 1)).any():
        raise ValueError(f"`strong_fractions` must be shares in [0, 1], got {fractions.tolist()[:5]}.")
    gain = int(np.sum(strong & ~weak))
    accuracy = (weak.sum() + np.minimum(fractions * len(strong), gain)) / len(strong)
    return _curve(fractions, accuracy, fractions, strong, weak)


def cost_swept_curve(accuracy_estimates: Any, strong_correct: Any, weak_correct: Any, strong_call_costs: Any,
                     weak_call_cost: float = 0.0) -> CallPerformanceCurve:
    """The curve of a route-only model as the price of a strong call is swept: `argmax_j (a_j(x) - c_j)` per price.

    A query goes to the strong model iff `a_strong - c_strong > a_weak - c_weak` (a tie goes to the weak model, the
    first expert). Prices are in units of accuracy: a strong call is worth it if it raises the expected accuracy by
    more than its price. Prices are non-negative, so queries where `a_strong <= a_weak + c_weak` never go to the
    strong model and the curve may end below 100 % strong calls.

    Args:
        accuracy_estimates (array-like `[N, 2]`): estimated accuracy of the weak (column 0) and strong (column 1) model.
        strong_correct (array-like `[N]`) / weak_correct (array-like `[N]`): each model's correctness.
        strong_call_costs (array-like `[S]`): prices of a strong call to sweep, each finite and >= 0.
        weak_call_cost (`float`, *optional*, defaults to 0.0): price of a weak call, finite and >= 0.

    Returns:
        [`CallPerformanceCurve`] whose `settings` are the prices.

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import cost_swept_curve
    >>> curve = cost_swept_curve([[0.9, 0.95], [0.2, 0.9]], [1, 1], [1, 0], strong_call_costs=[0.0, 0.1, 1.0])
    >>> curve.strong_fraction.tolist(), curve.settings.tolist()
    ([0.0, 0.5, 1.0], [1.0, 0.1, 0.0])

    ```
    """
    strong, weak = _correct(strong_correct, weak_correct)
    estimates = _array("accuracy_estimates", accuracy_estimates, 2)
    if estimates.shape != (len(strong), 2):
        raise ValueError(f"`accuracy_estimates` must be [N, 2] (weak, strong) with N = {len(strong)}, got shape "
                         f"{estimates.shape}.")
    prices = _array("strong_call_costs", strong_call_costs, 1)
    if prices.size == 0 or (prices < 0).any():
        raise ValueError(f"`strong_call_costs` must be finite, non-negative prices, got {prices.tolist()[:5]}.")
    weak_price = check_expert_costs([weak_call_cost], 1, "weak_call_cost")[0]
    fraction, accuracy = [], []
    for price in prices:
        to_strong = estimates[:, 1] - price > estimates[:, 0] - weak_price
        fraction.append(float(to_strong.mean()))
        accuracy.append(float(np.where(to_strong, strong, weak).mean()))
    return _curve(fraction, accuracy, prices, strong, weak)


def _gap(curve: CallPerformanceCurve) -> float:
    gap = curve.strong_accuracy - curve.weak_accuracy
    if gap == 0:
        raise ValueError("the strong and the weak model have the same accuracy: the performance gap is 0, so PGR, APGR "
                         "and CPT are undefined.")
    return gap


def pgr(curve: CallPerformanceCurve) -> np.ndarray:
    """PGR of every point: `(accuracy - weak_accuracy) / (strong_accuracy - weak_accuracy)`.

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import oracle_curve, pgr
    >>> pgr(oracle_curve([1, 1, 0, 1], [0, 1, 1, 0], strong_fractions=[0, 0.25])).tolist()
    [0.0, 1.0]

    ```
    """
    return (curve.accuracy - curve.weak_accuracy) / _gap(curve)


def apgr(curve: CallPerformanceCurve) -> float:
    """APGR: the trapezoidal area under PGR against the share of strong calls, over the range the curve spans.

    RouteLLM computes `(AUC - weak_auc) / (strong_auc - weak_auc)` with `np.trapz` over the points sorted by share,
    which is this area divided by the width of the range (1 when the curve runs from 0 % to 100 % strong calls).

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import apgr, oracle_curve
    >>> apgr(oracle_curve([1, 1, 0, 1], [0, 1, 1, 0], strong_fractions=[0, 0.25, 0.5, 1]))  # PGR 0, 1, 2, 2
    1.5

    ```
    """
    width = float(curve.strong_fraction[-1] - curve.strong_fraction[0])
    if width <= 0:
        raise ValueError("the curve must span a range of strong-call shares to have an APGR; all its points have "
                         f"the share {curve.strong_fraction[0]}.")
    values = pgr(curve)
    area = float(np.sum(np.diff(curve.strong_fraction) * (values[1:] + values[:-1]) / 2))
    return area / width


def cpt(curve: CallPerformanceCurve, level: float,
        method: Literal["routellm", "first_crossing"] = "routellm") -> float:
    """CPT(level): the share of strong calls at which the curve recovers `level` of the gap (PGR = level).

    Args:
        curve ([`CallPerformanceCurve`]): the router's curve.
        level (`float`): the PGR to reach, in (0, 1] (RouteLLM reports 0.2, 0.5 and 0.8).
        method (`str`, *optional*, defaults to `"routellm"`): `"routellm"` is `np.interp(target, accuracy, share)` as
            in RouteLLM's code (meaningful when accuracy increases along the curve; clamped to the end shares);
            `"first_crossing"` is the smallest share at which the piecewise-linear curve reaches the target (NaN if
            it never does).

    Returns:
        `float`: a share in [0, 1].

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import call_performance_curve, cpt
    >>> curve = call_performance_curve([0.9, 0.1, 0.5, 0.3], [1, 1, 0, 1], [0, 1, 0, 0], num_results=2)
    >>> cpt(curve, 0.5)  # accuracies 0.25, 0.5, 0.75 at shares 0, 0.5, 1: the target 0.5 is met at 0.5
    0.5

    ```
    """
    if isinstance(level, bool) or not isinstance(level, Real) or not 0 < float(level) <= 1:
        raise ValueError(f"`level` must be a PGR in (0, 1], got {level!r}.")
    target = curve.weak_accuracy + float(level) * _gap(curve)
    x, r = curve.strong_fraction, curve.accuracy
    if method == "routellm":
        return float(np.interp(target, r, x))
    if method != "first_crossing":
        raise ValueError(f"`method` must be 'routellm' or 'first_crossing', got {method!r}.")
    if r[0] >= target:
        return float(x[0])
    for i in range(len(r) - 1):
        if r[i] < target <= r[i + 1]:
            return float(x[i] + (target - r[i]) / (r[i + 1] - r[i]) * (x[i + 1] - x[i]))
    return float("nan")


def routing_summary(curve: CallPerformanceCurve, levels: Sequence[float] = (0.2, 0.5, 0.8)) -> dict[str, float]:
    """APGR and CPT at each level (RouteLLM's table), as `{"apgr": ..., "cpt_50": ..., ...}`; shares in [0, 1].

    Example:

    ```python
    >>> from hf_defer.evaluation.routellm_metrics import call_performance_curve, routing_summary
    >>> curve = call_performance_curve([0.9, 0.1, 0.5, 0.3], [1, 1, 0, 1], [0, 1, 0, 0], num_results=2)
    >>> routing_summary(curve, levels=(0.5,))
    {'apgr': 0.5, 'cpt_50': 0.5}

    ```
    """
    summary = {"apgr": apgr(curve)}
    for level in levels:
        summary[f"cpt_{round(100 * level):d}"] = cpt(curve, level)
    return summary
