"""Reading a user's data for the commands: files and Hub datasets as splits, checked before any model is loaded.

[`read_table`] reads one csv, json, jsonl, parquet or txt file; [`load_raw_datasets`] the splits of a run;
[`check_splits`] checks every split (test included) for what the run will need of it, so that a mistake stops the run
before the first training step with one message naming the flag or file, the split, the row and the fix;
[`pipeline_inputs`] turns a split into what the deferral pipeline takes.
"""

from __future__ import annotations

import csv
import json
import logging
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import datasets

__all__ = ["CSV_FIELD_LIMIT", "TableStream", "allow_large_csv_fields", "check_splits", "empty_text_rows",
           "join_text_columns", "load_raw_datasets", "pipeline_inputs", "read_table", "scan_text_file", "split_sources"]

logger = logging.getLogger(__name__)

_BUILDERS = {"csv": "csv", "json": "json", "jsonl": "json", "parquet": "parquet"}


def _checked_extension(path: str, flag: str) -> str:
    """The extension of a readable input file, after the checks both readers make: a known format, an existing file,
    not empty (each an error naming `flag` and the file)."""
    extension = str(path).rsplit(".", 1)[-1].lower()
    if extension != "txt" and extension not in _BUILDERS:
        raise ValueError(f"{flag} must be a csv, json, jsonl, parquet or txt file, got {path!r}.")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{flag} {path!r} does not exist" + (" (it is a folder)." if os.path.isdir(path)
                                                                       else "."))
    if os.path.getsize(path) == 0:
        raise ValueError(f"{flag} {path!r} is empty; give a file with a header and data rows.")
    return extension


CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)
"""The largest CSV cell the `csv` module reads here (its default, 128 KiB, refuses a long document in one cell; a C
`long` bounds it, 2**31 - 1 on every platform)."""


def allow_large_csv_fields() -> None:
    """Lets the `csv` module read cells up to [`CSV_FIELD_LIMIT`] characters (pandas and pyarrow have no limit)."""
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)


def scan_text_file(path: str, flag: str, extension: str) -> int:
    """One pass over a csv, json, jsonl or txt file, before a reader sees it: every line must be UTF-8 text (a
    byte-order mark at the start, as Excel's "CSV UTF-8" writes, is allowed), else a `ValueError` naming `flag`, the
    file and the line. Returns the number of records: a CSV's records (header included, quoted cells over several
    lines counted once), the non-blank lines of any other file.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.inputs import scan_text_file
    >>> path = os.path.join(tempfile.mkdtemp(), "latin1.csv")
    >>> _ = open(path, "wb").write(b"id,text\\n1,ok\\n2,caf\\xe9\\n")
    >>> scan_text_file(path, "--input", "csv")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --input '...latin1.csv', line 3: not UTF-8 text (byte 0xe9 at column 6); ...

    ```
    """
    allow_large_csv_fields()
    where = {"line": 0}
    hint = ' (Excel: "CSV UTF-8")' if extension == "csv" else ""

    def lines() -> Iterator[str]:
        with open(path, "rb") as handle:
            for number, raw in enumerate(handle, start=1):
                where["line"] = number
                try:
                    yield raw.decode("utf-8-sig" if number == 1 else "utf-8")
                except UnicodeDecodeError as error:
                    raise ValueError(f"{flag} {path!r}, line {number}: not UTF-8 text (byte {raw[error.start]:#04x} at "
                                     f"column {error.start + 1}); save the file as UTF-8{hint}.") \
                        from None

    if extension != "csv":
        return sum(1 for line in lines() if line.strip())
    try:
        return sum(1 for record in csv.reader(lines()) if record)
    except csv.Error as error:
        raise ValueError(f"{flag} {path!r}, line {where['line']}: {error}.") from None


def _bad_json_line(path: str) -> str | None:
    """Where a JSON Lines (or JSON) file stops being JSON: `line N: <reason>`, or None when every line is JSON."""
    with open(path, encoding="utf-8-sig", errors="replace") as handle:
        document = handle.read(4096).lstrip().startswith("[")
        handle.seek(0)
        located = None if document else _first_bad_json_line(handle)
        if document or (located is not None and located.startswith("line 1: not valid JSON")
                        and os.path.getsize(path) <= 1 << 28):  # one (pretty-printed) JSON document, read whole
            handle.seek(0)
            try:
                json.loads(handle.read())
            except ValueError as error:
                return f"line {getattr(error, 'lineno', '?')}: not valid JSON ({getattr(error, 'msg', error)})"
            return None
        return located


