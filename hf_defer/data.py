"""Dataset loaders and the batch collator for learning to defer.

- [`load_hatespeech`]: the HateSpeech benchmark (Davidson et al., 2017) with the real-human "random annotator"
  expert, as a `datasets.DatasetDict` with a seeded 70/10/20 train/validation/test split.
- [`DataCollatorForDeferral`]: pads tokenized text (or stacks precomputed feature vectors / pixel values) and keeps
  `labels` and `expert_labels` as integer tensors, ready for `EncoderForDeferral` and `DeferralTrainer`.
"""

from __future__ import annotations

import io
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase
from transformers.utils import PaddingStrategy

from .bundled_data import bundled_bytes
from .experts import annotator_expert

__all__ = [
    "HATESPEECH_CITATION",
    "HATESPEECH_HUB_ID",
    "HATESPEECH_LABELS",
    "DataCollatorForDeferral",
    "default_hatespeech_source",
    "load_hatespeech",
]

HATESPEECH_HUB_ID = "tdavidson/hate_speech_offensive"
"""Hub id of the Davidson et al. (2017) data, read only when asked for: `load_hatespeech(HATESPEECH_HUB_ID)`."""

HATESPEECH_CITATION = """@inproceedings{davidson2017automated,
  title     = {Automated Hate Speech Detection and the Problem of Offensive Language},
  author    = {Davidson, Thomas and Warmsley, Dana and Macy, Michael and Weber, Ingmar},
  booktitle = {Proceedings of the 11th International AAAI Conference on Web and Social Media (ICWSM)},
  year      = {2017}
}"""
"""BibTeX of the HateSpeech data (MIT license; the tweets contain offensive language)."""

HATESPEECH_LABELS = ("hate_speech", "offensive_language", "neither")
"""Class names of HateSpeech in class-id order; also the names of the per-class annotator count columns."""

_CSV_COLUMNS = ("count", "hate_speech", "offensive_language", "neither", "class", "tweet")
_HUB_COLUMNS = ("count", "hate_speech_count", "offensive_language_count", "neither_count", "class", "tweet")
_HUB_RENAMES = {"hate_speech_count": "hate_speech", "offensive_language_count": "offensive_language",
                "neither_count": "neither"}
_CSV_NAME = "labeled_data.csv"
_HUB_ID_PATTERN = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def default_hatespeech_source() -> str | None:
    """Where [`load_hatespeech`] reads from when `path_or_repo` is None.

    The environment variable `HF_DEFER_HATESPEECH` (a local path or a Hub dataset id) if it is set; otherwise `None`,
    which means the copy shipped inside the package (`hf_defer/bundled/hatespeech/labeled_data.csv.gz`, checked
    against its upstream SHA-256 when read). The Hub is only used when a Hub id is asked for explicitly.

    Returns:
        `str` or `None`: the configured source, or `None` for the shipped copy.

    Example:

    ```python
    >>> from hf_defer.data import default_hatespeech_source
    >>> source = default_hatespeech_source()  # None unless $HF_DEFER_HATESPEECH is set

    ```
    """
    return os.environ.get("HF_DEFER_HATESPEECH") or None


