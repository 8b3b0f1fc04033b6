"""Label Studio tasks from a deferral model's decisions: one task per deferred input, keyed so that pushing the same
input twice finds the task already there.

A task's `data` holds the input (`text`), its key (`hf_defer_key`: the input's own id when it has one, else the SHA-256
of its content), the model's suggestion and class probabilities, the expert it routed the input to with every
expert's estimated accuracy, and the cost of that expert. Its pre-annotation (`predictions`) is the suggested class,
scored by the model's probability of that class.
"""

from __future__ import annotations

import hashlib
import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from .labeling import CONTROL_NAME, OBJECT_NAME

__all__ = ["KEY_FIELD", "deferred_tasks", "task_key"]

KEY_FIELD = "hf_defer_key"
"""The task field that holds an input's key; the same key is the `item` of every answer pulled back."""


def task_key(content: Any, input_id: Any = None) -> str:
    """The key of an input: `id:<input_id>` when the input has an id, else `sha256:<hex>` of its content (a string as
    UTF-8, anything else as canonical JSON).

    Example:

    ```python
    >>> from hf_defer.review.tasks import task_key
    >>> task_key("some tweet", input_id=17)
    'id:17'
    >>> task_key("some tweet")[:15]
    'sha256:8c98a012'

    ```
    """
    if input_id is not None:
        if isinstance(input_id, float) and math.isnan(input_id) or (isinstance(input_id, str) and not input_id.strip()):
            raise ValueError(f"an input id must be a non-empty value, got {input_id!r}.")
        return f"id:{input_id}"
    payload = content if isinstance(content, str) else json.dumps(content, sort_keys=True, default=str)
    return "sha256:" + hashlib.sha256(payload.encode("utf-8")).hexdigest()


