"""Reliability diagrams and expected calibration error: equal-width confidence bins, their pooling over runs, and
the ECE of binned data. [`deferral_metrics`] reports the experts' ECE with them; also importable from `hf_defer.evaluation.metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ..modeling.validators import is_int

__all__ = ["MAX_BINS", "expected_calibration_error", "pool_reliability", "reliability_bins", "reliability_ece"]

MAX_BINS = 100_000
"""The most bins [`reliability_bins`] takes: its lists have one entry per bin."""


def _to_numpy_1d(name: str, values: Any) -> np.ndarray:
    """``values`` as a 1-D float64 array, with errors naming ``name``."""
    if isinstance(values, torch.Tensor):
        values = values.detach().cpu().float().numpy() if values.is_floating_point() else values.detach().cpu().numpy()
    try:
        array = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a one-dimensional array of numbers, got {type(values).__name__} ({err}).") from None
    if array.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {array.shape}.")
    return array


def reliability_bins(confidence: Any, correct: Any, n_bins: int = 15, soft: bool = False) -> dict[str, list[float]]:
    """Data for a reliability diagram: equal-width confidence bins on [0, 1].

    An estimate ``p`` falls in bin ``min(floor(p * n_bins), n_bins - 1)``, so 0 lies in the first bin and 1 in
    the last.

    Args:
        confidence (array-like of shape `[N]`): estimated probabilities in [0, 1].
        correct (array-like of shape `[N]`): outcomes, 0/1 or bool.
        n_bins (`int`, *optional*, defaults to 15): number of bins.
        soft (`bool`, *optional*, defaults to `False`): accept outcomes anywhere in [0, 1] (scores, such as a judge's
            grade, whose expectation the confidence estimates); a bin's ``accuracy`` is then its mean score.

    Returns:
        `dict`: ``bin_edges`` (``n_bins + 1`` floats), ``counts``, ``mean_confidence`` and ``accuracy`` per bin
        (NaN for empty bins).

    Example:

    ```python
    >>> from hf_defer.evaluation import reliability_bins
    >>> reliability_bins([0.1, 0.9, 0.95], [0, 1, 1], n_bins=2)["accuracy"]
    [0.0, 1.0]

    ```
    """
    conf = _to_numpy_1d("confidence", confidence)
    hits = _to_numpy_1d("correct", correct)
    if conf.shape != hits.shape:
        raise ValueError(f"confidence and correct must have the same length, got {conf.shape[0]} and {hits.shape[0]}.")
    if not is_int(n_bins) or not 1 <= n_bins <= MAX_BINS:
        raise ValueError(f"n_bins must be an integer in [1, {MAX_BINS}], got {n_bins!r}.")
    n_bins = int(n_bins)
    if soft and not ((hits >= 0) & (hits <= 1)).all():
        raise ValueError(f"correct must hold scores in [0, 1], got {np.unique(hits[~((hits >= 0) & (hits <= 1))])[:5].tolist()}.")
    if not soft and not np.isin(hits, (0.0, 1.0)).all():
        raise ValueError(f"correct must hold outcomes 0/1 (or bool), got {np.unique(hits[~np.isin(hits, (0.0, 1.0))])[:5].tolist()}.")
    if conf.size and (np.isnan(conf).any() or conf.min() < 0 or conf.max() > 1):
        raise ValueError(f"confidence must lie in [0, 1], got values in [{np.nanmin(conf)}, {np.nanmax(conf)}].")
    index = np.minimum((conf * n_bins).astype(np.int64), n_bins - 1)
    counts = np.bincount(index, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_conf = np.bincount(index, weights=conf, minlength=n_bins) / counts
        accuracy = np.bincount(index, weights=hits, minlength=n_bins) / counts
    return {
        "bin_edges": np.linspace(0.0, 1.0, n_bins + 1).tolist(),
        "counts": counts.tolist(),
        "mean_confidence": mean_conf.tolist(),
        "accuracy": accuracy.tolist(),
    }


def expected_calibration_error(confidence: Any, correct: Any, n_bins: int = 15) -> float:
    """Expected calibration error ``sum_b (n_b / N) |mean confidence_b - accuracy_b|`` over equal-width bins.

    Binning as in [`reliability_bins`]. Returns 0.0 for no inputs.

    Example:

    ```python
    >>> from hf_defer.evaluation import expected_calibration_error
    >>> expected_calibration_error([0.8, 0.8, 0.8, 0.8, 0.8], [1, 1, 1, 1, 0])
    0.0

    ```
    """
    return reliability_ece(reliability_bins(confidence, correct, n_bins))


def pool_reliability(diagrams: Sequence[dict[str, list[float]]]) -> dict[str, list[float]]:
    """Merges the reliability-diagram data of several runs over the same bins: counts add, means are count-weighted.

    The result equals [`reliability_bins`] of all the runs' inputs at once (up to rounding).

    Args:
        diagrams (sequence of `dict`): [`reliability_bins`] outputs with the same ``bin_edges``.

    Returns:
        `dict`: ``bin_edges``, ``counts``, ``mean_confidence`` and ``accuracy`` (NaN for empty bins).

    Example:

    ```python
    >>> from hf_defer.evaluation.metrics import pool_reliability
    >>> a = {"bin_edges": [0, 0.5, 1], "counts": [1, 1], "mean_confidence": [0.2, 0.9], "accuracy": [0.0, 1.0]}
    >>> b = {"bin_edges": [0, 0.5, 1], "counts": [0, 3], "mean_confidence": [float("nan"), 0.7], "accuracy": [float("nan"), 0.5]}
    >>> pool_reliability([a, b])["accuracy"]
    [0.0, 0.625]

    ```
    """
    if not diagrams:
        raise ValueError("diagrams must hold at least one reliability diagram, got none.")
    edges = diagrams[0]["bin_edges"]
    if any(d["bin_edges"] != edges for d in diagrams):
        raise ValueError("diagrams must share their bin edges.")
    counts = np.sum([np.asarray(d["counts"], dtype=np.float64) for d in diagrams], axis=0)
    pooled = {"bin_edges": list(edges), "counts": counts.astype(int).tolist()}
    for key in ("mean_confidence", "accuracy"):
        weighted = np.sum([np.nan_to_num(np.asarray(d[key], dtype=np.float64)) * np.asarray(d["counts"]) for d in diagrams],
                          axis=0)
        with np.errstate(invalid="ignore", divide="ignore"):
            pooled[key] = (weighted / counts).tolist()
    return pooled


def reliability_ece(bins: dict[str, list[float]]) -> float:
    """Expected calibration error of reliability-diagram data: ``sum_b (n_b / N) |mean confidence_b - accuracy_b|``.

    With [`pool_reliability`] it gives the ECE of several runs pooled. Returns 0.0 when every bin is empty.

    Args:
        bins (`dict`): [`reliability_bins`] or [`pool_reliability`] output.

    Example:

    ```python
    >>> from hf_defer.evaluation.metrics import reliability_ece
    >>> reliability_ece({"counts": [1, 1], "mean_confidence": [0.25, 0.75], "accuracy": [0.0, 1.0]})
    0.25

    ```
    """
    counts = np.asarray(bins["counts"], dtype=np.float64)
    total = counts.sum()
    if total == 0:
        return 0.0
    gap = np.abs(np.asarray(bins["mean_confidence"], dtype=np.float64) - np.asarray(bins["accuracy"], dtype=np.float64))
    return float(np.sum(counts[counts > 0] / total * gap[counts > 0]))
