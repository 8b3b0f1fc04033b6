"""`hf-defer monitor`: a decision log (what `hf-defer predict` writes) checked against the model's certified promises,
in one batch: the deferral rates, the label-free error estimate and, with a labels file, the true system error, each
with its anytime-valid bound, and the alarm ([`DeferralMonitor`]).

The log's rows are taken in their order (the order the decisions were made). A labels file (e.g. `hf-defer review
pull`'s `answers.csv`: `item`, `answer`) gives the true label of some rows, matched by id: every deferred row should
have one (the reviewers' answers), and the kept rows that have one must have been drawn for an audit at random, each
with probability `--audit_rate`. A reviewer's answer is taken as final (as the expert's answer and as the truth, so a
deferred row counts as right) unless `--expert_answer_column` names a column with the expert's own answer.
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from .inputs import read_table
from .outputs import check_output_file

__all__ = ["monitor_log", "run_monitor"]


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


def monitor_log(model: str, log: str, *, labels: str | None = None, confidence: float | None = None,
                audit_rate: float | None = None, id_column: str | None = None, labels_id_column: str | None = None,
                label_column: str | None = None, expert_answer_column: str | None = None) -> dict[str, Any]:
    """The monitor's state after the decision log `log` of the saved model `model` (and the labels file `labels`).

    Example:

    ```python
    >>> from hf_defer.commands.monitor import monitor_log
    >>> state = monitor_log("my-model", "decisions.jsonl", labels="answers.csv", audit_rate=0.05)  # doctest: +SKIP
    >>> state["alarm"]  # doctest: +SKIP
    ```
    """
    from ..monitoring import DeferralMonitor

    monitor = DeferralMonitor.from_model(model, confidence=confidence,
                                         audit_rate=None if labels is None else (audit_rate or 0.0))
    table = read_table(log, "--log").to_pandas()
    ids_name = _column(table, id_column, ("id", "row", "item"), "--id_column", log)
    needed = {"defer", "expert"}
    if not needed <= set(table.columns):
        raise ValueError(f"--log {log!r} is not a decision log of hf-defer predict: it lacks the columns "
                         f"{sorted(needed - set(table.columns))} (its columns are {list(table.columns)}).")
    ids = [str(value) for value in table[ids_name]]
    if len(set(ids)) != len(ids):
        raise ValueError(f"--log {log!r}: the ids of column {ids_name!r} repeat; give --id_column with unique ids.")
    label_of: dict[str, Any] = {}
    answer_of: dict[str, Any] = {}
    if labels is not None:
        answers = read_table(labels, "--labels").to_pandas()
        key = _column(answers, labels_id_column, ("item", "id", "row"), "--labels_id_column", labels)
        value = _column(answers, label_column, ("label", "labels", "answer"), "--label_column", labels)
        expert = None if expert_answer_column is None else _column(answers, expert_answer_column, (),
                                                                   "--expert_answer_column", labels)
        for row in answers.to_dict("records"):  # the latest answer of an item wins (the file is oldest first)
            if not _missing(row[value]):
                label_of[str(row[key])] = row[value]
                answer_of[str(row[key])] = row[value] if expert is None else row[expert]
        unknown = sorted(set(label_of) - set(ids))
        if unknown:
            raise ValueError(f"--labels {labels!r} labels ids that are not in --log {log!r}: {unknown[:5]} (matched "
                             f"on {key!r} against the log's {ids_name!r}).")
    rows = table.to_dict("records")
    defer = [str(row["defer"]).strip().lower() in ("true", "1") for row in rows]
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
    lines.append("alarm: " + (state["alarm"]["message"] if state["alarm"] else "none"))
    return "\n".join(lines)


def run_monitor(args: argparse.Namespace) -> int:
    """`hf-defer monitor`: prints the state, writes it as JSON with --output; exit status 1 on an alarm with
    --fail_on_alarm."""
    if args.output is not None:
        check_output_file(args.output, [args.log] + ([args.labels] if args.labels else []), overwrite=args.overwrite)
    state = monitor_log(args.model, args.log, labels=args.labels, confidence=args.confidence,
                        audit_rate=args.audit_rate, id_column=args.id_column,
                        labels_id_column=args.labels_id_column, label_column=args.label_column,
                        expert_answer_column=args.expert_answer_column)
    print(_format(state))
    if args.output is not None:
        with open(args.output, "w") as handle:
            json.dump(state, handle, indent=2)
    return 1 if args.fail_on_alarm and state["alarm"] else 0