def _first_bad_json_line(lines: Iterator[str]) -> str | None:
    """`line N: <reason>` for the first line of JSON Lines that is not a JSON object, read line by line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as error:
            return f"line {number}: not valid JSON ({getattr(error, 'msg', error)}): {line.strip()!r:.60}"
        if not isinstance(row, dict):
            return f"line {number}: a JSON {type(row).__name__}, not an object of column values: {line.strip()!r:.60}"
    return None


def _unreadable(flag: str, path: str, extension: str, error: Exception) -> ValueError:
    """The error for a file `datasets` could not read: for JSON, the first line that is not a JSON object; else the
    reader's own reason (pandas, pyarrow), which `datasets` wraps in its own error."""
    located = _bad_json_line(path) if extension in ("json", "jsonl") else None
    if located is not None:
        return ValueError(f"{flag} {path!r}, {located}; fix or remove the line.")
    cause = error.__cause__ or error
    reason = " ".join(str(cause).split())[:300] or type(cause).__name__
    return ValueError(f"{flag} {path!r} cannot be read as {extension}: {reason}")


def read_table(path: str, flag: str = "--input") -> datasets.Dataset:
    """A csv, json, jsonl or parquet file as a `datasets.Dataset`; a `.txt` file holds one text per line (column
    `text`). A missing, empty, unreadable or header-only file is an error naming `flag` and the file.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.inputs import read_table
    >>> path = os.path.join(tempfile.mkdtemp(), "new.csv")
    >>> _ = open(path, "w").write("id,text\\n7,good movie\\n")
    >>> read_table(path)["text"][:]
    ['good movie']

    ```
    """
    extension = _checked_extension(path, flag)
    if extension != "parquet":
        scan_text_file(path, flag, extension)  # not UTF-8: named by line, before a reader fails (or reads it wrong)
    if extension == "txt":
        with open(path, encoding="utf-8-sig") as handle:
            table = datasets.Dataset.from_dict({"text": [line.rstrip("\n") for line in handle if line.strip()]})
    else:
        try:
            table = datasets.load_dataset(_BUILDERS[extension], data_files=path, split="train")
        except Exception as error:  # datasets wraps the reader's error (pandas, pyarrow) in its own
            if "corresponds to no data" in str(error):  # a header and no row
                raise ValueError(f"{flag} {path!r} holds no data rows (only a header?); give a file with data "
                                 "rows.") from None
            raise _unreadable(flag, path, extension, error) from error
    if len(table) == 0:
        raise ValueError(f"{flag} {path!r} holds no data rows (only a header?); give a file with data rows.")
    return table


