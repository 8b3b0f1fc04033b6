"""The deferral metrics as an `evaluate` module, shipped in the package and loaded offline.

The module folder (`metric_scripts/deferral/`) holds the script, a README (the metric card) and a `requirements.txt`
naming hf_defer, so `evaluate.load(DEFERRAL_METRIC_PATH)` works from any environment where hf_defer is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["DEFERRAL_METRIC_PATH", "load_metric"]

DEFERRAL_METRIC_PATH = str(Path(__file__).resolve().parent / "metric_scripts" / "deferral")
"""Folder of the `evaluate` module (`deferral.py`): `evaluate.load(DEFERRAL_METRIC_PATH)` loads it."""

_BUDGET_RANKINGS = ("expert_accuracy", "margin")


def load_metric(model: Any = None, *, expert_costs: Any = None, defer_threshold: float | None = None,
                budget_ranking: str | None = None, **kwargs: Any) -> Any:
    """`evaluate.load` of the deferral metric shipped with hf_defer: `add_batch` / `add` / `compute` over the K + M
    logits (or class probabilities + expert accuracies with `inputs="probabilities"`), `references` and
    `expert_predictions`; `compute` returns [`deferral_metrics`].

    Given a deferral model (or its config), the metric decides as the model's pipeline does: its surrogate, its
    `expert_costs` and (calibrated) `defer_threshold`, and budgets ranked by the deferral margin, so that its numbers
    are those of `DeferralTrainer.evaluate()` and of the pipeline. Without a model it is the paper's: zero costs and
    threshold, budgets ranked by estimated expert accuracy. Keywords given here, or to `compute`, win.

    Args:
        model ([`EncoderForDeferral`] or [`DeferralConfig`], *optional*): the model whose decision rule to use.
        expert_costs (`list[float]`, *optional*): the cost of each expert (default: the model's, else zeros).
        defer_threshold (`float`, *optional*): the deferral margin (default: the model's, else 0).
        budget_ranking (`str`, *optional*): `"margin"` (the default with a model) or `"expert_accuracy"` (without).
        kwargs: passed to `evaluate.load` (`experiment_id`, `num_process`, `process_id`, ...).

    Example:

    ```python
    >>> import hf_defer
    >>> metric = hf_defer.load_metric()
    >>> metric.add_batch(predictions=[[3.0, 0.0, 0.0, 1.0]], references=[0], expert_predictions=[1])
    >>> metric.add_batch(predictions=[[0.0, 0.0, 0.5, 4.0]], references=[2], expert_predictions=[2])
    >>> metric.compute()["coverage"]
    0.5
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=3, defer_threshold=0.9))
    >>> hf_defer.load_metric(model).compute(predictions=[[0.0, 0.0, 0.5, 4.0]], references=[2],
    ...                                     expert_predictions=[2])["coverage"]  # the margin is below 0.9: no deferral
    1.0

    ```
    """
    import evaluate

    if budget_ranking is not None and budget_ranking not in _BUDGET_RANKINGS:
        raise ValueError(f"budget_ranking must be one of {_BUDGET_RANKINGS}, got {budget_ranking!r}.")
    defaults: dict[str, Any] = {}
    if model is not None:
        config = getattr(model, "config", model)
        if getattr(config, "model_type", None) != "deferral":
            raise ValueError(f"model must be a deferral model or its DeferralConfig, got {type(model).__name__}.")
        defaults = {"surrogate": config, "num_experts": config.num_experts, "budget_ranking": "margin"}
    for key, value in (("expert_costs", expert_costs), ("defer_threshold", defer_threshold),
                       ("budget_ranking", budget_ranking)):
        if value is not None:
            defaults[key] = list(value) if key == "expert_costs" else value
    metric = evaluate.load(DEFERRAL_METRIC_PATH, **kwargs)
    metric.defaults = defaults
    return metric
