"""Deferral budgets: pick the pipeline's ``defer_threshold`` so that at most a given share of inputs is deferred."""

from __future__ import annotations

from numbers import Integral, Real
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from .guarantees import MARGIN_TOLERANCE, _threshold_between, empirical_budget_threshold  # noqa: F401 (re-exported)
from ..modeling.pipeline_deferral import DeferralPipeline


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


def _saved_processor(model: Any, kind: str) -> Any:
    """The tokenizer / image processor saved with ``model``: in the folder it was loaded from, else its encoder's."""
    from transformers import AutoImageProcessor, AutoTokenizer

    loader = AutoTokenizer if kind == "tokenizer" else AutoImageProcessor
    tried: list[str] = []
    for source in (getattr(model, "name_or_path", None), getattr(model.config.encoder, "_name_or_path", None)):
        if source and str(source) not in tried:
            tried.append(str(source))
            try:
                return loader.from_pretrained(source)
            except (OSError, ValueError, TypeError):
                continue
    raise ValueError(f"found no {kind} saved with the model (looked in {tried or 'nothing: the model was not loaded'}"
                     f" from a folder); pass {kind}= to calibrate_deferral.")


def calibrate_deferral(
    model_or_pipeline: Any,
    dataset: Any,
    max_deferral_rate: float = 0.1,
    batch_size: int = 64,
    expert_costs: Any = None,
    tokenizer: Any = None,
    image_processor: Any = None,
    available_experts: Any = None,
    **processor_kwargs: Any,
) -> float:
    """Sets the deferral threshold so that at most ``max_deferral_rate`` of held-out inputs go to an expert.

    The deferral pipeline defers an input when its margin ``max_j (a_j - c_j) - max_y p(y|x)`` exceeds
    ``defer_threshold`` ([`DeferralSurrogate.decide`]). Of the inputs deferred at threshold 0, the budget
    ([`budget_deferrals`], ranked by margin) keeps the ``floor(max_deferral_rate * N)`` with the highest margins; the
    threshold is then the midpoint between the lowest margin kept and the highest margin left out (or 0 when
    the model defers within the budget on its own), never closer than ``MARGIN_TOLERANCE`` (1e-7) to any margin, so
    that a rounding difference between calibration and a later pipeline run (another batch size, padding) does not
    flip an input. On the same inputs the pipeline then defers exactly those kept inputs, and its system error is
    ``deferral_metrics(..., budget_ranking="margin")``'s ``budgeted_error``; kept inputs whose margin ties the
    highest one left out (to within the tolerance) cannot be told apart by a threshold and stay with the classifier
    (fewer deferrals than the budget). With ``floor(max_deferral_rate * N) = 0`` the threshold lies above every
    margin: nothing is deferred. The threshold is never negative: an input whose
    best expert is not estimated to beat the classifier is never deferred.

    The threshold is stored in ``model.config.defer_threshold``, and given costs in ``model.config.expert_costs``
    (``save_pretrained`` keeps them; the pipeline, the model's `defer` output and [`deferral_metrics`] given the
    model apply them by default), and returned. Labels are not needed: only the model's estimates enter.

    Args:
        model_or_pipeline ([`EncoderForDeferral`] or [`DeferralPipeline`]): the model, or a deferral pipeline.
        dataset (`datasets.Dataset` or `list`): held-out inputs: a list of pipeline inputs, or a dataset with a
            `text` column (and optionally `text_pair`), an `image` column, or a `features` column for a head-only
            model.
        max_deferral_rate (`float`, *optional*, defaults to 0.1): the budget, in (0, 1].
        batch_size (`int`, *optional*, defaults to 64): pipeline batch size.
        expert_costs (sequence of `float`, *optional*): one cost per expert (defaults to the costs the given pipeline
            was built with, else `model.config.expert_costs`); stored in `model.config.expert_costs`.
        tokenizer / image_processor (*optional*): for a text / vision model; by default the one saved with the model
            (in the folder it was loaded from, else with its encoder).
        available_experts (*optional*): who can be asked, as the pipeline takes it: expert names (or a bool mask) for
            every input, or one entry per input of `dataset`. The margins, hence the budget, count only those; an
            input with nobody to ask is never deferred (and still counts in `N`).
        processor_kwargs (*optional*): the tokenizer (or image-processor) settings the pipeline will be called with,
            e.g. `truncation=True, max_length=128`: the margins, hence the threshold, depend on them.

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
    if isinstance(max_deferral_rate, bool) or not isinstance(max_deferral_rate, Real):
        raise TypeError(f"max_deferral_rate must be a number in (0, 1], got {type(max_deferral_rate).__name__}.")
    if not 0 < max_deferral_rate <= 1:
        raise ValueError(f"max_deferral_rate must lie in (0, 1], got {max_deferral_rate!r}.")
    if isinstance(batch_size, bool) or not isinstance(batch_size, Integral) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    max_deferral_rate, batch_size = float(max_deferral_rate), int(batch_size)
    if isinstance(model_or_pipeline, DeferralPipeline):
        pipe = model_or_pipeline
    elif getattr(getattr(model_or_pipeline, "config", None), "model_type", None) == "deferral":
        model = model_or_pipeline
        if model.config.encoder is not None and model.main_input_name == "pixel_values" and image_processor is None:
            image_processor = _saved_processor(model, "image_processor")
        elif model.config.encoder is not None and model.main_input_name != "pixel_values" and tokenizer is None:
            tokenizer = _saved_processor(model, "tokenizer")
        pipe = DeferralPipeline(model=model.eval(), tokenizer=tokenizer, image_processor=image_processor,
                                device=model.device)  # eval(): no dropout in the margins, as in a loaded model
    else:
        raise ValueError(
            "model_or_pipeline must be a deferral model (config.model_type == 'deferral') or a DeferralPipeline, got "
            f"{type(model_or_pipeline).__name__}."
        )
    inputs = _pipeline_inputs(dataset, pipe.input_kind)
    if not inputs:
        raise ValueError("dataset is empty: calibration needs held-out inputs.")
    # The inputs stream as a generator, for which torch's batch sampler builds a list of `batch_size` indices up front:
    # a batch size far above the number of inputs would exhaust the memory for nothing.
    batch_size = min(batch_size, len(inputs))
    # Validates expert_costs the way the pipeline does, before any forward pass; a pipeline built with costs keeps them.
    costs = pipe.resolve_costs(expert_costs)
    if available_experts is not None:  # a per-input mask needs the list; the names of the whole call do not mind
        processor_kwargs = {**processor_kwargs, "available_experts": available_experts}
    outputs = pipe(inputs if available_experts is not None else (item for item in inputs), batch_size=batch_size,
                   expert_costs=costs, defer_threshold=0.0, return_margin=True, **processor_kwargs)  # a generator streams
    decided = [(out["defer"], out["margin"])
               for out in tqdm(outputs, total=len(inputs), desc="Calibrating deferral", disable=len(inputs) < 1000)]
    deferred, margins = np.array([d for d, _ in decided], dtype=bool), np.array([m for _, m in decided])
    threshold = empirical_budget_threshold(margins, max_deferral_rate, deferred)
    config = pipe.model.config
    config.defer_threshold = threshold
    if costs is not None:
        config.expert_costs = [float(cost) for cost in costs]
    for name in ("defer_threshold", "expert_costs"):  # values fixed at construction would override the config's
        pipe._postprocess_params.pop(name, None)
    return threshold



__all__ = ["calibrate_deferral"]
