"""Metrics of route-only models against hand-worked cases, and DeferralTrainer's evaluation and card for them."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import TrainingArguments

from hf_defer import DeferralConfig, DeferralTrainer, EncoderForRouting, deferral_metrics

NAMES = ["classifier_fixed", "small_llm", "large_llm"]
LOGITS = torch.logit(torch.tensor([[0.7, 0.8, 0.95], [0.9, 0.8, 0.99], [0.2, 0.3, 0.9]], dtype=torch.float64)).float()
COSTS = [0.0, 0.05, 0.3]  # gains: [.70 .75 .65] -> small; [.90 .75 .69] -> classifier; [.20 .25 .60] -> large
CORRECT = [[1, 0, 1], [1, 1, 0], [0, 1, 1]]
CONFIG = DeferralConfig(feature_size=3, route_only=True, num_experts=3, expert_names=NAMES, expert_costs=COSTS)


def test_route_only_metrics_worked_by_hand():
    metrics = deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=np.array(CORRECT, dtype=bool),
                               budgets=[0.34], n_bins=1)
    assert metrics["system_error"] == pytest.approx(1 / 3)  # small LLM wrong on row 1; rows 2 and 3 right
    assert metrics["coverage"] == pytest.approx(1 / 3)
    assert metrics["deferral_rate_small_llm"] == pytest.approx(1 / 3)
    assert metrics["deferral_rate_large_llm"] == pytest.approx(1 / 3)
    assert "deferral_rate_classifier_fixed" not in metrics
    assert metrics["mean_cost"] == pytest.approx((0.05 + 0.0 + 0.3) / 3)
    # one deferral kept: row 3 (its expert's estimate 0.9 beats row 1's 0.8); row 1 falls back to the right classifier
    assert metrics["budgeted_error_34"] == pytest.approx(0.0)
    # one bin: |mean estimate - mean correctness| per expert
    expected = [abs(0.6 - 2 / 3), abs((0.8 + 0.8 + 0.3) / 3 - 2 / 3), abs((0.95 + 0.99 + 0.9) / 3 - 2 / 3)]
    for name, value in zip(NAMES, expected):
        assert metrics[f"expert_ece_{name}"] == pytest.approx(value, abs=1e-6)
    assert metrics["expert_ece"] == pytest.approx(np.mean(expected), abs=1e-6)


def test_missing_answers_are_routed_to_as_the_pipeline_does_counted_unscored_and_scores_count_as_expected_error():
    # Issue 41: the small LLM has no recorded correctness on row 0, but the router does not know that when it routes:
    # row 0 still goes to it (gain 0.75 > 0.70), as the pipeline would send it; that route cannot be scored.
    missing = [[1, -100, 1], [1, 1, 0], [0, 1, 1]]
    metrics = deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=missing, budgets=(),
                               expert_names=NAMES)
    assert metrics["coverage"] == pytest.approx(1 / 3)  # rows 0 (small) and 2 (large) leave the default expert
    assert metrics["unscored_deferrals"] == 1 and metrics[f"unscored_deferrals_{NAMES[1]}"] == 1
    assert metrics["scored_rows"] == 2 and metrics["system_error"] == pytest.approx(0.0)  # rows 1 and 2: both right
    scores = [[0.5, 0.25, 1.0], [0.9, 1.0, 0.0], [0.0, 1.0, 0.6]]  # judged: rows pay 1 - score of their expert
    metrics = deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=scores, budgets=())
    assert metrics["system_error"] == pytest.approx((0.75 + 0.1 + 0.4) / 3)
    unscored = [[1, 0, 1], [-100, 1, 0], [0, 1, 1]]  # the default kept row 2 but has no answer there
    metrics = deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=unscored, budgets=())
    assert metrics["scored_share"] == pytest.approx(2 / 3) and metrics["system_error"] == pytest.approx(0.5)


def test_bad_targets_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="labels: a route-only model"):
        deferral_metrics(LOGITS, [0, 1, 0], surrogate=CONFIG, expert_correct=CORRECT)
    with pytest.raises(ValueError, match="expert_correct must lie in"):
        deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=[[1, 2, 0]] * 3)
    with pytest.raises(ValueError, match="expert_correct must be"):
        deferral_metrics(LOGITS, None, surrogate=CONFIG, expert_correct=[["yes", "no", "no"]] * 3)


def test_trainer_evaluates_and_writes_the_card_of_a_route_only_model(tmp_path):
    import datasets

    rng = np.random.default_rng(0)
    features = rng.normal(size=(48, 3)).astype("float32")
    correct = np.stack([features[:, 0] > 0, rng.random(48) < 0.7, np.ones(48, bool)], 1).astype("float32")
    correct[::5, 1] = -100  # the small LLM skipped some
    rows = datasets.Dataset.from_dict({"features": features, "expert_correct": correct})
    model = EncoderForRouting(DeferralConfig(feature_size=3, route_only=True, num_experts=3, expert_names=NAMES,
                                             expert_costs=COSTS))
    args = TrainingArguments(str(tmp_path / "out"), num_train_epochs=3, per_device_train_batch_size=16, report_to=[],
                             use_cpu=True, logging_strategy="no", save_strategy="no", learning_rate=0.05)
    trainer = DeferralTrainer(model=model, args=args, train_dataset=rows, eval_dataset=rows)
    trainer.train()
    result = trainer.evaluate()
    with torch.no_grad():
        logits = model.eval()(features=torch.tensor(features)).logits
    expected = deferral_metrics(logits, None, surrogate=model.config, expert_correct=correct, budget_ranking="margin")
    assert result["eval_system_error"] == pytest.approx(expected["system_error"])
    assert result["eval_loss"] == pytest.approx(float(model.surrogate(logits, expert_correct=torch.tensor(correct))),
                                                rel=1e-5)
    card = trainer.model_card_data()
    assert card.surrogate == "route_only" and card.class_names == [] and "coverage" in card.metrics
    trainer.save_model()  # the card of a route-only model: no classes, its experts, its metrics
    from huggingface_hub import ModelCard

    saved = ModelCard.load(tmp_path / "out" / "README.md")
    assert "route-only" in saved.text and "**Classes" not in saved.text and "`K + M` logits" not in saved.text
    assert all(f"`{name}`" in saved.text for name in NAMES)
    assert saved.data.library_name == "hf-defer"
    values = {result.metric_type: result.metric_value for result in saved.data.eval_results}
    assert values["system_error"] == pytest.approx(result["eval_system_error"])
    with pytest.raises(ValueError, match="cannot use class labels"):
        DeferralTrainer(model=model, args=args, train_dataset=rows.add_column("labels", [0] * 48))
