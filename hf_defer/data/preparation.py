"""Turn a user's dataset (a label column, expert columns, text or images) into what [`DeferralTrainer`] takes.

[`prepare_deferral_dataset`] maps string labels and `ClassLabel` columns through one `label2id`, maps every expert
column through the same one, handles missing annotations, tokenizes text (or attaches an image processor) and
returns the class and expert names that `DeferralConfig` / `EncoderForDeferral.from_encoder_pretrained` take, so that
pipelines, model cards and metrics speak the data's names rather than `LABEL_0` and `expert_0`.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from ..modeling.side_features import (
    check_side_features,
    is_missing_side_value,
    side_feature_specs,
    side_feature_tensors,
    side_feature_value,
)
from ..modeling.surrogate_base import IGNORE_INDEX
from .labels import LabelMap as _LabelMap  # the label rules live there, stated once
from .labels import class_names as _class_names
from .labels import training_split as _training_split
from .labels import is_missing
from ..modeling.validators import is_number
from ..modeling.validators import MISSING_EXPERT_MODES  # defined with the other shared rules; re-exported

__all__ = ["MISSING_EXPERT_MODES", "PreparedDeferralData", "check_side_feature_columns", "prepare_deferral_dataset"]

logger = logging.getLogger(__name__)

@dataclass
class PreparedDeferralData:
    """What [`prepare_deferral_dataset`] returns.

    Args:
        dataset (`datasets.Dataset` or `datasets.DatasetDict`): columns `labels` (class ids), `expert_labels` (an id
            per row for one expert, a list of M ids for M experts) and the model inputs (`input_ids`, ... after a
            tokenizer; `text` / `text_pair` / `image` as given).
        id2label (`dict[int, str]`): the class names, by class id.
        expert_names (`list[str]`): one name per expert, in the order of `expert_labels`.
        route_only (`bool`, *optional*, defaults to `False`): data for a route-only model (no label column: no class,
            only `expert_correct`).
        side_features (`list[dict]`, *optional*): the `DeferralConfig.side_features` of the side-feature columns
            (their categories, or the training split's mean and standard deviation), when some were given; the
            dataset then carries them as `side_categorical` / `side_numeric`.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer import DeferralConfig, PreparedDeferralData, prepare_deferral_dataset
    >>> ds = datasets.Dataset.from_dict({"features": [[0.1, 0.2], [0.3, 0.4]], "label": ["pos", "neg"],
    ...                                  "alice": ["pos", "pos"]})
    >>> prepared = prepare_deferral_dataset(ds, "label", ["alice"])
    >>> isinstance(prepared, PreparedDeferralData), prepared.num_labels, prepared.num_experts
    (True, 2, 1)
    >>> DeferralConfig(feature_size=2, **prepared.model_kwargs()).expert_names
    ['alice']

    ```
    """

    dataset: datasets.Dataset | datasets.DatasetDict
    id2label: dict[int, str]
    expert_names: list[str]
    route_only: bool = False
    side_features: list[dict[str, Any]] | None = None

    @property
    def label2id(self) -> dict[str, int]:
        return {name: index for index, name in self.id2label.items()}

    @property
    def num_labels(self) -> int:
        return len(self.id2label)

    @property
    def num_experts(self) -> int:
        return len(self.expert_names)

    def model_kwargs(self) -> dict[str, Any]:
        """`num_labels`, `num_experts`, `id2label` and `expert_names`, for `DeferralConfig(...)` or
        `EncoderForDeferral.from_encoder_pretrained(...)`; for route-only data `route_only=True`, `num_experts` and
        `expert_names` (no class head, so no `num_labels` nor `id2label`); with side features, `side_features`."""
        side = {} if self.side_features is None else {"side_features": [dict(s) for s in self.side_features]}
        if self.route_only:
            return {"route_only": True, "num_experts": self.num_experts, "expert_names": list(self.expert_names),
                    **side}
        return {"num_labels": self.num_labels, "num_experts": self.num_experts, "id2label": dict(self.id2label),
                "expert_names": list(self.expert_names), **side}


class _ImageTransform:
    """`with_transform` function: images to `pixel_values` with an image processor, when rows are read."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        out = {key: value for key, value in batch.items() if key != "image"}
        images = [image.convert("RGB") for image in batch["image"]]
        out["pixel_values"] = list(self.processor(images=images, return_tensors="np")["pixel_values"])
        return out


def _check_string_column(split: datasets.Dataset, column: str, where: str) -> None:
    feature = split.features[column]
    if not (isinstance(feature, datasets.Value) and feature.dtype in ("string", "large_string")):
        raise ValueError(f"text column {column!r}{where} must hold text (strings), got the feature {feature}.")
    values = split[column][:]
    bad = [row for row, value in enumerate(values) if not isinstance(value, str)]
    if bad:
        raise ValueError(f"text column {column!r}{where} must hold a string in every row; rows {bad[:5]} have none.")


def _expert_answers(split: datasets.Dataset, experts: list[str], label_map: _LabelMap,
                    split_name: Any) -> tuple[np.ndarray, list[str], list[str]]:
    """The class ids `[N, M]` of the experts' answers (-1: missing), the expert names and each expert's column."""
    where = _where(split_name)
    blocks, names_here, sources = [], [], []
    for column in experts:
        feature, values = split.features[column], split[column][:]
        if isinstance(feature, (datasets.List, datasets.LargeList, list)):
            inner = feature.feature if hasattr(feature, "feature") else feature[0]
            widths = sorted({len(value) for value in values if value is not None})
            if len(widths) > 1 or any(value is None for value in values):
                raise ValueError(
                    f"expert column {column!r}{where} holds lists of different lengths {widths}: each row needs "
                    "one answer per expert (None or -1 where an expert did not answer)."
                )
            width = widths[0] if widths else 0
            flat = [item for value in values for item in value]
            ids = label_map.ids(flat, inner, column, split_name, False).reshape(len(values), width)
            blocks.append(ids)
            names_here += [f"{column}_{j}" for j in range(width)]
            sources += [column] * width
        else:
            blocks.append(label_map.ids(values, feature, column, split_name, False)[:, None])
            names_here.append(column)
            sources.append(column)
    return np.concatenate(blocks, axis=1), names_here, sources


def _expert_scores(split: datasets.Dataset, columns: list[str], split_name: Any) -> np.ndarray:
    """The experts' correctness or scores `[N, M]` as float64 in [0, 1], NaN where missing; anything else (a string, a
    number outside [0, 1]) is an error naming the column, the row and the value."""
    where = _where(split_name)
    out = np.full((len(split), len(columns)), np.nan)
    for j, column in enumerate(columns):
        if isinstance(split.features[column], (datasets.List, datasets.LargeList, list)):
            raise ValueError(f"expert correctness column {column!r}{where} holds lists: give one column per expert.")
        for row, value in enumerate(split[column][:]):
            if is_missing(value):
                continue
            if isinstance(value, (bool, np.bool_)) or (isinstance(value, numbers.Real) and 0 <= value <= 1):
                out[row, j] = float(value)
            else:
                raise ValueError(
                    f"expert correctness column {column!r}{where}, row {row}: {value!r} is neither a boolean nor a "
                    "number in [0, 1] (1 or True: the expert was right, 0 or False: wrong, or a score such as a "
                    "judge's grade); None, NaN, -1 or '' mark a missing answer.")
    return out


def _as_number(value: Any) -> float | None:
    """`value` as a float when it is a real number (not a bool) or a string holding one, else None."""
    if isinstance(value, (bool, np.bool_)):
        return None
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return None
    return None


def check_side_feature_columns(split: datasets.Dataset, side_features: Sequence[Any],
                                 categorical: Sequence[str] = (), where: str = "") -> dict[str, list[Any]]:
    """The values of the side-feature columns of `split` (name -> values), checked: every column present, no value
    missing (`is_missing_side_value`: `None`, NaN, a blank string), none a list or dict, and, for a numeric side feature (a spec of a model's
    `config.side_features`), every value a finite number. With column names (no specs yet), a column of text whose
    values are mostly numbers is refused too (a stray word in a column of numbers would make every number a category),
    unless it is named in `categorical`. Each `ValueError` names the column, the row and the value.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.data.preparation import check_side_feature_columns
    >>> table = datasets.Dataset.from_dict({"subject": ["law", "math"], "length": ["12", "long"]})
    >>> check_side_feature_columns(table, ["subject"])
    {'subject': ['law', 'math']}
    >>> check_side_feature_columns(table, [{"name": "length", "kind": "numeric", "mean": 0.0, "std": 1.0}])
    Traceback (most recent call last):
    ...
    ValueError: side feature column 'length', row 1: the model reads 'length' as a number, got 'long' (1 such row(s)).

    ```
    """
    names = [spec["name"] if isinstance(spec, Mapping) else spec for spec in side_features]
    missing = [name for name in names if name not in split.column_names]
    if missing:
        raise ValueError(f"side feature column(s) {missing} not found in the dataset{where}; its columns are "
                         f"{split.column_names}.")
    out = {}
    for name, spec in zip(names, side_features):
        if isinstance(split.features[name], (datasets.List, datasets.LargeList, list, dict)):
            raise ValueError(f"side feature column {name!r}{where} holds lists or dicts: give one value per row "
                             "(a number, or a category such as a subject).")
        values = split[name][:]
        absent = [row for row, value in enumerate(values) if is_missing_side_value(value)]
        if absent:
            raise ValueError(f"side feature column {name!r}{where}, row {absent[0]}: the value is missing (None, NaN or "
                             f"empty) in {len(absent)} row(s); fill them in (e.g. 'unknown' for a category, 0 for a "
                             "number) or remove the rows.")
        numeric_spec = isinstance(spec, Mapping) and spec.get("kind") == "numeric"
        for row, value in enumerate(values):  # one value per row: a list or dict inside a column of objects
            if not numeric_spec:
                try:
                    side_feature_value({"name": name, "kind": "categorical"}, value)
                except ValueError as error:
                    if isinstance(value, (str, bool)) or is_number(value):
                        continue  # an infinite number: named below, with the other numbers
                    raise ValueError(f"side feature column {name!r}{where}, row {row}: {error}.") from None
        as_numbers = [_as_number(value) for value in values]
        if numeric_spec:
            bad = [row for row, number in enumerate(as_numbers) if number is None or not math.isfinite(number)] or \
                [row for row, value in enumerate(values) if isinstance(value, str)]  # then numbers written as text
            if bad:
                raise ValueError(f"side feature column {name!r}{where}, row {bad[0]}: the model reads {name!r} as a "
                                 f"number, got {values[bad[0]]!r:.40} ({len(bad)} such row(s)).")
        elif not isinstance(spec, Mapping):
            texts = [row for row, value in enumerate(values) if isinstance(value, str)]
            words = [row for row in texts if as_numbers[row] is None]
            if name not in categorical and texts and len(words) < len(values) / 2:
                raise ValueError(
                    f"side feature column {name!r}{where} holds mostly numbers but row {words[0] if words else texts[0]}"
                    f" holds {values[words[0] if words else texts[0]]!r:.40} ({len(words) or len(texts)} such row(s)): "
                    "a column of numbers needs a number in every row; to treat each value as a category instead, "
                    "name the column among the categorical side features (--categorical_side_feature_columns)."
                    if words else
                    f"side feature column {name!r}{where} holds numbers written as text (row {texts[0]}: "
                    f"{values[texts[0]]!r:.40}): write them as numbers, or name the column among the categorical side "
                    "features (--categorical_side_feature_columns) to treat each value as a category.")
            infinite = [row for row, value in enumerate(values) if isinstance(value, numbers.Real)
                        and not isinstance(value, (bool, np.bool_)) and not math.isfinite(float(value))]
            if infinite:
                raise ValueError(f"side feature column {name!r}{where}, row {infinite[0]}: {values[infinite[0]]!r} is "
                                 "not a finite number.")
        out[name] = values
    return out


def prepare_deferral_dataset(
    dataset: datasets.Dataset | datasets.DatasetDict, label_column: str | None = "label",
    expert_columns: str | Sequence[str] | None = (), *, text_column: str | None = None,
    text_pair_column: str | None = None, image_column: str | None = None, processor: Any = None,
    max_length: int | None = None, label_names: Sequence[str] | None = None, missing_expert: str = "error",
    expert_correct_columns: str | Sequence[str] = (),
    side_feature_columns: str | Sequence[str] | Sequence[Mapping[str, Any]] = (),
    categorical_side_features: Sequence[str] = (), side_feature_dim: int = 8,
) -> PreparedDeferralData:
    """Prepares any dataset with a label column and one or more expert columns for [`DeferralTrainer`].

    * Labels (the rules of [`hf_defer.data.labels`], one for every split and column): the classes are `label_names`
      (a list, or a model's `config.id2label` to prepare data for that model), else the label column's `ClassLabel`
      names, else the distinct labels of the training split (`"train"`, else the first): strings in sorted order,
      integers in increasing order named by their digits (labels `1..5` give classes `"1"..."5"`, ids 0..4). Strings
      are compared stripped (`"pos "` is `"pos"`); names differing only in case, and a class named `"defer"`, are
      refused. `None`, NaN, `-1`, `"-1"` and `""` mark a missing value, never a class; `-100` marks an ignored row.
      A label of another split that is no class, or integer labels in one split and strings in another, is an error
      naming the split, the column, the row and the value.
    * Experts: every expert column is mapped through the same `label2id` (names, `ClassLabel` ids or class ids);
      a value outside the class set is an error naming the column, the row and the value. A list-valued column
      holds several experts (the same number in every row). A missing annotation (`None`, NaN, `-1`, `"-1"` or `""`)
      is an error with `missing_expert="error"`; with `"drop"` its row is dropped and the count logged per split;
      with `"mask"` the row stays, with -100 for that expert: its terms leave the loss (the classifier's and the
      other experts' stay, also when nobody answered), and in evaluation it is not available on that row.
    * Experts judged by correctness or a score: each of `expert_correct_columns` is one more expert, given not as
      an answer but as its target, a boolean (was it right) or a number in [0, 1] (a judge's grade, a pass rate);
      missing as above (NaN is missing, as in every column), anything else is an error. Then the dataset carries
      `expert_correct` (floats, one per expert, answers turned into 1.0 / 0.0 against the label, -100 where missing)
      in place of `expert_labels`.
    * Route-only data (`label_column=None`: no class to predict, only which model to call): at least two
      `expert_correct_columns` and no `expert_columns` (an answer cannot be scored without a label) nor `label_names`.
      The dataset carries `expert_correct` and the inputs, no `labels`; `.model_kwargs()` gives `route_only=True`,
      `num_experts` and `expert_names` for a route-only model (`EncoderForRouting`, its config
      `DeferralConfig(route_only=True, ...)`).
    * Inputs: `text_column` (and `text_pair_column`) become `text` (and `text_pair`) and, with a tokenizer as
      `processor`, are tokenized (`truncation=True`, `max_length`). `image_column` becomes `image`; with an image
      processor it is turned into `pixel_values` when rows are read (`with_transform`: train such a split with
      `TrainingArguments(remove_unused_columns=False)`). Other columns are dropped.
    * Side features (`side_feature_columns`: what a router knows beside the text, such as the subject or the prompt's
      length): a column of numbers is a numeric feature (standardised in the model by the training split's mean and
      standard deviation), any other column, and those named in `categorical_side_features`, a categorical one (its
      distinct values in the training split are the categories, embedded `side_feature_dim` wide; a value not among
      them gets the "unseen" row). Give a model's `config.side_features` (dicts) instead of names to prepare data for
      that model. The dataset carries `side_categorical` (category ids, 0 for unseen) and `side_numeric` (the raw
      numbers) and `.model_kwargs()` gives `side_features` for the config. A missing value (`None`, NaN, blank), a
      column of numbers with a word in it, or a non-number where the model reads a number is an error naming the
      column and the row.

    Every check runs before anything is tokenized, so errors come before any model is loaded.

    Args:
        dataset (`datasets.Dataset` or `datasets.DatasetDict`): the data; all splits are prepared alike.
        label_column (`str`, *optional*, defaults to `"label"`): the true class; `None` for route-only data.
        expert_columns (`str` or `list[str]`): the experts' answers, one column per expert (or a list column).
        text_column / text_pair_column / image_column (`str`, *optional*): the model's input.
        processor (*optional*): a tokenizer for text, an image processor for images.
        max_length (`int`, *optional*): the tokenizer's truncation length.
        label_names (`list[str]` or `dict`, *optional*): the class names in class-id order, or a model's
            `config.id2label` (`{id: name}`) or `label2id`: the classes of a model to prepare an evaluation split for.
        missing_expert (`str`, *optional*, defaults to `"error"`): `"error"`, `"drop"` or `"mask"`.
        expert_correct_columns (`str` or `list[str]`, *optional*): experts given as correctness or scores.
        side_feature_columns (`str`, `list[str]` or `list[dict]`, *optional*): the side-feature columns, or a model's
            `config.side_features`.
        categorical_side_features (`list[str]`, *optional*): side-feature columns of numbers to treat as categories
            (a tier 1/2/3).
        side_feature_dim (`int`, *optional*, defaults to 8): the embedding width of each categorical side feature.

    Returns:
        [`PreparedDeferralData`]: `.dataset` (same type as `dataset`), `.id2label`, `.expert_names`, and
        `.model_kwargs()` for the model.

    Raises:
        `ValueError`: a missing column, a label or expert answer outside the class set, a missing annotation (with
            `missing_expert="error"`), a text column that is not text, an image column that is not images, expert lists
            of different lengths, or a split whose labels are all ignored.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer import prepare_deferral_dataset
    >>> ds = datasets.Dataset.from_dict({"text": ["great", "awful", "fine"], "label": ["pos", "neg", "pos"],
    ...                                  "alice": ["pos", "neg", None], "bob": ["neg", "neg", "pos"]})
    >>> prepared = prepare_deferral_dataset(ds, "label", ["alice", "bob"], text_column="text", missing_expert="drop")
    >>> prepared.id2label, prepared.expert_names, prepared.dataset["expert_labels"][:]
    ({0: 'neg', 1: 'pos'}, ['alice', 'bob'], [[1, 0], [0, 0]])
    >>> routes = datasets.Dataset.from_dict({"prompt": ["2 + 2?", "Prove it."], "small": [True, False],
    ...                                      "large": [True, True]})
    >>> prepared = prepare_deferral_dataset(routes, None, expert_correct_columns=["small", "large"],
    ...                                     text_column="prompt")
    >>> prepared.model_kwargs(), prepared.dataset["expert_correct"][:]
    ({'route_only': True, 'num_experts': 2, 'expert_names': ['small', 'large']}, [[1.0, 1.0], [0.0, 1.0]])
    >>> routes = routes.add_column("subject", ["math", "logic"]).add_column("length", [6, 9])
    >>> prepared = prepare_deferral_dataset(routes, None, expert_correct_columns=["small", "large"],
    ...                                     text_column="prompt", side_feature_columns=["subject", "length"])
    >>> [(spec["name"], spec["kind"]) for spec in prepared.side_features]
    [('subject', 'categorical'), ('length', 'numeric')]
    >>> prepared.dataset["side_categorical"][:], prepared.dataset["side_numeric"][:]
    ([[2], [1]], [[6.0], [9.0]])

    ```
    """
    splits = _dataset_splits(dataset)
    request = _checked_request(label_column, expert_columns, expert_correct_columns, label_names, missing_expert,
                               text_column, text_pair_column, image_column, processor, max_length,
                               side_feature_columns, categorical_side_features, side_feature_dim)
    side_values, side_specs = _side_feature_values(splits, request)
    _check_split_columns(splits, request)
    names, label_map = _classes(splits, request, label_names)
    result, expert_names = _prepare_splits(splits, request, names, label_map, side_specs, side_values)
    return PreparedDeferralData(result, dict(enumerate(names)), expert_names, route_only=request.route_only,
                                side_features=side_specs)


@dataclass
class _Request:
    """The checked arguments of [`prepare_deferral_dataset`], read by each of its steps."""

    label_column: str | None
    experts: list[str]
    judged: list[str]
    text_column: str | None
    text_pair_column: str | None
    image_column: str | None
    processor: Any
    max_length: int | None
    missing_expert: str
    side_given: list[Any]
    given_specs: bool
    categorical_side_features: Sequence[str]
    side_feature_dim: int

    @property
    def route_only(self) -> bool:
        """Route-only data: no label column, only which expert to call."""
        return self.label_column is None

    @property
    def inputs(self) -> dict[str, str]:
        """The input columns given, each with the name it takes (`text`, `text_pair`, `image`)."""
        return {name: renamed for name, renamed in ((self.text_column, "text"), (self.text_pair_column, "text_pair"),
                                                    (self.image_column, "image")) if name is not None}


def _where(split_name: Any) -> str:
    """Where a split is, for an error message: `" of split 'train'"`, or nothing for a lone `Dataset`."""
    return "" if split_name is None else f" of split {split_name!r}"


def _dataset_splits(dataset: Any) -> dict[Any, datasets.Dataset]:
    """The splits of `dataset` by name (`None` for a lone `Dataset`); anything else, or no split, is an error."""
    if isinstance(dataset, datasets.DatasetDict):
        splits: dict[Any, datasets.Dataset] = dict(dataset)
    elif isinstance(dataset, datasets.Dataset):
        splits = {None: dataset}
    else:
        raise ValueError(f"dataset must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}.")
    if not splits:
        raise ValueError("dataset is an empty DatasetDict: it has no split.")
    return splits


def _checked_request(label_column: str | None, expert_columns: str | Sequence[str] | None,
                     expert_correct_columns: str | Sequence[str], label_names: Any, missing_expert: str,
                     text_column: str | None, text_pair_column: str | None, image_column: str | None,
                     processor: Any, max_length: int | None,
                     side_feature_columns: str | Sequence[str] | Sequence[Mapping[str, Any]],
                     categorical_side_features: Sequence[str], side_feature_dim: int) -> _Request:
    """The arguments checked among themselves (before any split is read): experts, inputs, then side features."""
    experts, judged = _checked_experts(label_column, expert_columns, expert_correct_columns, label_names)
    if missing_expert not in MISSING_EXPERT_MODES:
        raise ValueError(f"missing_expert must be one of {MISSING_EXPERT_MODES}, got {missing_expert!r}.")
    _check_inputs(text_column, text_pair_column, image_column, processor)
    inputs = [name for name in (text_column, text_pair_column, image_column) if name is not None]
    side_given, given_specs = _checked_side_features(side_feature_columns, categorical_side_features,
                                                     side_feature_dim, [label_column, *experts, *judged, *inputs])
    return _Request(label_column, experts, judged, text_column, text_pair_column, image_column, processor,
                    max_length, missing_expert, side_given, given_specs, categorical_side_features, side_feature_dim)


def _checked_experts(label_column: str | None, expert_columns: str | Sequence[str] | None,
                     expert_correct_columns: str | Sequence[str], label_names: Any) -> tuple[list[str], list[str]]:
    """The expert columns (answers) and the judged ones (correctness or scores), checked against the label column."""
    if expert_columns is None:
        expert_columns = ()
    if isinstance(expert_columns, str):
        expert_columns = [expert_columns]
    if isinstance(expert_correct_columns, str):
        expert_correct_columns = [expert_correct_columns]
    experts, judged = list(expert_columns), list(expert_correct_columns)
    if not experts + judged or not all(isinstance(name, str) and name for name in experts + judged):
        raise ValueError(
            f"expert_columns must name at least one column with the experts' answers (or expert_correct_columns one "
            f"with their correctness), got {expert_columns!r} and {expert_correct_columns!r} "
            "(no expert column? simulate one with hf_defer.experts.class_subset_expert / annotator_expert)."
        )
    if label_column is None and (experts or label_names is not None or len(judged) < 2):
        raise ValueError(
            "label_column=None prepares route-only data (no class, only which expert to call): it needs at least two "
            "expert_correct_columns (each expert's correctness or score) and no expert_columns or label_names (an "
            f"answer cannot be scored without a label); got expert_columns={experts!r}, expert_correct_columns="
            f"{judged!r}, label_names={label_names!r}. Give label_column to train a classifier that defers.")
    if label_column is not None and not isinstance(label_column, str):
        raise ValueError(f"label_column must be a column name (or None for route-only data), got {label_column!r}.")
    if len(set(experts + judged)) != len(experts + judged) or label_column in experts + judged:
        raise ValueError(f"expert_columns {experts} and expert_correct_columns {judged} must be distinct and differ "
                         f"from label_column {label_column!r}.")
    return experts, judged


def _check_inputs(text_column: str | None, text_pair_column: str | None, image_column: str | None,
                  processor: Any) -> None:
    """Checks that the input columns and the processor go together (text with a tokenizer, images with the other)."""
    if text_column is not None and image_column is not None:
        raise ValueError(f"give text_column or image_column, not both (got {text_column!r} and {image_column!r}).")
    if text_pair_column is not None and text_column is None:
        raise ValueError(f"text_pair_column={text_pair_column!r} needs text_column.")
    is_tokenizer = isinstance(processor, PreTrainedTokenizerBase)
    if processor is not None and (is_tokenizer and text_column is None or not is_tokenizer and image_column is None):
        raise ValueError(
            f"processor {type(processor).__name__} needs {'text_column' if is_tokenizer else 'image_column'}: a "
            "tokenizer goes with a text column, an image processor with an image column."
        )


def _checked_side_features(side_feature_columns: str | Sequence[str] | Sequence[Mapping[str, Any]],
                           categorical_side_features: Sequence[str], side_feature_dim: int,
                           other_columns: list[Any]) -> tuple[list[Any], bool]:
    """The side features given (column names, or a model's specs, checked) and whether they are specs."""
    if isinstance(side_feature_columns, str):
        side_feature_columns = [side_feature_columns]
    side_given = list(side_feature_columns or ())
    given_specs = bool(side_given) and all(isinstance(item, Mapping) for item in side_given)
    if given_specs:
        side_given = check_side_features(side_given)
    elif not all(isinstance(item, str) and item for item in side_given):
        raise ValueError(f"side_feature_columns must be column names or a model's config.side_features (dicts), got "
                         f"{side_feature_columns!r:.120}.")
    side_names = [item["name"] if given_specs else item for item in side_given]
    if len(set(side_names)) != len(side_names):
        raise ValueError(f"side_feature_columns {side_names} name a column twice.")
    taken = [name for name in side_names if name in other_columns]
    if taken:
        raise ValueError(f"side_feature_columns {taken} are also the label, an expert or the input column: a side "
                         "feature is a column of its own.")
    unknown = [name for name in categorical_side_features if name not in side_names]
    if unknown or (categorical_side_features and given_specs):
        raise ValueError(f"categorical_side_features {list(categorical_side_features)} must be among the "
                         f"side_feature_columns {side_names} (and are given by the specs when those are a model's).")
    if isinstance(side_feature_dim, bool) or not isinstance(side_feature_dim, int) or side_feature_dim < 1:
        raise ValueError(f"side_feature_dim must be a positive integer, got {side_feature_dim!r}.")
    return side_given, given_specs


def _side_feature_values(splits: dict[Any, datasets.Dataset],
                         request: _Request) -> tuple[dict[Any, dict[str, list[Any]]], list[dict[str, Any]] | None]:
    """Each split's side-feature values (checked) and the specs: the model's, or learnt from the training split."""
    side_values: dict[Any, dict[str, list[Any]]] = {}
    for split_name, split in splits.items():
        side_values[split_name] = check_side_feature_columns(
            split, request.side_given, request.categorical_side_features, _where(split_name)) \
            if request.side_given else {}
    if not request.side_given:
        return side_values, None
    side_specs = request.side_given if request.given_specs else side_feature_specs(
        side_values[_training_split(splits)], dim=request.side_feature_dim,
        categorical=request.categorical_side_features)
    for split_name, split in splits.items():  # a numeric feature must be a number in every split
        check_side_feature_columns(split, [spec for spec in side_specs if spec["kind"] == "numeric"], (),
                                   _where(split_name))
    return side_values, side_specs


def _check_split_columns(splits: dict[Any, datasets.Dataset], request: _Request) -> None:
    """Checks that every split has the columns named, text in the text columns and images in the image column."""
    for split_name, split in splits.items():
        where = _where(split_name)
        for role, names in (("label_column", [] if request.route_only else [request.label_column]),
                            ("expert_columns", request.experts), ("expert_correct_columns", request.judged),
                            ("text/image column", list(request.inputs))):
            missing = [name for name in names if name not in split.column_names]
            if missing:
                raise ValueError(f"{role} {missing} not found in the dataset{where}; its columns are "
                                 f"{split.column_names}.")
        if request.text_column is not None:
            _check_string_column(split, request.text_column, where)
        if request.text_pair_column is not None:
            _check_string_column(split, request.text_pair_column, where)
        image_column = request.image_column
        if image_column is not None and not isinstance(split.features[image_column], datasets.Image):
            raise ValueError(
                f"image column {image_column!r}{where} must hold images (datasets.Image), got "
                f"{split.features[image_column]}."
            )


def _classes(splits: dict[Any, datasets.Dataset], request: _Request,
             label_names: Any) -> tuple[list[str], _LabelMap | None]:
    """The class names and the label map every split's labels and answers go through (none for route-only data)."""
    if request.route_only:
        clash = [name for name in request.judged
                 if name in (request.text_column, request.text_pair_column, request.image_column)]
        if clash:
            raise ValueError(f"expert_correct_columns {clash} are also the input column: name different columns.")
        return [], None
    first = splits[_training_split(splits)]  # its label column's feature: how integer answers read
    names = _class_names(splits, request.label_column, label_names)
    return names, _LabelMap(names, first.features[request.label_column], declared=label_names is not None)


def _prepare_splits(splits: dict[Any, datasets.Dataset], request: _Request, names: list[str],
                    label_map: _LabelMap | None, side_specs: list[dict[str, Any]] | None,
                    side_values: dict[Any, dict[str, list[Any]]]) -> tuple[Any, list[str]]:
    """Every split prepared (a `Dataset` for a lone one, else a `DatasetDict`) and the expert names they share."""
    prepared: dict[Any, datasets.Dataset] = {}
    expert_names: list[str] | None = None
    for split_name, split in splits.items():
        prepared[split_name], expert_names = _prepare_split(split, split_name, request, names, label_map, expert_names,
                                                            side_specs, side_values[split_name])
    result = prepared[None] if None in prepared else datasets.DatasetDict(prepared)
    return result, list(expert_names or [])


def _prepare_split(split: datasets.Dataset, split_name: Any, request: _Request, names: list[str],
                   label_map: _LabelMap | None, expected_experts: list[str] | None,
                   side_specs: list[dict[str, Any]] | None,
                   side_values: dict[str, list[Any]]) -> tuple[datasets.Dataset, list[str]]:
    """One split prepared (labels, expert targets, side features; rows missing an answer dropped; inputs
    processed), and its expert names."""
    where = _where(split_name)
    labels = _split_labels(split, split_name, request, label_map)
    expert_ids, scores, expert_names, sources = _split_experts(split, split_name, request, label_map,
                                                               expected_experts)
    missing = _rows_missing_expert(expert_ids, scores, expert_names, sources, request.missing_expert, where)
    expert_ids = np.where(expert_ids == -1, IGNORE_INDEX, expert_ids)
    # The label column is kept until the new columns are in: a table without columns has no rows (route-only data:
    # the first correctness column holds the rows' place).
    kept = request.judged[0] if request.route_only else request.label_column
    out = split.select_columns([*request.inputs, kept]).rename_columns({**request.inputs, kept: "_raw_label"})
    out = _add_targets(out, labels, names, expert_ids, scores, request)
    if side_specs:
        out = _add_side_features(out, side_specs, side_values)
    out = _drop_rows(out.remove_columns("_raw_label"), missing, where)
    return _attach_processor(out, request), expert_names


def _split_labels(split: datasets.Dataset, split_name: Any, request: _Request,
                  label_map: _LabelMap | None) -> np.ndarray:
    """A split's class ids (-100: an ignored row; all -100 for route-only data); a missing label is an error."""
    if request.route_only or label_map is None:
        return np.full(len(split), IGNORE_INDEX, dtype=np.int64)
    label_column, where = request.label_column, _where(split_name)
    labels = label_map.ids(split[label_column][:], split.features[label_column], label_column, split_name, True)
    if (labels == -1).any():
        rows = np.flatnonzero(labels == -1)[:5].tolist()
        raise ValueError(f"label column {label_column!r}{where} has no label in rows {rows} (None, NaN, -1, '-1' "
                         "and '' mark a missing label; classes numbered -1, 0, 1 need names first).")
    if len(labels) and (labels == IGNORE_INDEX).all():
        raise ValueError(f"every label of label column {label_column!r}{where} is {IGNORE_INDEX} (ignored).")
    return labels


def _split_experts(split: datasets.Dataset, split_name: Any, request: _Request, label_map: _LabelMap | None,
                   expected: list[str] | None) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """A split's expert answers (class ids, -1: missing), judged experts' scores (NaN: missing), the expert names
    (the same as the first split's) and each expert's column."""
    if request.experts and label_map is not None:
        expert_ids, names_here, sources = _expert_answers(split, request.experts, label_map, split_name)
    else:
        expert_ids, names_here, sources = np.zeros((len(split), 0), dtype=np.int64), [], []
    names_here, sources = names_here + request.judged, sources + request.judged
    if expected is not None and names_here != expected:
        raise ValueError(f"the expert columns hold {names_here}{_where(split_name)} but {expected} in the first "
                         "split.")
    return expert_ids, _expert_scores(split, request.judged, split_name), names_here, sources


def _rows_missing_expert(expert_ids: np.ndarray, scores: np.ndarray, expert_names: list[str], sources: list[str],
                         missing_expert: str, where: str) -> np.ndarray:
    """The rows to drop for a missing annotation (none with `"mask"`, which logs the answers per expert); with
    `"error"` a missing annotation is an error naming the column and the row."""
    absent = np.concatenate([expert_ids == -1, np.isnan(scores)], axis=1)  # [N, M]: no answer
    missing = absent.any(axis=1) if missing_expert != "mask" else np.zeros(len(expert_ids), dtype=bool)
    if missing.any() and missing_expert == "error":
        row = int(np.flatnonzero(missing)[0])
        column = sources[int(np.argmax(absent[row]))]
        raise ValueError(
            f"expert column {column!r}{where}, row {row}: the annotation is missing (None, -1 or NaN) in "
            f"{int(missing.sum())} row(s); pass missing_expert='drop' to drop them, or missing_expert='mask' "
            "to keep them without that expert's answer."
        )
    if missing_expert == "mask" and absent.any():
        logger.info(f"prepare_deferral_dataset: rows{where} answered per expert (of {len(expert_ids)}): "
                    f"{dict(zip(expert_names, (~absent).sum(axis=0).tolist()))}")
    return missing


def _add_targets(out: datasets.Dataset, labels: np.ndarray, names: list[str], expert_ids: np.ndarray,
                 scores: np.ndarray, request: _Request) -> datasets.Dataset:
    """`out` with `labels` (unless route-only) and `expert_labels`, or `expert_correct` when some experts are judged
    (the answers' correctness against the label, then the scores; -100 where missing)."""
    ignored = (labels == IGNORE_INDEX).any()
    if not request.route_only:
        out = out.add_column("labels", labels.tolist(),
                             feature=datasets.Value("int64") if ignored else datasets.ClassLabel(names=names))
    column, values, dtype = "expert_labels", expert_ids, "int64"
    if request.judged:  # targets rather than answers: the answers' correctness against the label, then the scores
        right = np.where((expert_ids == IGNORE_INDEX) | (labels == IGNORE_INDEX)[:, None], IGNORE_INDEX,
                         (expert_ids == labels[:, None]).astype(np.float64))
        column, values, dtype = "expert_correct", np.concatenate([right, np.nan_to_num(scores, nan=IGNORE_INDEX)],
                                                                 axis=1), "float64"
    if values.shape[1] == 1:
        return out.add_column(column, values[:, 0].tolist(), feature=datasets.Value(dtype))
    return out.add_column(column, values.tolist(), feature=datasets.List(datasets.Value(dtype),
                                                                         length=values.shape[1]))


def _add_side_features(out: datasets.Dataset, side_specs: list[dict[str, Any]],
                       values: dict[str, list[Any]]) -> datasets.Dataset:
    """`out` with the model's side inputs `side_categorical` / `side_numeric`, as `side_feature_tensors` makes them
    for the pipeline."""
    categorical, numeric = side_feature_tensors(side_specs, [dict(zip(values, row)) for row in zip(*values.values())])
    for name, tensor, dtype in (("side_categorical", categorical, "int64"), ("side_numeric", numeric, "float32")):
        if tensor.shape[1]:
            out = out.add_column(name, tensor.tolist(), feature=datasets.List(datasets.Value(dtype),
                                                                            length=tensor.shape[1]))
    return out


def _drop_rows(out: datasets.Dataset, missing: np.ndarray, where: str) -> datasets.Dataset:
    """`out` without the rows missing an expert annotation (their count logged); none left is an error."""
    if not missing.any():
        return out
    logger.warning(f"prepare_deferral_dataset: dropped {int(missing.sum())} of {len(out)} rows{where} with a "
                   f"missing expert annotation.")
    out = out.select(np.flatnonzero(~missing))
    if len(out) == 0:
        raise ValueError(f"every row{where} misses an expert annotation: nothing is left after dropping them.")
    return out


def _attach_processor(out: datasets.Dataset, request: _Request) -> datasets.Dataset:
    """`out` tokenized (a tokenizer) or turning images into `pixel_values` when read (an image processor)."""
    processor, max_length = request.processor, request.max_length
    if isinstance(processor, PreTrainedTokenizerBase):
        pair = "text_pair" if request.text_pair_column is not None else None

        def tokenize(batch: dict[str, list]) -> Any:
            return processor(batch["text"], batch[pair] if pair else None, truncation=True, max_length=max_length)

        return out.map(tokenize, batched=True, desc="Tokenizing")
    if processor is not None:
        return out.with_transform(_ImageTransform(processor))
    return out
