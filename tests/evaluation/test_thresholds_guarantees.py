"""calibrate_deferral with a confidence: the threshold is the certified one on the model's margins, the observed
values are those deferral_metrics scores, the guarantee is recorded, saved and cleared, and bad calls are refused."""

from __future__ import annotations

import datetime
import re

import numpy as np
import pytest
import torch
from datasets import Dataset

import hf_defer  # noqa: F401 (registers the "deferral" task)
from hf_defer import DeferralConfig, EncoderForDeferral, deferral_metrics
from hf_defer.evaluation.thresholds import calibrate_deferral
from hf_defer.evaluation.guarantees import binomial_order_statistic, budget_threshold

D, N = 5, 600


def model_and_data(seed: int = 0, num_experts: int = 2):
    torch.manual_seed(seed)
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3, num_experts=num_experts,
                                              expert_names=["alice", "bob"][:num_experts])).eval()
    with torch.no_grad():
        model.head[-1].bias[3:] += 1.0  # the experts look good: many positive margins
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(N, D)).astype("float32")
    labels = rng.integers(0, 3, size=N)
    answers = np.where(rng.uniform(size=(N, num_experts)) < 0.8, labels[:, None], (labels[:, None] + 1) % 3)
    answers[rng.uniform(size=(N, num_experts)) < 0.1] = -100  # some answers are missing
    return model, features, labels, answers


def margins_by_hand(model, features, available=None, costs=None):
    with torch.no_grad():
        out = model(features=torch.tensor(features))
    gains = out.expert_accuracy.double() - torch.tensor(costs or [0.0] * model.config.num_experts).double()
    if available is not None:
        gains = gains.masked_fill(~torch.as_tensor(available), float("-inf"))
    best, expert = gains.max(dim=1)
    return (best - out.class_probs.double().max(dim=1).values).numpy(), expert.numpy(), out.logits


def test_budget_with_confidence_is_the_order_statistic_and_is_saved(tmp_path):
    model, features, _, _ = model_and_data()
    margins, _, _ = margins_by_hand(model, features)
    threshold = calibrate_deferral(model, Dataset.from_dict({"features": features}), max_deferral_rate=0.1,
                                   confidence=0.9, batch_size=32)
    assert threshold == pytest.approx(budget_threshold(margins, 0.1, confidence=0.9), abs=1e-6)
    # Independently: at most k - 1 calibration inputs deferred, k the binomial order statistic.
    assert (margins > threshold).sum() <= binomial_order_statistic(N, 0.1, 0.9) - 1
    guarantee = model.config.deferral_guarantee
    assert guarantee["n"] == N and guarantee["confidence"] == 0.9 and guarantee["threshold"] == threshold
    assert guarantee["claims"][0]["kind"] == "deferral_rate" and guarantee["claims"][0]["target"] == 0.1
    assert guarantee["date"] == datetime.date.today().isoformat() and guarantee["expert_names"] == ["alice", "bob"]
    model.save_pretrained(tmp_path)
    assert EncoderForDeferral.from_pretrained(tmp_path).config.deferral_guarantee == guarantee
    calibrate_deferral(model, list(features), max_deferral_rate=0.1)  # the empirical rule certifies nothing
    assert model.config.deferral_guarantee is None


def test_error_target_matches_deferral_metrics_and_names_the_smallest():
    model, features, labels, answers = model_and_data(1)
    data = Dataset.from_dict({"features": features, "labels": labels, "expert_labels": answers})
    with pytest.raises(ValueError, match="smallest max_error certified here is") as refused:
        calibrate_deferral(model, data, max_error=0.01, confidence=0.9)
    smallest = float(re.search(r"certified here is ([0-9]+\.[0-9]+)", str(refused.value)).group(1))
    threshold = calibrate_deferral(model, data, max_error=smallest, confidence=0.9)  # the message's value works
    claim = model.config.deferral_guarantee["claims"][0]
    assert claim["kind"] == "system_error" and claim["bound"].endswith("exact binomial p-values")
    _, _, logits = margins_by_hand(model, features)
    scored = deferral_metrics(logits, labels, answers, surrogate=model, defer_threshold=threshold)
    # The decisions do not know who answered (issue 41): a deferral to an expert with no answer is unscored in the
    # metrics and an error in the guarantee (an upper bound whatever that expert would have said).
    n = int(np.sum(np.asarray(labels) != -100))
    errors = scored["system_error"] * scored.get("scored_rows", n) + scored.get("unscored_deferrals", 0)
    assert claim["observed"] == pytest.approx(errors / n, abs=1e-9)
    assert claim["observed"] <= smallest


def test_budget_per_expert_and_mean_cost():
    model, features, labels, answers = model_and_data(2)
    rates = {"alice": 0.05, "bob": 0.1}
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=rates, confidence=0.9)
    margins, expert, _ = margins_by_hand(model, features)
    for j, (name, rate) in enumerate(rates.items()):  # each at confidence 1 - 0.1 / 2
        assert ((margins > threshold) & (expert == j)).sum() <= binomial_order_statistic(N, rate, 0.95) - 1
    costs = [0.3, 0.1]
    calibrate_deferral(model, list(features), max_mean_cost=0.02, expert_costs=costs, confidence=0.9)
    guarantee = model.config.deferral_guarantee
    _, _, logits = margins_by_hand(model, features)
    scored = deferral_metrics(logits, labels, np.tile(labels[:, None], 2), surrogate=model)  # the config's costs
    assert guarantee["claims"][0]["observed"] == pytest.approx(scored["mean_cost"], abs=1e-9)
    assert guarantee["expert_costs"] == costs and guarantee["claims"][0]["observed"] <= 0.02


