"""Simulated experts for learning to defer.

Every function here takes a `datasets.Dataset` and returns a new one with an added integer column (by default
`expert_labels`) that holds what the expert would answer for each example. The draws are seeded: the same `seed`
(or the same state of a `numpy.random.Generator`) gives the same expert labels.

- [`annotator_expert`]: the HateSpeech expert of Mozannar et al. (2023) and Cao et al. (2023): the label of one
  random annotator, drawn from the per-example annotator counts.
- [`class_subset_expert`]: the CIFAR-style synthetic expert: accurate (with probability `p`) on the first `k`
  classes, uniformly random elsewhere.
- [`dialect_biased_expert`]: the "synthetic" HateSpeech expert of Mozannar et al. (2023), whose accuracy depends on
  the dialect of the text (flags from any dialect model; the experiments use TwitterAAE, `research/twitteraae.py`).
- [`annotator_accuracy`]: the exact accuracy of [`annotator_expert`] on each example, `counts[label] / sum(counts)`.
- [`model_expert`] (from [`hf_defer.experts.model_experts`]): the answers of a model (pipeline, model, callable) as an expert.
- [`stack_experts`]: turns M single-expert columns into the list column `expert_labels` of an M-expert dataset.
"""

from __future__ import annotations

from collections.abc import Sequence

import datasets
import numpy as np

from ..modeling.validators import check_positive_int, check_probability, is_int

__all__ = ["annotator_accuracy", "annotator_expert", "class_subset_expert", "dialect_biased_expert",
           "stack_experts"]

SeedLike = int | np.random.Generator


def _make_rng(seed: SeedLike) -> np.random.Generator:
    """Return a numpy Generator from a non-negative int seed (or the Generator itself)."""
    if isinstance(seed, np.random.Generator):
        return seed
    if not is_int(seed) or seed < 0:
        raise ValueError(f"`seed` must be a non-negative int or a numpy.random.Generator, got {seed!r}.")
    return np.random.default_rng(int(seed))


def check_dataset(dataset: object) -> datasets.Dataset:
    """``dataset`` if it is a `datasets.Dataset` (a `DatasetDict` is refused with the advice to apply the expert to
    each split), for the simulated and the model experts."""
    if isinstance(dataset, datasets.DatasetDict):
        raise ValueError("`dataset` must be a datasets.Dataset, got a DatasetDict; apply the expert to each split "
                         "(or, better, to the full dataset before splitting so every example keeps one expert label).")
    if not isinstance(dataset, datasets.Dataset):
        raise ValueError(f"`dataset` must be a datasets.Dataset, got {type(dataset).__name__}.")
    return dataset


