"""Annotations as labelling tools export them: one row per (item, annotator, answer), turned into one expert column per
annotator ([`annotations_to_columns`]), and a target built from the annotators where no gold label exists
([`aggregate_labels`]: majority, leave-one-out majority, or Dawid–Skene through crowd-kit).

A missing answer in the wide columns is `None`, which [`prepare_deferral_dataset`] reads as missing (as it does `-1`
and NaN). Ties are never broken: a tied target is `None` and flagged in a `<column>_tied` column, and the count is
logged.
"""

from __future__ import annotations

import logging
import numbers
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any, Union

import datasets
import numpy as np
import pandas as pd

from .labels import is_missing  # one rule for "missing", as prepare_deferral_dataset reads it

__all__ = ["AGGREGATION_METHODS", "DUPLICATE_POLICIES", "aggregate_labels", "annotations_to_columns"]

logger = logging.getLogger(__name__)

Table = Union[datasets.Dataset, pd.DataFrame]

DUPLICATE_POLICIES = ("error", "first", "last", "majority")
"""What [`annotations_to_columns`] does when one annotator answered one item more than once."""

AGGREGATION_METHODS = ("majority", "leave_one_out", "dawid_skene")
"""The methods of [`aggregate_labels`]."""


def _normalise(value: Any) -> Any:
    """Integral floats (pandas stores integer answers with gaps as float) become ints; numpy scalars become Python."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _columns(data: Table, argument: str) -> list[str]:
    if isinstance(data, datasets.Dataset):
        return list(data.column_names)
    if isinstance(data, pd.DataFrame):
        return [str(name) for name in data.columns]
    raise ValueError(f"`{argument}` must be a datasets.Dataset or a pandas.DataFrame, got {type(data).__name__}.")


def _values(data: Table, column: str) -> list[Any]:
    values = data[column][:] if isinstance(data, datasets.Dataset) else data[column].tolist()
    return [_normalise(value) for value in values]


def _require(data: Table, names: Sequence[str], argument: str) -> None:
    columns = _columns(data, "data")
    missing = [name for name in names if name not in columns]
    if missing:
        raise ValueError(f"`{argument}`: column(s) {missing} not found in `data`; its columns are {columns}.")


def _check_label_set(values: list[Any], label_names: Sequence[Any] | None, column: str) -> None:
    if label_names is None:
        return
    allowed = set(label_names)
    bad = [row for row, value in enumerate(values) if not is_missing(value) and value not in allowed]
    if bad:
        found = sorted({repr(values[row]) for row in bad})[:5]
        raise ValueError(
            f"column {column!r} holds answers outside `label_names` {list(label_names)}: {', '.join(found)} "
            f"(rows {bad[:5]})."
        )


def _plurality(answers: Sequence[Any]) -> tuple[Any, bool]:
    """The most frequent answer and whether it is tied with another; `(None, False)` for no answers."""
    if not answers:
        return None, False
    ranked = Counter(answers).most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None, True
    return ranked[0][0], False


def _feature_of(values: list[Any], source: Any) -> Any:
    """The feature of a column of answers with `None` gaps: the source's `ClassLabel`, else inferred from the values."""
    if isinstance(source, datasets.ClassLabel):
        return source
    present = [value for value in values if value is not None]
    if present and all(isinstance(value, str) for value in present):
        return datasets.Value("string")
    if present and all(isinstance(value, bool) for value in present):
        return datasets.Value("bool")
    if present and all(isinstance(value, numbers.Integral) and not isinstance(value, bool) for value in present):
        return datasets.Value("int64")
    return None


def _build(like: Table, columns: dict[str, list[Any]], features: dict[str, Any]) -> Table:
    if isinstance(like, pd.DataFrame):
        return pd.DataFrame({name: pd.Series(values, dtype=object if any(value is None for value in values) else None)
                             for name, values in columns.items()})
    if any(feature is None for feature in features.values()):
        return datasets.Dataset.from_dict(columns)
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def _add_columns(data: Table, added: dict[str, list[Any]], features: dict[str, Any]) -> Table:
    """`data` with the `added` columns; in a DataFrame, the bool columns are bool and the others objects (`None`)."""
    clash = [name for name in added if name in _columns(data, "data")]
    if clash:
        raise ValueError(f"`data` already has the output column(s) {clash}; pass another `output_column` or drop them.")
    if isinstance(data, pd.DataFrame):
        out = data.copy()
        for name, values in added.items():
            flag = features[name] == datasets.Value("bool") and None not in values
            out[name] = pd.Series(values, dtype=bool if flag else object, index=out.index)
        return out
    for name, values in added.items():
        data = data.add_column(name, values, feature=features[name])
    return data


