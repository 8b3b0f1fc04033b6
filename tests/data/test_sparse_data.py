"""Sparse expert answers and experts judged by correctness or a score, from the user's table to a trained model
(issues 19 and 22): prepare_deferral_dataset(missing_expert="mask", expert_correct_columns=...), the checks, the
collator, the model's forward and DeferralTrainer."""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from transformers import TrainingArguments

from hf_defer import DataCollatorForDeferral, DeferralConfig, DeferralTrainer, EncoderForDeferral, deferral_metrics
from hf_defer import prepare_deferral_dataset
from hf_defer.data.checks import check_deferral_dataset

IGNORE = -100
K, D = 3, 4


def table() -> datasets.Dataset:
    return datasets.Dataset.from_dict({
        "text": ["a", "b", "c", "d"],
        "label": ["neg", "pos", "pos", "neg"],
        "alice": ["neg", None, "neg", ""],  # rows 1 and 3 unanswered
        "bob": ["pos", "pos", None, "neg"],  # row 2 unanswered
        "judge": [0.75, None, 1.0, float("nan")],  # a grade; rows 1 and 3 ungraded
        "tests": [True, False, None, True],  # passed or not; row 2 untested
    })


def test_mask_keeps_every_row_with_minus_100_where_an_expert_did_not_answer():
    prepared = prepare_deferral_dataset(table(), "label", ["alice", "bob"], text_column="text", missing_expert="mask")
    # classes neg = 0, pos = 1; row 1 has only bob, row 2 only alice, row 3 only bob
    assert prepared.dataset["expert_labels"][:] == [[0, 1], [IGNORE, 1], [0, IGNORE], [IGNORE, 0]]
    assert prepared.dataset["labels"][:] == [0, 1, 1, 0] and prepared.expert_names == ["alice", "bob"]
    nobody = datasets.Dataset.from_dict({"label": ["neg", "pos"], "alice": [None, "pos"]})
    kept = prepare_deferral_dataset(nobody, "label", "alice", missing_expert="mask").dataset  # still trains the classifier
    assert kept["expert_labels"][:] == [IGNORE, 1] and kept["labels"][:] == [0, 1]
    with pytest.raises(ValueError, match="pass missing_expert='drop' to drop them, or missing_expert='mask'"):
        prepare_deferral_dataset(table(), "label", ["alice", "bob"])
    with pytest.raises(ValueError, match=r"missing_expert must be one of \('error', 'drop', 'mask'\)"):
        prepare_deferral_dataset(table(), "label", ["alice"], missing_expert="skip")


def test_correctness_and_scores_become_expert_correct_next_to_the_answers():
    prepared = prepare_deferral_dataset(table(), "label", ["alice"], expert_correct_columns=["judge", "tests"],
                                        missing_expert="mask")
    assert prepared.expert_names == ["alice", "judge", "tests"] and "expert_labels" not in prepared.dataset.column_names
    # alice's answers against the labels (neg/neg right, neg/pos wrong), then the grades, then the test results
    assert prepared.dataset["expert_correct"][:] == [[1.0, 0.75, 1.0], [IGNORE, IGNORE, 0.0], [0.0, 1.0, IGNORE],
                                                     [IGNORE, IGNORE, 1.0]]
    dropped = prepare_deferral_dataset(table(), "label", expert_correct_columns="judge", missing_expert="drop").dataset
    assert dropped["expert_correct"][:] == [0.75, 1.0] and dropped["labels"][:] == [0, 1]


@pytest.mark.parametrize(("first", "value"), [("", "yes"), (0.5, 1.5), (0.5, -0.5), (0, 2)])
def test_correctness_that_is_no_boolean_nor_a_number_in_0_1_is_refused(first, value):
    data = datasets.Dataset.from_dict({"label": ["neg", "pos"], "judge": [first, value]})
    with pytest.raises(ValueError, match=rf"expert correctness column 'judge', row 1: {value!r} is neither a boolean "
                                         r"nor a number in \[0, 1\]"):
        prepare_deferral_dataset(data, "label", expert_correct_columns="judge")
    with pytest.raises(ValueError, match="must be distinct"):
        prepare_deferral_dataset(data, "label", ["judge"], expert_correct_columns="judge")


