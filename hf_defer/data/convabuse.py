"""ConvAbuse (Cercas Curry, Abercrombie and Rieser, EMNLP 2021): abuse towards two chatbots, labelled by 8 experts.

**Content warning:** the user turns contain abusive, sexist and sexually explicit text.

The train/validation/test splits of the authors (`2_splits/` of `amandacurry/convabuse`, CC BY 4.0) are shipped in
``hf_defer/data/bundled/convabuse/`` and checked against their upstream SHA-256 on every read. Each item is a user turn
with the three turns before it; each of 8 identified expert annotators labelled 23–43 % of the items (in every split)
with an abuse severity, and there is no independent gold label: [`load_convabuse`] builds the targets by majority and
keeps one column per annotator, missing (`None`) where that annotator did not label the item.
"""

from __future__ import annotations

import io

import datasets
import pandas as pd

from .annotations import aggregate_labels, annotations_to_columns
from .bundled_data import bundled_bytes

__all__ = [
    "CONVABUSE_ANNOTATORS",
    "CONVABUSE_BINARY_NAMES",
    "CONVABUSE_CITATION",
    "CONVABUSE_SEVERITY_NAMES",
    "load_convabuse",
]

CONVABUSE_ANNOTATORS = tuple(f"Annotator{k}" for k in range(1, 9))
"""The 8 expert annotators, as named upstream; also the names of the annotator columns of [`load_convabuse`]."""

CONVABUSE_SEVERITY_NAMES = ("not_abusive", "ambiguous", "mildly_abusive", "strongly_abusive", "very_strongly_abusive")
"""Severity classes in id order: upstream `is_abuse` values 1, 0, -1, -2 and -3."""

CONVABUSE_BINARY_NAMES = ("not_abusive", "abusive")
"""Binary classes in id order: abusive means a severity below 0 (mildly, strongly or very strongly abusive)."""

CONVABUSE_CITATION = """@inproceedings{cercas-curry-etal-2021-convabuse,
  title     = {{C}onv{A}buse: Data, Analysis, and Benchmarks for Nuanced Abuse Detection in Conversational {AI}},
  author    = {Cercas Curry, Amanda and Abercrombie, Gavin and Rieser, Verena},
  booktitle = {Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing},
  year      = {2021},
  pages     = {7388--7403},
  publisher = {Association for Computational Linguistics},
  url       = {https://aclanthology.org/2021.emnlp-main.587},
  doi       = {10.18653/v1/2021.emnlp-main.587}
}"""
"""BibTeX of ConvAbuse (CC BY 4.0: cite it when you use or share the data)."""

_SPLITS = {"train": "train", "validation": "valid", "test": "test"}
_SEVERITY_VALUES = ("1", "0", "-1", "-2", "-3")  # the order of CONVABUSE_SEVERITY_NAMES
_TEXT_COLUMNS = ("example_id", "conv_id", "prev_agent", "prev_user", "agent", "user", "bot")
_TASKS = ("binary", "severity")
_REPEATS = ("majority", "first", "last")


def _read_split(upstream: str) -> pd.DataFrame:
    name = f"convabuse/ConvAbuseEMNLP{upstream}.csv"
    # keep_default_na=False: a turn such as "NA" or "null" stays text; an empty cell is an annotator's gap.
    frame = pd.read_csv(io.BytesIO(bundled_bytes(name)), dtype=str, keep_default_na=False)
    needed = [*_TEXT_COLUMNS, *(f"{annotator}_is_abuse.{value}" for annotator in CONVABUSE_ANNOTATORS
                                for value in _SEVERITY_VALUES)]
    missing = [column for column in needed if column not in frame.columns]
    if missing:
        raise ValueError(f"the shipped {name} lacks the columns {missing[:5]}; reinstall hf_defer.")
    return frame