def annotations_to_columns(
    data: Table,
    item_column: str,
    annotator_column: str,
    answer_column: str,
    *,
    min_answers: int = 1,
    duplicates: str = "error",
    label_names: Sequence[Any] | None = None,
    keep_columns: Sequence[str] = (),
    column_prefix: str = "",
) -> Table:
    """Turn a long table of annotations (one row per item, annotator and answer) into one column per annotator.

    Rows with no answer (`None`, NaN or an empty string) are skipped (and counted in the log). Items keep the order in
    which they first appear; annotator columns are sorted by name. An annotator who did not answer an item gets
    `None` there, which [`prepare_deferral_dataset`] reads as a missing annotation (`missing_expert="drop"` or
    `"mask"`).

    Args:
        data (`datasets.Dataset` or `pandas.DataFrame`): the long table.
        item_column (`str`): the item id (one output row per distinct id).
        annotator_column (`str`): the annotator id; every row needs one.
        answer_column (`str`): the answer (a class name or a non-negative class id).
        min_answers (`int`, *optional*, defaults to 1): keep the annotators with at least this many answers (after
            resolving repeats); the others are dropped and named in the log.
        duplicates (`str`, *optional*, defaults to `"error"`): one annotator answering one item more than once is an
            error, unless this is `"first"` or `"last"` (the first or last such row), or `"majority"` (their most
            frequent answer; a tie among their own answers leaves the cell missing, counted in the log).
        label_names (`Sequence`, *optional*): the label set; an answer outside it is an error.
        keep_columns (`Sequence[str]`, *optional*): item-level columns to carry over (e.g. the text); each must hold
            one value per item.
        column_prefix (`str`, *optional*, defaults to `""`): prepended to each annotator id to name its column.

    Returns:
        The same kind of table as `data`: `item_column`, the `keep_columns`, then one column per kept annotator.

    Raises:
        ValueError: a missing column, a missing annotator or item id, an answer outside `label_names` or equal to -1
            (read as "missing" downstream), a repeat with `duplicates="error"`, a `min_answers` that removes every
            annotator, a `keep_columns` value that differs within an item, or two annotators mapping to one column.

    Example:

    ```python
    >>> import pandas as pd
    >>> from hf_defer import annotations_to_columns
    >>> long = pd.DataFrame({"item": [1, 1, 2, 3, 3], "who": ["ann", "bob", "ann", "ann", "bob"],
    ...                      "answer": ["pos", "neg", "neg", "pos", "pos"]})
    >>> annotations_to_columns(long, "item", "who", "answer")
       item  ann   bob
    0     1  pos   neg
    1     2  neg  None
    2     3  pos   pos

    ```
    """
    _check_long_table(data, item_column, annotator_column, answer_column, keep_columns, duplicates, min_answers)
    items, annotators, answers = (_values(data, name) for name in (item_column, annotator_column, answer_column))
    answered = _answered_rows(items, annotators, answers, item_column, annotator_column, answer_column, label_names)
    cells = _resolve_repeats(items, annotators, answers, answered, duplicates)
    kept = _kept_annotators(cells, min_answers)
    names = [f"{column_prefix}{annotator}" for annotator in kept]
    taken = [item_column, *keep_columns]
    clash = sorted({name for name in names if names.count(name) > 1 or name in taken})
    if clash:
        raise ValueError(f"annotator column name(s) {clash} collide with each other or with `item_column` / "
                         "`keep_columns`; pass a `column_prefix`.")
    return _wide_table(data, items, cells, dict(zip(names, kept)), item_column, answer_column, keep_columns)


def _check_long_table(data: Table, item_column: str, annotator_column: str, answer_column: str,
                      keep_columns: Sequence[str], duplicates: str, min_answers: int) -> None:
    """Checks the arguments of [`annotations_to_columns`]: the columns exist, the policy and minimum are valid."""
    _require(data, [item_column], "item_column")
    _require(data, [annotator_column], "annotator_column")
    _require(data, [answer_column], "answer_column")
    if isinstance(keep_columns, str):
        raise ValueError(f"`keep_columns` must be a list of column names, got the string {keep_columns!r}.")
    _require(data, list(keep_columns), "keep_columns")
    if duplicates not in DUPLICATE_POLICIES:
        raise ValueError(f"`duplicates` must be one of {DUPLICATE_POLICIES}, got {duplicates!r}.")
    if isinstance(min_answers, bool) or not isinstance(min_answers, numbers.Integral) or min_answers < 1:
        raise ValueError(f"`min_answers` must be an int >= 1, got {min_answers!r}.")


