"""Answers: Label Studio's annotated tasks (as its API sends them) turned into rows of a long table, one row per answer.

Each row is `item` (the task's key, the input's id or content hash), `annotator` (the reviewer's email), `answer` (a
class name), `time` (when the answer was last changed, as the server wrote it), then `text`, `task_id`,
`annotation_id` and `lead_time` (seconds the reviewer spent). What is not an answer is skipped and said: a skipped
(cancelled) task, an empty or multiple choice, a class the model does not have, a task that hf_defer did not push.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .labeling import CONTROL_NAME, OBJECT_NAME
from .tasks import KEY_FIELD

__all__ = ["ANSWER_COLUMNS", "annotation_rows", "answer_of"]

ANSWER_COLUMNS = ("item", "annotator", "answer", "time", "text", "task_id", "annotation_id", "lead_time")
"""The columns of the long table, in order."""


def answer_of(annotation: Mapping[str, Any], classes: Sequence[str]) -> tuple[str | None, str | None]:
    """The class an annotation chose, or `None` with the reason it is not an answer.

    Example:

    ```python
    >>> from hf_defer.review.answers import answer_of
    >>> choice = lambda *names: {"result": [{"from_name": "label", "type": "choices", "value": {"choices": list(names)}}]}
    >>> answer_of(choice("neither"), ["neither", "offensive"])
    ('neither', None)
    >>> answer_of(choice("spam"), ["neither", "offensive"])
    (None, "answered 'spam', a class the model does not have (its classes are ['neither', 'offensive'])")

    ```
    """
    if annotation.get("was_cancelled"):
        return None, "skipped the task (a cancelled annotation)"
    chosen = [choice for item in annotation.get("result") or [] if item.get("from_name") == CONTROL_NAME
              for choice in (item.get("value") or {}).get("choices") or []]
    if not chosen:
        return None, "submitted no choice"
    if len(chosen) > 1:
        return None, f"chose {len(chosen)} classes {chosen}, not one"
    if chosen[0] not in classes:
        return None, f"answered {chosen[0]!r}, a class the model does not have (its classes are {list(classes)})"
    return chosen[0], None


def annotation_rows(
    tasks: Iterable[Mapping[str, Any]], users: Mapping[int, str], classes: Sequence[str]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of the long table for every answer in `tasks`, and what was skipped (with the reason).

    Args:
        tasks (`Iterable[dict]`): tasks as the API sends them (`id`, `data`, `annotations`).
        users (`Mapping[int, str]`): user id to identity (email); an id not in it is filed as `user-<id>`.
        classes (`Sequence[str]`): the model's classes; another answer is skipped.

    Returns:
        `(rows, skipped)`: `rows` are dicts with [`ANSWER_COLUMNS`]; `skipped` dicts with `task_id`,
        `annotation_id`, `annotator`, `item` and `reason`.

    Example:

    ```python
    >>> from hf_defer.review.answers import annotation_rows
    >>> task = {"id": 3, "data": {"text": "hi", "hf_defer_key": "id:7"}, "annotations": [
    ...     {"id": 9, "completed_by": 2, "updated_at": "2026-01-02T03:04:05Z", "lead_time": 4.5,
    ...      "result": [{"from_name": "label", "value": {"choices": ["neither"]}}]}]}
    >>> rows, skipped = annotation_rows([task], {2: "ann@example.com"}, ["neither", "offensive"])
    >>> rows[0]["item"], rows[0]["annotator"], rows[0]["answer"], skipped
    ('id:7', 'ann@example.com', 'neither', [])

    ```
    """
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for task in tasks:
        data = task.get("data") or {}
        key = data.get(KEY_FIELD)
        for annotation in task.get("annotations") or []:
            user = annotation.get("completed_by")
            user = user.get("id") if isinstance(user, Mapping) else user
            annotator = users.get(user, f"user-{user}")
            if key is None:
                skipped.append({"task_id": task.get("id"), "annotation_id": annotation.get("id"), "annotator": annotator,
                                "item": None, "reason": f"task {task.get('id')} was not pushed by hf_defer (its data has "
                                                        f"no {KEY_FIELD!r})"})
                continue
            answer, reason = answer_of(annotation, classes)
            if answer is None:
                skipped.append({"task_id": task.get("id"), "annotation_id": annotation.get("id"), "annotator": annotator,
                                "item": key, "reason": reason})
                continue
            rows.append({"item": key, "annotator": annotator, "answer": answer,
                         "time": annotation.get("updated_at") or annotation.get("created_at"),
                         "text": data.get(OBJECT_NAME), "task_id": task.get("id"), "annotation_id": annotation.get("id"),
                         "lead_time": annotation.get("lead_time")})
    return rows, skipped
