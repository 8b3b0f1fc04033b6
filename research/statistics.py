"""Statistics over seeds: mean and standard error, and which methods are comparable to the best one."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

__all__ = ["comparable_methods", "mean_and_standard_error"]


def mean_and_standard_error(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (`scipy.stats.sem`: sample standard deviation / sqrt(n)).

    The error is NaN for a single value.

    Example:

    ```python
    >>> mean_and_standard_error([1.0, 2.0, 3.0])
    (2.0, 0.5773502691896258)

    ```
    """
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ValueError("values must hold at least one number, got none.")
    error = float(stats.sem(array)) if array.size > 1 else float("nan")
    return float(array.mean()), error


def comparable_methods(values: dict[str, Sequence[float]], higher_is_better: bool = False,
                       alpha: float = 0.05) -> set[str]:
    """The best method by mean and every method not significantly different from it.

    The methods' runs are paired (run i of every method uses the same split and expert draw), so the test is a
    two-sided paired t-test (`scipy.stats.ttest_rel`) at level `alpha`. With fewer than two runs only the best
    is returned. Identical paired values count as comparable; a constant non-zero difference as different.

    Args:
        values (`dict[str, Sequence[float]]`): one value per run for each method, runs in the same order.
        higher_is_better (`bool`, *optional*, defaults to False): coverage-like metrics.
        alpha (`float`, *optional*, defaults to 0.05): significance level.

    Returns:
        `set[str]`: the methods to highlight.

    Example:

    ```python
    >>> sorted(comparable_methods({"a": [1.0, 1.1, 0.9], "b": [1.05, 1.0, 1.0], "c": [5.0, 5.2, 5.1]}))
    ['a', 'b']

    ```
    """
    if not values:
        raise ValueError("values must name at least one method, got none.")
    arrays = {name: np.asarray(v, dtype=np.float64) for name, v in values.items()}
    lengths = {a.size for a in arrays.values()}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"every method needs the same positive number of runs, got {sorted(lengths)}.")
    sign = -1.0 if higher_is_better else 1.0
    best = min(arrays, key=lambda name: sign * arrays[name].mean())
    chosen = {best}
    if lengths.pop() < 2:
        return chosen
    for name, array in arrays.items():
        if name == best:
            continue
        difference = array - arrays[best]
        if np.allclose(difference, difference[0]):  # the t statistic is undefined for a constant difference
            if np.isclose(difference[0], 0.0):
                chosen.add(name)
            continue
        if stats.ttest_rel(array, arrays[best]).pvalue >= alpha:
            chosen.add(name)
    return chosen
