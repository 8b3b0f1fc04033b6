"""Baselines for deferring to models: the confidence cascade and a threshold router, in the error-cost plane.

A deferral model routes each input with one trained model and a price list (see `hf_defer.evaluation.costs`). The two
common alternatives, evaluated here on the same footing (one [`ErrorCostCurve`] over a grid of settings):

- [`confidence_cascade_curve`]: members in order of price; member i answers when its top softmax probability is
  at least `t_i`, else the input goes on to the next member (and the last one always answers). Every member
  consulted is paid.
- [`router_curve`]: a separately trained router scores each input (e.g. the estimated probability that the cheap
  model is wrong, as RouteLLM's classifier routers do); with ascending thresholds `s_1 <= ... <= s_{L-1}` the input
  goes to member `#{i : score >= s_i}` alone. The router and the chosen member are paid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from hf_defer.evaluation.costs import ErrorCostCurve
from hf_defer.evaluation.costs import check_array as _array, check_class_ids as _class_ids, check_rows as _per_row
from hf_defer.modeling.surrogate_base import check_expert_costs

__all__ = ["confidence_cascade_curve", "router_curve"]


def _members(member_answers: Any, labels: Any, prices: Sequence[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Answers `[N, L]` and labels `[N]` as class ids (>= 0: an ignored -100 or a missing -1 is refused, not scored)
    and one price per member."""
    answers = _class_ids("member_answers", member_answers, 2)
    y = _class_ids("labels", labels, 1)
    if answers.shape[0] != y.shape[0] or answers.shape[0] == 0 or answers.shape[1] < 2:
        raise ValueError(f"`member_answers` must be [N, L] with N = len(labels) > 0 and L >= 2, got {answers.shape}.")
    return answers, y, np.asarray(check_expert_costs(prices, answers.shape[1], "prices"), dtype=np.float64)


def _grid(settings: Any, width: int, name: str) -> np.ndarray:
    grid = _array(name, settings, 2)
    if grid.shape[0] == 0 or grid.shape[1] != width:
        raise ValueError(f"`{name}` must be [S, {width}] finite thresholds with S >= 1, got shape {grid.shape}.")
    return grid


def confidence_cascade_curve(
    member_confidence: Any, member_answers: Any, labels: Any, prices: Sequence[float], thresholds: Any
) -> ErrorCostCurve:
    """Error and mean cost of a confidence cascade for each row of `thresholds`.

    Args:
        member_confidence (array-like `[N, L - 1]`, or `[N]` for two members): the top softmax probability of
            each member but the last; finite (an `[L - 1, N]` array is refused, not reshaped).
        member_answers (array-like `[N, L]`): each member's answer, a class id >= 0 (the last member is e.g. a
            person).
        labels (array-like `[N]`): true classes, ids >= 0 (drop rows labelled -100 first).
        prices (sequence of `float`): the price of consulting each member.
        thresholds (array-like `[S, L - 1]`): `t_i` of each setting; member i answers iff its confidence >= t_i.

    Returns:
        [`ErrorCostCurve`] with `settings = thresholds`.

    Example:

    ```python
    >>> from research.routing_baselines import confidence_cascade_curve
    >>> curve = confidence_cascade_curve([[0.9], [0.6]], [[0, 0], [0, 1]], labels=[0, 1], prices=[1.0, 10.0],
    ...                                  thresholds=[[0.0], [0.7]])
    >>> curve.cost.tolist(), curve.error.tolist()  # t = 0.7: the second input goes on (1 + 10 paid)
    ([1.0, 6.0], [0.5, 0.0])

    ```
    """
    answers, y, costs = _members(member_answers, labels, prices)
    width = answers.shape[1] - 1
    try:
        confidence = _per_row("member_confidence", member_confidence, len(y), width)
    except ValueError as err:
        raise ValueError(f"{err} `member_confidence` needs one column per member but the last.") from None
    grid = _grid(thresholds, width, "thresholds")
    paid = np.cumsum(costs)  # stopping at member i pays members 0..i
    rows, last = np.arange(len(y)), answers.shape[1] - 1
    cost, error = [], []
    for setting in grid:
        stops = confidence >= setting[None, :]
        stop = np.where(stops.any(axis=1), np.argmax(stops, axis=1), last)
        cost.append(float(paid[stop].mean()))
        error.append(float(np.mean(answers[rows, stop] != y)))
    return ErrorCostCurve.from_points(cost, error, grid)


def router_curve(
    score: Any, member_answers: Any, labels: Any, prices: Sequence[float], thresholds: Any, router_cost: float = 0.0
) -> ErrorCostCurve:
    """Error and mean cost of a threshold router for each row of `thresholds`.

    Args:
        score (array-like `[N]`): the router's score, finite; higher sends an input to a later (costlier) member.
        member_answers (array-like `[N, L]`): each member's answer, a class id >= 0.
        labels (array-like `[N]`): true classes, ids >= 0.
        prices (sequence of `float`): the price of each member.
        thresholds (array-like `[S, L - 1]`): ascending `s_1 <= ... <= s_{L-1}` of each setting.
        router_cost (`float`, *optional*, defaults to 0.0): paid for every input (running the router).

    Returns:
        [`ErrorCostCurve`] with `settings = thresholds`.

    Example:

    ```python
    >>> from research.routing_baselines import router_curve
    >>> curve = router_curve([0.2, 0.8], [[0, 0], [0, 1]], labels=[0, 1], prices=[0.0, 10.0], thresholds=[[0.5]])
    >>> curve.cost.tolist(), curve.error.tolist()
    ([5.0], [0.0])

    ```
    """
    answers, y, costs = _members(member_answers, labels, prices)
    values = _array("score", score, np.ndim(score.detach().cpu() if hasattr(score, "detach") else score))
    if values.shape != y.shape:
        raise ValueError(f"`score` must have one value per input ({len(y)}), got shape {values.shape}.")
    check_expert_costs([router_cost], 1, "router_cost")
    grid = _grid(thresholds, answers.shape[1] - 1, "thresholds")
    if (np.diff(grid, axis=1) < 0).any():
        raise ValueError("each row of `thresholds` must be ascending (s_1 <= s_2 <= ...).")
    rows = np.arange(len(y))
    cost, error = [], []
    for setting in grid:
        member = (values[:, None] >= setting[None, :]).sum(axis=1)
        cost.append(float(router_cost + costs[member].mean()))
        error.append(float(np.mean(answers[rows, member] != y)))
    return ErrorCostCurve.from_points(cost, error, grid)