def _local_csv(source: str) -> Path | None:
    """Return the CSV behind a local path, None for a Hub id, or raise for a local path that does not exist."""
    path = Path(source).expanduser()
    if path.is_dir():
        for candidate in (path / _CSV_NAME, path / "hatespeech" / _CSV_NAME, path / f"{_CSV_NAME}.gz"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(
            f"`path_or_repo` is the directory {str(path)!r}, which does not contain {_CSV_NAME} "
            f"(looked for {str(path / _CSV_NAME)!r} and {str(path / 'hatespeech' / _CSV_NAME)!r})."
        )
    if path.is_file():
        return path
    looks_local = (
        source.lower().endswith((".csv", ".csv.gz"))
        or os.path.isabs(source)
        or source.startswith((".", "~"))
        or not _HUB_ID_PATTERN.match(source)
    )
    if looks_local:
        raise FileNotFoundError(
            f"`path_or_repo` {source!r} looks like a local path but no such file or directory exists; expected the "
            f"Davidson CSV ({_CSV_NAME}), a directory containing it, or a Hub dataset id such as {HATESPEECH_HUB_ID!r}."
        )
    return None


def _check_columns(found: Sequence[Any], expected: Sequence[str], source: str) -> None:
    missing = [name for name in expected if name not in found]
    if missing:
        raise ValueError(
            f"`path_or_repo` {source!r} does not have the HateSpeech columns: expected {list(expected)}, "
            f"missing {missing}, found {list(map(str, found))}."
        )


def _read_csv(path: Path | io.BytesIO, name: str) -> pd.DataFrame:
    # keep_default_na=False: tweets such as "NA" or "null" must stay strings. A `.gz` path is decompressed.
    frame = pd.read_csv(path, dtype={"tweet": str}, keep_default_na=False)
    unnamed = [name for name in frame.columns if str(name) == "" or str(name).startswith("Unnamed:")]
    frame = frame.drop(columns=unnamed)
    _check_columns(list(frame.columns), _CSV_COLUMNS, name)
    return frame


def _read_hub(repo_id: str) -> pd.DataFrame:
    loaded = datasets.load_dataset(repo_id, split="train")
    if isinstance(loaded, datasets.DatasetDict):  # defensive: a loader that ignores `split`
        loaded = datasets.concatenate_datasets(list(loaded.values()))
    _check_columns(loaded.column_names, _HUB_COLUMNS, repo_id)
    frame = loaded.select_columns(list(_HUB_COLUMNS)).to_pandas()
    return frame.rename(columns=_HUB_RENAMES)


def _to_dataset(frame: pd.DataFrame, source: str) -> datasets.Dataset:
    """Validate the six HateSpeech columns and build the Dataset with `text`, `labels` and the counts."""
    numeric: dict[str, np.ndarray] = {}
    for name in ("count", *HATESPEECH_LABELS, "class"):
        values = pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
        bad = ~np.isfinite(values) | (values != np.round(values)) | (values < 0)
        if bad.any():
            rows = np.flatnonzero(bad)[:5].tolist()
            raise ValueError(
                f"`path_or_repo` {source!r}: column {name!r} must hold non-negative integers; rows {rows} have "
                f"{frame[name].iloc[rows].tolist()}."
            )
        numeric[name] = values.astype(np.int64)
    bad = numeric["class"] >= len(HATESPEECH_LABELS)
    if bad.any():
        raise ValueError(
            f"`path_or_repo` {source!r}: column 'class' must be in {{0, 1, 2}}; rows "
            f"{np.flatnonzero(bad)[:5].tolist()} have {numeric['class'][bad][:5].tolist()}."
        )
    per_class = sum(numeric[name] for name in HATESPEECH_LABELS)
    bad = per_class != numeric["count"]
    if bad.any():
        raise ValueError(
            f"`path_or_repo` {source!r}: the annotator counts {list(HATESPEECH_LABELS)} must add up to 'count'; "
            f"they do not in rows {np.flatnonzero(bad)[:5].tolist()}."
        )
    tweets = frame["tweet"].tolist()
    if not all(isinstance(text, str) for text in tweets):
        rows = [i for i, text in enumerate(tweets) if not isinstance(text, str)][:5]
        raise ValueError(f"`path_or_repo` {source!r}: column 'tweet' must hold strings; rows {rows} do not.")
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "labels": datasets.ClassLabel(names=list(HATESPEECH_LABELS)),
            "count": datasets.Value("int64"),
            **{name: datasets.Value("int64") for name in HATESPEECH_LABELS},
        }
    )
    return datasets.Dataset.from_dict(
        {
            "text": tweets,
            "labels": numeric["class"],
            "count": numeric["count"],
            **{name: numeric[name] for name in HATESPEECH_LABELS},
        },
        features=features,
    )