def features(answers: list, column: str = "expert_labels", seed: int = 0) -> datasets.Dataset:
    rng = np.random.default_rng(seed)
    n = len(answers)
    return datasets.Dataset.from_dict({"features": rng.normal(size=(n, D)).astype("float32"),
                                       "labels": rng.integers(0, K, n), column: answers})


def head_model(num_experts: int = 2, seed: int = 0, **config) -> EncoderForDeferral:
    torch.manual_seed(seed)
    return EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=K, num_experts=num_experts,
                                             expert_names=["alice", "bob"][:num_experts], **config))


def test_checks_count_answers_per_expert_and_refuse_an_expert_without_any_in_training():
    data = features([[0, IGNORE], [1, 2], [IGNORE, IGNORE], [2, IGNORE]])
    assert check_deferral_dataset(data, head_model()) == {"alice": 3, "bob": 1}
    silent = features([[0, IGNORE], [1, IGNORE]])
    assert check_deferral_dataset(silent, head_model(), "eval_dataset") == {"alice": 2, "bob": 0}
    with pytest.raises(ValueError, match=r"train_dataset: expert\(s\) \['bob'\] answered none of the 2 labelled rows"):
        check_deferral_dataset(silent, head_model(), "train_dataset", require_answers=True)
    scores = features([[0.5, IGNORE], [1.0, 0.0]], column="expert_correct")
    assert check_deferral_dataset(scores, head_model()) == {"alice": 2, "bob": 1}
    for bad, message in (([[0.5, float("nan")], [1.0, 0.0]], r"expert_correct must lie in \[0, 1\]"),
                         ([[0.5, 1.5], [1.0, 0.0]], r"expert_correct must lie in \[0, 1\]"),
                         ([[0.5, None], [1.0, 0.0]], r"column 'expert_correct' has missing values \(None\).*-100"),
                         ([["a", "b"], ["c", "d"]], "must hold numbers in"),
                         ([[0.5, 1.0, 0.0], [1.0, 0.0, 0.0]], "expert_correct must have num_experts=2 entries")):
        with pytest.raises(ValueError, match=message):
            check_deferral_dataset(features(bad, column="expert_correct"), head_model(), "d")
    both = scores.add_column("expert_labels", [[0, 1], [1, 1]])
    with pytest.raises(ValueError, match="has both 'expert_labels' and 'expert_correct'"):
        check_deferral_dataset(both, head_model())


def test_collator_and_forward_take_expert_correct():
    collator = DataCollatorForDeferral()
    batch = collator([{"features": [0.0] * D, "labels": 1, "expert_correct": [0.5, IGNORE]},
                      {"features": [1.0] * D, "labels": 0, "expert_correct": [True, 0]}])
    assert batch["expert_correct"].dtype == torch.float32
    assert batch["expert_correct"].tolist() == [[0.5, IGNORE], [1.0, 0.0]]
    model = head_model().eval()
    out = model(**batch)
    want = model.surrogate(out.logits, batch["labels"], expert_correct=batch["expert_correct"])
    assert torch.equal(out.loss, want)
    with pytest.raises(ValueError, match="both 'expert_labels' and 'expert_correct'"):
        collator([{"labels": 1, "expert_labels": 1, "expert_correct": 1.0}])
    with pytest.raises(ValueError, match="expert_correct holds None; write -100"):
        collator([{"labels": 1, "expert_correct": [None, 1.0]}])
    with pytest.raises(ValueError, match="labels are required with expert_correct"):
        model(features=batch["features"], expert_correct=batch["expert_correct"])


def args(tmp_path: Path, **overrides) -> TrainingArguments:
    return TrainingArguments(**{"output_dir": str(tmp_path / "out"), "report_to": [], "use_cpu": True,
                                "disable_tqdm": True, "save_strategy": "no", "logging_strategy": "no",
                                "learning_rate": 0.5, "optim": "sgd", "lr_scheduler_type": "constant",
                                "weight_decay": 0.0, "seed": 0, **overrides})


