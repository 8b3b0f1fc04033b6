"""`hf-defer monitor`: a decision log (what `hf-defer predict` writes) checked against the model's certified promises,
in one batch: the deferral rates, the label-free error estimate and, with a labels file, the true system error, each
with its anytime-valid bound, and the alarm ([`DeferralMonitor`]).

The log's rows are taken in their order (the order the decisions were made). A labels file (e.g. `hf-defer review
pull`'s `answers.csv`: `item`, `answer`) gives the true label of some rows, matched by id: every deferred row should
have one (the reviewers' answers), and the kept rows that have one must have been drawn for an audit at random, each
with probability `--audit_rate`. A reviewer's answer is taken as final (as the expert's answer and as the truth, so a
deferred row counts as right) unless `--expert_answer_column` names a column with the expert's own answer.

`--reference_log` and `--reference_labels` recalibrate the label-free estimate first
([`DeferralMonitor.recalibrate`]): the decision log of the model on labelled reference inputs (e.g. `hf-defer predict`
on the calibration file) and a file with their true labels and, for the deferred rows, the expert's answer (one
column per expert, named as the experts, as `hf-defer calibrate` reads them), matched by id as --log and --labels.
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from typing import Any

from .evaluate import match_expert_columns
from .inputs import read_table
from .outputs import check_output_file

__all__ = ["monitor_log", "reference_rows", "run_monitor"]


def _column(table: Any, name: str | None, candidates: tuple[str, ...], flag: str, path: str) -> str:
    columns = list(table.columns)
    if name is not None:
        if name not in columns:
            raise ValueError(f"{flag} {name!r} is not a column of {path!r}; its columns are {columns}.")
        return name
    found = next((c for c in candidates if c in columns), None)
    if found is None:
        raise ValueError(f"{path!r} has none of the columns {list(candidates)}; name one with {flag} (its columns "
                         f"are {columns}).")
    return found


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value)) or value == ""


def _log_table(path: str, flag: str, id_column: str | None) -> tuple[Any, list[str]]:
    """A decision log as a pandas table, with its ids (as strings, unique)."""
    table = read_table(path, flag).to_pandas()
    needed = {"defer", "expert"}
    if not needed <= set(table.columns):
        raise ValueError(f"{flag} {path!r} is not a decision log of hf-defer predict: it lacks the columns "
                         f"{sorted(needed - set(table.columns))} (its columns are {list(table.columns)}).")
    ids_name = _column(table, id_column, ("id", "row", "item"), "--id_column", path)
    ids = [str(value) for value in table[ids_name]]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{flag} {path!r}: the ids of column {ids_name!r} repeat; give --id_column with unique ids.")
    return table, ids


def _labels_table(path: str, flag: str, id_column: str | None, id_flag: str, id_names: tuple[str, ...],
                  label_column: str | None, label_flag: str) -> tuple[Any, str, str]:
    """A labels file as a pandas table, with its id column and its label column."""
    table = read_table(path, flag).to_pandas()
    key = _column(table, id_column, id_names, id_flag, path)
    return table, key, _column(table, label_column, ("label", "labels", "answer"), label_flag, path)


def _check_known(labelled: Any, ids: list[str], flag: str, path: str, log_flag: str, log: str, key: str) -> None:
    unknown = sorted(set(labelled) - set(ids))
    if unknown:
        raise ValueError(f"{flag} {path!r} labels ids that are not in {log_flag} {log!r}: {unknown[:5]} (matched on "
                         f"{key!r} against the log's ids).")


def _deferred(row: dict[str, Any]) -> bool:
    """Whether a decision log's row was deferred (`defer` read from JSON, CSV or Parquet)."""
    return str(row["defer"]).strip().lower() in ("true", "1")


