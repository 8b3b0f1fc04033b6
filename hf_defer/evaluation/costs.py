"""What deferring costs: the decision rule with prices, the mean cost paid, and the error-cost curve.

A deferral model estimates the class posterior `p(y|x)` and each expert's accuracy `a_j(x)`. With a price `c_j`
for asking expert j (in units of probability), the Bayes rule defers iff `max_j (a_j - c_j) - max_y p_y > t` and
then to `argmax_j (a_j - c_j)`. Because the estimates of a bounded surrogate (A-SM) are calibrated, one trained
model serves every price list: sweeping the prices at decision time traces the model's **error-cost curve**, the
system error against the mean cost paid per input, with no retraining.

- [`mean_cost`]: the mean cost per input of given decisions.
- [`error_cost_curve`]: sweep decision-time costs (a grid, or one scale applied to the prices) over a validation
  set; returns an [`ErrorCostCurve`] with its Pareto front.
- [`pareto_front`] / [`area_under_error_cost`]: the front of any set of (cost, error) points, and the mean over
  budgets of the lowest error a budget buys, to compare methods by one number.
- [`plot_error_cost_curves`]: the fronts of several methods in one figure.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..modeling.surrogate_base import check_defer_threshold, check_expert_costs, estimate_margin

__all__ = ["ErrorCostCurve", "area_under_error_cost", "error_cost_curve", "mean_cost", "pareto_front",
           "plot_error_cost_curves"]


def check_array(name: str, values: Any, ndim: int, dtype: Any = np.float64) -> np.ndarray:
    """`values` as an array of `ndim` dimensions; numbers (`float64`) must be finite. A `ValueError` naming `name`
    otherwise: an [`ErrorCostCurve`] of NaN estimates would be a curve of nothing. The array check of the error-cost
    sweeps and of the routing measures.

    Example:

    ```python
    >>> check_array("costs", [0.5, 1.0], ndim=1).tolist()
    [0.5, 1.0]

    ```
    """
    if hasattr(values, "detach"):  # a torch tensor
        values = values.detach().cpu().numpy()
    try:
        raw = np.asarray(values)
        if raw.dtype.kind not in "biuf" or (raw.dtype.kind == "b" and dtype is not bool):
            raise TypeError(f"dtype {raw.dtype}")
        array = raw.astype(dtype)
    except (TypeError, ValueError) as err:
        raise ValueError(f"`{name}` must be a rectangular array of numbers, got a {type(values).__name__} that is "
                         f"not ({err}).") from None
    if array.ndim != ndim:
        raise ValueError(f"`{name}` must have {ndim} dimension(s), got shape {array.shape}.")
    if dtype is np.float64 and not np.isfinite(array).all():
        rows = np.flatnonzero(~np.isfinite(array).reshape(array.shape[0], -1).all(axis=1))[:5].tolist()
        raise ValueError(f"`{name}` must be finite, got NaN or infinity in rows {rows}.")
    if dtype is bool and raw.dtype.kind != "b" and not np.isin(raw, (0, 1)).all():
        raise ValueError(f"`{name}` must hold booleans (or 0 and 1), got {np.unique(raw)[:5].tolist()}.")
    return array


def check_class_ids(name: str, values: Any, ndim: int, num_classes: int | None = None) -> np.ndarray:
    """`values` as integer class ids (`int64`) of `ndim` dimensions, each in `[0, num_classes)` (`>= 0` when
    `num_classes` is None): a label of -100 or -1, or a fraction, would otherwise be scored as an answer.

    Example:

    ```python
    >>> check_class_ids("labels", [0, 2, 1], ndim=1, num_classes=3).tolist()
    [0, 2, 1]

    ```
    """
    array = check_array(name, values, ndim)
    if not (array == np.round(array)).all():
        raise ValueError(f"`{name}` must be integer class ids, got {array[array != np.round(array)][:5].tolist()}.")
    bad = (array < 0) | (array >= (num_classes if num_classes is not None else np.inf))
    if bad.any():
        where = np.flatnonzero(bad.reshape(array.shape[0], -1).any(axis=1))[:5].tolist()
        expected = f"in [0, {num_classes})" if num_classes is not None else ">= 0"
        raise ValueError(f"`{name}` must be class ids {expected}, got {array[bad][:5].astype(np.int64).tolist()} "
                         f"in rows {where} (drop rows with an ignored or missing label first).")
    return array.astype(np.int64)


def check_rows(name: str, values: Any, n: int, width: int, num_classes: int | None = None,
             ids: bool = False) -> np.ndarray:
    """A `[n, width]` array (class ids with `ids`) from `values` of shape `[n, width]` (or `[n]` when `width == 1`),
    never reshaped from another shape: `[width, n]` is refused (transpose it), not read in the wrong order.

    Example:

    ```python
    >>> check_rows("answers", [1, 0, 1], n=3, width=1, ids=True).tolist()
    [[1], [0], [1]]

    ```
    """
    try:
        ndim = np.ndim(values.detach().cpu().numpy() if hasattr(values, "detach") else values)
    except ValueError:  # numpy refuses ragged nested lists
        raise ValueError(f"`{name}` must be a rectangular [{n}, {width}] array, got rows of different lengths.") from None
    ndim = 1 if ndim == 1 and width == 1 else 2
    array = check_class_ids(name, values, ndim, num_classes) if ids else check_array(name, values, ndim)
    if ndim == 1:
        array = array[:, None]
    if array.shape != (n, width):
        hint = " (transpose it: one row per input)" if array.shape == (width, n) else ""
        raise ValueError(f"`{name}` must have shape [N, {width}] = [{n}, {width}]{' or [N]' if width == 1 else ''}"
                         f", got {array.shape}{hint}.")
    return array


def _decide_with_costs(
    class_probs: np.ndarray, expert_accuracy: np.ndarray, costs: np.ndarray, threshold: float = 0.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cost-sensitive Bayes rule on estimates: `(defer [N], expert [N], prediction [N])`.

    Defers iff `max_j (a_j - c_j) - max_y p_y > threshold`, to `argmax_j (a_j - c_j)` (first on ties); `prediction`
    is `argmax_y p_y` for every row: [`~hf_defer.modeling.surrogate_base.estimate_margin`], the rule the model, the pipeline
    and the metrics decide by, here on estimates already computed.
    """
    margin, expert = estimate_margin(torch.as_tensor(class_probs, dtype=torch.float64),
                                     torch.as_tensor(expert_accuracy, dtype=torch.float64),
                                     torch.as_tensor(costs, dtype=torch.float64))
    return (margin > threshold).numpy(), expert.numpy(), np.argmax(class_probs, axis=1)


