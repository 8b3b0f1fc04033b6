"""`hf-defer annotations`: a labelling tool's long export (one row per item, annotator and answer) turned into the wide
CSV that `hf-defer train` reads: one answer column per annotator, the item-level columns (the text), and a target
aggregated from the annotators. The command prints the `hf-defer train` flags that read the file."""

from __future__ import annotations

import argparse
import contextlib
import logging
import shlex
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from .outputs import check_output_file

__all__ = ["read_frame", "run_annotations", "training_flags", "write_training_file"]

def read_frame(path: str, flag: str) -> Any:
    """[`read_table`] (csv, json, jsonl or parquet; errors name `flag` and the file) as a `pandas.DataFrame`."""
    from .inputs import read_table

    return read_table(path, flag).to_pandas()


def _in_file(error: ValueError, where: str) -> ValueError:
    return ValueError(f"{where}: {error}")


@contextlib.contextmanager
def _quiet_ties() -> Iterator[None]:
    """Without `aggregate_labels`' warning on ties: the command says what it did with them."""
    log = logging.getLogger("hf_defer.data.annotations")
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def write_training_file(annotations_file: str, item_column: str, annotator_column: str, answer_column: str,
                        items_file: str | None = None, method: str = "majority", label_column_name: str = "labels",
                        keep_tied: bool = False, output: str = "wide.csv", overwrite: bool = False,
                        duplicates: str = "error", keep_columns: Sequence[str] | None = None) -> dict[str, Any]:
    """Pivots a long table of annotations into one answer column per annotator ([`annotations_to_columns`]), merges the
    items file on `item_column`, builds the target with [`aggregate_labels`] and writes the CSV `output`.

    - `keep_columns` (default: every item-level column of `annotations_file`, one value per item, such as the text)
      are carried over; the other columns (they vary within an item, e.g. a time stamp per answer) are dropped and
      named in the summary, as are those that `items_file` also has (its own are kept).
    - Every annotated item must be in `items_file` (one row per item). A row without any answer (an item of
      `items_file` nobody annotated, or whose every answer is empty) has no target: it is dropped and counted.
    - `method="majority"` or `"dawid_skene"`: the target in `label_column_name`, the experts are the answer columns,
      named after the annotators.
    - `method="leave_one_out"`: the target is the majority of all annotators; each annotator's column holds their
      correctness, 1.0 or 0.0 against the majority of the *others* (`<annotator>_loo_target` of [`aggregate_labels`]),
      empty where they did not answer or the others tie or are absent; their answers move to `<annotator>_answer`.
      The experts are then given as correctness (`--expert_correct_columns`).
    - A tied target is dropped, unless `keep_tied`: then it is kept, empty, with `True` in `<label_column_name>_tied`
      (`hf-defer train` refuses a row without a label: drop or fix them before training).

    Returns:
        `{"rows", "experts", "tied", "tied_items", "no_answer", "unscored", "flags", "dropped_columns"}`: the rows
        written, the expert columns, the tied rows (dropped unless `keep_tied`) and their items, the rows dropped for
        want of an answer, the answers left unscored because the others tie (`leave_one_out`), the `hf-defer train`
        flags that read `output` ([`training_flags`]), and the columns of `annotations_file` left out.

    Raises:
        ValueError / OSError: a missing or unreadable file, a missing column, an item missing from `items_file`, a
            column clash, no row left with a target, or an existing `output` without `overwrite`; each names the flag.

    Example:

    ```python
    >>> from hf_defer.commands.annotations import write_training_file
    >>> write_training_file("annotations.csv", "item", "annotator", "answer", items_file="texts.csv")  # doctest: +SKIP
    ```
    """
    from ..data.annotations import AGGREGATION_METHODS

    if method not in AGGREGATION_METHODS:
        raise ValueError(f"--method must be one of {', '.join(AGGREGATION_METHODS)}, got {method!r}.")
    check_output_file(output, [annotations_file] + ([items_file] if items_file else []), overwrite=overwrite)
    source = f"--annotations_file {annotations_file}"
    long = read_frame(annotations_file, "--annotations_file")
    named = [("--item_column", item_column), ("--annotator_column", annotator_column),
             ("--answer_column", answer_column), *(("--keep_columns", column) for column in keep_columns or ())]
    for flag, column in named:
        if column not in long.columns:
            raise ValueError(f"{flag} {column!r} is not a column of {source}; its columns are {list(long.columns)}.")
    items = read_frame(items_file, "--items_file") if items_file is not None else None
    keep_columns, dropped = _kept_columns(long, item_column, annotator_column, answer_column, keep_columns,
                                          [*(items.columns if items is not None else []), label_column_name,
                                           f"{label_column_name}_tied"])
    wide, experts = _answer_columns(long, item_column, annotator_column, answer_column, duplicates, keep_columns,
                                    source)
    if method == "leave_one_out" and len(experts) < 2:
        raise ValueError(f"--method leave_one_out needs two or more annotators; {source} has {experts}.")
    unannotated = 0
    if items is not None:
        wide, unannotated = _merge_items(wide, items, f"--items_file {items_file}", item_column, source)
    answered = wide[experts].notna().any(axis=1)
    wide = wide[answered].reset_index(drop=True)
    no_answer = unannotated + int((~answered).sum())
    wide, tied_items = _add_target(wide, item_column, experts, method, label_column_name, keep_tied)
    if wide.empty:
        raise ValueError(f"{source}: no item is left with a target ({len(tied_items)} tied, {no_answer} without an "
                         "answer); nothing to train on (--keep_tied keeps the tied ones, without a target).")
    unscored = 0
    if method == "leave_one_out":
        wide, unscored = _leave_one_out_correctness(wide, experts)
    wide.to_csv(output, index=False)
    flags = training_flags(output, label_column_name, experts, method, text="text" in wide.columns)
    return {"rows": len(wide), "experts": experts, "tied": len(tied_items), "tied_items": tied_items,
            "no_answer": no_answer, "unscored": unscored, "flags": flags, "dropped_columns": dropped}


