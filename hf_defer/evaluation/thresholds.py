"""Deferral thresholds: [`calibrate_deferral`] sets the pipeline's ``defer_threshold`` from held-out inputs so that at
most a given share of inputs is deferred (or, with a confidence, so that an error or cost target holds on new inputs:
the statistics are in ``guarantees.py``). Calibration *error* (ECE, reliability diagrams) is ``reliability.py``'s."""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping
from datetime import date
from typing import Any

import numpy as np
from huggingface_hub.utils import are_progress_bars_disabled
from tqdm.auto import tqdm

from .guarantees import MARGIN_TOLERANCE, certify_threshold, check_guarantee, empirical_budget_threshold  # noqa: F401
from ..modeling.availability import InputWithAvailability, parse_available_experts
from ..modeling.guarantee_record import PER_INPUT
from ..modeling.pipeline_deferral import DeferralPipeline
from ..modeling.surrogate_routing import is_route_only
from ..modeling.validators import check_share, is_int


def _pipeline_inputs(dataset: Any, input_kind: str) -> tuple[Iterator[Any], int]:
    """The pipeline inputs held by ``dataset`` (a list of inputs or a `datasets.Dataset` with an input column) as a
    stream, a batch of rows read at a time, and their number."""
    columns = getattr(dataset, "column_names", None)
    if columns is None:
        if not isinstance(dataset, (list, tuple)):
            raise TypeError(
                f"dataset must be a datasets.Dataset or a list of pipeline inputs, got {type(dataset).__name__}."
            )
        return (item for item in dataset), len(dataset)  # a generator: the pipeline streams it
    column = input_kind  # the "text", "image" or "features" column
    if column not in columns:
        raise ValueError(
            f"dataset must have a {column!r} column for this {input_kind} model (raw inputs, as the pipeline takes "
            f"them); its columns are {columns}."
        )
    pair = input_kind == "text" and "text_pair" in columns
    rows = dataset.select_columns([column, "text_pair"] if pair else [column])

    def stream() -> Iterator[Any]:
        for batch in (rows.with_format("numpy") if input_kind == "features" else rows).iter(batch_size=256):
            if pair:
                yield from ({"text": t, "text_pair": p} for t, p in zip(batch["text"], batch["text_pair"]))
            elif input_kind == "features":
                yield from np.asarray(batch["features"], dtype=np.float32)
            else:
                yield from batch[column]

    return stream(), len(dataset)


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
    model_or_pipeline: Any, dataset: Any, max_deferral_rate: float | Mapping[str, float] | None = None,
    batch_size: int = 64, expert_costs: Any = None, tokenizer: Any = None, image_processor: Any = None,
    available_experts: Any = None, *, confidence: float | None = None, max_error: float | None = None,
    selective: bool = False, max_mean_cost: float | None = None, labels: Any = None, expert_labels: Any = None,
    expert_correct: Any = None, unlabeled: Any = None, guarantee: str = "high_probability", **processor_kwargs: Any,
) -> float:
    """Sets the deferral threshold so that at most ``max_deferral_rate`` of held-out inputs go to an expert, or, with
    a ``confidence``, so that promises on new inputs hold with that probability.

    **With a confidence** (in (0, 1)): with probability at least ``confidence`` over the draw of these calibration
    inputs, every promise given holds on new inputs from the same distribution ([`certify_threshold`]):

    * ``max_deferral_rate=b``: at most ``b`` of new inputs deferred (exact binomial order statistic, as tight as it
      allows); ``{"alice": 0.05, "bob": 0.1}``: each expert's own share of the inputs.
    * ``max_error=alpha``: the system error (what [`deferral_metrics`] scores: the classifier where it answers, the
      chosen expert where it defers) at most ``alpha``, with the fewest deferrals that certify it (Learn-then-Test);
      ``selective=True``: the classifier's error on the inputs it keeps. Needs labels and the experts' answers: the
      dataset's ``labels`` (or ``label``) and ``expert_labels`` (or ``expert_correct``) columns, or the arguments of
      those names; rows labelled -100 are left out. The decisions are the pipeline's, made with no knowledge of
      who answered: an input deferred to an expert with no recorded answer (-100) counts as an error, so the bound
      holds whatever that expert would have said. A `ValueError` names the smallest ``alpha`` certifiable.
      With ``unlabeled`` (more inputs, no labels): the prediction-powered test ([`certify_threshold`]) spends them
      and the model's own estimates (``1 -`` its probability of its answer where it answers, ``1 -`` the chosen
      expert's estimated accuracy where it defers) on the target, the labelled inputs correcting the estimates' bias;
      valid whatever the estimates are worth, and cheaper than the labelled inputs alone only where they are sharp.
    * ``max_mean_cost=P``: the mean price per input (``expert_costs``) at most ``P``.

    **An expected error** (``guarantee="expected"``, ``max_error`` alone and no ``confidence``): the system error on
    new inputs is at most ``max_error`` *averaged over calibration draws and inputs*, a refused calibration counting
    as no error (conformal risk control, [`certify_threshold`]); it is not a statement about any one calibration.
    It costs less than the high-probability promise. ``unlabeled`` (if given) only sets the most deferral it may use.

    What was certified is recorded in ``model.config.deferral_guarantee`` (claims, ``n``, date, costs, experts and
    availability; the model card states it, the pipeline warns when a call changes what it holds for). Without a
    confidence only ``max_deferral_rate`` (a float) is allowed, by the empirical rule below, and a former guarantee
    is cleared.

    **Without a confidence** (the empirical rule: the budget holds on these inputs, and on new ones about half of the
    time):

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
        max_deferral_rate (`float` or `dict`, *optional*): the budget, in (0, 1] (a dict of them per expert name, with
            a confidence); 0.1 when no promise is given.
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
        confidence (`float`, *optional*): in (0, 1): certify the promises with this probability.
        max_error (`float`, *optional*) / selective (`bool`, *optional*, defaults to `False`): the error target.
        max_mean_cost (`float`, *optional*): the budget on the mean cost per input.
        labels / expert_labels / expert_correct (array-like, *optional*): for ``max_error``, instead of the dataset's
            columns: ``[N]`` classes, ``[N, M]`` answers or correctness (-100 where missing).
        unlabeled (`datasets.Dataset` or `list`, *optional*): for ``max_error``, inputs from the same distribution
            without labels (as ``dataset`` takes them), for the prediction-powered test; every expert must have
            answered every labelled row, and ``available_experts`` (if given) must hold for the whole call.
        guarantee (`str`, *optional*, defaults to ``"high_probability"``): ``"expected"`` for the expected-error
            promise above.

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
    certified, max_deferral_rate, batch_size = _check_call(confidence, max_deferral_rate, max_error, max_mean_cost,
                                                           batch_size, guarantee, selective)
    pipe = _deferral_pipeline(model_or_pipeline, tokenizer, image_processor)
    inputs, count = _held_out_inputs(dataset, pipe.input_kind)
    batch_size = min(batch_size, count)  # torch's batch sampler lists `batch_size` indices up front: no more than N
    # Validates expert_costs the way the pipeline does, before any forward pass; a pipeline built with costs keeps them.
    costs, config, names = pipe.resolve_costs(expert_costs), pipe.model.config, list(pipe.model.config.expert_names)
    targets = _error_targets(config, dataset, max_error, unlabeled, available_experts, count, names, guarantee,
                             labels=labels, expert_labels=expert_labels, expert_correct=expert_correct)
    inputs, processor_kwargs = _with_experts(inputs, count, available_experts, names, processor_kwargs)
    margins, deferred, chosen, predicted, estimated = _run(pipe, inputs, count, batch_size, costs, certified, names,
                                                           processor_kwargs)
    others = None if unlabeled is None else _run_unlabeled(pipe, unlabeled, batch_size, costs, names,
                                                           processor_kwargs, available_experts)
    _lift_left_out_default(margins)
    if not certified:  # a former guarantee does not hold for this threshold
        threshold, config.deferral_guarantee = empirical_budget_threshold(margins, max_deferral_rate, deferred), None
    else:
        threshold = _certify(margins, chosen, predicted, targets, names, costs, config=config,
                             available_experts=available_experts, estimated=None if others is None else estimated,
                             unlabeled=others, confidence=confidence, max_deferral_rate=max_deferral_rate,
                             max_error=max_error, selective=selective, max_mean_cost=max_mean_cost,
                             guarantee=guarantee)
    _record_calibration(pipe, threshold, costs, names)
    return threshold


def _check_call(confidence: Any, max_deferral_rate: Any, max_error: Any, max_mean_cost: Any,
                batch_size: Any, guarantee: Any = "high_probability",
                selective: bool = False) -> tuple[bool, Any, int]:
    """The promises asked and the batch size, checked: ``(certified, max_deferral_rate, batch_size)`` (certified:
    a promise on new inputs; a budget of 0.1 when nothing is asked)."""
    if guarantee != "high_probability":  # the expected-error promise: max_error alone, no confidence
        check_guarantee(guarantee, confidence, max_error, selective, max_deferral_rate, max_mean_cost)
        return True, None, _check_batch_size(batch_size)
    certified = confidence is not None or max_error is not None or max_mean_cost is not None or isinstance(
        max_deferral_rate, Mapping)
    if max_deferral_rate is None and max_error is None and max_mean_cost is None:
        max_deferral_rate = 0.1
    if certified and confidence is None:
        raise ValueError("max_error, max_mean_cost and a budget per expert (a dict) are promises on new inputs: give "
                         "confidence= (in (0, 1), e.g. 0.9).")
    if not certified:
        max_deferral_rate = check_share(max_deferral_rate, "max_deferral_rate")
    return certified, max_deferral_rate, _check_batch_size(batch_size)


def _check_batch_size(batch_size: Any) -> int:
    if not is_int(batch_size) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
    return int(batch_size)


def _held_out_inputs(dataset: Any, input_kind: str) -> tuple[Iterator[Any], int]:
    """The calibration inputs as a stream, and their number (some: an empty dataset is refused)."""
    inputs, count = _pipeline_inputs(dataset, input_kind)
    if count == 0:
        raise ValueError("dataset is empty: calibration needs held-out inputs.")
    return inputs, count


def _deferral_pipeline(model_or_pipeline: Any, tokenizer: Any, image_processor: Any) -> DeferralPipeline:
    """The pipeline to calibrate: the one given, or one over the model with its saved tokenizer / image processor."""
    if isinstance(model_or_pipeline, DeferralPipeline):
        return model_or_pipeline
    if getattr(getattr(model_or_pipeline, "config", None), "model_type", None) != "deferral":
        raise ValueError(
            "model_or_pipeline must be a deferral model (config.model_type == 'deferral') or a DeferralPipeline, got "
            f"{type(model_or_pipeline).__name__}."
        )
    model = model_or_pipeline
    if model.config.encoder is not None and model.main_input_name == "pixel_values" and image_processor is None:
        image_processor = _saved_processor(model, "image_processor")
    elif model.config.encoder is not None and model.main_input_name != "pixel_values" and tokenizer is None:
        tokenizer = _saved_processor(model, "tokenizer")
    return DeferralPipeline(model=model.eval(), tokenizer=tokenizer, image_processor=image_processor,
                            device=model.device)  # eval(): no dropout in the margins, as in a loaded model


def _error_targets(config: Any, dataset: Any, max_error: Any, unlabeled: Any, available_experts: Any, count: int,
                   names: list[str], guarantee: str, **given: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """For an error target, the labels, the experts' correctness and who answered ([`_targets`]); `None` without
    one. Refuses what the target cannot use (a route-only model; unlabelled inputs without a target, or where who
    would answer them is not known)."""
    targets = None
    if max_error is not None:
        if is_route_only(config):
            raise ValueError("max_error needs a model with a class head; a route-only model takes a budget "
                             "(max_deferral_rate, max_mean_cost).")
        targets = _targets(dataset, given["labels"], given["expert_labels"], given["expert_correct"], count,
                           len(names))
    if unlabeled is not None:
        if max_error is None:
            raise ValueError("unlabeled= serves the error target: give max_error (budgets need no labels at all).")
        # The prediction-powered test corrects the predictions on the labelled rows (every answer needed); the
        # expected promise only takes its cap from the unlabelled inputs.
        if (guarantee == "high_probability" and not targets[2].all()) or (
                available_experts is not None and parse_available_experts(available_experts, names)[0]):
            raise ValueError("unlabeled= needs every expert to have answered every labelled row and availability "
                             "given for the whole call (not per input): who would answer an unlabelled input is "
                             "not known.")
    return targets


def _run_unlabeled(pipe: Any, unlabeled: Any, batch_size: int, costs: Any, names: list[str],
                   processor_kwargs: dict[str, Any], available_experts: Any) -> dict[str, np.ndarray]:
    """The margins and the model's predicted losses on the unlabelled inputs, for the prediction-powered test."""
    extra, extra_count = _pipeline_inputs(unlabeled, pipe.input_kind)
    if extra_count == 0:
        raise ValueError("unlabeled is empty: give the inputs without labels, or leave it out.")
    options = {key: value for key, value in processor_kwargs.items() if key != "available_experts"}
    if available_experts is not None:
        options["available_experts"] = available_experts
    u_margins, _, _, _, u_estimated = _run(pipe, extra, extra_count, min(batch_size, extra_count), costs,
                                           True, names, options)
    return {"margins": u_margins, "predicted_if_kept": u_estimated[0], "predicted_if_deferred": u_estimated[1]}


