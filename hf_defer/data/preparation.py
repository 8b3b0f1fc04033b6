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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import datasets
import numpy as np
from transformers import PreTrainedTokenizerBase

from ..modeling.surrogate_base import IGNORE_INDEX

__all__ = ["MISSING_EXPERT_MODES", "PreparedDeferralData", "prepare_deferral_dataset"]

logger = logging.getLogger(__name__)

MISSING_EXPERT_MODES = ("error", "drop")
"""What [`prepare_deferral_dataset`] does with a missing expert annotation (`None`, `-1` or NaN)."""

_MISSING = object()


@dataclass
class PreparedDeferralData:
    """What [`prepare_deferral_dataset`] returns.

    Args:
        dataset (`datasets.Dataset` or `datasets.DatasetDict`): columns `labels` (class ids), `expert_labels` (an id
            per row for one expert, a list of M ids for M experts) and the model inputs (`input_ids`, ... after a
            tokenizer; `text` / `text_pair` / `image` as given).
        id2label (`dict[int, str]`): the class names, by class id.
        expert_names (`list[str]`): one name per expert, in the order of `expert_labels`.
    """

    dataset: datasets.Dataset | datasets.DatasetDict
    id2label: dict[int, str]
    expert_names: list[str]

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
        `EncoderForDeferral.from_encoder_pretrained(...)`."""
        return {"num_labels": self.num_labels, "num_experts": self.num_experts, "id2label": dict(self.id2label),
                "expert_names": list(self.expert_names)}


class _ImageTransform:
    """`with_transform` function: images to `pixel_values` with an image processor, when rows are read."""

    def __init__(self, processor: Any) -> None:
        self.processor = processor

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        out = {key: value for key, value in batch.items() if key != "image"}
        images = [image.convert("RGB") for image in batch["image"]]
        out["pixel_values"] = list(self.processor(images=images, return_tensors="np")["pixel_values"])
        return out


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or (
        isinstance(value, numbers.Integral) and not isinstance(value, bool) and value == -1)


def _class_names(splits: dict[Any, datasets.Dataset], label_column: str,
                 label_names: Sequence[str] | None) -> list[str]:
    """The class names: `label_names`, else the `ClassLabel` names, else the sorted distinct string labels, else the
    integers 0..max as strings."""
    if label_names is not None:
        if isinstance(label_names, str) or not all(isinstance(name, str) for name in label_names):
            raise ValueError(f"label_names must be a list of class names (str), got {label_names!r}.")
        names = list(label_names)
    else:
        feature = next(iter(splits.values())).features[label_column]
        if isinstance(feature, datasets.ClassLabel):
            names = list(feature.names)
        else:
            values = {value for split in splits.values() for value in split[label_column][:]}
            values = {value for value in values if not _is_missing(value) and value != IGNORE_INDEX}
            if all(isinstance(value, str) for value in values):
                names = sorted(values)
            elif all(isinstance(value, numbers.Real) and not isinstance(value, bool) and float(value).is_integer()
                     and value >= 0 for value in values):
                names = [str(index) for index in range(int(max(values, default=-1)) + 1)]
            else:
                odd = sorted({repr(value) for value in values if not isinstance(value, (int, float))})[:5]
                raise ValueError(
                    f"label column {label_column!r} must hold class names (str), a ClassLabel or non-negative class "
                    f"ids (int); got {feature} with values such as {odd or sorted(map(repr, values))[:5]}."
                )
    if len(set(names)) != len(names):
        raise ValueError(f"the class names must be distinct, got {names}.")
    if len(names) < 2:
        raise ValueError(
            f"label column {label_column!r} has {len(names)} class(es) {names}; learning to defer needs at least 2."
        )
    return names


class _LabelMap:
    """Maps a column's raw values (names, `ClassLabel` ids, integer ids, integral floats) to class ids."""

    def __init__(self, names: list[str], label_feature: Any) -> None:
        self.names, self.label2id = names, {name: index for index, name in enumerate(names)}
        # Plain integer answers are class ids of the label column: of its ClassLabel, or of integer labels.
        self.label_classes = label_feature.names if isinstance(label_feature, datasets.ClassLabel) else None
        self.integer_labels = names == [str(index) for index in range(len(names))] or (
            isinstance(label_feature, datasets.Value) and label_feature.dtype.startswith(("int", "uint")))

    def ids(self, values: list[Any], feature: Any, column: str, split: Any, allow_ignore: bool) -> np.ndarray:
        """Class ids of a column; -100 for an ignored label, -1 for a missing annotation."""
        where = "" if split is None else f" of split {split!r}"
        class_names = feature.names if isinstance(feature, datasets.ClassLabel) else self.label_classes
        out = np.empty(len(values), dtype=np.int64)
        for row, value in enumerate(values):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            if allow_ignore and value == IGNORE_INDEX:
                out[row] = IGNORE_INDEX
                continue
            if _is_missing(value) or (isinstance(value, str) and value.strip() == "-1" and value not in self.label2id):
                out[row] = -1  # "-1" too: a CSV column of names writes a missing -1 as text
                continue
            index = _MISSING
            if isinstance(value, str):
                index = self.label2id.get(value, _MISSING)
            elif isinstance(value, numbers.Integral) and not isinstance(value, bool):
                if class_names is not None and 0 <= value < len(class_names):
                    index = self.label2id.get(class_names[value], _MISSING)
                elif class_names is None and self.integer_labels and 0 <= value < len(self.names):
                    index = int(value)
                elif class_names is None:
                    index = self.label2id.get(str(value), _MISSING)
            if index is _MISSING:
                raise ValueError(
                    f"column {column!r}{where}, row {row}: {value!r} is not one of the {len(self.names)} classes "
                    f"{self.names[:10]}{' ...' if len(self.names) > 10 else ''}."
                )
            out[row] = index
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
    where = "" if split_name is None else f" of split {split_name!r}"
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


