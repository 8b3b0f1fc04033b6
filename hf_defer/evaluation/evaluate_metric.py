"""The deferral metrics as an `evaluate` module, shipped in the package and loaded offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["DEFERRAL_METRIC_PATH", "load_metric"]

DEFERRAL_METRIC_PATH = str(Path(__file__).resolve().parent / "metric_scripts" / "deferral")
"""Folder of the `evaluate` module (`deferral.py`): `evaluate.load(DEFERRAL_METRIC_PATH)` loads it."""


def load_metric(**kwargs: Any) -> Any:
    """`evaluate.load` of the deferral metric shipped with hf_defer: `add_batch` / `add` / `compute` over the K + M
    logits (or class probabilities + expert accuracies with `inputs="probabilities"`), `references` and
    `expert_predictions`; `compute` returns [`deferral_metrics`].

    Args:
        kwargs: passed to `evaluate.load` (`experiment_id`, `num_process`, `process_id`, ...).

    Example:

    ```python
    >>> import hf_defer
    >>> metric = hf_defer.load_metric()
    >>> metric.add_batch(predictions=[[3.0, 0.0, 0.0, 1.0]], references=[0], expert_predictions=[1])
    >>> metric.add_batch(predictions=[[0.0, 0.0, 0.5, 4.0]], references=[2], expert_predictions=[2])
    >>> metric.compute()["coverage"]
    0.5

    ```
    """
    import evaluate

    return evaluate.load(DEFERRAL_METRIC_PATH, **kwargs)
