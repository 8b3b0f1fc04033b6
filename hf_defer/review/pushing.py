"""Push: the inputs a deferral model defers become Label Studio tasks, with the model's suggestion as a pre-annotation.

Pushing is idempotent and resumable: the keys of the tasks already in the project are read first and only the missing
ones are imported, in batches that each land whole or not at all. Pushing the same inputs again creates nothing; a push
cut off half way is finished by running it again.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..modeling.validators import check_positive_int
from .client import ReviewProject, ReviewServerError
from .tasks import KEY_FIELD, deferred_tasks

__all__ = ["PushReport", "push", "push_dataset"]

logger = logging.getLogger(__name__)


@dataclass
class PushReport:
    """What a push did.

    Attributes:
        inputs (`int`): inputs looked at.
        deferred (`int`): distinct deferred inputs (one task each).
        created (`list[int]`): ids of the tasks created by this push.
        already_there (`int`): deferred inputs whose task the project already had (pushed before).

    Example:

    ```python
    >>> from hf_defer.review import PushReport
    >>> report = PushReport(inputs=2, deferred=1, created=[41], already_there=0)  # what push(...) returns
    >>> print(report)
    2 inputs, 1 deferred: 1 tasks created, 0 already in the project

    ```
    """

    inputs: int = 0
    deferred: int = 0
    created: list[int] = field(default_factory=list)
    already_there: int = 0

    def __str__(self) -> str:
        return (f"{self.inputs} inputs, {self.deferred} deferred: {len(self.created)} tasks created, "
                f"{self.already_there} already in the project")


def _check_batch_size(batch_size: Any) -> int:
    return check_positive_int(batch_size, "batch_size")


def push(
    project: ReviewProject,
    inputs: Sequence[Any],
    outputs: Sequence[Mapping[str, Any]],
    *,
    expert_names: Sequence[str],
    expert_costs: Sequence[float] | None = None,
    ids: Sequence[Any] | None = None,
    model_version: str = "hf_defer",
    batch_size: int = 100,
) -> PushReport:
    """Send the inputs a deferral pipeline deferred to a Label Studio project, as tasks with pre-annotations.

    Args:
        project ([`ReviewProject`]): from [`connect`].
        inputs (`Sequence`): the inputs as reviewers should read them (texts), aligned with `outputs`.
        outputs (`Sequence[dict]`): `pipeline("deferral")`'s output for each input; the inputs it did not defer are
            left out.
        expert_names (`Sequence[str]`), expert_costs (`Sequence[float]`, *optional*): the model's
            `config.expert_names` and `config.expert_costs`.
        ids (`Sequence`, *optional*): one id per input; tasks are keyed by it (else by a hash of the input).
        model_version (`str`, *optional*): the version the pre-annotations are filed under.
        batch_size (`int`, *optional*, defaults to 100): tasks per import request.

    Returns:
        [`PushReport`].

    Raises:
        ValueError: see [`~hf_defer.review.tasks.deferred_tasks`]; a suggested class the project does not offer.
        ReviewServerError: the server failed; its `report` attribute says what had been created before (run the same
            push again to finish: what is already there is skipped).

    Example:

    ```python
    >>> from transformers import pipeline  # doctest: +SKIP
    >>> clf = pipeline("deferral", model="demo_model")  # doctest: +SKIP
    >>> texts = ["tweet one", "tweet two"]  # doctest: +SKIP
    >>> push(project, texts, clf(texts), expert_names=clf.model.config.expert_names)  # doctest: +SKIP
    PushReport(inputs=2, deferred=1, created=[41], already_there=0)

    ```
    """
    batch_size = _check_batch_size(batch_size)
    tasks = deferred_tasks(inputs, outputs, expert_names=expert_names, ids=ids, expert_costs=expert_costs,
                           model_version=model_version)
    unknown = sorted({task["data"]["hf_defer_suggestion"] for task in tasks} - set(project.classes))
    if unknown:
        raise ValueError(f"the model suggests the class(es) {unknown}, which project {project.title!r} does not offer "
                         f"(it offers {project.classes}).")
    report = PushReport(inputs=len(inputs), deferred=len(tasks))
    existing = project.task_keys()
    new = [task for task in tasks if task["data"][KEY_FIELD] not in existing]
    report.already_there = len(tasks) - len(new)
    if report.already_there:
        logger.info(f"push: {report.already_there} deferred input(s) already have a task in project "
                    f"{project.title!r}; skipped.")
    for start in range(0, len(new), batch_size):
        batch = new[start:start + batch_size]
        try:
            created = project.import_tasks(batch)
        except ReviewServerError as error:
            error.report = report
            raise ReviewServerError(
                f"{error} The push stopped after creating {len(report.created)} of {len(new)} new task(s); run the same "
                "push again to create the rest (tasks already in the project are skipped).") from error
        if len(created) != len(batch):
            logger.warning(f"push: the server reported {len(created)} task id(s) for an import of {len(batch)} task(s).")
        report.created += created
    logger.info(f"push to project {project.title!r}: {report}.")
    return report


def push_dataset(
    project: ReviewProject,
    classifier: Any,
    dataset: Any,
    *,
    text_column: str = "text",
    id_column: str | None = None,
    input_column: str | None = None,
    batch_size: int = 100,
    **pipeline_kwargs: Any,
) -> PushReport:
    """Run a dataset through a deferral pipeline and push the inputs it defers ([`push`]).

    Args:
        project ([`ReviewProject`]): from [`connect`].
        classifier (`DeferralPipeline`): `pipeline("deferral", model=...)`.
        dataset (`datasets.Dataset`): the inputs.
        text_column (`str`, *optional*, defaults to `"text"`): what reviewers read.
        id_column (`str`, *optional*): a column of unique ids to key the tasks by (else a hash of the text).
        input_column (`str`, *optional*): what the model reads, when it is not the text (e.g. `"features"` for a
            head-only model over sentence embeddings).
        batch_size (`int`, *optional*, defaults to 100): inputs per pipeline batch and tasks per import request.
        pipeline_kwargs: passed to each pipeline call (e.g. `truncation=True`, `expert_costs=[...]`).

    Returns:
        [`PushReport`].

    Example:

    ```python
    >>> report = push_dataset(project, pipeline("deferral", model="demo_model"), test_split,  # doctest: +SKIP
    ...                       text_column="text", truncation=True)
    >>> print(report)  # doctest: +SKIP
    4957 inputs, 811 deferred: 811 tasks created, 0 already in the project

    ```
    """
    batch_size = _check_batch_size(batch_size)
    columns = list(getattr(dataset, "column_names", []) or [])
    for argument, name in (("text_column", text_column), ("id_column", id_column), ("input_column", input_column)):
        if name is not None and name not in columns:
            raise ValueError(f"`{argument}` {name!r} is not a column of the dataset; its columns are {columns}.")
    texts = list(dataset[text_column])
    model_inputs: Any = texts if input_column is None else list(dataset[input_column])
    if input_column == "features":  # a head-only model takes one [N, D] array
        import numpy as np

        model_inputs = np.asarray(model_inputs, dtype=np.float32)
    outputs = classifier(model_inputs, batch_size=batch_size, **pipeline_kwargs)
    if isinstance(outputs, Mapping):
        outputs = [outputs]
    config = classifier.model.config
    return push(project, texts, list(outputs), expert_names=list(config.expert_names),
                expert_costs=pipeline_kwargs.get("expert_costs", getattr(config, "expert_costs", None)),
                ids=None if id_column is None else list(dataset[id_column]),
                model_version=str(getattr(config, "_name_or_path", "") or "hf_defer"), batch_size=batch_size)