def sparse_answers(n: int, seed: int) -> list:
    rng = np.random.default_rng(seed)
    answers = rng.integers(0, K, (n, 2))
    answers[rng.random((n, 2)) < 0.4] = IGNORE
    answers[0] = IGNORE  # a row nobody answered
    return answers.tolist()


@pytest.mark.parametrize("column", ["expert_labels", "expert_correct"])
def test_trainer_trains_one_full_batch_step_on_the_masked_loss_and_evaluates_with_names(tmp_path, column):
    answers = sparse_answers(16, seed=1)
    if column == "expert_correct":  # the answers' correctness would do; scores exercise the soft targets
        answers = np.where(np.array(answers) == IGNORE, IGNORE,
                           np.random.default_rng(2).uniform(0, 1, (16, 2))).astype(np.float32).tolist()
    train = features(answers, column, seed=3)
    model, reference = head_model(seed=4), head_model(seed=4)
    trainer = DeferralTrainer(model=model, args=args(tmp_path, per_device_train_batch_size=16, max_steps=1),
                              train_dataset=train, eval_dataset=features(sparse_answers(12, seed=5), seed=6))
    trainer.train()
    # One SGD step on the mean masked loss of all 16 rows, computed by the model's own loss without the Trainer.
    table = train.with_format("torch")[:]
    loss = reference(features=table["features"], labels=table["labels"], **{column: table[column]}).loss
    loss.backward()
    with torch.no_grad():
        for trained, start in zip(model.parameters(), reference.parameters()):
            torch.testing.assert_close(trained, start - 0.5 * start.grad)
    model.config.defer_threshold = -0.3  # defer often: deferrals to the experts available on each row are scored
    metrics = trainer.evaluate()
    assert {"eval_expert_ece_alice", "eval_deferral_rate_bob"} <= set(metrics) and metrics["eval_coverage"] < 0.8
    assert not any(key.endswith(("_0", "_1")) for key in metrics)
    evaluation = features(sparse_answers(12, seed=5), seed=6).with_format("torch")[:]
    model.eval()
    with torch.no_grad():
        out = model(features=evaluation["features"], labels=evaluation["labels"],
                    expert_labels=evaluation["expert_labels"])
    expected = deferral_metrics(out.logits, evaluation["labels"], evaluation["expert_labels"], model.config,
                                budget_ranking="margin")
    assert metrics["eval_system_error"] == pytest.approx(expected["system_error"])
    assert metrics["eval_expert_ece_bob"] == pytest.approx(expected["expert_ece_bob"])
    assert metrics["eval_loss"] == pytest.approx(float(out.loss), rel=1e-5)
    # An evaluation set of scores: gathered as the targets (not as answers), scored as expected errors.
    scores = np.where(evaluation["expert_labels"].numpy() == IGNORE, IGNORE, 0.25).astype(np.float32)
    scored = trainer.evaluate(features(scores.tolist(), "expert_correct", seed=6))
    expected = deferral_metrics(out.logits, evaluation["labels"], surrogate=model.config, expert_correct=scores,
                                budget_ranking="margin")
    assert scored["eval_system_error"] == pytest.approx(expected["system_error"])
    assert scored["eval_expert_ece_alice"] == pytest.approx(expected["expert_ece_alice"])


def test_trainer_refuses_an_expert_who_answered_no_training_row(tmp_path):
    train = features([[0, IGNORE], [1, IGNORE], [2, IGNORE]])
    with pytest.raises(ValueError, match=r"train_dataset: expert\(s\) \['bob'\] answered none"):
        DeferralTrainer(model=head_model(), args=args(tmp_path), train_dataset=train)
    DeferralTrainer(model=head_model(), args=args(tmp_path), train_dataset=features([[0, 1], [1, IGNORE]]),
                    eval_dataset=train)  # in evaluation it is allowed: that expert is simply never available