def _answer_columns(long: Any, item_column: str, annotator_column: str, answer_column: str, duplicates: str,
                    keep_columns: Sequence[str], source: str) -> tuple[Any, list[str]]:
    """The wide table ([`annotations_to_columns`]) and its expert columns, named as `hf-defer train` will read them
    (stripped); an annotator id with a comma, or two that only spaces tell apart, is refused."""
    from ..data.annotations import annotations_to_columns

    try:
        wide = annotations_to_columns(long, item_column, annotator_column, answer_column, duplicates=duplicates,
                                      keep_columns=list(keep_columns))
    except ValueError as error:
        raise _in_file(error, source) from error
    experts = [str(column) for column in wide.columns if column not in (item_column, *keep_columns)]
    wide.columns = [str(column) for column in wide.columns]
    commas = [name for name in experts if "," in name]
    if commas:
        raise ValueError(f"--annotator_column {annotator_column!r}: annotator(s) {commas[:5]} hold a comma, which "
                         "`hf-defer train --expert_column_names` reads as a separator; rename them.")
    # `hf-defer train` strips the names of --expert_column_names: the columns are named as it will read them, and two
    # annotators that only spaces tell apart (or one that becomes a kept column's name) are refused here, not there
    read_as: dict[str, list[str]] = {}
    for name in [item_column, *keep_columns, *experts]:
        read_as.setdefault(name.strip(), []).append(name)
    collide = next((names for names in read_as.values() if len(names) > 1), None)
    if collide is not None:
        raise ValueError(f"--annotator_column {annotator_column!r}: {collide!r} differ only in the spaces around them, "
                         "and `hf-defer train --expert_column_names` strips those, so they would be one column; give "
                         f"each annotator one id in {source} (e.g. strip the ids).")
    return wide.rename(columns={name: name.strip() for name in experts}), [name.strip() for name in experts]


