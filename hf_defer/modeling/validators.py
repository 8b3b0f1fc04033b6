"""The small argument checks that several parts of hf_defer share: each rule written once and imported where needed.

It lives in ``modeling/`` because the model's own files (the config, the surrogates, the side features, the pipeline)
use it, and those may import nothing outside ``modeling/``: they are copied next to the saved weights for
``trust_remote_code`` loading, and so is this file. Every other subpackage imports it from here. Only the standard
library: the command line reads it before torch is imported. It also holds the two names the pipeline reserves,
which the config refuses as class or expert names (``DEFER_LABEL``, ``CLASSIFIER_ANSWER``).

A check names the argument, says what was expected and shows what came, in a `ValueError` (a wrong type too, as
hf_defer's argument checks do throughout).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Integral, Real
from typing import Any

DEFER_LABEL = "defer"
"""The ``"label"`` the deferral pipeline gives a deferred input (no class may be named so: `DeferralConfig` refuses it)."""
CLASSIFIER_ANSWER = "classifier"
"""The pipeline's ``"answered_by"`` of an input the model answers itself, with model experts (no expert may be named
so)."""

__all__ = ["MISSING_EXPERT_MODES", "check_positive_int", "check_probability", "check_seed", "check_share",
           "is_finite_number", "is_int", "is_number", "split_sizes"]

MISSING_EXPERT_MODES: tuple[str, ...] = ("error", "drop", "mask")
"""What [`prepare_deferral_dataset`] does with a missing expert annotation (`None`, NaN, `-1`, `"-1"`, `""`;
``missing_expert=``, ``--missing_expert``): refuse it, drop its row, or keep the row with -100 for that expert (its
terms leave the loss; it is unavailable there). Here, with the other rules, because the command
line checks it before anything heavy is imported (this module is read from its file then: standard library only)."""


def is_int(value: Any) -> bool:
    """An integer, Python's or numpy's, but not a bool.

    Example:

    ```python
    >>> import numpy as np
    >>> [is_int(v) for v in (3, np.int64(3), True, 3.0)]
    [True, True, False, False]

    ```
    """
    return isinstance(value, Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A real number, Python's or numpy's (NaN and infinities included), but not a bool.

    Example:

    ```python
    >>> import numpy as np
    >>> [is_number(v) for v in (0.5, np.float32(0.5), 2, float("nan"), True, "0.5")]
    [True, True, True, True, False, False]

    ```
    """
    return isinstance(value, Real) and not isinstance(value, bool)


def is_finite_number(value: Any) -> bool:
    """A real number that is neither NaN nor infinite, and not a bool.

    Example:

    ```python
    >>> [is_finite_number(v) for v in (0.5, float("inf"), float("nan"), False)]
    [True, False, False, False]

    ```
    """
    return is_number(value) and math.isfinite(value)


def check_seed(value: Any, argument: str = "seed") -> int:
    """A random seed: a non-negative integer (Python's or numpy's, not a bool), as an `int`.

    Args:
        value: the seed given.
        argument (`str`, *optional*, defaults to `"seed"`): the argument's name, for the error.

    Raises:
        ValueError: not a non-negative integer.

    Example:

    ```python
    >>> check_seed(7)
    7
    >>> check_seed(-1, "expert_seed")
    Traceback (most recent call last):
    ...
    ValueError: `expert_seed` must be a non-negative int, got -1.

    ```
    """
    if not is_int(value) or value < 0:
        raise ValueError(f"`{argument}` must be a non-negative int, got {value!r}.")
    return int(value)


def check_positive_int(value: Any, argument: str) -> int:
    """A count or a size (``batch_size``, ``num_classes``, ``max_seq_length``...): an integer >= 1 (Python's or
    numpy's, not a bool), as an `int`.

    Raises:
        ValueError: not a positive integer.

    Example:

    ```python
    >>> check_positive_int(32, "batch_size")
    32
    >>> check_positive_int(0, "batch_size")
    Traceback (most recent call last):
    ...
    ValueError: `batch_size` must be a positive int, got 0.

    ```
    """
    if not is_int(value) or value < 1:
        raise ValueError(f"`{argument}` must be a positive int, got {value!r}.")
    return int(value)


def check_share(value: Any, argument: str, closed_top: bool = True) -> float:
    """A share of inputs in ``(0, 1]`` (or ``(0, 1)`` with ``closed_top=False``), as a float: the one rule for
    ``max_deferral_rate`` (the calibration, the guarantees, the metrics' budgets, the CLI), ``max_error`` and
    ``confidence``.

    Args:
        value: the share given.
        argument (`str`): the argument's name, for the error (``"max_deferral_rate"``, ``"--max_deferral_rate"``...).
        closed_top (`bool`, *optional*, defaults to `True`): whether 1 itself is allowed.

    Raises:
        ValueError: not a number (a string, a bool, `None`...), NaN, or outside the interval.

    Example:

    ```python
    >>> check_share(0.1, "max_deferral_rate")
    0.1
    >>> check_share(1.0, "confidence", closed_top=False)
    Traceback (most recent call last):
    ...
    ValueError: confidence must lie in (0, 1), got 1.0.

    ```
    """
    interval = f"(0, 1{']' if closed_top else ')'}"
    if not is_number(value):
        raise ValueError(f"{argument} must be a number in {interval}, got {type(value).__name__} {value!r}.")
    if not (0 < value <= 1 if closed_top else 0 < value < 1):  # False for NaN
        raise ValueError(f"{argument} must lie in {interval}, got {value!r}.")
    return float(value)


def check_probability(value: Any, argument: str) -> float:
    """A probability in ``[0, 1]``, as a float.

    Args:
        value: the probability given.
        argument (`str`): the argument's name, for the error.

    Raises:
        ValueError: not a number, NaN, or outside ``[0, 1]``.

    Example:

    ```python
    >>> check_probability(0.3, "p")
    0.3
    >>> check_probability(1.5, "p")
    Traceback (most recent call last):
    ...
    ValueError: `p` must be a probability in [0, 1], got 1.5.

    ```
    """
    if not is_number(value) or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"`{argument}` must be a probability in [0, 1], got {value!r}.")
    return float(value)


def split_sizes(num_rows: int, split: Sequence[float]) -> tuple[int, int, int]:
    """The train, validation and test sizes of ``num_rows`` rows cut by ``split``, three fractions in (0, 1) that sum
    to 1 (validation and test rounded, train the rest); the one check of a loader's ``split`` argument.

    Raises:
        ValueError: not three fractions in (0, 1) summing to 1, or a split left empty.

    Example:

    ```python
    >>> split_sizes(100, (0.8, 0.1, 0.1))
    (80, 10, 10)

    ```
    """
    if isinstance(split, str) or not isinstance(split, Sequence) or len(split) != 3:
        raise ValueError(f"`split` must be three fractions (train, validation, test), got {split!r}.")
    fractions = []
    for value in split:
        if not is_number(value) or not 0 < float(value) < 1:
            raise ValueError(f"`split` fractions must each lie in (0, 1), got {tuple(split)!r}.")
        fractions.append(float(value))
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(f"`split` fractions must sum to 1, got {tuple(split)!r} (sum {sum(fractions)}).")
    num_validation = round(fractions[1] * num_rows)
    num_test = round(fractions[2] * num_rows)
    num_train = num_rows - num_validation - num_test
    if min(num_train, num_validation, num_test) < 1:
        raise ValueError(
            f"`split` {tuple(split)!r} of {num_rows} rows leaves an empty split "
            f"(train {num_train}, validation {num_validation}, test {num_test})."
        )
    return num_train, num_validation, num_test
