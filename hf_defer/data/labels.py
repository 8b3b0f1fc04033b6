"""The label rules of a user's dataset, stated once: what a class is, what a missing answer is, which values are errors.

[`prepare_deferral_dataset`] applies them to the label column of every split and to every expert column alike, and
[`DeferralTrainer`] checks with [`check_label_names`] that a prepared split speaks the model's classes.

* **Missing.** `None`, NaN, `-1` (an integer or `-1.0`), and the strings `"-1"` and `""` (blank after stripping) mark a
  missing value, in every column: never a class. (`-1` is the missing value of a `datasets.ClassLabel`; classes
  numbered `-1, 0, 1` must be mapped to names first.) `-100` in the label column marks an ignored row.
* **Names.** Strings are compared stripped of surrounding whitespace (`"pos "` is `"pos"`); two names that differ
  only in case (`"Pos"`, `"pos"`) are refused, since nothing tells whether they are one class or two; `"defer"` is
  refused as a class name (the pipeline's label of a deferred input).
* **Classes.** `label_names` (a list, or a model's `config.id2label` / `label2id`), else the `ClassLabel` names of
  the label column, else the distinct labels of the **training split** (`"train"`, else the first split): strings in
  sorted order, integers in increasing order, named by their digits (labels `1..5` give the classes `"1"..."5"`, ids
  0..4: no class that no row has). A class seen only in another split, or only in an expert column, is not a class.
* **Unknown values.** A label or answer that is no class is an error naming the split, the column, the row and the
  value.
* **Integers and strings.** With a `ClassLabel` label column an integer is an id of that `ClassLabel`; with
  `label_names` and integer labels, an integer is a class id in `label_names`' order; with classes taken from integer
  labels, only integers are answers, and with classes taken from strings, only strings: integers in one split or
  column and digit strings in another are one error, naming the split, the column, the row and the fix.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import datasets
import numpy as np

from ..modeling.pipeline_deferral import DEFER_LABEL
from ..modeling.surrogate_base import IGNORE_INDEX

__all__ = ["LabelMap", "check_label_names", "class_names", "is_missing", "training_split"]

MISSING_STRINGS = ("", "-1")
"""Strings that mark a missing value (after stripping surrounding whitespace)."""

_UNKNOWN = object()


def is_missing(value: Any) -> bool:
    """Whether `value` marks a missing label or answer: `None`, NaN, -1, `"-1"` or a blank string."""
    if value is None or isinstance(value, (bool, np.bool_)):
        return value is None
    if isinstance(value, numbers.Real):
        return math.isnan(value) or value == -1
    return isinstance(value, str) and value.strip() in MISSING_STRINGS


def _clean(value: Any) -> Any:
    """A raw value as it is compared with the class names: strings stripped, integral numbers as `int`."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and float(value).is_integer():
        return int(value)
    return value


def _kind(feature: Any) -> str | None:
    """`"classlabel"`, `"str"` or `"int"` (integers, or floats that must be integral) of a column's (inner) feature,
    `None` for a column without values (all null), `"other"` for anything else."""
    if isinstance(feature, datasets.ClassLabel):
        return "classlabel"
    dtype = getattr(feature, "dtype", None) if isinstance(feature, datasets.Value) else None
    if dtype in ("string", "large_string"):
        return "str"
    if dtype is not None and dtype.startswith(("int", "uint", "float")):
        return "int"
    return None if dtype == "null" else "other"


def _where(split: Any) -> str:
    return "" if split is None else f" of split {split!r}"


def training_split(splits: Mapping[Any, datasets.Dataset]) -> Any:
    """The split whose labels define the classes: `"train"` when there is one, else the first."""
    return "train" if "train" in splits else next(iter(splits))


def _declared_names(label_names: Any) -> list[str]:
    """The class names of `label_names`: a list of names in id order, `{id: name}` or `{name: id}`."""
    if isinstance(label_names, Mapping):
        items = list(label_names.items())
        if all(isinstance(key, numbers.Integral) and isinstance(name, str) for key, name in items):
            by_id = dict(items)
        elif all(isinstance(name, str) and isinstance(key, numbers.Integral) for name, key in items):
            by_id = {key: name for name, key in items}
        else:
            by_id = None
        if by_id is None or sorted(by_id) != list(range(len(by_id))):
            raise ValueError(f"label_names given as a mapping must be {{id: name}} (config.id2label) or {{name: id}} "
                             f"(config.label2id) with the ids 0..K-1, got {label_names!r}.")
        return [by_id[index] for index in range(len(by_id))]
    if isinstance(label_names, str) or not isinstance(label_names, Sequence) or not all(
            isinstance(name, str) for name in label_names):
        raise ValueError(f"label_names must be a list of class names (str) or a model's config.id2label, got "
                         f"{label_names!r}.")
    return list(label_names)