def _merge_items(wide: Any, items: Any, where: str, item_column: str, source: str) -> tuple[Any, int]:
    """The items file (one row per item, every annotated item in it) merged with the wide table, its order and
    columns first; and the count of its items nobody annotated."""
    if item_column not in items.columns:
        raise ValueError(f"--item_column {item_column!r} is not a column of {where}; its columns are "
                         f"{list(items.columns)}.")
    repeated = items[item_column][items[item_column].duplicated()].tolist()
    if repeated:
        raise ValueError(f"{where}: item(s) {repeated[:5]} have more than one row in column {item_column!r}; "
                         "give one row per item.")
    known = set(items[item_column].tolist())
    missing = [item for item in wide[item_column].tolist() if item not in known]
    if missing:
        raise ValueError(f"{where} lacks {len(missing)} item(s) of {source} (column {item_column!r}), e.g. "
                         f"{missing[:5]}; every annotated item needs its row there.")
    clash = [str(column) for column in items.columns if column != item_column and str(column) in wide.columns]
    if clash:
        raise ValueError(f"{where}: column(s) {clash} are also annotators or --keep_columns of {source}; rename "
                         "them.")
    return items.merge(wide, on=item_column, how="inner"), len(items) - len(wide)


def _add_target(wide: Any, item_column: str, experts: list[str], method: str, label_column_name: str,
                keep_tied: bool) -> tuple[Any, list[Any]]:
    """The wide table with the target in `label_column_name` (Dawid–Skene, else the majority), its tied rows dropped
    unless `keep_tied`; and the tied items."""
    from ..data.annotations import aggregate_labels

    tied_column = f"{label_column_name}_tied"
    taken = [name for name in (label_column_name, tied_column) if name in wide.columns]
    if taken:
        raise ValueError(f"--label_column_name {label_column_name!r}: the table already has the column(s) {taken}; "
                         "choose another --label_column_name.")
    try:
        with _quiet_ties():
            wide = aggregate_labels(wide, experts, "dawid_skene" if method == "dawid_skene" else "majority",
                                    output_column=label_column_name)
    except ValueError as error:
        raise _in_file(error, f"--method {method}") from error
    tied = wide[tied_column].astype(bool)
    tied_items = wide.loc[tied, item_column].tolist()
    if not keep_tied:
        wide = wide[~tied].drop(columns=[tied_column]).reset_index(drop=True)
    return wide, tied_items


def _leave_one_out_correctness(wide: Any, experts: list[str]) -> tuple[Any, int]:
    """The wide table with each annotator's answers moved to `<annotator>_answer` and their column holding their
    correctness against the majority of the others (empty where unscored); and the answers left unscored (ties)."""
    from ..data.annotations import aggregate_labels

    taken = [f"{name}_answer" for name in experts if f"{name}_answer" in wide.columns]
    if taken:
        raise ValueError(f"--method leave_one_out moves the answers to <annotator>_answer, but {taken} exist.")
    with _quiet_ties():
        others = aggregate_labels(wide[experts], experts, "leave_one_out")
    wide = wide.rename(columns={name: f"{name}_answer" for name in experts})
    unscored = 0
    for name in experts:
        given, against = wide[f"{name}_answer"], others[f"{name}_loo_target"]
        wide[name] = (given == against).astype(float).where(given.notna() & against.notna())
        unscored += int((given.notna() & others[f"{name}_loo_tied"]).sum())
    return wide, unscored


def _kept_columns(long: Any, item_column: str, annotator_column: str, answer_column: str,
                  keep_columns: Sequence[str] | None, taken: Sequence[str]) -> tuple[list[str], list[str]]:
    """The columns of the export carried over, and those left out: `keep_columns` as given, or by default every
    column with one value per item that is neither an annotator's name nor `taken` (the items file's columns, the
    target's)."""
    others = [str(column) for column in long.columns if column not in (item_column, annotator_column, answer_column)]
    if keep_columns is not None:
        return list(keep_columns), [column for column in others if column not in keep_columns]
    per_item = long.groupby(item_column, dropna=False, sort=False)
    annotators = {str(name) for name in long[annotator_column].dropna().unique()}
    kept = [column for column in others if column not in annotators and column not in map(str, taken)
            and bool((per_item[column].nunique(dropna=False) <= 1).all())]
    return kept, [column for column in others if column not in kept]


