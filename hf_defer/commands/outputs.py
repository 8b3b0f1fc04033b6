"""What the commands write: `predictions.csv` (spreadsheet-safe), the guard that keeps a run off the user's own files,
and the run summary (`hf_defer_run.json` and the lines printed at the end of a run).

Only the standard library and numbers go in here: the CSV is written with `csv.writer`, every text cell made safe for
spreadsheets ([`spreadsheet_safe`]).
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["RUN_SUMMARY", "OutputFolder", "PredictionWriter", "check_output_file", "check_provenance",
           "file_digest", "format_summary", "prediction_format", "prediction_header", "prediction_values",
           "provenance_path", "read_provenance", "remove_provenance", "resume_predictions", "spreadsheet_safe",
           "write_predictions", "write_provenance"]

RUN_SUMMARY = "hf_defer_run.json"
"""The final JSON of a run in its `--output_dir`: where everything went, the threshold, the metrics by stage, and the
files the run wrote (so that a later run into the same folder knows them from the user's own)."""

_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


def spreadsheet_safe(value: Any) -> Any:
    """A CSV cell that a spreadsheet shows as text, never runs as a formula.

    A text cell that starts with `=`, `+`, `-`, `@`, a tab or a carriage return gets a leading `'`, as OWASP's
    guidance on CSV injection and spreadsheet-safe writers (`defusedcsv`) do, unless it is a plain number such as
    `-1.5`. Class and expert names come from a model's config, which may have been downloaded: `=1+2` or
    `@SUM(A1)` there would otherwise be evaluated by Excel or LibreOffice when `predictions.csv` is opened.

    Example:

    ```python
    >>> from hf_defer.commands.outputs import spreadsheet_safe
    >>> spreadsheet_safe("=1+2"), spreadsheet_safe("@SUM(A1)"), spreadsheet_safe("-1.5"), spreadsheet_safe("neither")
    ("'=1+2", "'@SUM(A1)", '-1.5', 'neither')

    ```
    """
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS) and not _NUMBER.fullmatch(value):
        return "'" + value
    return value


def prediction_header(expert_names: Sequence[str], id_column: str = "row", columns: Sequence[str] = (),
                      route_only: bool = False, margin: bool = False, scored_by: bool = False) -> list[str]:
    """The columns of a predictions file: the id column, the copied input `columns`, then `label, defer, expert,
    class_label, class_score` (with `route_only`: `estimated_accuracy, cost`), with `margin` the deferral margin,
    one `expert_accuracy_<name>` per expert, and with `scored_by` which graph of an int8 ONNX export scored the row
    (`int8`, or `float32` where its fallback scored it again). Every writer ([`write_predictions`], `hf-defer predict`) takes its
    columns from here and each row's values from [`prediction_values`]."""
    decision = ("estimated_accuracy", "cost") if route_only else ("class_label", "class_score")
    header = [id_column, *columns, "label", "defer", "expert", *decision, *(["margin"] if margin else [])]
    header += [f"expert_accuracy_{name}" for name in expert_names] + (["scored_by"] if scored_by else [])
    if len(set(header)) != len(header):
        raise ValueError(f"the predictions' columns must differ, got {header}: rename the copied input columns.")
    return header


def prediction_values(out: Mapping[str, Any], route_only: bool = False, margin: bool = False,
                      scored_by: bool = False) -> list[Any]:
    """One pipeline output as the decision cells of [`prediction_header`] (after the id and copied columns): Python
    strings, booleans, floats and None (no expert)."""
    chosen = ([float(out["estimated_accuracy"]), float(out["cost"])] if route_only
              else [out["class_label"], float(out["class_score"])])
    return [out["label"], bool(out["defer"]), out["expert"], *chosen, *([float(out["margin"])] if margin else []),
            *(float(value) for value in out["expert_accuracy"]), *([out["scored_by"]] if scored_by else [])]