def mean_cost(defer: Any, expert: Any, expert_costs: Sequence[float], model_cost: float = 0.0) -> float:
    """Mean cost per input of a deferral system: every input pays `model_cost`, a deferred one also its expert's cost.

    Args:
        defer (array-like of bool, shape `[N]`): which inputs are deferred.
        expert (array-like of int, shape `[N]`): the expert of each input (read where deferred).
        expert_costs (sequence of `float`): one non-negative cost per expert.
        model_cost (`float`, *optional*, defaults to 0.0): the cost of running the deferral model on one input.

    Returns:
        `float`: `model_cost + (1/N) sum_{i deferred} expert_costs[expert_i]`.

    Example:

    ```python
    >>> from hf_defer.evaluation.costs import mean_cost
    >>> mean_cost([True, False, True, False], [1, 0, 0, 1], expert_costs=[2.0, 10.0], model_cost=1.0)
    4.0

    ```
    """
    defer = check_array("defer", defer, 1, bool)
    expert = check_array("expert", expert, 1)
    if not (expert == np.round(expert)).all():
        raise ValueError(f"`expert` must be integer expert ids, got {expert[expert != np.round(expert)][:5].tolist()}.")
    expert = expert.astype(np.int64)
    if defer.shape != expert.shape or defer.size == 0:
        raise ValueError(
            f"`defer` and `expert` must be non-empty and of one length, got {defer.size} and {expert.size}."
        )
    # One flat cost per expert: a nested or ragged expert_costs is refused by check_expert_costs, naming it.
    costs = np.asarray(check_expert_costs(expert_costs, len(expert_costs) if hasattr(expert_costs, "__len__") else 1))
    if expert[defer].size and (expert[defer].min() < 0 or expert[defer].max() >= costs.size):
        raise ValueError(f"`expert` must index `expert_costs` (0..{costs.size - 1}) where deferred.")
    check_expert_costs([model_cost], 1, "model_cost")
    return float(model_cost + np.where(defer, costs[np.where(defer, expert, 0)], 0.0).mean())


@dataclass
class ErrorCostCurve:
    """Error against mean cost of a family of decision rules (one point per setting).

    Attributes:
        cost (`np.ndarray` `[S]`): mean cost per input of each setting.
        error (`np.ndarray` `[S]`): system error of each setting.
        settings (`np.ndarray` `[S, P]`): the swept values (decision-time costs, thresholds, ...) of each setting.
        pareto (`np.ndarray` of int): indices of the settings on the Pareto front, by increasing cost.

    Example:

    ```python
    >>> from hf_defer.evaluation import ErrorCostCurve
    >>> curve = ErrorCostCurve.from_points(cost=[1.0, 2.0, 2.0, 3.0, 0.5], error=[0.3, 0.2, 0.25, 0.2, 0.4],
    ...                                    settings=[[0.1], [0.2], [0.3], [0.4], [0.5]])
    >>> curve.pareto.tolist()  # (2.0, 0.25) and (3.0, 0.2) cost more for no less error
    [4, 0, 1]
    >>> curve.settings[curve.pareto].ravel().tolist()
    [0.5, 0.1, 0.2]

    ```
    """

    cost: np.ndarray
    error: np.ndarray
    settings: np.ndarray
    pareto: np.ndarray

    @classmethod
    def from_points(cls, cost: Any, error: Any, settings: Any) -> ErrorCostCurve:
        cost, error = np.asarray(cost, dtype=np.float64), np.asarray(error, dtype=np.float64)
        return cls(cost, error, np.asarray(settings, dtype=np.float64), pareto_front(cost, error))

    def front(self) -> tuple[np.ndarray, np.ndarray]:
        """`(cost, error)` of the Pareto-optimal settings, by increasing cost (and decreasing error)."""
        return self.cost[self.pareto], self.error[self.pareto]


