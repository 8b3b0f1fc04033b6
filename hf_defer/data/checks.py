"""What [`DeferralTrainer`] checks of its datasets before the first step (the model and the checkpoint it resumes from
are checked in `hf_defer.inspection.model_checks`).

Every check reads whole columns at once (Arrow compute or numpy, never a Python loop over rows), so it stays cheap on
big datasets. A streamed `datasets.IterableDataset` is checked on its first examples.
"""

from __future__ import annotations

import itertools
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from transformers.utils import logging

from ..modeling.surrogate_routing import is_route_only

logger = logging.get_logger(__name__)

PEEK_ROWS = 64
"""How many examples of a streamed dataset are checked (its first ones)."""

def _rows(mask: Any) -> list[int]:
    return np.flatnonzero(np.asarray(mask))[:5].tolist()


def _list_column(dataset: datasets.Dataset, column: str, name: str) -> tuple[pa.ChunkedArray, pa.ChunkedArray | None]:
    """The column as Arrow, and for a column of lists the per-row lengths (else `None`); nested lists are refused."""
    array = dataset.data.column(column)
    indices = getattr(dataset, "_indices", None)  # after select/shuffle/split: one vectorised take, not row by row
    if indices is not None:
        array = pc.take(array, indices.column(0))
    kind = array.type
    if not (pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind)):
        return array, None
    if pa.types.is_nested(kind.value_type):
        raise ValueError(f"{name}: column '{column}' must hold one flat list per row, got nested lists ({kind}).")
    return pc.list_flatten(array), pc.list_value_length(array)


def _integer_column(dataset: datasets.Dataset, column: str, name: str, numbers: bool = False) -> np.ndarray:
    """An integer column (one int, or one list of ints of the same length, per row) as an array [N] or [N, width];
    with ``numbers``, a column of numbers (floats, ints or bools: `expert_correct`)."""
    values, lengths = _list_column(dataset, column, name)
    if values.null_count or (lengths is not None and lengths.null_count):
        missing = pc.is_null(values if lengths is None else lengths).to_numpy(zero_copy_only=False)
        if lengths is not None and not lengths.null_count:  # a None inside the lists: one per row
            missing = missing.reshape(len(dataset), -1).any(axis=1)
        fill = "-100 marks a missing answer" if column in ("expert_labels", "expert_correct") else \
            "-100 marks a row to ignore"
        raise ValueError(f"{name}: column '{column}' has missing values (None), e.g. in rows {_rows(missing)}; "
                         f"fill them ({fill}) or drop those rows.")
    if numbers and (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)
                    or pa.types.is_boolean(values.type)):
        pass
    elif numbers:
        raise ValueError(f"{name}: column '{column}' must hold numbers in [0, 1] (or -100 where there is none), got "
                         f"{values.type} values such as {values.slice(0, 3).to_pylist()}.")
    elif not pa.types.is_integer(values.type):
        sample = values.slice(0, 3).to_pylist()
        hint = (f"; map class names to ids first (hf_defer.prepare_deferral_dataset, or "
                f"dataset.class_encode_column('{column}'))"
                if pa.types.is_string(values.type) or pa.types.is_large_string(values.type) else "")
        raise ValueError(f"{name}: column '{column}' must hold class ids (int), got {values.type} values such as "
                         f"{sample}{hint}.")
    array = values.to_numpy(zero_copy_only=False)
    if lengths is None:
        return array
    low, high = pc.min_max(lengths).values()
    if low.as_py() != high.as_py():
        widths = lengths.to_numpy()
        raise ValueError(f"{name}: column '{column}' must have the same number of entries in every row (one per "
                         f"expert), got rows of {low.as_py()} and of {high.as_py()}, e.g. rows "
                         f"{_rows(widths != widths[0])}.")
    return array.reshape(len(dataset), high.as_py())