def write_predictions(outputs: Iterable[dict[str, Any]], path: str | os.PathLike, expert_names: Sequence[str],
                      ids: Sequence[Any] | None = None, id_column: str = "row",
                      columns: Mapping[str, Sequence[Any]] | None = None, route_only: bool = False) -> int:
    """Writes deferral-pipeline outputs as CSV (or JSON Lines, Parquet for a `.jsonl`, `.json`, `.parquet` path;
    see [`PredictionWriter`]): the id column (`id_column`: the input's own ids, else `row`, the row number in the
    input), the copied input `columns`, then `label, defer, expert, class_label, class_score` and one
    `expert_accuracy_<name>` column per expert ([`prediction_header`]). CSV text cells go through
    [`spreadsheet_safe`]. Returns the number of rows.

    With `route_only` (a route-only model's outputs: no class), `class_label, class_score` give way to
    `estimated_accuracy, cost`: the chosen expert's estimated accuracy and its cost. Outputs with a `margin` (the
    pipeline's `return_margin=True`) get a `margin` column after those: an input is deferred where its margin
    exceeds the deferral threshold (`inf` where only another expert was available, `-inf` where none was).

    Example:

    ```python
    >>> import tempfile, os
    >>> from hf_defer.commands.outputs import write_predictions
    >>> path = os.path.join(tempfile.mkdtemp(), "predictions.csv")
    >>> out = {"label": "=cmd", "defer": False, "expert": None, "class_label": "=cmd", "class_score": 0.75,
    ...        "expert_accuracy": [0.5]}
    >>> write_predictions([out], path, ["alice"], ids=["a7"], id_column="id")
    1
    >>> print(open(path).read().strip())
    id,label,defer,expert,class_label,class_score,expert_accuracy_alice
    a7,'=cmd,False,,'=cmd,0.75,0.5

    ```
    """
    columns = dict(columns or {})
    outputs = iter(outputs)
    first = next(outputs, None)
    outputs = itertools.chain([] if first is None else [first], outputs)
    margin = first is not None and "margin" in first
    header = prediction_header(expert_names, id_column, list(columns), route_only, margin)
    extension = str(path).rsplit(".", 1)[-1].lower()
    count = 0
    types = dict.fromkeys([id_column, *columns])
    with PredictionWriter(path, header, format=_FORMATS.get(extension, "csv"), column_types=types) as writer:
        rows = []
        for count, out in enumerate(outputs, start=1):
            row = count - 1
            rows.append([row if ids is None else ids[row], *(values[row] for values in columns.values()),
                         *prediction_values(out, route_only, margin)])
        writer.write_rows(rows)
    return count


_FORMATS = {"csv": "csv", "jsonl": "jsonl", "json": "jsonl", "parquet": "parquet"}
_ARROW_TYPES = {"label": "string", "defer": "bool", "expert": "string", "class_label": "string"}


def prediction_format(path: str | os.PathLike, flag: str = "--output") -> str:
    """`csv`, `jsonl` or `parquet`, by the extension of `path` (`.json` files are written as JSON Lines, as
    `datasets` writes and reads them); any other extension is an error naming `flag`."""
    extension = str(path).rsplit(".", 1)[-1].lower()
    if extension not in _FORMATS:
        raise ValueError(f"{flag} must end in .csv, .jsonl, .json or .parquet (the format is taken from it), got "
                         f"{str(path)!r}.")
    return _FORMATS[extension]