class TableStream:
    """A csv, json, jsonl, parquet or txt file read in chunks by `datasets` in streaming mode: memory does not grow
    with the file. CSV cells are read as text (ids such as `007` stay as written); a `.txt` file holds one text per
    line (column `text`, blank lines skipped). Opening it checks the file (missing, empty, unreadable, no data row:
    errors name `flag` and the file) and reads the first chunk.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.inputs import TableStream
    >>> path = os.path.join(tempfile.mkdtemp(), "new.csv")
    >>> _ = open(path, "w").write("id,text\\n007,good movie\\n8,bad\\n")
    >>> stream = TableStream(path, chunk_size=1)
    >>> stream.column_names, stream.num_rows, [chunk["id"] for chunk in stream]
    (['id', 'text'], 2, [['007'], ['8']])

    ```
    """

    def __init__(self, path: str, flag: str = "--input", chunk_size: int = 1000) -> None:
        self.path, self.flag, self.chunk_size = str(path), flag, chunk_size
        self.extension = extension = _checked_extension(path, flag)
        options: dict[str, Any] = {}
        self._records = None if extension == "parquet" else scan_text_file(path, flag, extension)
        if extension == "csv":
            with open(path, newline="", encoding="utf-8-sig") as handle:  # Excel's "CSV UTF-8" starts with a BOM
                names = next(csv.reader(handle), [])
            options["features"] = datasets.Features({name: datasets.Value("string") for name in names})
        if extension == "txt":
            options["encoding"] = "utf-8-sig"
        if extension == "parquet":  # Arrow batches of a chunk, not of a row group (pandas writes up to 1Mi rows in one)
            options["batch_size"] = chunk_size
        builder = "text" if extension == "txt" else _BUILDERS[extension]
        self.dataset = datasets.load_dataset(builder, data_files=path, split="train", streaming=True, **options)
        self._first = next(self._chunks(), None)
        if self._first is None:
            raise ValueError(f"{flag} {path!r} holds no data rows (only a header?); give a file with data rows.")
        self.column_names = list(self._first)
        self.num_rows = self._count_rows()

    @property
    def features(self) -> datasets.Features | None:
        """The columns' types as `datasets` read them (None where it infers them only while reading)."""
        return self.dataset.features

    def cast_column(self, column: str, feature: Any) -> None:
        """Reads `column` as `feature` (e.g. `datasets.Image()` for a column of image paths) from the first row."""
        self.dataset = self.dataset.cast_column(column, feature)
        self._first = next(self._chunks(), None)

    def _chunks(self) -> Iterator[dict[str, list[Any]]]:
        try:
            for chunk in self.dataset.iter(batch_size=self.chunk_size):
                if self.extension == "txt":
                    chunk = {"text": [line for line in chunk["text"] if line.strip()]}
                    if not chunk["text"]:
                        continue
                yield chunk
        except Exception as error:  # datasets wraps the reader's error (pandas, pyarrow) in its own
            raise _unreadable(self.flag, self.path, self.extension, error) from error

    def __iter__(self) -> Iterator[dict[str, list[Any]]]:
        """The chunks in order, each `{column: values}` of at most `chunk_size` rows."""
        if self._first is not None:
            first, self._first = self._first, None
            yield first
            chunks = self._chunks()
            next(chunks, None)  # the first chunk, already given
            yield from chunks
        else:
            yield from self._chunks()

    def _count_rows(self) -> int | None:
        """The row count for the progress bar: Parquet's metadata, the lines of a JSON Lines or text file, the records
        of a CSV file ([`scan_text_file`]'s pass)."""
        if self.extension == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(self.path).metadata.num_rows
        assert self._records is not None  # counted by the UTF-8 check that opening the file made
        return max(self._records - 1, 0) if self.extension == "csv" else self._records


def split_sources(data_args: Any) -> dict[str, str]:
    """What each split was read from, as the flag that named it: `"--train_file train.csv"`, or the Hub dataset."""
    if data_args.dataset_name is not None:
        return {split: f"--dataset_name {data_args.dataset_name} (split {name!r})" for split, name in
                (("train", data_args.train_split_name), ("validation", data_args.validation_split_name),
                 ("test", data_args.test_split_name))}
    return {split: f"--{split}_file {path}" for split, path in (("train", data_args.train_file),
                                                               ("validation", data_args.validation_file),
                                                               ("test", data_args.test_file)) if path is not None}


