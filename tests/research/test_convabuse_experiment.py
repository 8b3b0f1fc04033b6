"""The ConvAbuse experiment: its scoring rule against hand-worked examples, and one reduced run end to end (the
first rows of each split, one seed, one epoch, the report rendered by the script)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hf_defer import deferral_metrics
from research.convabuse_annotators import (METHODS, ConvAbuseArguments, experts_of, item_errors, pooled_expert,
                                            run_convabuse, scoring_targets)
from research.convabuse_annotators_report import convabuse_markdown, item_difference
from script_loader import load_script

ROOT = Path(__file__).resolve().parents[2]

# Three annotators a, b, c; None = did not answer. Worked by hand:
# item 0: a=1 b=1 c=0 -> majority 1; a's others (b=1, c=0) tie -> 1/2; b's others tie -> 1/2; c's others (1, 1) say 1
#         and c said 0 -> 0.
# item 1: a=0 c=0 -> majority 0; a's other (c) says 0 -> 1; c's other (a) says 0 -> 1; b did not answer.
# item 2: a=1 b=0 -> the majority ties: no label; a's other (b) says 0 -> 0; b's other (a) says 1 -> 0.
# item 3: everyone 0 -> 0, everyone right.
ANSWERS = pd.DataFrame({"a": [1, 0, 1, 0], "b": [1, None, 0, 0], "c": [0, 0, None, 0]})
LABELS = [1, 0, -100, 0]
LEAVE_ONE_OUT = [[0.5, 0.5, 0.0], [1.0, -100.0, 1.0], [0.0, 0.0, -100.0], [1.0, 1.0, 1.0]]
FULL_MAJORITY = [[1.0, 1.0, 0.0], [1.0, -100.0, 1.0], [-100.0, -100.0, -100.0], [1.0, 1.0, 1.0]]


def test_each_annotator_is_scored_against_the_others_majority():
    labels, correct = scoring_targets(ANSWERS)
    assert labels.tolist() == LABELS
    assert correct.tolist() == LEAVE_ONE_OUT
    labels, correct = scoring_targets(ANSWERS, "majority")  # own vote included: b and a are "right" on item 0
    assert labels.tolist() == LABELS and correct.tolist() == FULL_MAJORITY
    labels, correct = scoring_targets(ANSWERS, "dawid_skene", reference=[0, 0, 1, None])
    assert labels.tolist() == [0, 0, 1, -100]
    assert correct.tolist() == [[0.0, 0.0, 1.0], [1.0, -100.0, 1.0], [1.0, 0.0, -100.0], [-100.0, -100.0, -100.0]]


def test_scoring_refuses_what_it_cannot_score():
    with pytest.raises(ValueError, match="target"):
        scoring_targets(ANSWERS, "gold")
    with pytest.raises(ValueError, match="reference"):
        scoring_targets(ANSWERS, "dawid_skene")
    with pytest.raises(ValueError, match="binary"):  # a tie among three classes is not worth 1/2
        scoring_targets(pd.DataFrame({"a": [2], "b": [1], "c": [0]}))


def test_a_deferral_to_j_is_scored_against_the_others_majority():
    labels, correct = scoring_targets(ANSWERS)
    # K = 2 classes, then the experts a, b, c. A-SM: with class logits (0, 0) expert j's estimate is sigmoid(u_j)
    # against a class probability of 1/2, so it defers iff the best *available* expert logit is above 0.
    logits = np.array([[0.0, 0.0, -5.0, 5.0, -5.0],   # item 0 -> b, who scores 1/2 against a and c (tied): error 1/2
                       [0.0, 0.0, 1.0, 5.0, -5.0],    # item 1 -> b is the best but did not answer: a, right
                       [0.0, 0.0, 5.0, 5.0, 5.0],     # item 2: no label, left out
                       [3.0, 0.0, -5.0, -5.0, -5.0]])  # item 3: the classifier says 0, right
    assigned = np.asarray(correct) != -100  # the experiment decides among the annotators of each item (explicitly)
    metrics = deferral_metrics(logits, labels, surrogate="asm", num_experts=3, expert_correct=correct,
                               expert_names=["a", "b", "c"], available=assigned)
    assert metrics["system_error"] == pytest.approx((0.5 + 0.0 + 0.0) / 3)
    assert metrics["coverage"] == pytest.approx(1 / 3)
    assert metrics["deferral_rate_a"] == pytest.approx(1 / 3) and metrics["deferral_rate_b"] == pytest.approx(1 / 3)
    decisions = item_errors(logits, labels, correct, "asm")
    assert decisions["error"].tolist() == [0.5, 0.0, 0.0] and decisions["expert"][:2].tolist() == [1, 0]
    # Without that availability, deferral_metrics reports what a pipeline does knowing nobody's answers (issue 41):
    # item 1 goes to b, who did not answer it: an unscored deferral, and the error is over the other two items.
    blind = deferral_metrics(logits, labels, surrogate="asm", num_experts=3, expert_correct=correct,
                             expert_names=["a", "b", "c"])
    assert blind["deferral_rate_b"] == pytest.approx(2 / 3) and blind["unscored_deferrals_b"] == 1
    assert blind["scored_rows"] == 2 and blind["system_error"] == pytest.approx(0.5 / 2)
    # Scored against the full majority instead, b's own vote makes item 0 right: the target moves the number.
    labels, correct = scoring_targets(ANSWERS, "majority")
    assert deferral_metrics(logits, labels, surrogate="asm", num_experts=3, expert_correct=correct,
                            available=np.asarray(correct) != -100)["system_error"] == pytest.approx(0.0)
    # Deferring item 0 to c instead: c said 0 where a and b said 1.
    logits[0, 2:] = [-5.0, -5.0, 5.0]
    assert item_errors(logits, *scoring_targets(ANSWERS), "asm")["error"][0] == 1.0


def test_the_pooled_expert_is_the_mean_of_who_answered_and_the_baselines_pick_their_columns():
    _, correct = scoring_targets(ANSWERS)
    np.testing.assert_allclose(pooled_expert(correct), [[1 / 3], [1.0], [0.0], [1.0]], rtol=1e-6)
    choice, names = {"drop": ["c", "a"], "best_single": "b"}, list("abc")
    masked_names, masked = experts_of("masked_asm", correct, choice, annotators=names)
    assert masked_names == names and masked is correct
    assert experts_of("drop", correct, choice, annotators=names)[1].tolist() == [[0.0, 0.5], [1.0, 1.0],
                                                                                 [-100.0, 0.0], [1.0, 1.0]]
    assert experts_of("best_single", correct, choice, annotators=names)[1][:, 0].tolist() == [0.5, -100.0, 0.0, 1.0]
    assert (experts_of("classifier", correct, choice, annotators=names)[1] == -100).all()  # never available
    assert (experts_of("classifier", correct, choice, training=True, annotators=names)[1] == 0).all()  # never right
    with pytest.raises(ValueError, match="method"):
        experts_of("oracle", correct, choice, annotators=names)


def test_item_difference_brackets_the_mean_difference():
    rng = np.random.default_rng(0)
    baseline = (rng.random(400) < 0.2).astype(float)
    better = np.where(rng.random(400) < 0.5, 0.0, baseline)
    difference = item_difference(better, baseline)
    assert difference["mean"] == pytest.approx(100 * (better.mean() - baseline.mean()))
    assert difference["low"] < difference["mean"] < difference["high"] < 0
    assert item_difference([1.0, 0.0], [1.0, 0.0]) == {"mean": 0.0, "low": 0.0, "high": 0.0}


@pytest.mark.slow  # make test-slow (CI): the quick suite stays under 3 minutes on 2 cores
def test_one_reduced_run_end_to_end(tmp_path):
    arguments = ConvAbuseArguments(seeds=[0], epochs=1, context=False, max_rows=80, cache_dir=str(tmp_path / "cache"),
                                   output_dir=str(tmp_path))
    record = run_convabuse(arguments, tmp_path)
    assert record["complete"] and {run["method"] for run in record["runs"]} == set(METHODS)
    labelled = record["data"]["labelled"]["test"]
    for run in record["runs"]:
        main = run["metrics"]["leave_one_out"]
        assert 0.0 <= main["system_error"] <= 1.0 and 0.0 <= main["coverage"] <= 1.0
        # The JSON's per-item errors (the decisions with availability) average to deferral_metrics' system error.
        assert np.mean(record["item_errors"][run["method"]]) == pytest.approx(main["system_error"], abs=1e-4)
        assert len(record["item_errors"][run["method"]]) == labelled
    classifier = next(run for run in record["runs"] if run["method"] == "classifier")["metrics"]["leave_one_out"]
    assert classifier["coverage"] == 1.0 and classifier["system_error"] == pytest.approx(classifier["classifier_error"])
    num_train = {run["method"]: run["num_train"] for run in record["runs"]}
    assert num_train["drop"] == record["choice"]["drop_rows"] < num_train["masked_asm"]
    assert num_train["masked_asm"] == record["data"]["labelled"]["train"]  # every labelled row, answered or not
    # The script renders the report from the JSON alone.
    (tmp_path / "convabuse.md").unlink(missing_ok=True)
    assert load_script("convabuse.py").main(["--render_only", "--output_dir", str(tmp_path), "--overwrite"]) == 0
    text = (tmp_path / "convabuse.md").read_text()
    assert text == convabuse_markdown(json.loads((tmp_path / "convabuse.json").read_text()))
    assert "| A-SM, 8 annotators masked |" in text and "Annotator8" in text


def test_the_committed_report_is_rendered_from_the_committed_json():
    record = json.loads((ROOT / "results" / "convabuse.json").read_text())
    assert record["complete"] and len({run["seed"] for run in record["runs"]}) == 5
    assert (ROOT / "results" / "convabuse.md").read_text() == convabuse_markdown(record)


@pytest.mark.parametrize("module", ["research.convabuse_annotators", "research.convabuse_annotators_report"])
def test_docstring_examples_run(module):
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
