"""Pull: the reviewers' completed answers read back as a long table (item, annotator, answer, time), incrementally, and
turned into one expert column per reviewer for the next training round.

A pull reads every annotated task of the project and returns the answers not already in `known` (the table of earlier
pulls): a new answer, or a new version of one (its `time` changed). Nothing pulled before is dropped: answers whose task
was deleted on the server since are named in the log and stay in `known`. [`pull_to_csv`] keeps the table in a CSV file,
replaced atomically, so an interrupted pull loses nothing and the next pull starts where it stopped.
"""

from __future__ import annotations

import logging
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from .answers import ANSWER_COLUMNS, annotation_rows
from .client import ReviewProject

__all__ = ["PullResult", "pull", "pull_to_csv", "read_answers", "reviews_to_columns"]

logger = logging.getLogger(__name__)


@dataclass
class PullResult:
    """What a pull found.

    Attributes:
        table (`pandas.DataFrame`): the new answers, with the columns of
            [`~hf_defer.review.answers.ANSWER_COLUMNS`], oldest first.
        skipped (`list[dict]`): annotations that are not answers (`task_id`, `annotation_id`, `annotator`, `item`,
            `reason`).
        gone (`list[dict]`): answers in `known` whose annotation is no longer on the server (`item`, `annotator`,
            `task_id`, `annotation_id`); they stay in `known`.

    Example:

    ```python
    >>> from hf_defer.review import PullResult, pull, read_answers
    >>> result = pull(project)  # doctest: +SKIP
    >>> result = PullResult(table=read_answers("no-answers-yet.csv"))  # what a pull that found nothing returns
    >>> len(result.table), list(result.table.columns[:3]), result.skipped, result.gone
    (0, ['item', 'annotator', 'answer'], [], [])

    ```
    """

    table: pd.DataFrame
    skipped: list[dict[str, Any]] = field(default_factory=list)
    gone: list[dict[str, Any]] = field(default_factory=list)


def _empty() -> pd.DataFrame:
    return pd.DataFrame({name: pd.Series(dtype=object) for name in ANSWER_COLUMNS})


def _identity(annotation_id: Any, time: Any) -> tuple[str, str]:
    return str(annotation_id), str(time)


def _check_known(known: Any) -> pd.DataFrame:
    if known is None:
        return _empty()
    if not isinstance(known, pd.DataFrame):
        raise ValueError(f"`known` must be a pandas.DataFrame of earlier pulls (or None), got {type(known).__name__}.")
    missing = [name for name in ("item", "annotator", "answer", "time", "task_id", "annotation_id")
               if name not in known.columns]
    if missing:
        raise ValueError(f"`known` lacks the column(s) {missing} of a pulled table; its columns are "
                         f"{[str(name) for name in known.columns]}.")
    return known


def pull(project: ReviewProject, known: pd.DataFrame | None = None) -> PullResult:
    """Read the answers given since the last pull.

    Args:
        project ([`ReviewProject`]): from [`connect`].
        known (`pandas.DataFrame`, *optional*): the answers pulled before (what earlier pulls returned, concatenated,
            or [`read_answers`] of the CSV that [`pull_to_csv`] keeps); those are not returned again.

    Returns:
        [`PullResult`]: the new answers as a long table, and what was skipped or has gone from the server.

    Raises:
        ReviewServerError: the server is unreachable or refuses the token (nothing is lost: pull again).

    Example:

    ```python
    >>> first = pull(project).table  # doctest: +SKIP
    >>> later = pull(project, known=first).table  # only what was answered since  # doctest: +SKIP

    ```
    """
    known = _check_known(known)
    seen = {_identity(a, t) for a, t in zip(known["annotation_id"], known["time"])}
    tasks = list(project.annotated_tasks())
    users = project.users()
    if any(annotation.get("completed_by") not in users for task in tasks for annotation in task["annotations"]):
        users = project.users(refresh=True)  # a reviewer who joined since the last read
    rows, skipped = annotation_rows(tasks, users, project.classes)
    for skip in skipped:
        log = logger.info if skip["reason"].startswith("skipped the task") else logger.warning
        log(f"pull: skipped annotation {skip['annotation_id']} of task {skip['task_id']} (item "
                       f"{skip['item']!r}) by {skip['annotator']}: {skip['reason']}.")
    new = [row for row in rows if _identity(row["annotation_id"], row["time"]) not in seen]
    revised = {str(row["annotation_id"]) for row in new} & {str(a) for a in known["annotation_id"]}
    if revised:
        logger.info(f"pull: {len(revised)} answer(s) were changed since the last pull; their new versions are added "
                    "(reviews_to_columns keeps the latest).")
    on_server = {str(annotation.get("id")) for task in tasks for annotation in task["annotations"]}
    gone_rows = known[~known["annotation_id"].astype(str).isin(on_server)]
    gone = gone_rows[["item", "annotator", "task_id", "annotation_id"]].drop_duplicates().to_dict("records")
    if gone:
        tasks_gone = sorted({str(row["task_id"]) for row in gone})
        logger.warning(f"pull: {len(gone)} answer(s) pulled before are no longer on the server (task(s) "
                       f"{tasks_gone[:20]} deleted, or the annotations deleted); they stay in your table.")
    table = pd.DataFrame(new, columns=list(ANSWER_COLUMNS)) if new else _empty()
    table = table.sort_values(["time", "annotation_id"], kind="stable").reset_index(drop=True)
    logger.info(f"pull from project {project.title!r}: {len(table)} new answer(s), {len(skipped)} skipped.")
    return PullResult(table=table, skipped=skipped, gone=gone)