def _long_annotations(frame: pd.DataFrame, upstream: str) -> pd.DataFrame:
    """One row per annotation, repeats included: `item` (row number), `annotator`, `severity`, `binary` (names).

    Upstream writes an annotator's repeated annotations of an item into one cell per one-hot column, comma-separated
    in the same order across the five `is_abuse` columns ("1, 1" and "0, 0" ...)."""
    rows = []
    for annotator in CONVABUSE_ANNOTATORS:
        cells = [frame[f"{annotator}_is_abuse.{value}"].tolist() for value in _SEVERITY_VALUES]
        for item, one_hot in enumerate(zip(*cells)):
            if all(cell.strip() == "" for cell in one_hot):
                continue
            parts = [[bit.strip() for bit in cell.split(",")] for cell in one_hot]
            for position in range(len(parts[0])):
                bits = [part[position] if position < len(part) else "" for part in parts]
                if sorted(bits) != ["0", "0", "0", "0", "1"]:
                    raise ValueError(
                        f"ConvAbuse {upstream} row {item}, {annotator}: the is_abuse columns {list(one_hot)} are not "
                        "one-hot; the shipped file is damaged, reinstall hf_defer."
                    )
                severity = bits.index("1")
                rows.append((item, annotator, CONVABUSE_SEVERITY_NAMES[severity],
                             CONVABUSE_BINARY_NAMES[int(severity >= 2)]))
    return pd.DataFrame(rows, columns=["item", "annotator", "severity", "binary"])


def _wide(long: pd.DataFrame, answer: str, names: tuple[str, ...], repeats: str, num_items: int) -> pd.DataFrame:
    """One column per annotator (class ids, None where missing), one row per item in file order."""
    wide = annotations_to_columns(long, "item", "annotator", answer, duplicates=repeats, label_names=names)
    wide = wide.set_index("item").reindex(range(num_items))
    ids = {name: index for index, name in enumerate(names)}
    return pd.DataFrame({annotator: [ids.get(value) if isinstance(value, str) else None
                                     for value in (wide[annotator] if annotator in wide else [None] * num_items)]
                         for annotator in CONVABUSE_ANNOTATORS}, dtype=object)


def _number(text: str) -> str:
    """Upstream ids are written as floats for E.L.I.Z.A. ("170648.0"): drop the ".0"."""
    return text[:-2] if text.endswith(".0") else text


