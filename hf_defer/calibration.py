"""Deferral budgets: pick the pipeline's ``defer_threshold`` so that at most a given share of inputs is deferred."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .pipeline_deferral import DeferralPipeline, deferral_margin

def _pipeline_inputs(dataset: Any, input_kind: str) -> list[Any]:
    """The pipeline inputs held by ``dataset``: a list of inputs or a `datasets.Dataset` with an input column."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        if not isinstance(dataset, (list, tuple)):
            raise TypeError(
                f"dataset must be a datasets.Dataset or a list of pipeline inputs, got {type(dataset).__name__}."
            )
        return list(dataset)
    column = input_kind  # the "text", "image" or "features" column
    if column not in columns:
        raise ValueError(
            f"dataset must have a {column!r} column for this {input_kind} model (raw inputs, as the pipeline takes "
            f"them); its columns are {columns}."
        )
    if input_kind == "text" and "text_pair" in columns:
        return [{"text": t, "text_pair": p} for t, p in zip(dataset["text"], dataset["text_pair"])]
    if input_kind == "features":
        return list(np.asarray(dataset.with_format("numpy")["features"], dtype=np.float32))
    return list(dataset[column])


def calibrate_deferral(
    model_or_pipeline: Any,
    dataset: Any,
    max_deferral_rate: float = 0.1,
    batch_size: int = 64,
    expert_costs: Any = None,
    tokenizer: Any = None,
    image_processor: Any = None,
) -> float:
    """Sets the deferral threshold so that at most ``max_deferral_rate`` of held-out inputs go to an expert.

    The deferral pipeline defers an input when its margin ``max_j (expert_accuracy_j - cost_j) - top class
    probability`` exceeds ``defer_threshold``. With the ``N`` margins of ``dataset`` sorted from highest to lowest,
    ``s_0 >= s_1 >= ...``, and the budget ``B = floor(max_deferral_rate * N)``, the threshold is
    ``t = max(0, s_B)`` (``t = 0`` when ``B = N``): the inputs with the highest estimated gain from deferring are
    deferred first, as in the paper's budgeted error, exactly ``B`` of them when the margins have no ties at
    ``s_B``, fewer otherwise. It never goes below 0, so it never defers an input whose best expert is not
    estimated to beat the classifier: if the model defers less than the budget on its own, it is left as is.

    The threshold is stored in ``model.config.defer_threshold`` (``save_pretrained`` keeps it; the pipeline applies
    it by default) and returned. Labels are not needed: only the model's estimates enter.

    Args:
        model_or_pipeline ([`EncoderForDeferral`] or [`DeferralPipeline`]): the model, or a deferral pipeline.
        dataset (`datasets.Dataset` or `list`): held-out inputs: a list of pipeline inputs, or a dataset with a
            `text` column (and optionally `text_pair`), an `image` column, or a `features` column for a head-only
            model.
        max_deferral_rate (`float`, *optional*, defaults to 0.1): the budget, in (0, 1].
        batch_size (`int`, *optional*, defaults to 64): pipeline batch size.
        expert_costs (sequence of `float`, *optional*): one cost per expert, as passed to the pipeline (defaults to
            the costs the given pipeline was built with); pass the same costs to the pipeline when using the threshold.
        tokenizer / image_processor (*optional*): needed to build a pipeline from a text / vision model.

    Returns:
        `float`: the threshold, also in ``model.config.defer_threshold``.

    Example:

    ```python
    >>> import numpy as np
    >>> import hf_defer
    >>> model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    >>> held_out = list(np.random.default_rng(0).normal(size=(50, 4)).astype("float32"))
    >>> threshold = hf_defer.calibrate_deferral(model, held_out, max_deferral_rate=0.1)
    >>> model.config.defer_threshold == threshold
    True

    ```
    """
    if isinstance(max_deferral_rate, bool) or not isinstance(max_deferral_rate, (int, float)):
        raise TypeError(f"max_deferral_rate must be a number in (0, 1], got {type(max_deferral_rate).__name__}.")
    if not 0 < max_deferral_rate <= 1:
        raise ValueError(f"max_deferral_rate must lie in (0, 1], got {max_deferral_rate!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    if isinstance(model_or_pipeline, DeferralPipeline):
        pipe = model_or_pipeline
    elif getattr(getattr(model_or_pipeline, "config", None), "model_type", None) == "deferral":
        pipe = DeferralPipeline(model=model_or_pipeline, tokenizer=tokenizer, image_processor=image_processor,
                                device=model_or_pipeline.device)
    else:
        raise ValueError(
            "model_or_pipeline must be a deferral model (config.model_type == 'deferral') or a DeferralPipeline, got "
            f"{type(model_or_pipeline).__name__}."
        )
    inputs = _pipeline_inputs(dataset, pipe.input_kind)
    if not inputs:
        raise ValueError("dataset is empty: calibration needs held-out inputs.")
    # Validates expert_costs the way the pipeline does, before any forward pass; a pipeline built with costs keeps them.
    costs = pipe._sanitize_parameters(expert_costs=expert_costs)[2].get("expert_costs")
    if costs is None:
        costs = pipe._postprocess_params.get("expert_costs") or getattr(pipe.model.config, "expert_costs", None)
    outputs = pipe((item for item in inputs), batch_size=batch_size, expert_costs=costs)  # a generator streams
    margins = np.array(
        [deferral_margin(out["class_score"], out["expert_accuracy"], costs)[0]
         for out in tqdm(outputs, total=len(inputs), desc="Calibrating deferral", disable=len(inputs) < 1000)]
    )
    budget = math.floor(max_deferral_rate * len(margins) + 1e-9)
    ranked = np.sort(margins)[::-1]
    threshold = 0.0 if budget >= len(ranked) else max(0.0, float(ranked[budget]))
    pipe.model.config.defer_threshold = threshold
    pipe._postprocess_params.pop("defer_threshold", None)  # a threshold fixed at construction would override it
    return threshold


__all__ = ["calibrate_deferral"]