def prepare_deferral_dataset(
    dataset: datasets.Dataset | datasets.DatasetDict,
    label_column: str = "label",
    expert_columns: str | Sequence[str] = (),
    *,
    text_column: str | None = None,
    text_pair_column: str | None = None,
    image_column: str | None = None,
    processor: Any = None,
    max_length: int | None = None,
    label_names: Sequence[str] | None = None,
    missing_expert: str = "error",
) -> PreparedDeferralData:
    """Prepares any dataset with a label column and one or more expert columns for [`DeferralTrainer`].

    * Labels: a `ClassLabel` column keeps its names; string labels become classes in sorted order; integer labels
      `0..K-1` are named `"0"..."K-1"`; `label_names` fixes the class order instead. `-100` marks an ignored row.
    * Experts: every expert column is mapped through the same `label2id` (names, `ClassLabel` ids or class ids);
      a value outside the class set is an error naming the column, the row and the value. A list-valued column
      holds several experts (the same number in every row). A missing annotation (`None`, `-1` or `"-1"`, NaN) is an
      error
      with `missing_expert="error"`; with `"drop"` its row is dropped and the count logged per split.
    * Inputs: `text_column` (and `text_pair_column`) become `text` (and `text_pair`) and, with a tokenizer as
      `processor`, are tokenized (`truncation=True`, `max_length`). `image_column` becomes `image`; with an image
      processor it is turned into `pixel_values` when rows are read (`with_transform`: train such a split with
      `TrainingArguments(remove_unused_columns=False)`). Other columns are dropped.

    Every check runs before anything is tokenized, so errors come before any model is loaded.

    Args:
        dataset (`datasets.Dataset` or `datasets.DatasetDict`): the data; all splits are prepared alike.
        label_column (`str`, *optional*, defaults to `"label"`): the true class.
        expert_columns (`str` or `list[str]`): the experts' answers, one column per expert (or a list column).
        text_column / text_pair_column / image_column (`str`, *optional*): the model's input.
        processor (*optional*): a tokenizer for text, an image processor for images.
        max_length (`int`, *optional*): the tokenizer's truncation length.
        label_names (`list[str]`, *optional*): the class names in class-id order.
        missing_expert (`str`, *optional*, defaults to `"error"`): `"error"` or `"drop"`.

    Returns:
        [`PreparedDeferralData`]: `.dataset` (same type as `dataset`), `.id2label`, `.expert_names`, and
        `.model_kwargs()` for the model.

    Raises:
        `ValueError`: a missing column, a label or expert answer outside the class set, a missing annotation (with
        `missing_expert="error"`), a text column that is not text, an image column that is not images, expert lists of
        different lengths, or a split whose labels are all ignored.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer import prepare_deferral_dataset
    >>> ds = datasets.Dataset.from_dict({"text": ["great", "awful", "fine"], "label": ["pos", "neg", "pos"],
    ...                                  "alice": ["pos", "neg", None], "bob": ["neg", "neg", "pos"]})
    >>> prepared = prepare_deferral_dataset(ds, "label", ["alice", "bob"], text_column="text", missing_expert="drop")
    >>> prepared.id2label, prepared.expert_names, prepared.dataset["expert_labels"][:]
    ({0: 'neg', 1: 'pos'}, ['alice', 'bob'], [[1, 0], [0, 0]])

    ```
    """
    if isinstance(dataset, datasets.DatasetDict):
        splits: dict[Any, datasets.Dataset] = dict(dataset)
    elif isinstance(dataset, datasets.Dataset):
        splits = {None: dataset}
    else:
        raise ValueError(f"dataset must be a datasets.Dataset or DatasetDict, got {type(dataset).__name__}.")
    if not splits:
        raise ValueError("dataset is an empty DatasetDict: it has no split.")
    if isinstance(expert_columns, str):
        expert_columns = [expert_columns]
    experts = list(expert_columns)
    if not experts or not all(isinstance(name, str) and name for name in experts):
        raise ValueError(
            f"expert_columns must name at least one column with the experts' answers, got {expert_columns!r} "
            "(no expert column? simulate one with hf_defer.experts.class_subset_expert / annotator_expert)."
        )
    if len(set(experts)) != len(experts) or label_column in experts:
        raise ValueError(f"expert_columns {experts} must be distinct and differ from label_column {label_column!r}.")
    if missing_expert not in MISSING_EXPERT_MODES:
        raise ValueError(f"missing_expert must be one of {MISSING_EXPERT_MODES}, got {missing_expert!r}.")
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
    inputs = {name: renamed for name, renamed in ((text_column, "text"), (text_pair_column, "text_pair"),
                                                  (image_column, "image")) if name is not None}
    for split_name, split in splits.items():
        where = "" if split_name is None else f" of split {split_name!r}"
        for role, names in (("label_column", [label_column]), ("expert_columns", experts),
                            ("text/image column", list(inputs))):
            missing = [name for name in names if name not in split.column_names]
            if missing:
                raise ValueError(f"{role} {missing} not found in the dataset{where}; its columns are "
                                 f"{split.column_names}.")
        if text_column is not None:
            _check_string_column(split, text_column, where)
        if text_pair_column is not None:
            _check_string_column(split, text_pair_column, where)
        if image_column is not None and not isinstance(split.features[image_column], datasets.Image):
            raise ValueError(
                f"image column {image_column!r}{where} must hold images (datasets.Image), got "
                f"{split.features[image_column]}."
            )

    first = next(iter(splits.values()))
    names = _class_names(splits, label_column, label_names)
    label_map = _LabelMap(names, first.features[label_column])
    expert_names: list[str] | None = None
    prepared: dict[Any, datasets.Dataset] = {}
    for split_name, split in splits.items():
        where = "" if split_name is None else f" of split {split_name!r}"
        labels = label_map.ids(split[label_column][:], split.features[label_column], label_column, split_name, True)
        if (labels == -1).any():
            rows = np.flatnonzero(labels == -1)[:5].tolist()
            raise ValueError(f"label column {label_column!r}{where} has no label in rows {rows}.")
        if len(labels) and (labels == IGNORE_INDEX).all():
            raise ValueError(f"every label of label column {label_column!r}{where} is {IGNORE_INDEX} (ignored).")
        expert_ids, names_here, sources = _expert_answers(split, experts, label_map, split_name)
        if expert_names is not None and names_here != expert_names:
            raise ValueError(f"the expert columns hold {names_here}{where} but {expert_names} in the first split.")
        expert_names = names_here
        missing = (expert_ids == -1).any(axis=1)
        if missing.any() and missing_expert == "error":
            row = int(np.flatnonzero(missing)[0])
            column = sources[int(np.argmax(expert_ids[row] == -1))]
            raise ValueError(
                f"expert column {column!r}{where}, row {row}: the annotation is missing (None, -1 or NaN) in "
                f"{int(missing.sum())} row(s); pass missing_expert='drop' to drop them."
            )
        # The label column is kept until the new columns are in: a table without columns has no rows.
        out = split.select_columns([*inputs, label_column]).rename_columns({**inputs, label_column: "_raw_label"})
        ignored = (labels == IGNORE_INDEX).any()
        out = out.add_column("labels", labels.tolist(),
                             feature=datasets.Value("int64") if ignored else datasets.ClassLabel(names=names))
        if expert_ids.shape[1] == 1:
            out = out.add_column("expert_labels", expert_ids[:, 0].tolist(), feature=datasets.Value("int64"))
        else:
            out = out.add_column("expert_labels", expert_ids.tolist(),
                                 feature=datasets.List(datasets.Value("int64"), length=expert_ids.shape[1]))
        out = out.remove_columns("_raw_label")
        if missing.any():
            logger.warning(f"prepare_deferral_dataset: dropped {int(missing.sum())} of {len(out)} rows{where} with a "
                           f"missing expert annotation.")
            out = out.select(np.flatnonzero(~missing))
            if len(out) == 0:
                raise ValueError(f"every row{where} misses an expert annotation: nothing is left after dropping them.")
        if is_tokenizer:
            pair = "text_pair" if text_pair_column is not None else None

            def tokenize(batch: dict[str, list]) -> Any:
                return processor(batch["text"], batch[pair] if pair else None, truncation=True, max_length=max_length)

            out = out.map(tokenize, batched=True, desc="Tokenizing")
        elif processor is not None:
            out = out.with_transform(_ImageTransform(processor))
        prepared[split_name] = out
    result = prepared[None] if None in prepared else datasets.DatasetDict(prepared)
    return PreparedDeferralData(result, dict(enumerate(names)), list(expert_names or []))
