"""Dataset loaders for learning to defer, and the batch collator (from ``collator.py``) re-exported.

- [`load_hatespeech`]: the HateSpeech benchmark (Davidson et al., 2017) with the real-human "random annotator"
  expert, as a `datasets.DatasetDict` with a seeded 70/10/20 train/validation/test split.
- [`DataCollatorForDeferral`] (defined in ``collator.py``): pads tokenized text (or stacks precomputed feature vectors /
  pixel values) and keeps `labels` and `expert_labels` as integer tensors, ready for `EncoderForDeferral`.
"""

from __future__ import annotations

import io
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pandas as pd

from .bundled_data import bundled_bytes
from .collator import DataCollatorForDeferral  # re-exported: `from hf_defer.data import DataCollatorForDeferral`
from ..experts.simulated import annotator_expert
from ..modeling.validators import check_seed, split_sizes

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
    which means the copy shipped inside the package (`hf_defer/data/bundled/hatespeech/labeled_data.csv.gz`, checked
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
    seed = check_seed(seed, "seed")
    expert_seed = seed if expert_seed is None else check_seed(expert_seed, "expert_seed")
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
    split_sizes(10**6, split)

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

    _, num_validation, num_test = split_sizes(full.num_rows, split)
    first = full.train_test_split(test_size=num_test, seed=seed)
    second = first["train"].train_test_split(test_size=num_validation, seed=seed)
    return datasets.DatasetDict(
        {"train": second["train"], "validation": second["test"], "test": first["test"]}
    )