def test_availability_counts_and_is_recorded():
    model, features, _, _ = model_and_data(3)
    available = np.random.default_rng(3).uniform(size=(N, 2)) < 0.5
    calibrate_deferral(model, list(features), max_deferral_rate=0.2, confidence=0.9, available_experts=available)
    margins, _, _ = margins_by_hand(model, features, available)
    assert np.isneginf(margins).any()
    assert model.config.defer_threshold == pytest.approx(budget_threshold(margins, 0.2, confidence=0.9), abs=1e-6)
    assert model.config.deferral_guarantee["available_experts"] == "given per input"


def test_bad_calls_are_refused():
    model, features, labels, answers = model_and_data(4)
    with pytest.raises(ValueError, match="give confidence="):
        calibrate_deferral(model, list(features), max_error=0.1)
    with pytest.raises(ValueError, match="max_error needs the true labels"):
        calibrate_deferral(model, Dataset.from_dict({"features": features}), max_error=0.1, confidence=0.9)
    with pytest.raises(ValueError, match=r"names \['carol'\], which are not among the experts"):
        calibrate_deferral(model, list(features), max_deferral_rate={"carol": 0.1}, confidence=0.9)
    with pytest.raises(ValueError, match="confidence must lie in"):
        calibrate_deferral(model, list(features), max_deferral_rate=0.1, confidence=1.0)
    with pytest.raises(ValueError, match="max_mean_cost needs expert_costs"):
        calibrate_deferral(model, list(features), max_mean_cost=0.1, confidence=0.9)
    with pytest.raises(ValueError, match=r"expert_labels must have shape \[600, 2\]"):
        calibrate_deferral(model, list(features), max_error=0.3, confidence=0.9, labels=labels,
                           expert_labels=answers[:, :1])


def test_pipeline_warns_outside_the_guarantee():
    import warnings

    from transformers import pipeline

    model, features, _, _ = model_and_data(5)
    calibrate_deferral(model, list(features), max_deferral_rate=0.2, confidence=0.9, expert_costs=[0.1, 0.0])
    defer = pipeline("deferral", model=model)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the calibrated settings: no warning
        defer(list(features[:4]))
        defer(list(features[:4]), available_experts=["alice", "bob"])
    for changed in ({"expert_costs": [0.0, 0.0]}, {"defer_threshold": 0.5}, {"available_experts": ["alice"]}):
        with pytest.warns(UserWarning, match=f"not covered by the model's deferral guarantee.*{next(iter(changed))}"):
            defer(list(features[:4]), **changed)


def test_expected_error_is_conformal_risk_control_on_the_pipeline_losses():
    """guarantee="expected" (issue 47): the threshold is certify_threshold's on the losses worked out here from the
    model's own outputs (a missing answer of the chosen expert counts as an error), the record has no confidence and
    names the method, and the card says it is an average over calibration draws."""
    from hf_defer.evaluation.guarantees import certify_threshold
    from hf_defer.hub.model_card import describe_guarantee

    model, features, labels, answers = model_and_data(6)
    margins, expert, logits = margins_by_hand(model, features)
    kept = (logits[:, :3].argmax(dim=1).numpy() != labels).astype(float)
    chosen = answers[np.arange(N), expert]
    deferred = ((chosen == -100) | (chosen != labels)).astype(float)
    data = Dataset.from_dict({"features": features, "labels": labels, "expert_labels": answers})
    threshold = calibrate_deferral(model, data, max_error=0.5, guarantee="expected")
    by_hand = certify_threshold(margins, max_error=0.5, loss_if_kept=kept, loss_if_deferred=deferred,
                                guarantee="expected")
    assert threshold == pytest.approx(by_hand.threshold, abs=1e-6)
    guarantee = model.config.deferral_guarantee
    assert guarantee["confidence"] is None and guarantee["n"] == N
    claim = guarantee["claims"][0]
    assert claim["method"] == "conformal_risk_control" and claim["guarantee"] == "expected" and claim["cap"] == 0
    assert claim["observed"] == pytest.approx(np.where(margins > threshold, deferred, kept).mean(), abs=1e-9)
    text = describe_guarantee(guarantee, threshold)
    assert text.startswith("**In expectation only.**") and "not a statement about this one calibration" in text
    assert "conformal risk control" in text
    # Unlabelled inputs set the cap (answers of every expert are not needed for it); the threshold never defers more.
    more = list(np.random.default_rng(7).normal(size=(400, D)).astype("float32"))
    capped = calibrate_deferral(model, data, max_error=0.5, guarantee="expected", unlabeled=more)
    claim = model.config.deferral_guarantee["claims"][0]
    assert claim["unlabeled"] == 400 and capped >= claim["cap"] >= 0
    # The monitor has no confidence of the guarantee's to reuse: it asks for its own.
    from hf_defer import DeferralMonitor

    with pytest.raises(ValueError, match=r"bounds the expected error .* give the alarm's own, e.g. confidence=0.9"):
        DeferralMonitor.from_model(model)
    assert DeferralMonitor.from_model(model, confidence=0.9).state()["confidence"] == 0.9


def test_expected_error_refuses_what_makes_no_sense():
    model, features, labels, answers = model_and_data(6)
    data = Dataset.from_dict({"features": features, "labels": labels, "expert_labels": answers})
    for call, message in [(dict(confidence=0.9), "has no confidence"),
                          (dict(max_deferral_rate=0.1), "takes max_error alone: a deferral budget"),
                          (dict(selective=True), "selective error"),
                          (dict(guarantee="often"), "guarantee must be one of")]:
        with pytest.raises(ValueError, match=message):
            calibrate_deferral(model, data, **({"max_error": 0.5, "guarantee": "expected"} | call))
    with pytest.raises(ValueError, match="promises a system error: give max_error"):
        calibrate_deferral(model, data, guarantee="expected")