def _answered_rows(items: list[Any], annotators: list[Any], answers: list[Any], item_column: str,
                   annotator_column: str, answer_column: str, label_names: Sequence[Any] | None) -> list[int]:
    """The rows with an answer (the others counted in the log); every row needs an item and an annotator id, and
    no answer may be -1 or outside `label_names`."""
    for column, ids in ((annotator_column, annotators), (item_column, items)):
        bad = [row for row, value in enumerate(ids) if is_missing(value) or value == ""]
        if bad:
            raise ValueError(f"column {column!r} (`{'annotator' if ids is annotators else 'item'}_column`) has no id "
                             f"in {len(bad)} row(s), e.g. rows {bad[:5]}: every annotation needs one.")
    minus_one = [row for row, value in enumerate(answers)
                 if (value == -1 and not isinstance(value, bool)) or (isinstance(value, str) and value.strip() == "-1")]
    if minus_one:
        raise ValueError(f"column {answer_column!r} (`answer_column`) holds the answer -1 in rows {minus_one[:5]}; "
                         "prepare_deferral_dataset reads -1 as a missing answer: use class names or ids >= 0.")
    answered = [row for row, value in enumerate(answers) if not (is_missing(value) or value == "")]
    if len(answered) < len(answers):
        logger.info(f"annotations_to_columns: skipped {len(answers) - len(answered)} row(s) without an answer.")
    _check_label_set([answers[row] for row in answered], label_names, answer_column)
    return answered


def _resolve_repeats(items: list[Any], annotators: list[Any], answers: list[Any], answered: list[int],
                     duplicates: str) -> dict[tuple[Any, Any], Any]:
    """One answer per (item, annotator): a repeat resolved by `duplicates` (an error with `"error"`; a tie among a
    `"majority"` is `None`), the counts logged."""
    grouped: dict[tuple[Any, Any], list[Any]] = {}
    for row in answered:
        grouped.setdefault((items[row], annotators[row]), []).append(answers[row])
    repeated = [key for key, given in grouped.items() if len(given) > 1]
    if repeated and duplicates == "error":
        item, annotator = repeated[0]
        raise ValueError(
            f"annotator {annotator!r} answered item {item!r} {len(grouped[repeated[0]])} times ({len(repeated)} "
            f"repeated (item, annotator) pair(s) in all); pass duplicates='first', 'last' or 'majority'."
        )
    cells: dict[tuple[Any, Any], Any] = {}
    conflicts = 0
    for key, given in grouped.items():
        if duplicates == "last":
            cells[key] = given[-1]
        elif duplicates == "majority":
            cells[key], tied = _plurality(given)
            conflicts += tied
        else:
            cells[key] = given[0]
    if repeated:
        logger.info(f"annotations_to_columns: {len(repeated)} repeated (item, annotator) pair(s) resolved with "
                    f"duplicates={duplicates!r}.")
    if conflicts:
        logger.warning(f"annotations_to_columns: {conflicts} (item, annotator) pair(s) have tied repeated answers; "
                       "left missing (duplicates='majority' never picks between them).")
    return cells


def _kept_annotators(cells: dict[tuple[Any, Any], Any], min_answers: int) -> list[Any]:
    """The annotators with at least `min_answers` answers, sorted by name (the others named in the log)."""
    counts = Counter(annotator for (_, annotator), value in cells.items() if value is not None)
    kept = sorted((name for name, count in counts.items() if count >= min_answers), key=str)
    if not kept:
        raise ValueError(f"`min_answers`={min_answers} removes every annotator: the most answers any annotator gave "
                         f"is {max(counts.values(), default=0)}.")
    dropped = sorted((name for name in counts if name not in kept), key=str)
    if dropped:
        logger.warning(f"annotations_to_columns: dropped {len(dropped)} annotator(s) with fewer than {min_answers} "
                       f"answers: {dropped[:20]}.")
    return kept


def _wide_table(data: Table, items: list[Any], cells: dict[tuple[Any, Any], Any], annotator_of: dict[str, Any],
                item_column: str, answer_column: str, keep_columns: Sequence[str]) -> Table:
    """One row per item (in the order of first appearance): the item id, the `keep_columns`, then each annotator's
    answer (`None` where they gave none), as the same kind of table as `data`."""
    first_row: dict[Any, int] = {}
    for row, item in enumerate(items):
        first_row.setdefault(item, row)
    order = list(first_row)
    columns: dict[str, list[Any]] = {item_column: order}
    source_features = data.features if isinstance(data, datasets.Dataset) else {}
    features: dict[str, Any] = {item_column: source_features.get(item_column) or _feature_of(order, None)}
    for column in keep_columns:
        columns[column] = _item_level_values(data, column, items, first_row)
        features[column] = source_features.get(column) or _feature_of(columns[column], None)
    for name, annotator in annotator_of.items():
        columns[name] = [cells.get((item, annotator)) for item in order]
        features[name] = _feature_of(columns[name], source_features.get(answer_column))
    return _build(data, columns, features)