def _number(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{what} must be a finite number, got {value!r}.")
    return float(value)


def _expert_cost(output: Mapping[str, Any], expert_names: Sequence[str], expert_costs: Sequence[float] | None) -> float:
    if "cost" in output and output["cost"] is not None:
        return _number(output["cost"], "a pipeline output's 'cost'")
    if not expert_costs:
        return 0.0
    return _number(expert_costs[list(expert_names).index(output["expert"])], "the routed expert's cost")


def deferred_tasks(
    inputs: Sequence[Any],
    outputs: Sequence[Mapping[str, Any]],
    *,
    expert_names: Sequence[str],
    ids: Sequence[Any] | None = None,
    expert_costs: Sequence[float] | None = None,
    model_version: str = "hf_defer",
) -> list[dict[str, Any]]:
    """The Label Studio tasks for the inputs a deferral pipeline deferred (its other outputs are left out).

    Args:
        inputs (`Sequence`): the inputs as a person should read them (texts), in the order of `outputs`.
        outputs (`Sequence[dict]`): what `pipeline("deferral")` returned for each input (`defer`, `expert`,
            `class_label`, `class_score`, `scores`, `expert_accuracy`, and `cost` when the pipeline had priced experts).
        expert_names (`Sequence[str]`): the model's `config.expert_names` (the order of `expert_accuracy`).
        ids (`Sequence`, *optional*): one id per input (a dataset's id column); without ids, inputs are keyed by a
            hash of their content, so two identical texts are one task.
        expert_costs (`Sequence[float]`, *optional*): the model's `config.expert_costs`, for outputs without `cost`.
        model_version (`str`, *optional*): the pre-annotations' model version (the model's name or folder).

    Returns:
        `list[dict]`: one task per distinct deferred key, in input order, ready for the import API.

    Raises:
        ValueError: lengths that differ, an output that is not a deferral output, an expert not in `expert_names`, a
            non-finite score, or one id given to two inputs.

    Example:

    ```python
    >>> from hf_defer.review.tasks import deferred_tasks
    >>> outputs = [{"defer": True, "expert": "reviewer", "class_label": "offensive", "class_score": 0.6,
    ...             "scores": {"offensive": 0.6, "neither": 0.4}, "expert_accuracy": [0.9]},
    ...            {"defer": False, "expert": None, "class_label": "neither", "class_score": 0.95,
    ...             "scores": {"neither": 0.95, "offensive": 0.05}, "expert_accuracy": [0.7]}]
    >>> tasks = deferred_tasks(["you idiot", "nice day"], outputs, expert_names=["reviewer"], ids=[1, 2],
    ...                        expert_costs=[0.2])
    >>> len(tasks), tasks[0]["data"]["hf_defer_key"], tasks[0]["data"]["hf_defer_cost"]
    (1, 'id:1', 0.2)
    >>> tasks[0]["predictions"][0]["result"][0]["value"], tasks[0]["predictions"][0]["score"]
    ({'choices': ['offensive']}, 0.6)

    ```
    """
    if len(inputs) != len(outputs):
        raise ValueError(f"`inputs` and `outputs` must have one entry per input, got {len(inputs)} and {len(outputs)}.")
    if ids is not None and len(ids) != len(inputs):
        raise ValueError(f"`ids` must have one id per input, got {len(ids)} ids for {len(inputs)} inputs.")
    names = list(expert_names)
    if expert_costs is not None and len(expert_costs) != len(names):
        raise ValueError(f"`expert_costs` must have one cost per expert {names}, got {list(expert_costs)}.")
    if ids is not None:
        seen: dict[str, int] = {}
        for row, input_id in enumerate(ids):
            key = task_key(None, input_id)
            if key in seen:
                raise ValueError(f"`ids` gives the id {input_id!r} to rows {seen[key]} and {row}; ids must be unique.")
            seen[key] = row
    tasks: dict[str, dict[str, Any]] = {}
    for row, (content, output) in enumerate(zip(inputs, outputs)):
        missing = [name for name in ("defer", "expert", "class_label", "class_score", "expert_accuracy")
                   if not isinstance(output, Mapping) or name not in output]
        if missing:
            raise ValueError(f"outputs[{row}] is not a deferral pipeline output: it lacks {missing}.")
        if not output["defer"]:
            continue
        if output["expert"] not in names:
            raise ValueError(f"outputs[{row}] routes to the expert {output['expert']!r}, which is not one of "
                             f"`expert_names` {names}.")
        accuracy = [_number(value, f"outputs[{row}]['expert_accuracy']") for value in output["expert_accuracy"]]
        if len(accuracy) != len(names):
            raise ValueError(f"outputs[{row}]['expert_accuracy'] has {len(accuracy)} values for the experts {names}.")
        score = _number(output["class_score"], f"outputs[{row}]['class_score']")
        scores = {str(name): _number(value, f"outputs[{row}]['scores']")
                  for name, value in (output.get("scores") or {output["class_label"]: score}).items()}
        key = task_key(content, None if ids is None else ids[row])
        data = {
            OBJECT_NAME: content if isinstance(content, str) else json.dumps(content, default=str),
            KEY_FIELD: key,
            "hf_defer_suggestion": str(output["class_label"]),
            "hf_defer_suggestion_score": f"{score:.2f}",
            "hf_defer_scores": scores,
            "hf_defer_expert": output["expert"],
            "hf_defer_expert_accuracy": dict(zip(names, accuracy)),
            "hf_defer_cost": _expert_cost(output, names, expert_costs),
        }
        if ids is not None:
            data["hf_defer_id"] = ids[row] if isinstance(ids[row], (str, int)) else str(ids[row])
        result = {"from_name": CONTROL_NAME, "to_name": OBJECT_NAME, "type": "choices",
                  "value": {"choices": [str(output["class_label"])]}, "score": score}
        tasks.setdefault(key, {"data": data, "predictions": [{"model_version": model_version, "score": score,
                                                              "result": [result]}]})
    return list(tasks.values())