def pareto_front(cost: Any, error: Any) -> np.ndarray:
    """Indices of the (cost, error) points no other point beats: none has lower-or-equal cost and lower error.

    Of points with equal cost and error the first is kept. The indices come by increasing cost, so their errors
    strictly decrease.

    Example:

    ```python
    >>> from hf_defer.evaluation.costs import pareto_front
    >>> pareto_front(cost=[1.0, 2.0, 2.0, 3.0, 0.5], error=[0.3, 0.2, 0.25, 0.2, 0.4]).tolist()
    [4, 0, 1]

    ```
    """
    cost, error = check_array("cost", cost, 1), check_array("error", error, 1)
    if cost.shape != error.shape or cost.size == 0 or not (np.isfinite(cost).all() and np.isfinite(error).all()):
        raise ValueError(
            f"`cost` and `error` must be finite, non-empty and of one length, got {cost.size} and {error.size}."
        )
    order = np.lexsort((np.arange(cost.size), error, cost))
    front, best = [], np.inf
    for index in order:
        if error[index] < best:
            front.append(index)
            best = error[index]
    return np.asarray(front, dtype=np.int64)


def area_under_error_cost(cost: Any, error: Any, low: float, high: float) -> float:
    """Mean, over budgets `b` uniform in `[low, high]`, of the lowest error whose cost is at most `b`.

    The lowest error a budget buys is a step function of the budget (the Pareto front drawn as a staircase); this
    is its area divided by `high - low`: one number per method, lower is better, comparable between methods on the
    same range. `low` must be at least the cheapest point's cost (below it no point is affordable).

    Example:

    ```python
    >>> from hf_defer.evaluation.costs import area_under_error_cost
    >>> area_under_error_cost(cost=[1.0, 2.0], error=[0.3, 0.1], low=1.0, high=3.0)  # (0.3 * 1 + 0.1 * 1) / 2
    0.2

    ```
    """
    cost, error = check_array("cost", cost, 1), check_array("error", error, 1)
    front = pareto_front(cost, error)
    if not (np.isfinite(low) and np.isfinite(high) and high > low):
        raise ValueError(f"`low` and `high` must be finite with high > low, got {low!r} and {high!r}.")
    if low < cost[front[0]]:
        raise ValueError(
            f"`low` ({low}) is below the cheapest point's cost ({cost[front[0]]}): no error is defined there."
        )
    edges = np.clip(np.append(cost[front], np.inf), low, high)  # step i holds on [edges[i], edges[i + 1])
    return float(np.sum(error[front] * np.diff(edges)) / (high - low))