def load_convabuse(task: str = "binary", repeats: str = "majority") -> datasets.DatasetDict:
    """Load ConvAbuse (Cercas Curry et al., EMNLP 2021) with its own train/validation/test splits and one column per
    expert annotator.

    **Content warning:** the user turns contain abusive, sexist and sexually explicit text.

    Items are user turns in conversations with two chatbots (E.L.I.Z.A. and CarbonBot; Alana's were not released),
    with the three turns before them. Each of the 8 expert annotators labelled part of the items with an abuse severity:
    1 (not abusive), 0 (ambiguous), -1, -2, -3 (mildly, strongly, very strongly abusive); abusive means a severity
    below 0. There is no independent gold label, so the targets are majorities of the annotators who labelled the
    item; a tie is `None` with `True` in `is_abuse_tied` / `severity_tied`, never broken (drop or mask those rows, or
    build another target with [`aggregate_labels`]). Some annotators labelled an item more than once; `repeats`
    says which of their answers counts. The data is shipped in the package (CC BY 4.0; cite
    [`CONVABUSE_CITATION`]) and its SHA-256 is checked on every load. The annotator columns are expert columns for
    [`prepare_deferral_dataset`], which reads their `None` as a missing answer; with 8 annotators each covering about a
    third of the items, mask missing answers rather than dropping rows.

    Args:
        task (`str`, *optional*, defaults to `"binary"`): the classes of the annotator columns: `"binary"`
            ([`CONVABUSE_BINARY_NAMES`], matching `is_abuse`) or `"severity"` ([`CONVABUSE_SEVERITY_NAMES`], matching
            `severity`).
        repeats (`str`, *optional*, defaults to `"majority"`): for an annotator who labelled an item more than once,
            the most frequent of their answers (a tie among them leaves the cell missing, counted in the log),
            `"first"` or `"last"` (in upstream order).

    Returns:
        `datasets.DatasetDict`: splits `train` (2,501 items), `validation` (831) and `test` (853), each with columns
        `example_id`, `conv_id`, `bot`, `prev_agent`, `prev_user`, `agent` (the context), `text` (the user turn
        that was labelled), `context` (the three turns before it, one per line, prefixed `agent:` / `user:`),
        `is_abuse` and `severity` (`ClassLabel` majorities, `None` when tied), `is_abuse_tied`, `severity_tied`,
        `num_annotators` (how many annotator columns hold an answer), and `Annotator1` ... `Annotator8` (`ClassLabel` of `task`, `None` where missing).

    Raises:
        ValueError: an unknown `task` or `repeats`.
        OSError: the shipped copy is damaged (its SHA-256 does not match the upstream file's).

    Example:

    ```python
    >>> from hf_defer.data import CONVABUSE_ANNOTATORS, load_convabuse
    >>> ds = load_convabuse()
    >>> ds.num_rows
    {'train': 2501, 'validation': 831, 'test': 853}
    >>> ds["train"].features["is_abuse"].names
    ['not_abusive', 'abusive']
    >>> train = ds["train"].filter(lambda row: not row["is_abuse_tied"])  # the rows with a majority
    >>> train.num_rows
    2422
    >>> sum(answer is not None for answer in train["Annotator1"]) / train.num_rows  # each expert covers a part
    0.2...


    ```
    """
    if task not in _TASKS:
        raise ValueError(f"`task` must be one of {_TASKS}, got {task!r}.")
    if repeats not in _REPEATS:
        raise ValueError(f"`repeats` must be one of {_REPEATS}, got {repeats!r}.")
    names = CONVABUSE_BINARY_NAMES if task == "binary" else CONVABUSE_SEVERITY_NAMES
    binary_label = datasets.ClassLabel(names=list(CONVABUSE_BINARY_NAMES))
    severity_label = datasets.ClassLabel(names=list(CONVABUSE_SEVERITY_NAMES))
    features = datasets.Features({
        "example_id": datasets.Value("int64"),
        **{column: datasets.Value("string") for column in
           ("conv_id", "bot", "prev_agent", "prev_user", "agent", "text", "context")},
        "is_abuse": binary_label, "severity": severity_label,
        "is_abuse_tied": datasets.Value("bool"), "severity_tied": datasets.Value("bool"),
        "num_annotators": datasets.Value("int64"),
        **{annotator: datasets.ClassLabel(names=list(names)) for annotator in CONVABUSE_ANNOTATORS},
    })
    splits = {}
    for split, upstream in _SPLITS.items():
        frame = _read_split(upstream)
        long = _long_annotations(frame, upstream)
        wide = {answer: _wide(long, answer, labels, repeats, len(frame)) for answer, labels in
                (("binary", CONVABUSE_BINARY_NAMES), ("severity", CONVABUSE_SEVERITY_NAMES))}
        targets = {}
        for answer, column in (("binary", "is_abuse"), ("severity", "severity")):
            target = aggregate_labels(wide[answer], list(CONVABUSE_ANNOTATORS), output_column=column)
            targets[column], targets[f"{column}_tied"] = target[column].tolist(), target[f"{column}_tied"].tolist()
        experts = wide["binary" if task == "binary" else "severity"]
        columns = {
            "example_id": [int(float(value)) for value in frame["example_id"]],
            "conv_id": [_number(value) for value in frame["conv_id"]],
            "bot": frame["bot"].tolist(),
            "prev_agent": frame["prev_agent"].tolist(),
            "prev_user": frame["prev_user"].tolist(),
            "agent": frame["agent"].tolist(),
            "text": frame["user"].tolist(),
            "context": [f"agent: {a}\nuser: {u}\nagent: {b}"
                        for a, u, b in zip(frame["prev_agent"], frame["prev_user"], frame["agent"])],
            **targets,
            "num_annotators": experts.notna().sum(axis=1).astype(int).tolist(),
            **{annotator: experts[annotator].tolist() for annotator in CONVABUSE_ANNOTATORS},
        }
        splits[split] = datasets.Dataset.from_dict(columns, features=features)
    return datasets.DatasetDict(splits)