def _item_level_values(data: Table, column: str, items: list[Any], first_row: dict[Any, int]) -> list[Any]:
    """A `keep_columns` column's value per item (in `first_row`'s order); one that differs within an item is an
    error."""
    values = _values(data, column)
    for row, item in enumerate(items):
        first = values[first_row[item]]
        if values[row] != first and not (is_missing(values[row]) and is_missing(first)):
            raise ValueError(f"`keep_columns`: column {column!r} has different values for item {item!r} "
                             f"({first!r} and {values[row]!r}); keep only item-level columns.")
    return [values[first_row[item]] for item in first_row]


def _dawid_skene(answers: list[list[Any]], columns: Sequence[str], n_iter: int, tol: float) -> tuple[list, list]:
    try:
        from crowdkit.aggregation import DawidSkene
    except ImportError as error:
        raise ImportError("method='dawid_skene' needs crowd-kit: pip install 'hf-defer[crowd]'.") from error
    long = pd.DataFrame(
        [(row, column, value) for row, values in enumerate(answers) for column, value in zip(columns, values)
         if value is not None],
        columns=["task", "worker", "label"],
    )
    targets: list[Any] = [None] * len(answers)
    tied = [False] * len(answers)
    if long.empty:
        return targets, tied
    with warnings.catch_warnings():  # crowd-kit 1.4 uses pandas keywords (inplace=, copy=) that pandas 3 deprecates
        warnings.filterwarnings("ignore", module=r"crowdkit\.")
        probas = DawidSkene(n_iter=n_iter, tol=tol).fit_predict_proba(long)
    values = probas.to_numpy(dtype=np.float64)
    best = values.max(axis=1, keepdims=True)
    top = np.isclose(values, best, rtol=1e-9, atol=1e-12)
    for task, row_top, row_values in zip(probas.index, top, values):
        if row_top.sum() > 1:
            tied[int(task)] = True
        else:
            targets[int(task)] = _normalise(probas.columns[int(np.argmax(row_values))])
    return targets, tied


def aggregate_labels(
    data: Table,
    annotator_columns: Sequence[str],
    method: str = "majority",
    *,
    output_column: str = "labels",
    label_names: Sequence[Any] | None = None,
    n_iter: int = 100,
    tol: float = 1e-5,
) -> Table:
    """Build a target from annotators where no gold label exists; ties are marked, never broken.

    - `"majority"`: the most frequent answer among the annotators who answered the row, in `output_column`.
    - `"leave_one_out"`: for each annotator column `c`, the majority of the *other* annotators in `c_loo_target`, so
      that annotator `c` is never graded against their own vote (defined whether or not `c` answered the row).
    - `"dawid_skene"`: the most probable class under the Dawid–Skene model (Dawid and Skene, 1979), fitted by EM with
      crowd-kit's `DawidSkene` (`pip install 'hf-defer[crowd]'`), in `output_column`.

    A tied target (two classes with the most votes, or the same Dawid–Skene probability) is `None`, with `True` in
    the matching `<target>_tied` column (`labels_tied`, `c_loo_tied`); a row without any (other) answer is `None`
    with `False`. The number of tied rows is logged as a warning. `None` targets are rows to drop or mask, not a class.

    Args:
        data (`datasets.Dataset` or `pandas.DataFrame`): one row per item, one column per annotator (e.g. the output
            of [`annotations_to_columns`]); `None`, NaN or -1 is a missing answer.
        annotator_columns (`Sequence[str]`): the annotator columns (two or more for `"leave_one_out"`).
        method (`str`, *optional*, defaults to `"majority"`): one of `"majority"`, `"leave_one_out"`, `"dawid_skene"`.
        output_column (`str`, *optional*, defaults to `"labels"`): the target column of `"majority"` and
            `"dawid_skene"`.
        label_names (`Sequence`, *optional*): the label set; an answer outside it is an error.
        n_iter (`int`, *optional*, defaults to 100), tol (`float`, *optional*, defaults to 1e-5): EM iterations and
            tolerance of `"dawid_skene"`.

    Returns:
        The same kind of table as `data` with the target and `_tied` columns added.

    Raises:
        ValueError: an unknown `method`, a missing or repeated annotator column, an answer outside `label_names`, fewer
            than two annotators for `"leave_one_out"`, or an output column that already exists.
        ImportError: `"dawid_skene"` without crowd-kit installed.

    Example:

    ```python
    >>> import pandas as pd
    >>> from hf_defer import aggregate_labels
    >>> wide = pd.DataFrame({"ann": ["pos", "neg", "pos"], "bob": ["pos", "pos", None], "cy": ["neg", "neg", "neg"]})
    >>> aggregate_labels(wide, ["ann", "bob", "cy"])[["labels", "labels_tied"]]
      labels  labels_tied
    0    pos        False
    1    neg        False
    2   None         True
    >>> aggregate_labels(wide, ["ann", "bob", "cy"], method="leave_one_out")["cy_loo_target"].tolist()
    ['pos', None, 'pos']

    ```
    """
    columns = _checked_annotator_columns(data, annotator_columns, method, output_column)
    rows, shared = _annotator_answers(data, columns, label_names)
    if method == "leave_one_out":
        added, flags = _leave_one_out_targets(rows, columns)
    else:
        if method == "majority":
            results = [_plurality([value for value in row if value is not None]) for row in rows]
            targets, tied = [target for target, _ in results], [flag for _, flag in results]
        else:
            targets, tied = _dawid_skene(rows, columns, n_iter, tol)
        added, flags = {output_column: targets, f"{output_column}_tied": tied}, [f"{output_column}_tied"]
    features: dict[str, Any] = {}
    for name, values in added.items():
        features[name] = datasets.Value("bool") if name in flags else _feature_of(values, shared)
    ties = {name: int(sum(added[name])) for name in flags if any(added[name])}
    if ties:
        logger.warning(f"aggregate_labels(method={method!r}): tied rows left as None (not broken): {ties}.")
    return _add_columns(data, added, features)