def error_cost_curve(
    class_probs: Any,
    expert_accuracy: Any,
    labels: Any,
    expert_labels: Any,
    expert_costs: Sequence[float],
    decision_costs: Any = None,
    scales: Sequence[float] | None = None,
    model_cost: float = 0.0,
    threshold: float = 0.0,
) -> ErrorCostCurve:
    """The error-cost curve of one deferral model: system error against mean cost, sweeping decision-time costs.

    For each row `d` of `decision_costs` the rule `defer iff max_j (a_j - d_j) - max_y p_y > threshold` decides,
    and the decisions are scored with the real prices: the error of the system (the classifier where it answers,
    the chosen expert where deferred) and [`mean_cost`] with `expert_costs`. The model is trained once; only the
    decision changes.

    Args:
        class_probs (array-like `[N, K]`) / expert_accuracy (array-like `[N, M]`): the model's estimates on a
            validation set (`DeferralOutput.class_probs` / `.expert_accuracy`).
        labels (array-like `[N]`): true classes, ids in `[0, K)` (drop rows labelled -100 first).
        expert_labels (array-like `[N, M]`, or `[N]` for one expert): each expert's answers, ids in `[0, K)`.
        expert_costs (sequence of `float`): the price of asking each expert (what is paid).
        decision_costs (array-like `[S, M]`, *optional*): the costs to decide with, one row per setting.
        scales (sequence of `float`, *optional*): instead, decide with `scale * expert_costs` for each scale. When
            neither is given: 0 and 60 scales from 1e-4 to 1 divided by the lowest positive price.
        model_cost (`float`, *optional*, defaults to 0.0): cost every input pays (running the model itself).
        threshold (`float`, *optional*, defaults to 0.0): the decision margin.

    Returns:
        [`ErrorCostCurve`] with `settings` = the decision costs.

    Raises:
        `ValueError`: estimates that are NaN or infinite, labels or answers outside `[0, K)` or not integers, arrays
            of another shape (an `[M, N]` array is refused, not reshaped), prices that are not one finite,
            non-negative number per expert.

    Example:

    ```python
    >>> from hf_defer.evaluation.costs import error_cost_curve
    >>> curve = error_cost_curve(class_probs=[[0.9, 0.1], [0.6, 0.4]], expert_accuracy=[[0.5], [0.95]],
    ...                          labels=[0, 1], expert_labels=[1, 1], expert_costs=[1.0], scales=[0.0, 1.0])
    >>> curve.cost.tolist(), curve.error.tolist()  # scale 0 defers the second input; scale 1 defers none
    ([0.5, 0.0], [0.0, 0.5])

    ```
    """
    probs, accuracy = check_array("class_probs", class_probs, 2), check_array("expert_accuracy", expert_accuracy, 2)
    n, m = accuracy.shape
    y = check_class_ids("labels", labels, 1, probs.shape[1])
    if probs.shape[0] != n or y.shape[0] != n or n == 0:
        raise ValueError(
            f"class_probs {probs.shape}, expert_accuracy {accuracy.shape} and labels {y.shape} must describe the same "
            "N > 0 inputs."
        )
    experts = check_rows("expert_labels", expert_labels, n, m, probs.shape[1], ids=True)
    prices = np.asarray(check_expert_costs(expert_costs, m), dtype=np.float64)  # flat: nested or ragged is refused
    threshold = check_defer_threshold(threshold)
    if decision_costs is None:
        if scales is None:
            positive = prices[prices > 0]
            scales = np.append(0.0, np.geomspace(1e-4, 1.0, 60) / (positive.min() if positive.size else 1.0))
        scales = check_array("scales", scales, 1)
        if scales.size == 0 or not np.isfinite(scales).all() or (scales < 0).any():
            raise ValueError(f"`scales` must be at least one finite, non-negative number, got {scales.tolist()}.")
        decision_costs = scales[:, None] * prices[None, :]
    grid = check_array("decision_costs", decision_costs, 2)
    if grid.shape[0] == 0 or grid.shape[1] != m or not np.isfinite(grid).all():
        raise ValueError(f"`decision_costs` must be at least one finite row with one column per expert ({m}), got "
                         f"shape {grid.shape}.")
    right = experts == y[:, None]
    rows = np.arange(n)
    costs, errors = [], []
    for row in grid:
        defer, expert, prediction = _decide_with_costs(probs, accuracy, row, threshold)
        errors.append(float(np.mean(np.where(defer, ~right[rows, expert], prediction != y))))
        costs.append(mean_cost(defer, expert, prices, model_cost))
    return ErrorCostCurve.from_points(costs, errors, grid)


def plot_error_cost_curves(
    curves: Mapping[str, tuple[Any, Any]],
    path: str | os.PathLike,
    points: Mapping[str, tuple[float, float]] | None = None,
    title: str | None = None,
    log_cost: bool = False,
) -> None:
    """Draw error-cost fronts as staircases (the lowest error each budget buys) and single systems as points.

    Args:
        curves (`Mapping[str, (cost, error)]`): a front per method (e.g. `ErrorCostCurve.front()`).
        path (`str` or `os.PathLike`): the image file (PNG).
        points (`Mapping[str, (cost, error)]`, *optional*): single systems (e.g. each member alone).
        title (`str`, *optional*): the figure title.
        log_cost (`bool`, *optional*, defaults to `False`): logarithmic cost axis.
    """
    from .plotting import agg_figure  # an Agg figure outside pyplot: the caller's backend and figures stay as they were

    figure = agg_figure(figsize=(6.4, 4.4))
    axis = figure.add_subplot()
    for name, (cost, error) in curves.items():
        axis.step(np.asarray(cost), 100 * np.asarray(error), where="post", label=name, linewidth=1.6)
    for name, (cost, error) in (points or {}).items():
        axis.scatter([cost], [100 * error], marker="o", color="black", zorder=3)
        axis.annotate(name, (cost, 100 * error), textcoords="offset points", xytext=(4, 4), fontsize=8)
    if log_cost:
        axis.set_xscale("log")
    axis.set_xlabel("mean cost per input")
    axis.set_ylabel("system error (%)")
    if title:
        axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=130)