def _check_seed(value: object, argument: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"`{argument}` must be a non-negative int, got {value!r}.")
    return int(value)


def _split_sizes(num_rows: int, split: Sequence[float]) -> tuple[int, int, int]:
    if isinstance(split, str) or not isinstance(split, Sequence) or len(split) != 3:
        raise ValueError(f"`split` must be three fractions (train, validation, test), got {split!r}.")
    fractions = []
    for value in split:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < float(value) < 1:
            raise ValueError(f"`split` fractions must each lie in (0, 1), got {tuple(split)!r}.")
        fractions.append(float(value))
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise ValueError(f"`split` fractions must sum to 1, got {tuple(split)!r} (sum {sum(fractions)}).")
    num_validation = round(fractions[1] * num_rows)
    num_test = round(fractions[2] * num_rows)
    num_train = num_rows - num_validation - num_test
    if min(num_train, num_validation, num_test) < 1:
        raise ValueError(
            f"`split` {tuple(split)!r} of {num_rows} rows leaves an empty split "
            f"(train {num_train}, validation {num_validation}, test {num_test})."
        )
    return num_train, num_validation, num_test


def load_hatespeech(
    path_or_repo: str | os.PathLike | None = None,
    seed: int = 0,
    split: Sequence[float] = (0.7, 0.1, 0.2),
    expert_seed: int | None = None,
) -> datasets.DatasetDict:
    """Load HateSpeech (Davidson et al., 2017) with its real-human expert, split into train/validation/test.

    Each tweet was labeled by 3 to 9 CrowdFlower annotators; `labels` is the majority class and the expert is
    one random annotator, `expert_labels ~ Categorical(counts / count)` (see [`annotator_expert`]), drawn once per
    example before splitting. Its expected accuracy against `labels` is 0.905 on the full data. This follows
    `human_ai_deferral` (Mozannar et al., 2023) and Cao et al. (2023, Table 2), except that the split is seeded.

    Args:
        path_or_repo (`str` or `os.PathLike`, *optional*):
            The Davidson CSV (`labeled_data.csv` or `labeled_data.csv.gz`: an unnamed index column, then `count`,
            `hate_speech`, `offensive_language`, `neither`, `class`, `tweet`), a directory containing it, or a Hub
            dataset id with the columns of `tdavidson/hate_speech_offensive` (`count`, `hate_speech_count`,
            `offensive_language_count`, `neither_count`, `class`, `tweet`), loaded with `datasets.load_dataset`.
            Defaults to `$HF_DEFER_HATESPEECH` when set, else the copy shipped in the package (MIT license,
            checksum-verified); the Hub is only read when its id is passed.
        seed (`int`, *optional*, defaults to 0):
            Seed of the split (and of the expert draws unless `expert_seed` is given).
        split (`Sequence[float]`, *optional*, defaults to `(0.7, 0.1, 0.2)`):
            Train, validation and test fractions; each in (0, 1), summing to 1. Sizes are rounded, train takes
            the remainder.
        expert_seed (`int`, *optional*):
            Seed of the random-annotator draws; defaults to `seed`. Fix it to keep the expert labels while
            varying the split.

    Returns:
        `datasets.DatasetDict`: splits `train`, `validation`, `test`, each with columns `text` (the tweet),
        `labels` (`ClassLabel` with names `["hate_speech", "offensive_language", "neither"]`), `count`,
        `hate_speech`, `offensive_language`, `neither` (annotator counts) and `expert_labels` (int).

    Raises:
        FileNotFoundError: a local path that does not exist, or a directory without `labeled_data.csv`.
        OSError: the shipped copy is damaged (its SHA-256 does not match the upstream file's).
        ValueError: missing columns, invalid counts or labels, invalid `seed`, `expert_seed` or `split`.

    Example:

    ```python
    >>> from hf_defer.data import load_hatespeech
    >>> ds = load_hatespeech(seed=0)  # the copy shipped in the package
    >>> ds["train"].num_rows, ds["validation"].num_rows, ds["test"].num_rows
    (17348, 2478, 4957)
    >>> ds["train"].features["labels"].names
    ['hate_speech', 'offensive_language', 'neither']

    ```
    """
    seed = _check_seed(seed, "seed")
    expert_seed = seed if expert_seed is None else _check_seed(expert_seed, "expert_seed")
    if path_or_repo is None:
        source = default_hatespeech_source()
    elif isinstance(path_or_repo, (str, os.PathLike)):
        source = os.fspath(path_or_repo)
    else:
        raise ValueError(
            f"`path_or_repo` must be a path, a Hub dataset id or None, got {type(path_or_repo).__name__}."
        )
    if source is not None and not source:
        raise ValueError("`path_or_repo` must be a non-empty path or Hub dataset id, got ''.")
    # Validate `split` before any (possibly slow) loading.
    _split_sizes(10**6, split)

    if source is None:
        name = "the shipped copy of labeled_data.csv"
        frame = _read_csv(io.BytesIO(bundled_bytes("hatespeech/labeled_data.csv")), name)
    elif (csv_path := _local_csv(source)) is not None:
        name = str(csv_path)
        frame = _read_csv(csv_path, name)
    else:
        name = source
        frame = _read_hub(source)
    full = _to_dataset(frame, name)
    full = annotator_expert(full, list(HATESPEECH_LABELS), seed=expert_seed, column="expert_labels")

    _, num_validation, num_test = _split_sizes(full.num_rows, split)
    first = full.train_test_split(test_size=num_test, seed=seed)
    second = first["train"].train_test_split(test_size=num_validation, seed=seed)
    return datasets.DatasetDict(
        {"train": second["train"], "validation": second["test"], "test": first["test"]}
    )