def _cell(value: Any) -> Any:
    """A table cell as a label: `None` where missing, a whole float (a column of ids with gaps) as an `int`."""
    if _missing(value):
        return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def reference_rows(log: str, labels: str, expert_names: list[str], *, id_column: str | None = None,
                   labels_id_column: str | None = None, label_column: str | None = None,
                   expert_columns: list[str] | None = None) -> tuple[list[dict[str, Any]], list[Any], list[Any]]:
    """The labelled reference rows for [`DeferralMonitor.recalibrate`] from files: the decision log `log` of the
    model on the reference inputs, and `labels`, a table with their ids, true labels and, for the deferred rows, each
    expert's answer (columns named as the experts, or `expert_columns` as `hf-defer calibrate`'s
    `--expert_column_names`); a route-only model's labels are whether the chosen expert was right (1/0) and need no
    answers. Log rows without a label are left out.

    Example:

    ```python
    >>> from hf_defer.commands.monitor import reference_rows
    >>> outputs, labels, answers = reference_rows("reference.jsonl", "calibration.csv", ["alice"])  # doctest: +SKIP
    ```
    """
    table, ids = _log_table(log, "--reference_log", id_column)
    truth, key, value = _labels_table(labels, "--reference_labels", labels_id_column, "--reference_id_column",
                                      ("id", "item", "row"), label_column, "--reference_label_column")
    keys = [str(k) for k in truth[key]]
    repeated = sorted(k for k, count in Counter(keys).items() if count > 1)
    if repeated:
        raise ValueError(f"--reference_labels {labels!r}: the ids of column {key!r} repeat ({repeated[:5]}); each "
                         "reference row needs one label.")
    _check_known(keys, ids, "--reference_labels", labels, "--reference_log", log, key)
    route_only = "estimated_accuracy" in table.columns and "class_score" not in table.columns
    columns: dict[str, str] = {}
    if not route_only:
        given = match_expert_columns(expert_columns, expert_names, "--reference_expert_columns")
        missing = [column for column in given if column not in truth.columns]
        if missing:
            raise ValueError(f"--reference_labels {labels!r} has no column {missing} for the experts' answers on "
                             "the deferred rows (columns named as the experts, or name them with "
                             f"--reference_expert_columns); its columns are {list(truth.columns)}.")
        columns = dict(zip(expert_names, given))
    by_id = {k: row for k, row in zip(keys, truth.to_dict("records"))}
    rows = table.to_dict("records")
    outputs, truths, answers = [], [], []
    for row_id, row in zip(ids, rows):
        found = by_id.get(row_id)
        if found is None or _missing(found[value]):
            continue
        outputs.append(row)
        truths.append(_cell(found[value]))
        expert = None if _missing(row.get("expert")) else str(row["expert"])
        answers.append(_cell(found[columns[expert]]) if _deferred(row) and expert in columns else None)
    if not outputs:
        raise ValueError(f"no row of --reference_log {log!r} has a label in --reference_labels {labels!r} (column "
                         f"{value!r}, matched on {key!r}).")
    return outputs, truths, answers