def _check_names(names: list[str], source: str) -> list[str]:
    """The stripped class names, refusing blanks and missing markers, repeats, case-only twins and `"defer"`."""
    stripped = [name.strip() for name in names]
    bad = [name for name in names if name.strip() in MISSING_STRINGS]
    if bad:
        raise ValueError(f"{source} has the class names {bad}, which mark a missing value (None, NaN, -1, '-1', '').")
    repeated = sorted({name for name in stripped if stripped.count(name) > 1})
    if repeated:
        raise ValueError(f"{source} names the classes {repeated} more than once (after stripping whitespace): "
                         f"{names}.")
    folded: dict[str, str] = {}
    for name in stripped:
        other = folded.setdefault(name.casefold(), name)
        if other != name:
            raise ValueError(
                f"{source} has the classes {other!r} and {name!r}, which differ only in case: one class or two? "
                "Normalise the column first (e.g. dataset.map(lambda row: {'label': row['label'].lower()})) or pass "
                "label_names."
            )
    if DEFER_LABEL in stripped:
        raise ValueError(f"{source} has a class named {DEFER_LABEL!r}, the label the deferral pipeline gives a "
                         f"deferred input; rename it (e.g. dataset.map(...) to {DEFER_LABEL + '_class'!r}).")
    return stripped


def class_names(splits: Mapping[Any, datasets.Dataset], label_column: str, label_names: Any = None) -> list[str]:
    """The class names, in class-id order, by the rules of this module: `label_names`, else the label column's
    `ClassLabel` names, else the distinct labels of the training split ([`training_split`]).

    Raises:
        `ValueError`: names that are blank, repeated, twins up to case or `"defer"`; labels that are neither names nor
            non-negative integers; fewer than two classes.
    """
    train = training_split(splits)
    if label_names is not None:
        names = _check_names(_declared_names(label_names), "label_names")
    else:
        split = splits[train]
        feature = split.features[label_column]
        kind = _kind(feature)
        if kind == "classlabel":
            names = _check_names(list(feature.names), f"the ClassLabel of label column {label_column!r}")
        else:
            values = {_clean(value) for value in split[label_column][:]}
            values = {value for value in values if not is_missing(value) and value != IGNORE_INDEX}
            if kind == "str":
                source = f"label column {label_column!r}{_where(None if len(splits) == 1 else train)}"
                names = _check_names(sorted(values), source)
            elif kind == "int" and all(isinstance(value, int) and value >= 0 for value in values):
                names = [str(value) for value in sorted(values)]
            else:
                odd = sorted({repr(value) for value in values if not (isinstance(value, int) and value >= 0)})[:5]
                raise ValueError(
                    f"label column {label_column!r}{_where(None if len(splits) == 1 else train)} must hold class names "
                    f"(str), a ClassLabel or non-negative class ids (int); got {feature} with values such as "
                    f"{odd or sorted(map(repr, values))[:5]}."
                )
    if len(names) < 2:
        where = "" if label_names is not None or len(splits) == 1 else f" in the training split {train!r}"
        unlabelled = ""
        if label_names is None and _kind(splits[train].features[label_column]) != "classlabel":
            rows = [row for row, value in enumerate(splits[train][label_column][:]) if is_missing(_clean(value))]
            if rows:  # not counted as a class: say so, or the error hides the rows that were set aside
                unlabelled = (f"; {len(rows)} of its {len(splits[train])} rows have no label and were not counted "
                              f"(rows {rows[:5]}{' ...' if len(rows) > 5 else ''}: None, NaN, -1, '-1' or '' mark a "
                              "missing label, and CSV readers read NA, N/A, null and nan as NaN): fill them in, or "
                              "rename such a class")
        raise ValueError(
            f"label column {label_column!r} has {len(names)} class(es) {names}{where}{unlabelled}; learning to defer "
            "needs at least 2."
        )
    return names