def _checked_annotator_columns(data: Table, annotator_columns: Sequence[str], method: str,
                               output_column: str) -> list[str]:
    """The annotator columns of [`aggregate_labels`], checked with its method and output column."""
    if method not in AGGREGATION_METHODS:
        raise ValueError(f"`method` must be one of {AGGREGATION_METHODS}, got {method!r}.")
    _columns(data, "data")
    if isinstance(annotator_columns, str) or not annotator_columns:
        raise ValueError(f"`annotator_columns` must be a non-empty list of column names, got {annotator_columns!r}.")
    columns = list(annotator_columns)
    repeated = sorted({name for name in columns if columns.count(name) > 1})
    if repeated:
        raise ValueError(f"`annotator_columns` names {repeated} more than once.")
    _require(data, columns, "annotator_columns")
    if method == "leave_one_out" and len(columns) < 2:
        raise ValueError(f"method='leave_one_out' needs at least two `annotator_columns`, got {columns}.")
    if not isinstance(output_column, str) or not output_column:
        raise ValueError(f"`output_column` must be a non-empty column name, got {output_column!r}.")
    return columns


def _annotator_answers(data: Table, columns: list[str],
                       label_names: Sequence[Any] | None) -> tuple[list[list[Any]], Any]:
    """Each row's answers (`None` where missing; each checked against `label_names`) and the feature the annotator
    columns share (a `Dataset`'s, when all have the same), for the targets."""
    by_column = {}
    for column in columns:
        values = [None if is_missing(value) else value for value in _values(data, column)]
        _check_label_set(values, label_names, column)
        by_column[column] = values
    rows = [list(answers) for answers in zip(*by_column.values())]
    source = data.features.get(columns[0]) if isinstance(data, datasets.Dataset) else None
    shared = source if isinstance(data, datasets.Dataset) and all(
        data.features[column] == source for column in columns) else None
    return rows, shared


def _leave_one_out_targets(rows: list[list[Any]], columns: list[str]) -> tuple[dict[str, list[Any]], list[str]]:
    """For each annotator column `c`, the majority of the other annotators (`c_loo_target`) and its tie flags
    (`c_loo_tied`); and the names of the flag columns."""
    added: dict[str, list[Any]] = {}  # target, then its tie flags, per target
    flags: list[str] = []
    for j, column in enumerate(columns):
        results = [_plurality([value for k, value in enumerate(row) if k != j and value is not None]) for row in rows]
        added[f"{column}_loo_target"] = [target for target, _ in results]
        added[f"{column}_loo_tied"] = [tied for _, tied in results]
        flags.append(f"{column}_loo_tied")
    return added, flags