def load_raw_datasets(data_args: Any, seed: int = 0, model_args: Any = None,
                      hold_out_for: str | None = "validation") -> datasets.DatasetDict:
    """The `train` / `validation` / `test` splits named by `--dataset_name` (its `--*_split_name` splits) or the data
    files. Without a validation split, `--validation_split_percentage` of train is held out (seeded) when
    `hold_out_for` says what will use it (logged with the count); with `hold_out_for=None` train keeps every row.
    `--shuffle_train_dataset` shuffles train once (`--shuffle_seed`); `--max_*_samples` keep the first rows."""
    if data_args.dataset_name is not None:
        hub = {}
        if model_args is not None:
            hub = {"cache_dir": model_args.cache_dir, "token": model_args.token,
                   "trust_remote_code": model_args.trust_remote_code or None}
        loaded = datasets.load_dataset(data_args.dataset_name, data_args.dataset_config_name,
                                       **{key: value for key, value in hub.items() if value is not None})
        if not isinstance(loaded, datasets.DatasetDict):
            loaded = datasets.DatasetDict({data_args.train_split_name: loaded})
        names = {"train": data_args.train_split_name, "validation": data_args.validation_split_name,
                 "test": data_args.test_split_name}
        unknown = [f"--{split}_split_name {name}" for split, name in names.items()
                   if name not in loaded and name != split]
        if unknown:
            raise ValueError(f"--dataset_name {data_args.dataset_name} has no split named in {unknown}; its splits "
                             f"are {list(loaded)}.")
        raw = datasets.DatasetDict({split: loaded[name] for split, name in names.items() if name in loaded})
        if not raw:
            raise ValueError(f"--dataset_name {data_args.dataset_name} has none of the splits {list(names.values())}; "
                             f"its splits are {list(loaded)}: name them with --train_split_name and the others.")
    else:
        sources = split_sources(data_args)
        extensions = {source.rsplit(".", 1)[-1].lower().replace("jsonl", "json") for source in sources.values()}
        if len(extensions) > 1:
            raise ValueError(f"the data files must share one format, got {sorted(sources.values())}.")
        # one file at a time: a test file may lack the label and expert columns
        raw = datasets.DatasetDict({split: read_table(source.split(" ", 1)[1], source.split(" ", 1)[0])
                                    for split, source in sources.items()})
    if "validation" not in raw and "train" in raw and hold_out_for:
        if len(raw["train"]) < 2:
            raise ValueError("the training data has fewer than 2 rows: nothing to hold out for validation; give "
                             "--validation_file or more rows.")
        held = raw["train"].train_test_split(test_size=data_args.validation_split_percentage / 100, seed=seed)
        logger.warning(f"held out {len(held['test'])} of the {len(raw['train'])} training rows "
                       f"(--validation_split_percentage {data_args.validation_split_percentage}) as the validation "
                       f"split, for {hold_out_for}; give --validation_file to train on every row.")
        raw["train"], raw["validation"] = held["train"], held["test"]
    if getattr(data_args, "shuffle_train_dataset", False) and "train" in raw:
        raw["train"] = raw["train"].shuffle(seed=data_args.shuffle_seed)
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples),
                         ("test", data_args.max_predict_samples)):
        if limit is not None and split in raw:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))
    return raw


def join_text_columns(dataset: datasets.Dataset, columns: Sequence[str], delimiter: str = " ") -> tuple[Any, str]:
    """`dataset` with the text `columns` joined by `delimiter` into one column (as `run_classification.py` joins
    `--text_column_names`), and that column's name; one column comes back as it is."""
    if len(columns) == 1:
        return dataset, columns[0]
    name = "+".join(columns)
    return dataset.map(lambda row: {name: delimiter.join(str(row[c]) for c in columns if row[c] is not None)},
                       desc="Joining the text columns"), name


def empty_text_rows(dataset: datasets.Dataset, column: str) -> list[int]:
    """Rows whose text is missing or holds only white space."""
    return [row for row, text in enumerate(dataset.with_format(None)[column])
            if not isinstance(text, str) or not text.strip()]


def _kind(feature: Any) -> str | None:
    """`"numbers"` (class ids), `"text"` (class names) or None (lists, images...) for a label or expert column."""
    if isinstance(feature, datasets.ClassLabel):
        return "numbers"
    if isinstance(feature, datasets.Value):
        if feature.dtype in ("string", "large_string"):
            return "text"
        if feature.dtype.startswith(("int", "uint", "float")):
            return "numbers"
    return None