_PASSTHROUGH_FLOAT_KEYS = ("features", "pixel_values")
_LABEL_ALIASES = ("label", "label_ids")


def _is_string_value(value: Any) -> bool:
    if isinstance(value, str):
        return True
    if isinstance(value, (list, tuple)) and value and all(isinstance(item, str) for item in value):
        return True
    return False


@dataclass
class DataCollatorForDeferral:
    """Collate examples for a deferral model: pad the text inputs and keep the class and expert labels.

    The text inputs are padded by `transformers.DataCollatorWithPadding`, which alone would fail on a string column
    and on head-only rows; around it, three differences: `expert_labels` is collated next to
    `labels` (a long tensor `[B]` for one expert, `[B, M]` for M experts); without a tokenizer it stacks the
    precomputed `features` vectors (float `[B, D]`) for head-only models; and string columns such as `text` are
    dropped instead of breaking the tensor conversion. `pixel_values` are stacked as float tensors. Any other
    column is passed to `tokenizer.pad` (or, without a tokenizer, stacked as is). A `label` or `label_ids` key is
    renamed to `labels`.

    Args:
        tokenizer (`PreTrainedTokenizerBase`, *optional*):
            Tokenizer used to pad `input_ids`, `attention_mask`, `token_type_ids`. Leave None for feature vectors
            or images.
        padding (`bool`, `str` or `PaddingStrategy`, *optional*, defaults to True):
            Padding strategy passed to `tokenizer.pad` (`True`/`"longest"`, `"max_length"`, `False`).
        max_length (`int`, *optional*):
            Maximum length for `tokenizer.pad`.
        pad_to_multiple_of (`int`, *optional*):
            Pad the sequence length to a multiple of this value.
        return_tensors (`str`, *optional*, defaults to `"pt"`):
            `"pt"` for torch tensors or `"np"` for numpy arrays.

    Example:

    ```python
    >>> from hf_defer.data import DataCollatorForDeferral
    >>> collator = DataCollatorForDeferral()  # head-only model over precomputed features
    >>> batch = collator([
    ...     {"features": [0.1, 0.2], "labels": 1, "expert_labels": [1, 0], "text": "a"},
    ...     {"features": [0.3, 0.4], "labels": 0, "expert_labels": [0, 0], "text": "b"},
    ... ])
    >>> sorted(batch), tuple(batch["features"].shape), batch["expert_labels"].tolist()
    (['expert_labels', 'features', 'labels'], (2, 2), [[1, 0], [0, 0]])

    ```
    """

    tokenizer: PreTrainedTokenizerBase | None = None
    padding: bool | str | PaddingStrategy = True
    max_length: int | None = None
    pad_to_multiple_of: int | None = None
    return_tensors: str = "pt"

    def __post_init__(self) -> None:
        if self.return_tensors not in ("pt", "np"):
            raise ValueError(f"`return_tensors` must be 'pt' or 'np', got {self.return_tensors!r}.")
        if self.tokenizer is not None and not hasattr(self.tokenizer, "pad"):
            raise ValueError(
                f"`tokenizer` must be a transformers tokenizer (with a `pad` method) or None, "
                f"got {type(self.tokenizer).__name__}."
            )

    def _to_output(self, array: np.ndarray) -> Any:
        if self.return_tensors == "np":
            return array
        import torch

        return torch.from_numpy(np.ascontiguousarray(array))

    @staticmethod
    def _integer_labels(values: list[Any], key: str) -> np.ndarray:
        # Fast path: one conversion for the whole column; the per-row checks below only run when it does not give
        # integers of a valid shape, and then produce the precise error message.
        try:
            array = np.asarray(values)
        except (TypeError, ValueError):
            array = None
        valid_ndim = (1,) if key == "labels" else (1, 2)
        if array is not None and np.issubdtype(array.dtype, np.integer) and array.ndim in valid_ndim and (
            array.ndim == 1 or array.shape[1] > 0
        ):
            return array.astype(np.int64, copy=False)
        out = []
        widths = set()
        for row, value in enumerate(values):
            if value is None:
                raise ValueError(f"`features` row {row} has {key}=None; expected an int label.")
            try:
                array = np.asarray(value.tolist() if hasattr(value, "tolist") else value)
            except (TypeError, ValueError):  # a ragged nested list
                array = np.empty((0, 0))
            if array.ndim > 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
                raise ValueError(
                    f"`features` row {row}: {key} must be an int"
                    f"{' or a list of ints' if key == 'expert_labels' else ''}, got {value!r}."
                )
            widths.add(None if array.ndim == 0 else array.shape[0])
            out.append(array.astype(np.int64))
        if key == "labels" and widths != {None}:
            raise ValueError(f"`features`: labels must be one int per row, got lists of lengths {sorted(w for w in widths if w is not None)}.")
        if len(widths) > 1:
            described = sorted("scalar" if width is None else f"{width} experts" for width in widths)
            raise ValueError(
                f"`features`: {key} must have the same width in every row (an int for one expert, or a list of M "
                f"ints for M experts); got {described}."
            )
        if widths == {0}:
            raise ValueError(f"`features`: {key} lists are empty; expected at least one expert label per row.")
        return np.stack(out)

    @staticmethod
    def _float_arrays(values: list[Any], key: str) -> np.ndarray:
        if not hasattr(values[0], "detach"):  # fast path for lists and numpy arrays, as for the labels
            try:
                array = np.asarray(values, dtype=np.float32)
            except (TypeError, ValueError):
                array = None
            if array is not None and array.ndim >= 2:
                return array
        arrays = []
        for row, value in enumerate(values):
            if hasattr(value, "detach"):  # torch tensor, possibly half precision
                value = value.detach().float().cpu().numpy()
            try:
                arrays.append(np.asarray(value, dtype=np.float32))
            except (TypeError, ValueError) as err:
                raise ValueError(f"`features` row {row}: {key} must be numeric, got {type(value).__name__}.") from err
        shapes = sorted({array.shape for array in arrays})
        if len(shapes) > 1:
            raise ValueError(f"`features`: {key} must have the same shape in every row, got shapes {shapes}.")
        return np.stack(arrays)

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate a list of examples into a batch.

        Args:
            features (`Sequence[Mapping[str, Any]]`):
                Examples as produced by a `datasets.Dataset` (one dict per example).

        Returns:
            `dict[str, Any]`: the model inputs, `labels` (long `[B]`) and `expert_labels` (long `[B]` or `[B, M]`)
            when present, as torch tensors (or numpy arrays with `return_tensors="np"`).
        """
        if isinstance(features, Mapping) or not isinstance(features, Sequence) or len(features) == 0:
            raise ValueError(f"`features` must be a non-empty list of examples (dicts), got {type(features).__name__}.")
        rows: list[dict[str, Any]] = []
        for index, example in enumerate(features):
            if not isinstance(example, Mapping):
                raise ValueError(f"`features` row {index} must be a dict, got {type(example).__name__}.")
            row = dict(example)
            for alias in _LABEL_ALIASES:
                if alias in row:
                    if "labels" in row:
                        raise ValueError(f"`features` row {index} has both 'labels' and {alias!r}; keep one.")
                    row["labels"] = row.pop(alias)
            rows.append(row)
        keys = list(rows[0])
        for index, row in enumerate(rows[1:], start=1):
            if set(row) != set(keys):
                raise ValueError(
                    f"`features` rows must have the same keys; row 0 has {sorted(keys)}, row {index} has {sorted(row)}."
                )

        batch: dict[str, Any] = {}
        if "labels" in keys:
            if "expert_labels" not in keys:
                raise ValueError(
                    "`features` have 'labels' but no 'expert_labels'; a deferral model needs the expert's answer for "
                    "every example (add it with hf_defer.annotator_expert / class_subset_expert)."
                )
            batch["labels"] = self._to_output(self._integer_labels([row["labels"] for row in rows], "labels"))
        if "expert_labels" in keys:
            batch["expert_labels"] = self._to_output(
                self._integer_labels([row["expert_labels"] for row in rows], "expert_labels")
            )
        for key in _PASSTHROUGH_FLOAT_KEYS:
            if key in keys:
                batch[key] = self._to_output(self._float_arrays([row[key] for row in rows], key))

        handled = {"labels", "expert_labels", *_PASSTHROUGH_FLOAT_KEYS}
        rest = [key for key in keys if key not in handled and not _is_string_value(rows[0][key])]
        if not rest:
            return batch
        if self.tokenizer is not None:  # the padding itself is DataCollatorWithPadding's, on the model inputs only
            padder = DataCollatorWithPadding(self.tokenizer, self.padding, self.max_length, self.pad_to_multiple_of,
                                             self.return_tensors)
            batch.update(padder([{key: row[key] for key in rest} for row in rows]))
            return batch
        if "input_ids" in rest:
            raise ValueError(
                "`features` contain 'input_ids' but `tokenizer` is None; pass the tokenizer so the sequences can "
                "be padded (DataCollatorForDeferral(tokenizer=...))."
            )
        for key in rest:
            values = [row[key] for row in rows]
            try:
                array = np.stack([np.asarray(value) for value in values])
            except ValueError as err:
                raise ValueError(
                    f"`features`: column {key!r} has values of different shapes and there is no tokenizer to pad "
                    "them; remove the column or pass a tokenizer."
                ) from err
            if array.dtype == object or not (np.issubdtype(array.dtype, np.number) or array.dtype == bool):
                raise ValueError(f"`features`: column {key!r} is not numeric (dtype {array.dtype}); remove it.")
            batch[key] = self._to_output(array)
        return batch


from .preparation import PreparedDeferralData, prepare_deferral_dataset  # noqa: E402  (re-exported)
__all__ += ["PreparedDeferralData", "prepare_deferral_dataset"]