class LabelMap:
    """Maps the raw values of a column (names, `ClassLabel` ids, integer labels, integral floats) to class ids.

    Args:
        names (`list[str]`): the classes, from [`class_names`].
        label_feature: the label column's feature in the training split.
        declared (`bool`): whether the names were given (`label_names`) rather than read from the labels.
    """

    def __init__(self, names: list[str], label_feature: Any, declared: bool = False) -> None:
        self.names, self.label2id = names, {name: index for index, name in enumerate(names)}
        self.label_kind = _kind(label_feature)
        self.label_classes = label_feature.names if self.label_kind == "classlabel" else None
        # How a plain integer answer reads: an id of the label column's ClassLabel, a class id in label_names' order,
        # or (classes read from integer labels) a label value, named by its digits.
        self.integers = {"classlabel": "classlabel", "int": "ids" if declared else "values"}.get(self.label_kind)
        self.strings = not (self.label_kind == "int" and not declared)

    def _fix(self, column: str, split: Any, kind: str) -> str:
        if kind == "int":
            return (f"the classes are names {self.names[:5]}, so answers must be names too: map the integers to names "
                    f"(e.g. dataset.map(...)), or cast the column ({column!r}) to a ClassLabel with the class names")
        return (f"the classes come from integer labels ({self.names[:5]}), so answers must be integers too: cast the "
                f"column, e.g. dataset.cast_column({column!r}, datasets.Value('int64')), or pass label_names")

    def ids(self, values: list[Any], feature: Any, column: str, split: Any, allow_ignore: bool) -> np.ndarray:
        """Class ids of a column's values; -100 for an ignored label (with `allow_ignore`), -1 for a missing value."""
        kind = _kind(feature)
        class_names = feature.names if kind == "classlabel" else self.label_classes
        out = np.empty(len(values), dtype=np.int64)
        for row, raw in enumerate(values):
            value = _clean(raw)
            if allow_ignore and value == IGNORE_INDEX and not isinstance(value, str):
                out[row] = IGNORE_INDEX
                continue
            if is_missing(value):
                out[row] = -1
                continue
            index = _UNKNOWN
            if isinstance(value, str):
                if kind == "str" and not self.strings:
                    self._refuse_kind(column, split, row, raw, "str")
                index = self.label2id.get(value, _UNKNOWN)
            elif isinstance(value, int) and not isinstance(value, bool):
                if kind == "classlabel" or (self.integers == "classlabel" and class_names is not None):
                    if 0 <= value < len(class_names):
                        index = self.label2id.get(class_names[value].strip(), _UNKNOWN)
                elif self.integers == "ids":
                    index = value if 0 <= value < len(self.names) else _UNKNOWN
                elif self.integers == "values":
                    index = self.label2id.get(str(value), _UNKNOWN)
                else:
                    self._refuse_kind(column, split, row, raw, "int")
            if index is _UNKNOWN:
                raise ValueError(self._unknown(column, split, row, raw, value))
            out[row] = index
        return out

    def _refuse_kind(self, column: str, split: Any, row: int, raw: Any, kind: str) -> None:
        held = "integers" if kind == "int" else "strings"
        raise ValueError(f"column {column!r}{_where(split)}, row {row}: {raw!r} — the column holds {held}, but "
                         f"{self._fix(column, split, kind)}.")

    def _unknown(self, column: str, split: Any, row: int, raw: Any, value: Any) -> str:
        shown = f"{self.names[:10]}{' ...' if len(self.names) > 10 else ''}"
        hint = ""
        if isinstance(value, str):
            twins = [name for name in self.names if name.casefold() == value.casefold()]
            hint = f" (it differs from the class {twins[0]!r} only in case)" if twins else ""
        return (f"column {column!r}{_where(split)}, row {row}: {raw!r} is not one of the {len(self.names)} classes "
                f"{shown}{hint}. The classes come from label_names, a ClassLabel or the labels of the training split; "
                "pass label_names=[...] to declare every class.")


def check_label_names(dataset: Any, config: Any, name: str = "dataset") -> None:
    """Checks that the class ids of `dataset` mean the classes of the model: when its `labels` (or `label`) column is
    a `ClassLabel`, its names must be the model's `config.id2label`, in order (a split prepared on its own, with classes
    `[neg, pos]`, would otherwise be scored against `[neg, neu, pos]` by position). A model with the default names
    (`LABEL_0`, ...) is checked by the number of classes only; a column without names is not checked.

    Raises:
        `ValueError`: the names or their number differ; the message gives the fix
            (`prepare_deferral_dataset(..., label_names=model.config.id2label)`).

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer import DeferralConfig, prepare_deferral_dataset
    >>> from hf_defer.data.labels import check_label_names
    >>> config = DeferralConfig(feature_size=4, id2label={0: "neg", 1: "neu", 2: "pos"})
    >>> test = datasets.Dataset.from_dict({"label": ["pos", "neg"], "alice": ["pos", "pos"]})
    >>> alone = prepare_deferral_dataset(test, "label", "alice").dataset  # classes [neg, pos]: "pos" is id 1
    >>> check_label_names(alone, config, "eval_dataset")
    Traceback (most recent call last):
    ...
    ValueError: eval_dataset's 'labels' column is a ClassLabel with the classes ['neg', 'pos'], but ...
    >>> matched = prepare_deferral_dataset(test, "label", "alice", label_names=config.id2label).dataset
    >>> matched["labels"][:], check_label_names(matched, config)
    ([2, 0], None)

    ```
    """
    features = getattr(dataset, "features", None)
    if not features:
        return
    column = "labels" if "labels" in features else "label" if "label" in features else None
    feature = features[column] if column else None
    if not isinstance(feature, datasets.ClassLabel):
        return
    ours = [str(config.id2label[index]) for index in range(config.num_labels)]
    theirs = [name.strip() for name in feature.names]
    default = ours == [f"LABEL_{index}" for index in range(len(ours))]
    if theirs == [name.strip() for name in ours] or (default and len(theirs) == len(ours)):
        return
    raise ValueError(
        f"{name}'s {column!r} column is a ClassLabel with the classes {theirs}, but the model's classes "
        f"(config.id2label) are {ours}: class ids would be compared by position. Prepare it with the model's classes, "
        "prepare_deferral_dataset(..., label_names=model.config.id2label), or cast it: "
        f"{name}.cast_column({column!r}, datasets.ClassLabel(names=...)) after mapping the ids."
    )