def _check_model_inputs(dataset: datasets.Dataset, model: Any, name: str) -> None:
    """The model's input column: present, of the right width, finite features, token ids the encoder takes."""
    columns, config = dataset.column_names, model.config
    if dataset.format.get("type") == "custom":  # with_transform: the inputs are made when rows are read
        return
    if config.encoder is None:
        if "features" not in columns:
            raise ValueError(f"{name} must have a 'features' column for a head-only model; its columns are {columns}.")
        values, lengths = _list_column(dataset, "features", name)
        if lengths is None or not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
            raise ValueError(f"{name}: column 'features' must hold one vector of numbers per row, got {values.type}.")
        if values.null_count or lengths.null_count:
            raise ValueError(f"{name}: column 'features' has missing values (None): drop or impute those rows.")
        widths = lengths.to_numpy()
        if (widths != config.feature_size).any():
            got = widths[widths != config.feature_size][0]
            raise ValueError(f"{name}: column 'features' must have feature_size={config.feature_size} numbers per row, "
                             f"got {got}, e.g. in rows {_rows(widths != config.feature_size)}: compute the features "
                             "with the encoder the model was built for, or set DeferralConfig(feature_size=...).")
        if pa.types.is_floating(values.type) and not pc.all(pc.is_finite(values)).as_py():
            bad = ~pc.is_finite(values).to_numpy(zero_copy_only=False).reshape(len(dataset), -1).all(axis=1)
            raise ValueError(f"{name}: column 'features' holds NaN or infinite values in rows {_rows(bad)}: drop or "
                             "impute those rows (e.g. dataset.filter) before training.")
        return
    main = model.main_input_name
    if main not in columns:
        fix = ("it was not tokenized; tokenize it first, e.g. dataset.map(lambda batch: tokenizer(batch['text'], "
               "truncation=True), batched=True)" if main == "input_ids" else "it was not processed; process the "
               "images first (image processor, e.g. with dataset.with_transform)")
        raise ValueError(f"{name} has no '{main}' column: {fix}; its columns are {columns}.")
    if main != "input_ids":
        return
    values, lengths = _list_column(dataset, "input_ids", name)
    if lengths is None or not pa.types.is_integer(values.type):
        raise ValueError(f"{name}: column 'input_ids' must hold one list of token ids per row, got {values.type}.")
    shortest, longest = (value.as_py() for value in pc.min_max(lengths).values())
    if shortest == 0:
        raise ValueError(f"{name}: column 'input_ids' has empty rows {_rows(lengths.to_numpy() == 0)}: drop them.")
    limit = model.max_input_length
    if limit is not None and longest > limit:
        raise ValueError(f"{name}: column 'input_ids' has rows of up to {longest} tokens, more than the encoder's "
                         f"{limit} positions (rows {_rows(lengths.to_numpy() > limit)}): tokenize with truncation=True, "
                         f"max_length={limit}.")
    vocab = model.input_vocab_size
    low, high = (value.as_py() for value in pc.min_max(values).values())
    if vocab is not None and (low < 0 or high >= vocab):
        raise ValueError(f"{name}: column 'input_ids' holds token ids from {low} to {high}, but the encoder's vocabulary "
                         f"has {vocab} (0 to {vocab - 1}): tokenize with the model's own tokenizer (or "
                         "resize_token_embeddings after adding tokens).")