def _lift_left_out_default(margins: np.ndarray) -> None:
    """A route-only default expert left out: deferred at any threshold (margin +inf); placed above all others."""
    if np.isposinf(margins).any():
        margins[np.isposinf(margins)] = max(0.0, float(margins[np.isfinite(margins)].max(initial=0.0))) + 1.0


def _record_calibration(pipe: Any, threshold: float, costs: list[float] | None, names: list[str]) -> None:
    """The threshold and the costs it was calibrated at, in the model's config (a call with other costs, or another
    threshold, warns); the pipeline then follows the config."""
    config = pipe.model.config
    config.defer_threshold = threshold
    if costs is not None:
        config.expert_costs = [float(cost) for cost in costs]
    config.calibrated_expert_costs = [float(cost) for cost in (costs or [0.0] * len(names))]
    for name in ("defer_threshold", "expert_costs"):  # values fixed at construction would override the config's
        pipe._postprocess_params.pop(name, None)


def _targets(dataset: Any, labels: Any, expert_labels: Any, expert_correct: Any, count: int,
             num_experts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The labels ``[N]``, each expert's correctness ``[N, M]`` (answers compared with the label, or the scores) and
    who answered ``[N, M]``, from the arguments or the dataset's columns."""
    columns = list(getattr(dataset, "column_names", None) or [])
    numpy = dataset.with_format("numpy") if columns else None
    if labels is None:
        column = next((name for name in ("labels", "label") if name in columns), None)
        if column is None:
            raise ValueError("max_error needs the true labels: a dataset with a 'labels' (or 'label') column, or "
                             f"labels=; the dataset's columns are {columns}.")
        labels = numpy[column]
    if expert_labels is None and expert_correct is None:
        if "expert_correct" in columns:
            expert_correct = numpy["expert_correct"]
        elif "expert_labels" in columns:
            expert_labels = numpy["expert_labels"]
        else:
            raise ValueError("max_error needs the experts' answers: an 'expert_labels' (or 'expert_correct') column, "
                             f"or expert_labels= / expert_correct=; the dataset's columns are {columns}.")
    y = np.asarray(labels)
    if y.shape != (count,) or not np.issubdtype(y.dtype, np.integer):
        raise ValueError(f"labels must be {count} class ids (one per input), got {y.dtype} of shape {y.shape}.")
    given = np.asarray(expert_correct if expert_correct is not None else expert_labels, dtype=np.float64)
    name = "expert_correct" if expert_correct is not None else "expert_labels"
    given = given.reshape(count, -1) if given.size == count * num_experts else given
    if given.shape != (count, num_experts):
        raise ValueError(f"{name} must have shape [{count}, {num_experts}] (one column per expert), got {given.shape}.")
    answered = given != -100
    if expert_correct is not None:
        if ((given[answered] < 0) | (given[answered] > 1)).any() or np.isnan(given).any():
            raise ValueError("expert_correct must lie in [0, 1] (-100 where missing).")
        correct = np.where(answered, given, 0.0)
    else:
        correct = (given == y[:, None]).astype(np.float64)
    return y.astype(np.int64), correct, answered


def _with_experts(inputs: Iterator[Any], count: int, available_experts: Any, names: list[str],
                  processor_kwargs: dict[str, Any]) -> tuple[Iterator[Any], dict[str, Any]]:
    """The input stream and the pipeline's options with the whole call's ``available_experts``: per-input availability
    rides with each input."""
    per_input, mask = (False, None) if available_experts is None else parse_available_experts(available_experts, names)
    if per_input and mask.shape[0] != count:
        raise ValueError(f"available_experts has {mask.shape[0]} rows (one per input), but dataset has {count} inputs.")
    # Who answered is not known at decision time: the decisions are the pipeline's (an input deferred to an expert
    # with no recorded answer counts as an error of the guarantee, which stays an upper bound).
    if not per_input:
        return inputs, processor_kwargs if mask is None else {**processor_kwargs, "available_experts": mask}
    return (InputWithAvailability(item, row) for item, row in zip(inputs, mask)), processor_kwargs


def _run(pipe: Any, inputs: Iterator[Any], count: int, batch_size: int, costs: Any, certified: bool,
         names: list[str], processor_kwargs: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """The pipeline over the inputs: margins, decisions at threshold 0, the chosen expert and class (-1: none), and
    the model's predicted losses (1 - its probability of its answer, 1 - the chosen expert's estimated accuracy)."""
    # At threshold 0 the pipeline's own decisions (today's rule); certifying, a threshold below every margin names the
    # expert each input would go to.
    with warnings.catch_warnings():  # calibrating is not deciding: a former guarantee has nothing to say about it
        warnings.filterwarnings("ignore", message="this call is not covered by the model's deferral guarantee")
        warnings.filterwarnings("ignore", message="this call decides with .* was calibrated")
        outputs = pipe(inputs, batch_size=batch_size, expert_costs=costs,
                       defer_threshold=-1e300 if certified else 0.0, return_margin=True, **processor_kwargs)
    margins, deferred = np.empty(count), np.empty(count, dtype=bool)
    chosen, predicted = np.full(count, -1), np.full(count, -1)
    estimated = np.zeros((2, count))
    index = {name: j for j, name in enumerate(names)}
    classes = {name: k for k, name in (pipe.model.config.id2label or {}).items()}
    for i, out in enumerate(tqdm(outputs, total=count, desc="Calibrating deferral",
                                 disable=count < 1000 or are_progress_bars_disabled())):
        margins[i], deferred[i] = out["margin"], out["defer"]
        chosen[i] = index.get(out["expert"], -1)
        predicted[i] = classes.get(out.get("class_label"), -1)
        estimated[0, i] = 1.0 - float(out.get("class_score", 0.0))
        estimated[1, i] = 1.0 - out["expert_accuracy"][chosen[i]] if chosen[i] >= 0 else estimated[0, i]
    return margins, deferred, chosen, predicted, np.clip(estimated, 0.0, 1.0)


def _certify(margins: np.ndarray, chosen: np.ndarray, predicted: np.ndarray, targets: tuple | None,
             names: list[str], costs: list[float] | None, *, config: Any, available_experts: Any,
             estimated: np.ndarray | None = None, unlabeled: dict[str, np.ndarray] | None = None,
             **promises: Any) -> float:
    """[`certify_threshold`] on what the pipeline found, recorded in ``config.deferral_guarantee``."""
    rates = promises["max_deferral_rate"]
    if isinstance(rates, Mapping) and set(rates) - set(names):
        raise ValueError(f"max_deferral_rate names {sorted(set(rates) - set(names))}, which are not among the "
                         f"experts {names}.")
    experts = np.asarray(names + [""])[chosen]  # "" where nobody is available
    keep = np.ones(margins.size, dtype=bool)
    losses: dict[str, Any] = {}
    if targets is not None:
        y, correct, _ = targets
        keep = y != -100
        rows = np.arange(margins.size)
        losses = {"loss_if_kept": (predicted != y).astype(np.float64)[keep],
                  "loss_if_deferred": np.where(chosen >= 0, 1.0 - correct[rows, np.maximum(chosen, 0)], np.nan)[keep]}
        if not keep.any():
            raise ValueError("every label is -100: no row to certify an error on.")
    if promises["max_mean_cost"] is not None:
        if costs is None or max(costs) <= 0:
            raise ValueError("max_mean_cost needs expert_costs (the price of each expert), some above 0.")
        losses["cost_if_deferred"] = np.where(chosen >= 0, np.asarray(costs)[np.maximum(chosen, 0)], np.nan)[keep]
        losses["cost_bound"] = float(max(costs))
    if unlabeled is not None and promises.get("guarantee") == "expected":  # the cap only
        losses.update(unlabeled=unlabeled)
    elif unlabeled is not None:
        losses.update(predicted_if_kept=estimated[0][keep], predicted_if_deferred=estimated[1][keep],
                      unlabeled=unlabeled)
    guarantee = certify_threshold(margins[keep], experts=experts[keep], **promises, **losses)
    config.deferral_guarantee = guarantee.recorded(
        names, expert_costs=costs, available_experts=_described(available_experts, names),
        date=date.today().isoformat()).to_dict()
    return guarantee.threshold


def _described(available_experts: Any, names: list[str]) -> list[str] | str | None:
    """The availability a guarantee holds for: `None` (every expert), the names of the whole call, or "given per
    input" (the pipeline cannot check that one)."""
    if available_experts is None:
        return None
    per_input, mask = parse_available_experts(available_experts, names)
    return PER_INPUT if per_input else [name for name, on in zip(names, mask) if on]


__all__ = ["calibrate_deferral"]