def read_answers(path: str | os.PathLike) -> pd.DataFrame:
    """The long table a [`pull_to_csv`] kept (an empty table when the file does not exist yet).

    Example:

    ```python
    >>> import os, tempfile
    >>> import pandas as pd
    >>> from hf_defer.review import read_answers
    >>> path = os.path.join(tempfile.mkdtemp(), "answers.csv")
    >>> len(read_answers(path))  # nothing pulled yet
    0
    >>> pd.DataFrame({"item": ["id:1"], "annotator": ["ann@example.com"], "answer": ["neither"],
    ...               "time": ["2026-01-05T10:00:00Z"], "text": ["you are such a clown lol"], "task_id": [7],
    ...               "annotation_id": [12], "lead_time": [4.2]}).to_csv(path, index=False)
    >>> read_answers(path)[["item", "annotator", "answer"]].values.tolist()
    [['id:1', 'ann@example.com', 'neither']]

    ```
    """
    path = Path(path)
    if not path.exists():
        return _empty()
    try:
        table = pd.read_csv(path, dtype={"item": str, "annotator": str, "answer": str, "time": str, "text": str},
                            keep_default_na=False, na_values={"lead_time": [""]}, encoding="utf-8-sig")
    except (UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as error:
        reason = " ".join(str(error).split())[:200]
        raise ValueError(f"the answers file {str(path)!r} cannot be read as a UTF-8 CSV ({reason}); give the file "
                         "`hf-defer review pull` keeps, or another --output.") from None
    return _check_known(table)


def pull_to_csv(project: ReviewProject, path: str | os.PathLike) -> PullResult:
    """Pull the new answers and append them to the CSV at `path` (created if missing), written to a temporary file
    and renamed over the old one, so the file always holds every answer pulled so far, each once.

    Example:

    ```python
    >>> result = pull_to_csv(project, "answers.csv")  # doctest: +SKIP
    >>> len(result.table), len(read_answers("answers.csv"))  # new now, all so far  # doctest: +SKIP

    ```
    """
    path = Path(path)
    known = read_answers(path)
    result = pull(project, known)
    if len(result.table) or not path.exists():
        combined = pd.concat([known, result.table], ignore_index=True) if len(known) else result.table
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        os.close(handle)
        try:
            combined.to_csv(scratch, index=False)
            os.replace(scratch, path)
        finally:
            if os.path.exists(scratch):
                os.remove(scratch)
    return result


def reviews_to_columns(table: pd.DataFrame, *, min_answers: int = 1, duplicates: str = "last",
                       column_prefix: str = "") -> pd.DataFrame:
    """One column per reviewer (`None` where they did not review the item), with the item's key and text, through
    [`~hf_defer.annotations_to_columns`]; a reviewer's latest answer counts when they changed it.

    Args:
        table (`pandas.DataFrame`): pulled answers (one or more pulls concatenated, or [`read_answers`]).
        min_answers (`int`, *optional*, defaults to 1): drop reviewers with fewer answers.
        duplicates (`str`, *optional*, defaults to `"last"`): how to resolve one reviewer answering one item twice
            (`"last"`: the latest by `time`).
        column_prefix (`str`, *optional*): prepended to each reviewer's column name.

    Returns:
        `pandas.DataFrame`: `item`, `text`, then one column per reviewer, ready for the next round (missing answers are
        `None`, which training masks).

    Example:

    ```python
    >>> import pandas as pd
    >>> from hf_defer.review import reviews_to_columns
    >>> table = pd.DataFrame({"item": ["id:1", "id:1", "id:2"], "annotator": ["ann@x.org", "bob@x.org", "ann@x.org"],
    ...                       "answer": ["neither", "offensive", "neither"], "text": ["hi", "hi", "yo"],
    ...                       "time": ["2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z", "2026-01-01T00:02:00Z"]})
    >>> reviews_to_columns(table)
       item text ann@x.org  bob@x.org
    0  id:1   hi   neither  offensive
    1  id:2   yo   neither       None

    ```
    """
    from hf_defer.data.annotations import annotations_to_columns

    missing = [name for name in ("item", "annotator", "answer", "time", "text") if name not in table.columns]
    if missing:
        raise ValueError(f"`table` lacks the column(s) {missing} of a pulled table; its columns are "
                         f"{[str(name) for name in table.columns]}.")
    ordered = table.sort_values("time", kind="stable") if duplicates == "last" else table
    return annotations_to_columns(ordered, "item", "annotator", "answer", min_answers=min_answers,
                                  duplicates=duplicates, keep_columns=["text"], column_prefix=column_prefix)