def check_column_name(name: object, argument: str) -> str:
    """``name`` if it is a non-empty string (a column name), else a `ValueError` naming ``argument``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"`{argument}` must be a non-empty column name (str), got {name!r}.")
    return name


def require_columns(dataset: datasets.Dataset, names: Sequence[str], argument: str) -> None:
    """A `ValueError` naming ``argument``, the missing columns and the dataset's columns, unless ``dataset`` has every
    column of ``names``."""
    missing = [name for name in names if name not in dataset.column_names]
    if missing:
        raise ValueError(f"`{argument}` names column(s) {missing} that the dataset does not have; "
                         f"available columns: {dataset.column_names}.")


def _numeric_columns(dataset: datasets.Dataset, names: Sequence[str]) -> dict[str, np.ndarray]:
    """Read columns as numpy arrays (respecting any indices mapping of the dataset)."""
    if len(dataset) == 0:
        return {name: np.zeros((0,), dtype=np.int64) for name in names}
    arrays = dict(dataset.with_format("numpy", columns=list(names))[:])  # datasets < 5: a float NaN column as objects
    floats = {n: f.dtype for n, f in dataset.features.items() if isinstance(f, datasets.Value) and "float" in f.dtype}
    return {n: v.astype(floats[n]) if v.dtype == object and n in floats else v for n, v in arrays.items()}


def _first_rows(mask: np.ndarray, limit: int = 5) -> list[int]:
    return np.flatnonzero(mask)[:limit].tolist()


def _class_labels(dataset: datasets.Dataset, label_column: str, num_classes: int) -> np.ndarray:
    """The integer labels in `label_column`, checked to lie in `[0, num_classes)`."""
    labels = _numeric_columns(dataset, [label_column])[label_column]
    if labels.ndim != 1 or (len(labels) and not np.issubdtype(labels.dtype, np.integer)):
        raise ValueError(f"`label_column` {label_column!r} must hold one integer class id per row, got dtype "
                         f"{labels.dtype} and shape {labels.shape}.")
    labels = labels.astype(np.int64)
    bad = (labels < 0) | (labels >= num_classes)
    if bad.any():
        raise ValueError(f"`label_column` {label_column!r} must hold labels in [0, {num_classes}) "
                         f"(`num_classes`={num_classes}); rows {_first_rows(bad)} have {labels[bad][:5].tolist()}.")
    return labels


def _replace_column(
    dataset: datasets.Dataset, column: str, values: np.ndarray | list, feature: datasets.features.FeatureType
) -> datasets.Dataset:
    if column in dataset.column_names:
        dataset = dataset.remove_columns(column)
    return dataset.add_column(column, values, feature=feature)


def _count_matrix(dataset: datasets.Dataset, count_columns: str | Sequence[str], column: str) -> np.ndarray:
    """The `[N, K]` annotator counts named by `count_columns`, checked (`column` is the one to be written)."""
    if isinstance(count_columns, str):
        require_columns(dataset, [count_columns], "count_columns")
        if column == count_columns:
            raise ValueError(f"`column` ({column!r}) must differ from the count column {count_columns!r}.")
        raw = _numeric_columns(dataset, [count_columns])[count_columns]
        if len(dataset) == 0:
            raw = raw.reshape(0, 1)
        if raw.dtype == object:
            lengths = sorted({len(row) for row in raw})
            raise ValueError(f"`count_columns` column {count_columns!r} must hold one list of K counts per row with "
                             f"the same K in every row; got lists of lengths {lengths}.")
        if raw.ndim != 2:
            raise ValueError(f"`count_columns` column {count_columns!r} must be list-valued (K counts per row); got "
                             "a column of scalars. Pass the K per-class count columns as a list instead.")
        counts = raw
    else:
        if not isinstance(count_columns, Sequence) or len(count_columns) == 0:
            raise ValueError("`count_columns` must be a column name or a non-empty sequence of column names, got "
                             f"{count_columns!r}.")
        names = [check_column_name(name, "count_columns") for name in count_columns]
        if len(set(names)) != len(names):
            raise ValueError(f"`count_columns` must not repeat a column, got {names}.")
        require_columns(dataset, names, "count_columns")
        if column in names:
            raise ValueError(f"`column` ({column!r}) must differ from the count columns {names}.")
        arrays = _numeric_columns(dataset, names)
        for name in names:
            if arrays[name].ndim != 1:
                raise ValueError(f"`count_columns` entry {name!r} must be a scalar numeric column, got values of shape "
                                 f"{arrays[name].shape[1:]} per row.")
        counts = np.stack([arrays[name] for name in names], axis=1) if len(dataset) else np.zeros((0, len(names)))

    if not (np.issubdtype(counts.dtype, np.number) and not np.issubdtype(counts.dtype, np.complexfloating)):
        raise ValueError(f"`count_columns` must hold real numbers, got values of dtype {counts.dtype}.")
    counts = counts.astype(np.float64) if not np.issubdtype(counts.dtype, np.integer) else counts.astype(np.int64)
    num_rows, num_classes = counts.shape
    if num_rows and not np.all(np.isfinite(counts)):
        raise ValueError("`count_columns` must hold finite counts; rows "
                         f"{_first_rows(~np.isfinite(counts).all(axis=1))} have NaN or infinite values.")
    if num_rows and (counts < 0).any():
        raise ValueError(f"`count_columns` must hold non-negative counts; rows {_first_rows((counts < 0).any(axis=1))} "
                         "have negative values.")
    totals = counts.sum(axis=1)
    if num_rows and (totals <= 0).any():
        raise ValueError("every row needs a positive total count to draw an annotator, but rows "
                         f"{_first_rows(totals <= 0)} have counts summing to 0 (`count_columns`={count_columns!r}).")
    return counts


def annotator_expert(
    dataset: datasets.Dataset,
    count_columns: str | Sequence[str],
    seed: SeedLike = 0,
    column: str = "expert_labels",
) -> datasets.Dataset:
    """Add the label of one random annotator per example, drawn from per-class annotator counts.

    This is the real-human expert of the HateSpeech benchmark (Davidson et al., 2017) as used by
    `human_ai_deferral` and by Cao et al. (2023): for an example with counts `c = (c_0, ..., c_{K-1})`
    (how many annotators chose each class) the expert answers `m ~ Categorical(c / c.sum())`. With integer counts
    this is exactly "pick one of the `c.sum()` annotators uniformly and report their label".

    Args:
        dataset (`datasets.Dataset`):
            The examples. It is not modified; a new dataset is returned.
        count_columns (`str` or `Sequence[str]`):
            Either the per-class count columns in class order (e.g. `["hate_speech", "offensive_language",
            "neither"]`), or the name of one list-valued column holding the K counts of each example. Counts
            must be non-negative numbers (integers or frequencies) with a positive sum in every row.
        seed (`int` or `numpy.random.Generator`, *optional*, defaults to 0):
            Seed of the draws; the same seed gives the same expert labels.
        column (`str`, *optional*, defaults to `"expert_labels"`):
            Name of the added int64 column. An existing column of that name (other than a count column) is replaced.

    Returns:
        `datasets.Dataset`: `dataset` with the added column of expert labels in `[0, K)`.

    Raises:
        ValueError: unknown or non-numeric columns, negative or non-finite counts, rows whose counts sum to zero.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts import annotator_expert
    >>> ds = datasets.Dataset.from_dict({"a": [3, 0, 1], "b": [0, 2, 0], "c": [0, 0, 0]})
    >>> annotator_expert(ds, ["a", "b", "c"], seed=0)["expert_labels"][:2]  # unanimous rows
    [0, 1]

    ```
    """
    dataset = check_dataset(dataset)
    column = check_column_name(column, "column")
    rng = _make_rng(seed)
    counts = _count_matrix(dataset, count_columns, column)
    num_rows, num_classes = counts.shape
    totals = counts.sum(axis=1)
    cumulative = np.cumsum(counts, axis=1)
    if np.all(counts == np.floor(counts)):
        # Integer counts: pick annotator u ~ Uniform{0, ..., total-1} and report the class it falls in.
        totals_int = totals.astype(np.int64)
        draws = rng.integers(0, totals_int) if num_rows else np.zeros((0,), dtype=np.int64)
        labels = (cumulative <= draws[:, None]).sum(axis=1)
    else:
        # Frequencies: inverse-CDF sampling; guard the measure-zero round-off u == total.
        draws = rng.random(num_rows) * totals
        labels = (cumulative <= draws[:, None]).sum(axis=1)
        last_positive = num_classes - 1 - np.argmax((counts > 0)[:, ::-1], axis=1)
        labels = np.minimum(labels, last_positive)
    labels = labels.astype(np.int64)
    return _replace_column(dataset, column, labels, datasets.Value("int64"))


def class_subset_expert(
    dataset: datasets.Dataset,
    num_classes: int,
    k: int,
    p: float,
    seed: SeedLike = 0,
    label_column: str = "labels",
    column: str = "expert_labels",
) -> datasets.Dataset:
    """Add a synthetic expert that knows the first `k` classes (the CIFAR-10/100 protocol of the L2D literature).

    For an example whose true label `y` is one of the first `k` classes (`y < k`) the expert returns `y` with
    probability `p` and otherwise a label drawn uniformly from all `num_classes` classes (which may also be `y`);
    for the other classes it returns a uniformly random label. Its accuracy is therefore
    `p + (1 - p) / num_classes` on the first `k` classes and `1 / num_classes` on the rest.

    Args:
        dataset (`datasets.Dataset`):
            The examples, with integer labels in `label_column`.
        num_classes (`int`):
            Number of classes K (labels must lie in `[0, K)`).
        k (`int`):
            How many classes (the first `k`: ids `0 .. k-1`) the expert knows; `0 < k <= num_classes`.
        p (`float`):
            Probability of answering correctly (before the uniform fallback) on the known classes; `0 <= p <= 1`.
        seed (`int` or `numpy.random.Generator`, *optional*, defaults to 0):
            Seed of the draws; the same seed gives the same expert labels.
        label_column (`str`, *optional*, defaults to `"labels"`):
            Column holding the true labels.
        column (`str`, *optional*, defaults to `"expert_labels"`):
            Name of the added int64 column. An existing column of that name is replaced.

    Returns:
        `datasets.Dataset`: `dataset` with the added column of expert labels.

    Raises:
        ValueError: invalid `num_classes`, `k`, `p`, an unknown label column or labels outside `[0, num_classes)`.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts import class_subset_expert
    >>> ds = datasets.Dataset.from_dict({"labels": [0, 1, 2, 3] * 3})
    >>> out = class_subset_expert(ds, num_classes=4, k=2, p=1.0, seed=0)
    >>> [m for y, m in zip(out["labels"], out["expert_labels"]) if y < 2]  # perfect on classes 0 and 1
    [0, 1, 0, 1, 0, 1]

    ```
    """
    dataset = check_dataset(dataset)
    check_positive_int(num_classes, "num_classes")
    if not is_int(k) or not 0 < k <= num_classes:
        raise ValueError(f"`k` must be an int with 0 < k <= num_classes ({num_classes}), got {k!r}.")
    p = check_probability(p, "p")
    label_column = check_column_name(label_column, "label_column")
    column = check_column_name(column, "column")
    if column == label_column:
        raise ValueError(f"`column` ({column!r}) must differ from `label_column` ({label_column!r}).")
    require_columns(dataset, [label_column], "label_column")
    rng = _make_rng(seed)
    labels = _class_labels(dataset, label_column, num_classes)
    num_rows = len(labels)
    correct = rng.random(num_rows) < float(p)
    random_labels = rng.integers(0, int(num_classes), size=num_rows)
    expert = np.where((labels < k) & correct, labels, random_labels).astype(np.int64)
    return _replace_column(dataset, column, expert, datasets.Value("int64"))


def stack_experts(
    dataset: datasets.Dataset,
    columns: Sequence[str],
    column: str = "expert_labels",
    remove_columns: bool = True,
) -> datasets.Dataset:
    """Combine M single-expert columns into one list column of M expert labels per example.

    Multi-expert deferral models (`num_experts=M`) read `expert_labels` as a list of M ints whose j-th entry is the
    answer of expert j, in the order of `columns`.

    Args:
        dataset (`datasets.Dataset`):
            The examples.
        columns (`Sequence[str]`):
            The M (>= 1) integer columns, one per expert, in expert order.
        column (`str`, *optional*, defaults to `"expert_labels"`):
            Name of the list column to create. It may be one of `columns` when `remove_columns` is True.
        remove_columns (`bool`, *optional*, defaults to True):
            Drop the single-expert columns after stacking.

    Returns:
        `datasets.Dataset`: `dataset` with `column` holding fixed-length lists of M int64 labels.

    Raises:
        ValueError: empty or repeated `columns`, unknown or non-integer columns, or a name clash with a kept column.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts import stack_experts
    >>> ds = datasets.Dataset.from_dict({"doctor": [0, 1], "nurse": [1, 1]})
    >>> list(stack_experts(ds, ["doctor", "nurse"])["expert_labels"])
    [[0, 1], [1, 1]]

    ```
    """
    dataset = check_dataset(dataset)
    column = check_column_name(column, "column")
    if isinstance(columns, str) or not isinstance(columns, Sequence) or len(columns) == 0:
        raise ValueError(f"`columns` must be a non-empty sequence of column names, got {columns!r}.")
    names = [check_column_name(name, "columns") for name in columns]
    if len(set(names)) != len(names):
        raise ValueError(f"`columns` must not repeat a column, got {names}.")
    require_columns(dataset, names, "columns")
    if not remove_columns and column in names:
        raise ValueError(f"`column` ({column!r}) is one of `columns` {names}; it can only be reused with "
                         "remove_columns=True.")
    arrays = _numeric_columns(dataset, names)
    for name in names:
        values = arrays[name]
        if values.ndim != 1 or (len(values) and not np.issubdtype(values.dtype, np.integer)):
            raise ValueError(f"`columns` entry {name!r} must hold one integer label per row, got dtype {values.dtype} "
                             f"and shape {values.shape}.")
    stacked = np.stack([arrays[name].astype(np.int64) for name in names], axis=1)
    feature = datasets.List(datasets.Value("int64"), length=len(names))
    # Add first, under a free temporary name, then drop: removing every column first would leave a 0-row table.
    temporary = column
    while temporary in dataset.column_names:
        temporary = f"_{temporary}"
    dataset = dataset.add_column(temporary, list(stacked), feature=feature)
    drop = list(names) if remove_columns else []
    if temporary != column and column not in drop:
        drop.append(column)  # an existing column of that name is replaced
    dataset = dataset.remove_columns(drop)
    return dataset.rename_column(temporary, column) if temporary != column else dataset


def annotator_accuracy(
    dataset: datasets.Dataset, count_columns: str | Sequence[str], label_column: str = "labels"
) -> np.ndarray:
    """The true accuracy of [`annotator_expert`] per example, `counts[label] / sum(counts)`, as an `[N]` array.

    On HateSpeech (`labels` = the majority class) it is the chance that a random annotator gives the majority label,
    the truth an estimate of `Pr(M = Y | x)` is compared with. `count_columns` as for [`annotator_expert`].

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts import annotator_accuracy
    >>> ds = datasets.Dataset.from_dict({"labels": [1, 2], "a": [0, 1], "b": [3, 1], "c": [0, 2]})
    >>> annotator_accuracy(ds, ["a", "b", "c"]).tolist()
    [1.0, 0.5]

    ```
    """
    dataset = check_dataset(dataset)
    label_column = check_column_name(label_column, "label_column")
    require_columns(dataset, [label_column], "label_column")
    counts = _count_matrix(dataset, count_columns, label_column)
    labels = _class_labels(dataset, label_column, counts.shape[1])
    return counts[np.arange(len(labels)), labels] / counts.sum(axis=1)


def dialect_biased_expert(
    dataset: datasets.Dataset,
    aae: str | Sequence[bool] | np.ndarray,
    num_classes: int,
    p_aae: float = 0.6,
    p_other: float = 0.9,
    seed: SeedLike = 0,
    label_column: str = "labels",
    column: str = "expert_labels",
) -> datasets.Dataset:
    """Add the labels of an annotator whose accuracy depends on the dialect of the text.

    On an AAE example the expert gives the true label with probability `p_aae`, elsewhere with probability
    `p_other`; otherwise a label drawn uniformly from the `num_classes` classes (which may be the true one).

    Args:
        dataset (`datasets.Dataset`): the examples; not modified.
        aae (`str` or sequence of `bool`): a boolean column of `dataset`, or one flag per example
            (e.g. `TwitterAAE(...).is_aae(dataset["text"])` of `research/twitteraae.py`, outside the package).
        num_classes (`int`): number of classes K (at least 2).
        p_aae (`float`, *optional*, defaults to 0.6): probability of being right on AAE examples.
        p_other (`float`, *optional*, defaults to 0.9): probability of being right on the other examples.
        seed (`int` or `numpy.random.Generator`, *optional*, defaults to 0): seed of the draws.
        label_column (`str`, *optional*, defaults to `"labels"`): column with the true labels.
        column (`str`, *optional*, defaults to `"expert_labels"`): name of the added int64 column (replaced if present).

    Returns:
        `datasets.Dataset`: `dataset` with the expert's labels in `column`.

    Example:

    ```python
    >>> import datasets
    >>> from hf_defer.experts import dialect_biased_expert
    >>> ds = datasets.Dataset.from_dict({"labels": [0, 1, 2, 1]})
    >>> dialect_biased_expert(ds, [True, True, False, False], 3, p_aae=0.0, p_other=1.0)["expert_labels"][2:]
    [2, 1]

    ```
    """
    dataset = check_dataset(dataset)
    if not is_int(num_classes) or num_classes < 2:
        raise ValueError(f"`num_classes` must be an int >= 2, got {num_classes!r}.")
    p_aae, p_other = check_probability(p_aae, "p_aae"), check_probability(p_other, "p_other")
    label_column = check_column_name(label_column, "label_column")
    column = check_column_name(column, "column")
    if column == label_column:
        raise ValueError(f"`column` ({column!r}) must differ from `label_column`.")
    require_columns(dataset, [label_column], "label_column")
    if isinstance(aae, str):
        require_columns(dataset, [aae], "aae")
        flags = _numeric_columns(dataset, [aae])[aae]
    else:
        flags = np.asarray(aae)
    if flags.size == 0:  # an empty column reads back as float
        flags = flags.astype(bool)
    if flags.shape != (len(dataset),) or flags.dtype != bool:
        raise ValueError(f"`aae` must hold one bool per example ({len(dataset)}), got dtype {flags.dtype} and shape "
                         f"{flags.shape}.")
    labels = _class_labels(dataset, label_column, int(num_classes))
    rng = _make_rng(seed)
    right = rng.random(len(labels)) < np.where(flags, p_aae, p_other)
    guess = rng.integers(0, int(num_classes), size=len(labels))
    expert = np.where(right, labels, guess).astype(np.int64)
    return _replace_column(dataset, column, expert, datasets.Value("int64"))