def _first_rows(dataset: datasets.IterableDataset, name: str) -> datasets.Dataset:
    rows = list(itertools.islice(iter(dataset.with_format(None)), PEEK_ROWS))
    if not rows:
        raise ValueError(f"{name} is empty: it yields no example.")
    try:
        return datasets.Dataset.from_list(rows)
    except (TypeError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowTypeError
        raise ValueError(f"{name}: its first examples do not have the same columns and types ({err}).") from None


def check_deferral_dataset(dataset: Any, model: Any, name: str = "dataset",
                           require_answers: bool = False) -> dict[str, int] | None:
    """Checks that a dataset can train/evaluate ``model`` before any step runs ([`DeferralTrainer`] calls it).

    A `datasets.Dataset` is checked whole; a streamed `datasets.IterableDataset` on its first `PEEK_ROWS` examples;
    other datasets (a torch `Dataset`) are not checked. The experts' targets are ``expert_labels`` (class ids, -100
    where an expert did not answer) or ``expert_correct`` (numbers in [0, 1], -100 where there is none).

    Args:
        dataset, model, name: the data, the deferral model it is for, and how errors call the data.
        require_answers (`bool`, *optional*, defaults to `False`): refuse an expert who answered no labelled row (the
            training split, where such an expert's estimate would learn nothing).

    Returns:
        `dict[str, int]` or `None`: for each expert (by name), how many labelled rows it answered (also logged);
        `None` when the dataset is not checked.

    Raises:
        `ValueError`: naming ``name``, the column and the fix, when ``labels`` (or ``label``) or ``expert_labels`` is
        missing, not integer class ids (strings, None, floats) or ragged; the expert labels do not have
        ``num_experts`` entries per row; a label lies outside ``[0, num_labels)``; every label is -100; the model's
        input column is missing (a text dataset never tokenized), ``features`` have the wrong width or NaN/inf, or
        ``input_ids`` are empty, longer than the encoder's positions or outside its vocabulary; ``expert_correct``
        holds a value outside [0, 1] other than -100 (NaN included), or comes with ``expert_labels``; with
        ``require_answers``, an expert answered no labelled row.

    Example:

    ```python
    >>> from datasets import Dataset
    >>> from hf_defer import DeferralConfig, EncoderForDeferral
    >>> from hf_defer.data.checks import check_deferral_dataset
    >>> model = EncoderForDeferral(DeferralConfig(feature_size=2, num_labels=2))
    >>> data = Dataset.from_dict({"features": [[0.5, float("nan")]], "labels": [1], "expert_labels": [0]})
    >>> check_deferral_dataset(data, model, "train_dataset")
    Traceback (most recent call last):
    ...
    ValueError: train_dataset: column 'features' holds NaN or infinite values in rows [0]: drop or impute those rows (e.g. dataset.filter) before training.

    ```
    """
    if isinstance(dataset, datasets.IterableDataset):
        dataset = _first_rows(dataset, name)
        name = f"{name} (its first {len(dataset)} examples)"
    columns = getattr(dataset, "column_names", None)
    if columns is None or not isinstance(dataset, datasets.Dataset):  # a torch Dataset: nothing cheap to check
        return None
    label_column = "label" if "labels" not in columns and "label" in columns else "labels"  # the collator renames it
    if is_route_only(model):  # no classes: each expert's correctness or score only
        return _check_route_only_dataset(dataset, model, name, columns, label_column)
    if "expert_correct" in columns and "expert_labels" in columns:
        raise ValueError(f"{name} has both 'expert_labels' and 'expert_correct': keep one (the experts' answers, or "
                         "whether each was right / its score).")
    targets = "expert_correct" if "expert_correct" in columns else "expert_labels"
    for column in (label_column, targets):
        if column not in columns:
            hint = (" (map your annotator columns with hf_defer.prepare_deferral_dataset(..., expert_columns=[...]), "
                    "or simulate an expert with hf_defer.experts)") if column == "expert_labels" else ""
            raise ValueError(f"{name} must have a '{column}' column{hint}; its columns are {columns}.")
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty.")
    config = model.config
    labels = _integer_column(dataset, label_column, name)
    if labels.ndim != 1:  # a list per row (a 0-d array stored by Arrow as [y]): the collator takes one int per row
        raise ValueError(f"{name}: column '{label_column}' must hold one class id (int) per row, got lists of "
                         f"{labels.shape[1]}; flatten it first (e.g. dataset.map(lambda row: "
                         f"{{'{label_column}': row['{label_column}'][0]}}) for lists of one).")
    given = _integer_column(dataset, targets, name, numbers=targets == "expert_correct")
    if config.num_experts > 1 and (given.ndim != 2 or given.shape[1] != config.num_experts):
        width = given.shape[1] if given.ndim == 2 else 1
        raise ValueError(f"{name}: {targets} must have num_experts={config.num_experts} entries per row, got {width}.")
    try:
        _, _, observed, valid = model.surrogate.check_expert_targets(
            torch.tensor(labels), **{targets: torch.tensor(given.astype(np.float32) if targets == "expert_correct"
                                                           else given)})
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from error
    if (labels == -100).all():
        raise ValueError(f"{name}: every '{label_column}' is -100 (ignored): there is no example to train or evaluate "
                         "on; give it rows with class ids.")
    answered = dict(zip(config.expert_names, (observed & valid[:, None]).sum(dim=0).tolist()))
    silent = [expert for expert, count in answered.items() if count == 0]
    if silent and require_answers:
        raise ValueError(f"{name}: expert(s) {silent} answered none of the {int(valid.sum())} labelled rows ({targets} "
                         "is -100 on all of them): nothing can teach the model their accuracy; give them answers or "
                         "leave them out of expert_columns / num_experts.")
    if any(count < int(valid.sum()) for count in answered.values()):
        logger.info(f"{name}: labelled rows answered per expert (of {int(valid.sum())}): {answered}")
    _check_model_inputs(dataset, model, name)
    return answered


def _check_route_only_dataset(dataset: datasets.Dataset, model: Any, name: str, columns: list[str],
                              label_column: str) -> dict[str, int]:
    """[`check_deferral_dataset`] for a route-only model: an ``expert_correct`` column ``[N, M]`` in [0, 1] (-100:
    missing) and no class labels or answers, which it cannot use."""
    unusable = [column for column in (label_column, "expert_labels") if column in columns]
    if unusable:
        raise ValueError(f"{name} has {unusable}: a route-only model has no class head and cannot use class labels or "
                         "the experts' answers; give each expert's correctness or score as 'expert_correct'.")
    if "expert_correct" not in columns:
        raise ValueError(f"{name} must have an 'expert_correct' column (each expert's correctness or score) for a "
                         f"route-only model; its columns are {columns}.")
    if len(dataset) == 0:
        raise ValueError(f"{name} is empty.")
    given = _integer_column(dataset, "expert_correct", name, numbers=True)
    try:
        _, _, observed, _ = model.surrogate.check_expert_targets(
            expert_correct=torch.tensor(given.astype(np.float32)), batch_size=len(dataset))
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from error
    _check_model_inputs(dataset, model, name)
    return dict(zip(model.config.expert_names, observed.sum(dim=0).tolist()))


__all__ = ["PEEK_ROWS", "check_deferral_dataset"]