def monitor_log(model: str, log: str, *, labels: str | None = None, confidence: float | None = None,
                audit_rate: float | None = None, id_column: str | None = None, labels_id_column: str | None = None,
                label_column: str | None = None, expert_answer_column: str | None = None,
                reference_log: str | None = None, reference_labels: str | None = None,
                reference_id_column: str | None = None, reference_label_column: str | None = None,
                reference_expert_columns: list[str] | None = None) -> dict[str, Any]:
    """The monitor's state after the decision log `log` of the saved model `model` (and the labels file `labels`),
    its label-free estimate recalibrated first on `reference_log` and `reference_labels` when given
    ([`reference_rows`]).

    Example:

    ```python
    >>> from hf_defer.commands.monitor import monitor_log
    >>> state = monitor_log("my-model", "decisions.jsonl", labels="answers.csv", audit_rate=0.05)  # doctest: +SKIP
    >>> state["alarm"]  # doctest: +SKIP
    ```
    """
    from ..monitoring import DeferralMonitor

    if (reference_log is None) != (reference_labels is None):
        raise ValueError("--reference_log and --reference_labels go together (the decision log of the model on "
                         "labelled reference inputs, and their labels); got only "
                         + ("--reference_log." if reference_labels is None else "--reference_labels."))
    monitor = DeferralMonitor.from_model(model, confidence=confidence,
                                         audit_rate=None if labels is None else (audit_rate or 0.0))
    if reference_log is not None:
        outputs, truths, answers = reference_rows(
            reference_log, reference_labels, monitor.expert_names, id_column=id_column,
            labels_id_column=reference_id_column, label_column=reference_label_column,
            expert_columns=reference_expert_columns)
        try:
            monitor.recalibrate(outputs, truths, expert_answers=answers)
        except ValueError as problem:  # a label or a row the monitor cannot read: say which files
            raise ValueError(f"--reference_log {reference_log!r} / --reference_labels {reference_labels!r}: "
                             f"{problem}") from None
    table, ids = _log_table(log, "--log", id_column)
    label_of: dict[str, Any] = {}
    answer_of: dict[str, Any] = {}
    if labels is not None:
        answers, key, value = _labels_table(labels, "--labels", labels_id_column, "--labels_id_column",
                                            ("item", "id", "row"), label_column, "--label_column")
        expert = None if expert_answer_column is None else _column(answers, expert_answer_column, (),
                                                                   "--expert_answer_column", labels)
        for row in answers.to_dict("records"):  # the latest answer of an item wins (the file is oldest first)
            if not _missing(row[value]):
                label_of[str(row[key])] = _cell(row[value])
                answer_of[str(row[key])] = _cell(row[value] if expert is None else row[expert])
        _check_known(label_of, ids, "--labels", labels, "--log", log, key)
    rows = table.to_dict("records")
    defer = [_deferred(row) for row in rows]
    audited = [not d and i in label_of for d, i in zip(defer, ids)]
    if labels is not None and any(audited) and not audit_rate:
        raise ValueError(f"--labels {labels!r} labels rows the model kept: give --audit_rate, the chance each kept "
                         "row had to be drawn for that audit (the estimate weighs them by its inverse).")
    monitor.update(rows, ids=ids, audited=audited if labels is not None else None)
    if labels is not None:
        monitor.update(labels=label_of, expert_answers={i: answer_of[i] for i, d in zip(ids, defer)
                                                        if d and i in answer_of})
    state = monitor.state()
    state["log"], state["labels"] = log, labels
    state["reference_log"], state["reference_labels"] = reference_log, reference_labels
    return state


def _format(state: dict[str, Any]) -> str:
    lines = [f"{state['rows']} decisions; confidence {state['confidence']:g} over the whole stream, split among "
             f"{state['tests']} tests"]
    for name, c in state["channels"].items():
        if c["n"] == 0:
            continue
        target = "" if c["target"] is None else f"  target {c['target']:g}"
        flag = "  ALARM" if c["alarm"] else ""
        lines.append(f"  {name:<28} {c['mean']:.4f}  [{c['lower']:.4f}, {c['upper']:.4f}]  (n={c['n']}){target}"
                     f"{flag}")
    if state["awaiting_labels"]:
        lines.append(f"  {state['awaiting_labels']} rows drawn for a label have none yet: the true error covers the "
                     "rows before the first of them")
    recalibration = state.get("recalibration")
    if recalibration is not None:
        fitted = recalibration["fitted_on_rows"]
        lines.append("  label-free estimate recalibrated: " + (", ".join(
            f"{key} (a map fitted on {rows} reference rows)" for key, rows in fitted.items()) or "no map")
            + ("; raw (calibrated on the reference rows, or too few of them): " + ", ".join(recalibration["raw"])
               if recalibration["raw"] else ""))
    lines.append("alarm: " + (state["alarm"]["message"] if state["alarm"] else "none"))
    return "\n".join(lines)


def run_monitor(args: argparse.Namespace) -> int:
    """`hf-defer monitor`: prints the state, writes it as JSON with --output; exit status 1 on an alarm with
    --fail_on_alarm."""
    if args.output is not None:
        inputs = [path for path in (args.log, args.labels, args.reference_log, args.reference_labels) if path]
        check_output_file(args.output, inputs, overwrite=args.overwrite)
    state = monitor_log(args.model, args.log, labels=args.labels, confidence=args.confidence,
                        audit_rate=args.audit_rate, id_column=args.id_column,
                        labels_id_column=args.labels_id_column, label_column=args.label_column,
                        expert_answer_column=args.expert_answer_column, reference_log=args.reference_log,
                        reference_labels=args.reference_labels, reference_id_column=args.reference_id_column,
                        reference_label_column=args.reference_label_column,
                        reference_expert_columns=None if args.reference_expert_columns is None else
                        args.reference_expert_columns.split(","))
    print(_format(state))
    if args.output is not None:
        with open(args.output, "w") as handle:
            json.dump(state, handle, indent=2)
    return 1 if args.fail_on_alarm and state["alarm"] else 0