def training_flags(output: str, label_column_name: str, experts: Sequence[str], method: str = "majority",
                   text: bool = False) -> list[str]:
    """The `hf-defer train` flags that read the file [`write_training_file`] wrote and train on it: the experts as
    answers (`--expert_column_names`) or, after `method="leave_one_out"`, as correctness (`--expert_correct_columns`),
    masked where missing, and `--do_train`; `hf-defer train` needs `--model_name_or_path` (and `--output_dir`) too.

    Example:

    ```python
    >>> from hf_defer.commands.annotations import training_flags
    >>> training_flags("wide.csv", "labels", ["ann", "bob"], text=True)  # doctest: +NORMALIZE_WHITESPACE
    ['--train_file', 'wide.csv', '--text_column_name', 'text', '--label_column_name', 'labels',
     '--expert_column_names', 'ann,bob', '--missing_expert', 'mask', '--do_train']

    ```
    """
    expert_flag = "--expert_correct_columns" if method == "leave_one_out" else "--expert_column_names"
    pairs = [("--train_file", output), *([("--text_column_name", "text")] if text else []),
             ("--label_column_name", label_column_name), (expert_flag, ",".join(experts)), ("--missing_expert", "mask")]
    # A value that starts with "-" (an annotator named "-dash") would read as a flag: "--flag=-dash,zed" parses.
    flags = [part for flag, value in pairs
             for part in ([f"{flag}={value}"] if value.startswith("-") else [flag, value])]
    return [*flags, "--do_train"]


def run_annotations(args: argparse.Namespace) -> int:
    """`hf-defer annotations`: what was dropped and written on stderr, the `hf-defer train` flags on stdout."""
    keep = [name.strip() for name in args.keep_columns.split(",") if name.strip()] if args.keep_columns else None
    summary = write_training_file(args.annotations_file, args.item_column, args.annotator_column, args.answer_column,
                                  args.items_file, args.method, args.label_column_name, args.keep_tied, args.output,
                                  args.overwrite, args.duplicates, keep)
    if summary["dropped_columns"]:
        why = ("not named by --keep_columns" if args.keep_columns else
               "they vary within an item, or --items_file or the target has them; --keep_columns names the "
               "item-level ones to keep")
        print(f"left out column(s) {', '.join(summary['dropped_columns'])} of {args.annotations_file} ({why}).",
              file=sys.stderr)
    if summary["no_answer"]:
        print(f"dropped {summary['no_answer']} item(s) without any answer: no target there.", file=sys.stderr)
    if summary["tied"]:
        shown = ", ".join(map(str, summary["tied_items"][:10])) + (" ..." if summary["tied"] > 10 else "")
        what = ("kept, without a target (hf-defer train needs them dropped)" if args.keep_tied else
                "dropped: the annotators split evenly, so there is no target (--keep_tied keeps them)")
        print(f"{summary['tied']} tied item(s) ({shown}) {what}.", file=sys.stderr)
    if summary["unscored"]:
        print(f"{summary['unscored']} answer(s) left unscored (empty): the other annotators tie there.",
              file=sys.stderr)
    if "--text_column_name" not in summary["flags"]:
        print("no column named 'text': bring the inputs with --items_file or --keep_columns, and name their column "
              "with --text_column_name when you train.", file=sys.stderr)
    print(f"wrote {summary['rows']} rows, {len(summary['experts'])} annotators, to {args.output}; train on it with "
          "`hf-defer train --model_name_or_path ENCODER --output_dir FOLDER` and the flags below (ENCODER "
          "sentence-transformers/all-MiniLM-L6-v2 with --freeze_encoder trains only a head: quick on a CPU):",
          file=sys.stderr)
    print(shlex.join(summary["flags"]))
    return 0