def check_splits(raw: Mapping[str, datasets.Dataset], sources: Mapping[str, str], input_columns: Mapping[str, str],
                 class_columns: Sequence[tuple[str, str]], unlabelled_ok: Sequence[str] = ("test",)) -> None:
    """Checks every split before the first step, each error naming the flag or file, the split, the row and the fix.

    Args:
        raw: the splits.
        sources: what each split was read from ([`split_sources`]).
        input_columns: `{flag: column}` of the model's inputs (text, text pair, image); every split needs them, and a
            text cell must not be empty.
        class_columns: `(flag, column)` of the label and each expert column; a split holds all of them or, if it is in
            `unlabelled_ok`, none (an unlabelled test file: predictions only). Each column holds class ids in every
            split or class names in every split, not ids in one file and digit strings in another.
    """
    for split, dataset in raw.items():
        where = f"split {split!r} ({sources.get(split, split)})"
        for flag, column in input_columns.items():
            if column not in dataset.column_names:
                raise ValueError(f"{flag} {column!r} is not a column of {where}; its columns are "
                                 f"{dataset.column_names}. Add the column or name the right one with {flag}.")
            if _kind(dataset.features[column]) == "text" or flag.startswith("--text"):
                empty = empty_text_rows(dataset, column)
                if empty:
                    raise ValueError(f"{flag} {column!r} of {where}, row {empty[0]}: the text is empty "
                                     f"({len(empty)} such row(s)); fill it in or remove the row.")
        present = [column for _, column in class_columns if column in dataset.column_names]
        if len(present) < len(class_columns) and (present or split not in unlabelled_ok):
            flag, column = next((f, c) for f, c in class_columns if c not in dataset.column_names)
            raise ValueError(f"{flag} {column!r} is not a column of {where}; its columns are {dataset.column_names}. "
                             f"Add the column or name the right one with {flag}.")
    for flag, column in class_columns:
        kinds = {split: _kind(dataset.features[column]) for split, dataset in raw.items()
                 if column in dataset.column_names}
        if len({kind for kind in kinds.values() if kind is not None}) > 1:
            (first, one), (second, other) = [(s, raw[s]) for s, k in kinds.items() if k == "numbers"][0], \
                [(s, raw[s]) for s, k in kinds.items() if k == "text"][0]
            raise ValueError(
                f"{flag} {column!r} holds class ids in split {first!r} ({sources.get(first, first)}; row 0: "
                f"{one[column][0]!r}) but text in split {second!r} ({sources.get(second, second)}; row 0: "
                f"{other[column][0]!r}); write it the same way in every file: all class names or all class ids.")


def pipeline_inputs(dataset: datasets.Dataset, text_column: str | None = None, text_pair_column: str | None = None,
                    image_column: str | None = None, side_features: Sequence[str] = ()) -> list[Any]:
    """The raw inputs of a split, as the deferral pipeline takes them: texts, text pairs or images; with
    `side_features` (the columns of a model's `config.side_features`), each text input a dict holding them too."""
    dataset = dataset.with_format(None)
    if image_column is not None:
        return list(dataset[image_column])
    if text_pair_column is not None:
        inputs = [{"text": t, "text_pair": p} for t, p in zip(dataset[text_column], dataset[text_pair_column])]
    else:
        inputs = list(dataset[text_column])
    if side_features:
        values = {name: dataset[name][:] for name in side_features}
        inputs = [{**(item if isinstance(item, dict) else {"text": item}),
                   **{name: values[name][row] for name in side_features}} for row, item in enumerate(inputs)]
    return inputs


def side_feature_rows(inputs: list[Any], chunk: Mapping[str, list[Any]], names: Mapping[str, bool],
                      key: str = "text", start: int = 0) -> list[Any]:
    """One chunk's pipeline inputs with the row's side features for a model with `config.side_features`: each input a
    dict with its `key` (`"text"`, or `"features"` for a head-only model) and the values of the chunk's columns named
    in `names` (name -> numeric), each read by `side_feature_value` (a CSV streams as text, so a numeric feature's
    cell is read as a float; a category is matched by what it means, so a Parquet float `1.0` is the category `"1"`).
    A missing value (`is_missing_side_value`: None, NaN, blank), a numeric feature's cell that is no finite number,
    or a list or dict is a `ValueError` naming the column and the row (counted from `start`, the chunk's first
    row)."""
    if not names:
        return inputs
    from ..modeling.side_features import is_missing_side_value, side_feature_value  # torch: only with side features

    def value(name: str, row: int) -> Any:
        try:
            return side_feature_value({"name": name, "kind": "numeric" if names[name] else "categorical"},
                                      chunk[name][row])
        except ValueError as error:
            ending = "; the model needs every side feature of every row." if is_missing_side_value(chunk[name][row]) \
                else "."
            raise ValueError(f"side feature column {name!r}, row {start + row}: {error}{ending}") from None

    return [{**(item if isinstance(item, dict) else {key: item}),
             **{name: value(name, row) for name in names}} for row, item in enumerate(inputs)]