class PredictionWriter:
    """Writes prediction rows to CSV, JSON Lines or Parquet as they come, each [`write_rows`] call in whole rows and
    flushed, so that a run killed at any point leaves whole rows and at most one partial last row, which
    [`resume_predictions`] drops. CSV cells go through [`spreadsheet_safe`] (None is an empty cell); JSON Lines and
    Parquet keep the values as they are (Parquet: one row group per call; the id and copied columns take their
    `column_types`, the decision columns are strings, booleans and float64).

    Args:
        path: the file; replaced unless `append` (rows added after those [`resume_predictions`] kept).
        header: the columns ([`prediction_header`]).
        format: `csv`, `jsonl` or `parquet` ([`prediction_format`] of `path` when None).
        column_types: `pyarrow` types of the id and copied columns, for Parquet (None: inferred from the first rows);
            every other column of `header` is a decision column.
        append: continue a file whose whole rows were kept (CSV, JSON Lines).

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.outputs import PredictionWriter
    >>> path = os.path.join(tempfile.mkdtemp(), "p.jsonl")
    >>> with PredictionWriter(path, ["row", "label"]) as writer:
    ...     writer.write_rows([[0, "spam"], [1, "=ham"]])
    >>> print(open(path).read().strip())
    {"row": 0, "label": "spam"}
    {"row": 1, "label": "=ham"}

    ```
    """

    def __init__(self, path: str | os.PathLike, header: Sequence[str], format: str | None = None,
                 column_types: Mapping[str, Any] | None = None, append: bool = False) -> None:
        self.path, self.header = str(path), list(header)
        self.format = format or prediction_format(path)
        self.column_types = dict(column_types or {})
        self._parquet: Any = None
        if self.format == "parquet":
            if append:
                raise ValueError("a Parquet file cannot be continued: its footer is written last.")
            self._handle = None
            return
        self._handle = open(self.path, "a" if append else "w", newline="", encoding="utf-8")
        if self.format == "csv" and not append:
            self.write_rows([self.header])

    def write_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        """Appends `rows` (lists of values in the order of the header) and flushes them."""
        if self.format == "parquet":
            self._write_parquet(rows)
            return
        if self.format == "csv":
            buffer = io.StringIO()
            csv.writer(buffer).writerows([spreadsheet_safe("" if cell is None else cell) for cell in row]
                                         for row in rows)
            text = buffer.getvalue()
        else:
            text = "".join(json.dumps(dict(zip(self.header, row)), ensure_ascii=False, default=str) + "\n"
                           for row in rows)
        self._handle.write(text)
        self._handle.flush()

    def _write_parquet(self, rows: Sequence[Sequence[Any]]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._parquet is None:
            fields = [(name, self.column_types[name] if name in self.column_types
                       else pa.type_for_alias(_ARROW_TYPES.get(name, "float64"))) for name in self.header]
            arrays = [pa.array([row[i] for row in rows], type=kind) for i, (_, kind) in enumerate(fields)]
            self._schema = pa.schema([pa.field(name, array.type) for (name, _), array in zip(fields, arrays)])
            self._parquet = pq.ParquetWriter(self.path, self._schema)
        columns = [pa.array([row[i] for row in rows], type=field.type) for i, field in enumerate(self._schema)]
        self._parquet.write_table(pa.Table.from_arrays(columns, schema=self._schema))

    def id_text(self, value: Any) -> str:
        """How an id is written in this format, as [`resume_predictions`] reads it back."""
        if self.format == "csv":
            return str(spreadsheet_safe("" if value is None else value))
        return json.dumps(value, ensure_ascii=False, default=str)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
        elif self._parquet is not None:
            self._parquet.close()
        elif self.format == "parquet":  # no row at all: an empty file with the header's columns
            import pyarrow as pa
            import pyarrow.parquet as pq

            pq.write_table(pa.table({name: pa.array([], type=self.column_types.get(name) or pa.string())
                                     if name in self.column_types else
                                     pa.array([], type=pa.type_for_alias(_ARROW_TYPES.get(name, "float64")))
                                     for name in self.header}), self.path)

    def __enter__(self) -> PredictionWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def resume_predictions(path: str | os.PathLike, header: Sequence[str]) -> tuple[int, str] | None:
    """Keeps the whole rows of a predictions file that a killed run left (CSV or JSON Lines), cuts off a partial last
    row, and returns how many rows it holds and a digest of their id cells (`sha256` of each cell as
    [`PredictionWriter.id_text`] writes it, then `\\x1f`), or None when not even the CSV
    header was written (start afresh). A file with other columns than `header`, or damaged before its last row, is
    refused: it was written with other options or by another program.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.outputs import resume_predictions
    >>> path = os.path.join(tempfile.mkdtemp(), "p.csv")
    >>> _ = open(path, "w", newline="").write("row,label\\r\\n0,spam\\r\\n1,ha")  # killed while writing row 1
    >>> resume_predictions(path, ["row", "label"])[0], open(path).read()
    (1, 'row,label\\n0,spam\\n')

    ```
    """
    from .inputs import allow_large_csv_fields  # a copied column may hold cells over the csv module's 128 KiB

    allow_large_csv_fields()
    path = str(path)
    data_format = prediction_format(path)
    if data_format == "parquet":
        raise ValueError(f"--resume continues a .csv, .jsonl or .json --output; {path!r} is Parquet, which is only "
                         "readable once complete (its footer is written last): run again without --resume.")
    digest, count, kept = hashlib.sha256(), 0, 0
    with open(path, "rb") as handle:
        if data_format == "jsonl":
            for end, line in _numbered_lines(handle):
                if not line.endswith(b"\n"):
                    break  # the partial last row of a killed run
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                if not isinstance(row, dict) or list(row) != list(header):
                    raise ValueError(f"--resume: line {count + 1} of {path!r} is not a row with the columns "
                                     f"{list(header)}; was it written with other options, or by another program?")
                digest.update(json.dumps(row[header[0]], ensure_ascii=False, default=str).encode() + b"\x1f")
                count, kept = count + 1, end
        else:
            found = _resume_csv(handle, path, header, digest)
            if found is None:
                return None
            kept, count = found
    with open(path, "r+b") as handle:
        handle.truncate(kept)
    return count, digest.hexdigest()


def _numbered_lines(handle: Any) -> Iterator[tuple[int, bytes]]:
    """(byte offset after the line, the line) of a binary file."""
    end = 0
    for line in handle:
        end += len(line)
        yield end, line


def _resume_csv(handle: Any, path: str, header: Sequence[str], digest: Any) -> tuple[int, int] | None:
    """The byte offset after the last whole row of a CSV predictions file and its row count (the header not
    counted); the ids go into `digest`. None when the header itself is incomplete."""
    consumed = {"end": 0, "line": b""}

    def text_lines() -> Iterator[str]:
        for end, line in _numbered_lines(handle):
            consumed["end"], consumed["line"] = end, line
            yield line.decode("utf-8", "surrogateescape")

    reader = csv.reader(text_lines())
    expected = [spreadsheet_safe(name) for name in header]
    kept, count = None, -1
    while True:
        try:
            record = next(reader)
        except StopIteration:
            break
        except csv.Error:  # a quoted cell cut short at the end of the file
            break
        ended = consumed["line"].endswith(b"\r\n")
        if count < 0 and ended and record != expected:
            raise ValueError(f"--resume: {path!r} has the columns {record}, this run writes {expected}: it was "
                             "written with other options (copied columns, model); give the same ones, or run again "
                             "without --resume.")
        if not (ended and len(record) == len(header)):
            if handle.read(1):
                raise ValueError(f"--resume: row {count} (counting from 0) of {path!r} does not have the columns "
                                 f"{list(header)} in one line; was it written with other options, or by another "
                                 "program?")
            break
        if count >= 0:
            digest.update(record[0].encode("utf-8", "surrogateescape") + b"\x1f")
        kept, count = consumed["end"], count + 1
    return None if kept is None else (kept, count)


PROVENANCE_SUFFIX = ".hf_defer.json"
"""The record `hf-defer predict` writes beside its output (`<output>.hf_defer.json`): what wrote the file."""
PROVENANCE_KEYS = (("defer_threshold", "the deferral threshold"), ("expert_costs", "the expert costs"),
                   ("model", "the model"), ("input", "the input"), ("options", "the options"),
                   ("columns", "the columns"))
"""What a resumed run must share with the run that wrote the file, in the order a mismatch is reported."""


def provenance_path(output: str | os.PathLike) -> Path:
    """Where the record of what wrote a predictions file lives: `<output>.hf_defer.json`, beside it."""
    return Path(str(output) + PROVENANCE_SUFFIX)


def file_digest(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """`sha256` of a file's bytes (read in 1 MiB blocks: memory does not grow with the file)."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk), b""):
            digest.update(block)
    return digest.hexdigest()


def write_provenance(output: str | os.PathLike, record: Mapping[str, Any]) -> Path:
    """Writes `record` (JSON: the model, its threshold and costs, the input, the options, the columns) beside
    `output` as `<output>.hf_defer.json`, atomically (a temporary file in the same folder, then `os.replace`): a run
    killed while writing it leaves the previous record or the new one, never half of one."""
    target = provenance_path(output)
    content = json.dumps({"written_by": "hf_defer predict", **record}, indent=2, sort_keys=True, default=str) + "\n"
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    temporary.write_text(content, encoding="utf-8")
    os.replace(temporary, target)
    return target


def read_provenance(output: str | os.PathLike) -> dict[str, Any] | None:
    """The record beside `output` when hf_defer wrote one, else None (missing, unreadable, or not hf_defer's)."""
    try:
        record = json.loads(provenance_path(output).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("written_by") == "hf_defer predict" else None


def remove_provenance(output: str | os.PathLike) -> None:
    """Removes the record beside `output` (its file was removed)."""
    provenance_path(output).unlink(missing_ok=True)


def check_provenance(output: str | os.PathLike, record: Mapping[str, Any] | None = None) -> None:
    """Refuses to continue (`--resume`) a predictions file that hf_defer cannot prove it wrote, or that it wrote with
    another model, threshold, costs, input or options than `record` says this run uses (None: only that the file is
    hf_defer's). The proof is the record [`write_provenance`] left beside it; a file without one -- the user's own
    notes, a file from another program or an older hf_defer -- is never continued: `ValueError` naming the file and
    the fix, and the file is left as it was.

    Example:

    ```python
    >>> import os, tempfile
    >>> from hf_defer.commands.outputs import check_provenance, write_provenance
    >>> output = os.path.join(tempfile.mkdtemp(), "notes.csv")
    >>> _ = open(output, "w").write("my own notes")
    >>> check_provenance(output)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --resume: --output '...notes.csv' has no record that hf-defer predict wrote it (...
    >>> _ = write_provenance(output, {"defer_threshold": 0.0, "expert_costs": [0.1]})
    >>> check_provenance(output, {"defer_threshold": 0.2, "expert_costs": [0.1]})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: --resume: --output '...notes.csv' was written with the deferral threshold 0.0, this run uses 0.2; ...

    ```
    """
    output = str(output)
    found = read_provenance(output)
    if found is None:
        raise ValueError(f"--resume: --output {output!r} has no record that hf-defer predict wrote it "
                         f"({provenance_path(output).name} is missing or not hf_defer's), so it may be your own file; "
                         "it was left as it is. Choose another --output, or pass --overwrite to replace it.")
    if record is None:
        return
    for key, what in PROVENANCE_KEYS:
        old, new = _canonical(found.get(key)), _canonical(record.get(key))
        if old != new:
            raise ValueError(f"--resume: --output {output!r} was written with {what} {_shown(found.get(key))}, this "
                             f"run uses {_shown(record.get(key))}; one file would hold the decisions of both. Give "
                             "the same ones, choose another --output, or pass --overwrite to start again.")


def _canonical(value: Any) -> str:
    """A recorded value as compared: a model or input by its digests, not by the name it was given by."""
    if isinstance(value, Mapping):
        value = {key: item for key, item in value.items() if key != "name"}
    return json.dumps(value, sort_keys=True, default=str)


def _shown(value: Any) -> str:
    """A recorded value, short: a model or input by its name and digests."""
    if isinstance(value, Mapping) and "name" in value:
        digests = ", ".join(f"{key} {str(item)[:12]}" for key, item in sorted(value.items()) if key != "name")
        return f"{value['name']!r} ({digests})"
    return _canonical(value)[:200]


def check_output_file(output: str | os.PathLike, inputs: Sequence[str | os.PathLike], flag: str = "--output",
                      overwrite: bool = False) -> None:
    """Refuses an output file that is one of the `inputs` (writing it would replace the data with the results), or
    that exists, unless `overwrite`. Raises `ValueError` / `FileExistsError` naming `flag` and the fix."""
    target = Path(output).expanduser().resolve()
    for source in inputs:
        if Path(source).expanduser().resolve() == target:
            raise ValueError(f"{flag} {str(output)!r} is the input file: writing it would replace your data with the "
                             f"results; choose another {flag}.")
    if target.is_dir():
        raise ValueError(f"{flag} {str(output)!r} is a folder; give a file name such as predictions.csv.")
    if target.exists() and not overwrite:
        raise FileExistsError(f"{flag} {str(output)!r} exists; pass --overwrite to replace it, or choose another "
                              f"{flag}.")


_SAVED = re.compile(r"config\.json|generation_config\.json|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index"
                    r"\.json|pytorch_model.*\.bin|adapter_(config\.json|model\.safetensors)|training_args\.bin|"
                    r"trainer_state\.json|.*_results\.json|reliability_diagram\.png|runs|checkpoint-\d+|"
                    r"(tokenizer|special_tokens_map|added_tokens|preprocessor|processor|image_processor)"
                    r"(_config)?\.json|"
                    r"vocab\.(txt|json)|merges\.txt|spiece\.model|sentencepiece\.bpe\.model|tokenizer\.model|"
                    r"chat_template\.(jinja|json)")
"""What `save_pretrained`, a tokenizer's or image processor's `save_pretrained`, `Trainer.save_model` and
`save_state` and hf_defer's card write into a model folder (besides the card, `README.md`, and the code files)."""
_CARD_MARK = "<!-- generated by hf_defer"
_CODE_FILES = frozenset(path.name for path in (Path(__file__).resolve().parent.parent / "modeling").glob("*.py")
                        if path.name != "__init__.py")
"""The code files a deferral model's `save_pretrained` copies next to its weights (`hf_defer.modeling`'s modules)."""


def hf_defer_saved_files(folder: str | os.PathLike) -> set[str]:
    """The entries of `folder` that an hf_defer save wrote, when the folder holds a deferral model saved by hf_defer
    (`config.json` of model type `deferral` next to `configuration_deferral.py`): the model, tokenizer and Trainer
    files, the code files and a `README.md` that is hf_defer's card. Empty for any other folder.

    Example:

    ```python
    >>> import json, tempfile, pathlib
    >>> from hf_defer.commands.outputs import hf_defer_saved_files
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (folder / "config.json").write_text(json.dumps({"model_type": "deferral"}))
    >>> _ = (folder / "configuration_deferral.py").write_text("# code")
    >>> _ = (folder / "notes.txt").write_text("mine")
    >>> sorted(hf_defer_saved_files(folder))
    ['config.json', 'configuration_deferral.py']

    ```
    """
    folder = Path(folder)
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return set()
    if not isinstance(config, dict) or config.get("model_type") != "deferral" \
            or not (folder / "configuration_deferral.py").is_file():
        return set()
    ours = set()
    for entry in folder.iterdir():
        if _SAVED.fullmatch(entry.name) or entry.name in _CODE_FILES:
            ours.add(entry.name)
        elif entry.name == "README.md":
            try:
                if _CARD_MARK in entry.read_text(encoding="utf-8"):
                    ours.add(entry.name)
            except (OSError, UnicodeDecodeError):
                pass
    return ours


class OutputFolder:
    """The `--output_dir` of a run, checked before anything is written: entries that no hf_defer run or save wrote
    there (a run's `hf_defer_run.json` lists what it wrote; a model folder saved by hf_defer -- `save_pretrained`,
    `save_for_hub`, `Trainer.save_model` -- is known by its files, [`hf_defer_saved_files`]; `checkpoint-*` folders
    are the Trainer's) are never replaced or deleted unless `overwrite`: the refusal lists them. A folder a run or a
    save wrote is run into again, or resumed.

    Example:

    ```python
    >>> import tempfile, pathlib
    >>> from hf_defer.commands.outputs import OutputFolder
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> (folder / "README.md").write_text("my notes")
    8
    >>> OutputFolder(folder).check()  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    FileExistsError: --output_dir '...' holds files that no hf_defer run or save wrote: README.md. ...

    ```
    """

    def __init__(self, path: str | os.PathLike, overwrite: bool = False) -> None:
        self.path = Path(path)
        self.overwrite = overwrite
        self.before = self._stat()
        summary = self._read_summary()
        self.previous_files = list(summary.get("files", [])) if summary is not None else None
        self._started = False

    def _stat(self) -> dict[str, tuple[int, int]]:
        if not self.path.is_dir():
            return {}
        return {entry.name: (entry.stat().st_mtime_ns, entry.stat().st_size) for entry in self.path.iterdir()}

    def _read_summary(self) -> dict[str, Any] | None:
        file = self.path / RUN_SUMMARY
        try:
            summary = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return summary if isinstance(summary, dict) and summary.get("written_by") == "hf_defer" else None

    def foreign(self) -> list[str]:
        """The entries of the folder that no hf_defer run or save wrote."""
        ours = hf_defer_saved_files(self.path)
        if self.previous_files is not None:  # a run's folder: what it listed, and the Trainer's checkpoints
            ours |= set(self.previous_files) | {RUN_SUMMARY}
            ours |= {name for name in self.before if re.fullmatch(r"checkpoint-\d+", name)}
        return sorted(name for name in self.before if name not in ours)

    def check(self) -> None:
        """Raises `FileExistsError` listing the foreign entries, unless there are none or `overwrite`."""
        if self.path.exists() and not self.path.is_dir():
            raise ValueError(f"--output_dir {str(self.path)!r} is a file; give a folder.")
        foreign = self.foreign()
        if foreign and not self.overwrite:
            shown = ", ".join(foreign[:10]) + (f" and {len(foreign) - 10} more" if len(foreign) > 10 else "")
            raise FileExistsError(
                f"--output_dir {str(self.path)!r} holds files that no hf_defer run or save wrote: {shown}. The run "
                "would replace or delete them (model files, README.md, predictions.csv, *_results.json); choose an "
                "empty or new --output_dir, or pass --overwrite_output_dir to replace them.")

    def start(self) -> None:
        """Marks the folder as a run's (before the first checkpoint) and removes the results of an earlier run there,
        so that `all_results.json` holds this run's metrics only."""
        self.path.mkdir(parents=True, exist_ok=True)
        self._started = True
        if self.previous_files is not None:
            for name in self.previous_files:
                if name.endswith("_results.json"):
                    (self.path / name).unlink(missing_ok=True)
        self.write_summary({"status": "running"})

    @contextlib.contextmanager
    def recording(self) -> Iterator[None]:
        """Around a run: once the run has started ([`start`]), `hf_defer_run.json` says how it ended, `"failed"` with
        the error (one line) or `"interrupted"` (Ctrl-C), next to what the run had recorded; a run that succeeds
        writes its own `"completed"` summary. Before [`start`] nothing is written (the folder is not the run's yet).

        Example:

        ```python
        >>> import json, tempfile, pathlib
        >>> from hf_defer.commands.outputs import OutputFolder
        >>> run = OutputFolder(pathlib.Path(tempfile.mkdtemp()) / "out")
        >>> try:
        ...     with run.recording():
        ...         run.start()
        ...         raise ConnectionError("the Hub cannot be reached")
        ... except ConnectionError:
        ...     pass
        >>> summary = json.loads((run.path / "hf_defer_run.json").read_text())
        >>> summary["status"], summary["error"]
        ('failed', 'ConnectionError: the Hub cannot be reached')

        ```
        """
        try:
            yield
        except KeyboardInterrupt:
            self._end("interrupted", "KeyboardInterrupt: stopped by the user (Ctrl-C)")
            raise
        except Exception as error:
            self._end("failed", f"{type(error).__name__}: {' '.join(str(error).split())}".rstrip(": "))
            raise

    def _end(self, status: str, error: str) -> None:
        last = self._read_summary() if (self.path / RUN_SUMMARY).is_file() and self._started else None
        if last is None:
            return
        last.pop("files", None)
        last.pop("written_by", None)
        self.write_summary({**last, "status": status, "error": error})

    def written(self) -> list[str]:
        """The entries this run wrote or changed, and those an earlier run into the folder wrote."""
        now = self._stat()
        changed = {name for name, stat in now.items() if self.before.get(name) != stat}
        return sorted((changed | set(self.previous_files or [])) & set(now) - {RUN_SUMMARY})

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Writes `hf_defer_run.json` with `summary` and the list of files the run wrote."""
        file = self.path / RUN_SUMMARY
        content = {"written_by": "hf_defer", **summary, "files": self.written()}
        file.write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")
        return file


def stage_metrics(metrics: Mapping[str, Any], prefix: str) -> dict[str, float]:
    """The metrics of one stage (`train`, `eval`, `calibrated_eval`, `test`) without their prefix."""
    return {key[len(prefix) + 1:]: value for key, value in metrics.items() if key.startswith(f"{prefix}_")}


def format_summary(summary: Mapping[str, Any]) -> str:
    """The lines a run ends with: where the model and the predictions went, the threshold, the test metrics."""
    lines = [f"Saved the deferral model to {summary['model']}"]
    if summary.get("predictions"):
        lines.append(f"  predictions: {summary['predictions']} ({summary.get('predicted_rows', 0)} rows)")
    threshold = summary.get("defer_threshold")
    if threshold is not None:
        rate = summary.get("max_deferral_rate")
        how = f" (calibrated: at most {rate:.0%} of the validation inputs deferred)" if rate is not None else ""
        lines.append(f"  deferral threshold: {threshold:.6g}{how}")
    test = summary.get("metrics", {}).get("test", {})
    shown = {key: value for key, value in test.items() if not key.endswith(("runtime", "per_second", "samples"))}
    if shown:
        lines.append("  test metrics: " + ", ".join(f"{key} {value:.4f}" for key, value in shown.items()))
    lines.append(f"  summary: {summary['summary_file']}")
    return "\n".join(lines)
