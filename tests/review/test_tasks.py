"""Tasks from pipeline outputs: only deferred inputs, keyed by id or by the SHA-256 of the content, with the suggestion,
probabilities, routed expert, accuracies and cost; bad outputs are refused."""

from __future__ import annotations

import math

import pytest

from hf_defer.review.tasks import deferred_tasks, task_key

EXPERTS = ["cheap", "senior"]


def output(defer=True, expert="senior", label="offensive", score=0.55, cost=None):
    out = {"defer": defer, "expert": expert if defer else None, "class_label": label, "class_score": score,
           "scores": {label: score, "neither": 1 - score}, "expert_accuracy": [0.7, 0.95]}
    if cost is not None:
        out["cost"] = cost
    return out


def test_keys_are_the_id_or_the_published_sha256_of_the_text():
    # FIPS 180-2's test vector: SHA-256("abc")
    assert task_key("abc") == "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert task_key("abc", input_id=0) == "id:0" and task_key("abc", input_id="x-1") == "id:x-1"
    assert task_key({"b": 1, "a": 2}) == task_key({"a": 2, "b": 1})  # canonical JSON for structured inputs
    with pytest.raises(ValueError, match="non-empty"):
        task_key("abc", input_id=" ")


def test_only_deferred_inputs_become_tasks_with_what_the_reviewer_should_see():
    tasks = deferred_tasks(["t0", "t1", "t2"], [output(), output(defer=False), output(expert="cheap", score=0.4)],
                           expert_names=EXPERTS, ids=[10, 11, 12], expert_costs=[0.05, 0.3], model_version="m")
    assert [task["data"]["hf_defer_key"] for task in tasks] == ["id:10", "id:12"]
    first = tasks[0]
    assert first["data"]["text"] == "t0" and first["data"]["hf_defer_id"] == 10
    assert first["data"]["hf_defer_expert"] == "senior" and first["data"]["hf_defer_cost"] == 0.3
    assert first["data"]["hf_defer_expert_accuracy"] == {"cheap": 0.7, "senior": 0.95}
    assert first["data"]["hf_defer_scores"] == {"offensive": 0.55, "neither": pytest.approx(0.45)}
    assert first["data"]["hf_defer_suggestion"] == "offensive" and first["data"]["hf_defer_suggestion_score"] == "0.55"
    (prediction,) = first["predictions"]
    assert prediction["model_version"] == "m" and prediction["score"] == 0.55
    assert prediction["result"] == [{"from_name": "label", "to_name": "text", "type": "choices",
                                     "value": {"choices": ["offensive"]}, "score": 0.55}]
    assert tasks[1]["data"]["hf_defer_cost"] == 0.05


def test_a_priced_output_keeps_its_own_cost_and_no_prices_means_zero():
    (task,) = deferred_tasks(["t"], [output(cost=0.42)], expert_names=EXPERTS, expert_costs=[0.05, 0.3])
    assert task["data"]["hf_defer_cost"] == 0.42
    (task,) = deferred_tasks(["t"], [output()], expert_names=EXPERTS)
    assert task["data"]["hf_defer_cost"] == 0.0


def test_the_same_text_without_ids_is_one_task_and_a_repeated_id_is_an_error():
    tasks = deferred_tasks(["same", "same", "other"], [output()] * 3, expert_names=EXPERTS)
    assert len(tasks) == 2
    with pytest.raises(ValueError, match="gives the id 7 to rows 0 and 2"):
        deferred_tasks(["a", "b", "c"], [output()] * 3, expert_names=EXPERTS, ids=[7, 8, 7])


@pytest.mark.parametrize("outputs, message", [
    ([output(expert="intern")], "'intern', which is not one of `expert_names`"),
    ([output(score=math.nan)], "finite number"),
    ([{"label": "defer"}], "lacks"),
    ([output(), output()], "one entry per input"),
])
def test_bad_outputs_are_refused_naming_the_row(outputs, message):
    with pytest.raises(ValueError, match=message):
        deferred_tasks(["only one"], outputs, expert_names=EXPERTS)
