"""hf_defer.evaluation.costs against hand-worked values; costs stored in the config, saved, reloaded and overridden in
the pipeline (the routing baselines of the experiments: tests/research/test_routing_baselines.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import pipeline

from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.evaluation.costs import (
    _decide_with_costs,
    area_under_error_cost,
    error_cost_curve,
    mean_cost,
    pareto_front,
    plot_error_cost_curves,
)

# Three inputs, K = 2 classes, M = 2 experts (prices 1 and 10). Hand-worked decisions (defer iff max_j (a_j - d_j) >
# max_y p_y, to the argmax):
#   d = (0, 0):     keep row 0 (0.7 < 0.9, right); row 1 -> expert 0 (0.95, right, 1); row 2 -> expert 1 (0.99, right,
#                   10): error 0, cost 11/3.
#   d = (0, 0.2):   row 2 -> expert 0 (0.9 > 0.79 and > 0.55; wrong, 1); row 1 -> expert 0 (right, 1):
#                   error 1/3, cost 2/3.
#   d = (0.5, 0.5): nobody deferred; the classifier says 0 everywhere, wrong on rows 1 and 2: error 2/3, cost 0.
PROBS = [[0.9, 0.1], [0.6, 0.4], [0.55, 0.45]]
ACCURACY = [[0.5, 0.7], [0.95, 0.8], [0.9, 0.99]]
LABELS = [0, 1, 1]
EXPERT_LABELS = [[1, 0], [1, 0], [0, 1]]
PRICES = [1.0, 10.0]
GRID = [[0.0, 0.0], [0.0, 0.2], [0.5, 0.5]]


def test_decision_rule_with_costs_and_threshold():
    defer, expert, prediction = _decide_with_costs(np.array(PROBS), np.array(ACCURACY), np.array([0.0, 0.2]), 0.0)
    assert defer.tolist() == [False, True, True] and expert[1:].tolist() == [0, 0] and prediction.tolist() == [0, 0, 0]
    # Rows 1 and 2 both have margin 0.35 (0.95 - 0.6 and 0.9 - 0.55): deferred below that threshold, kept above.
    defer, _, _ = _decide_with_costs(np.array(PROBS), np.array(ACCURACY), np.array([0.0, 0.2]), 0.349)
    assert defer.tolist() == [False, True, True]
    defer, _, _ = _decide_with_costs(np.array(PROBS), np.array(ACCURACY), np.array([0.0, 0.2]), 0.351)
    assert defer.tolist() == [False, False, False]


def test_mean_cost_by_hand_and_errors():
    # Deferred: row 0 to expert 1 (10), row 2 to expert 0 (1); every row pays the model's 0.5: 0.5 + 11 / 4.
    assert mean_cost([True, False, True, False], [1, 1, 0, 0], PRICES, model_cost=0.5) == pytest.approx(0.5 + 11 / 4)
    assert mean_cost([False, False], [0, 1], PRICES) == 0.0
    with pytest.raises(ValueError, match="non-negative"):
        mean_cost([True], [0], [-1.0, 1.0])
    with pytest.raises(ValueError, match="finite, non-negative"):
        mean_cost([True], [0], [float("nan"), 1.0])
    with pytest.raises(ValueError, match="index"):
        mean_cost([True], [2], PRICES)
    with pytest.raises(ValueError, match="one length"):
        mean_cost([True, False], [0], PRICES)


def test_error_cost_curve_against_hand_values():
    curve = error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES, decision_costs=GRID)
    assert curve.error.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3])
    assert curve.cost.tolist() == pytest.approx([11 / 3, 2 / 3, 0.0])
    assert curve.pareto.tolist() == [2, 1, 0]
    assert curve.settings.tolist() == GRID
    front_cost, front_error = curve.front()
    assert front_cost.tolist() == pytest.approx([0.0, 2 / 3, 11 / 3])
    # One scale on the prices: scale 0 is the zero-cost rule; scale 0.1 makes expert 1 cost 1 -> never chosen, and
    # expert 0 cost 0.1: row 1 (0.85 > 0.6) and row 2 (0.8 > 0.55, wrong) go to expert 0.
    scaled = error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES, scales=[0.0, 0.1], model_cost=1.0)
    assert scaled.cost.tolist() == pytest.approx([1 + 11 / 3, 1 + 2 / 3])
    assert scaled.error.tolist() == pytest.approx([0.0, 1 / 3])
    default = error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES)
    assert len(default.cost) == 61 and default.cost[0] == pytest.approx(11 / 3) and default.cost[-1] == 0.0
    with pytest.raises(ValueError, match="one column per expert"):
        error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES, decision_costs=[[0.0]])
    with pytest.raises(ValueError, match="one cost per expert"):
        error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, [1.0])
    with pytest.raises(ValueError, match="same N"):
        error_cost_curve(PROBS, ACCURACY, LABELS[:2], EXPERT_LABELS, PRICES)


def test_pareto_front_matches_brute_force():
    rng = np.random.default_rng(0)
    cost, error = rng.integers(0, 6, 40).astype(float), rng.integers(0, 6, 40).astype(float)
    front = pareto_front(cost, error)
    dominated = {i for i in range(40) for j in range(40)
                 if (cost[j] <= cost[i] and error[j] < error[i]) or (cost[j] < cost[i] and error[j] <= error[i])}
    expected = {}
    for i in sorted(set(range(40)) - dominated):  # the first of equal points
        expected.setdefault((cost[i], error[i]), i)
    assert sorted(front.tolist()) == sorted(expected.values())
    assert np.all(np.diff(cost[front]) > 0) and np.all(np.diff(error[front]) < 0)


def test_area_under_error_cost_by_hand():
    cost, error = [11 / 3, 2 / 3, 0.0, 2.0], [0.0, 1 / 3, 2 / 3, 0.5]  # the last point is dominated
    # Steps: 2/3 on [0, 2/3), 1/3 on [2/3, 11/3), 0 on [11/3, 4]: (4/9 + 1) / 4 = 13/36.
    assert area_under_error_cost(cost, error, 0.0, 4.0) == pytest.approx(13 / 36)
    assert area_under_error_cost(cost, error, 1.0, 2.0) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="cheapest"):
        area_under_error_cost([1.0], [0.1], 0.5, 2.0)
    with pytest.raises(ValueError, match="high > low"):
        area_under_error_cost(cost, error, 2.0, 1.0)


# ------------------------------------------------------------------ shapes and values are refused, not guessed


def test_error_cost_curve_refuses_transposed_nan_and_out_of_range_inputs():
    transposed = np.asarray(EXPERT_LABELS).T  # [M, N] = [2, 3]: reshaping it to [3, 2] would pair rows wrongly
    with pytest.raises(ValueError, match=r"expert_labels.*\[3, 2\].*transpose"):
        error_cost_curve(PROBS, ACCURACY, LABELS, transposed, PRICES, decision_costs=GRID)
    with pytest.raises(ValueError, match=r"expert_labels.*shape"):
        error_cost_curve(PROBS, ACCURACY, LABELS, [1, 0, 1, 0, 0, 1], PRICES, decision_costs=GRID)  # flattened
    for name, bad in (("class_probs", [[0.9, 0.1], [np.nan, 0.4], [0.55, 0.45]]),
                      ("expert_accuracy", [[0.5, 0.7], [0.95, np.inf], [0.9, 0.99]])):
        arguments = {"class_probs": PROBS, "expert_accuracy": ACCURACY, name: bad}
        with pytest.raises(ValueError, match=rf"`{name}` must be finite.*rows \[1\]"):
            error_cost_curve(labels=LABELS, expert_labels=EXPERT_LABELS, expert_costs=PRICES, decision_costs=GRID,
                             **arguments)
    # K = 2: a label 2, an ignored -100 or a fraction is no class; neither is an expert's missing -1.
    for labels in ([0, 2, 1], [0, -100, 1], [0, 0.5, 1]):
        with pytest.raises(ValueError, match="`labels` must be"):
            error_cost_curve(PROBS, ACCURACY, labels, EXPERT_LABELS, PRICES, decision_costs=GRID)
    with pytest.raises(ValueError, match=r"`expert_labels` must be class ids in \[0, 2\), got \[-1\]"):
        error_cost_curve(PROBS, ACCURACY, LABELS, [[1, 0], [1, -1], [0, 1]], PRICES, decision_costs=GRID)
    with pytest.raises(ValueError, match="defer_threshold must be a finite number"):
        error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES, decision_costs=GRID, threshold=float("nan"))
    with pytest.raises(ValueError, match="`labels` must be a rectangular array of numbers"):
        error_cost_curve(PROBS, ACCURACY, [0, None, 1], EXPERT_LABELS, PRICES, decision_costs=GRID)
    # One expert: `[N]` and `[N, 1]` are the same answers.
    one = error_cost_curve(PROBS, [[0.5], [0.95], [0.9]], LABELS, [1, 1, 0], [1.0], decision_costs=[[0.0]])
    same = error_cost_curve(PROBS, [[0.5], [0.95], [0.9]], LABELS, [[1], [1], [0]], [1.0], decision_costs=[[0.0]])
    # Rows 1 and 2 deferred (0.95 > 0.6, 0.9 > 0.55): expert right on row 1, wrong on row 2; row 0 kept and right.
    assert one.error.tolist() == same.error.tolist() == [pytest.approx(1 / 3)]


def test_mean_cost_refuses_fractional_experts_and_non_boolean_decisions():
    with pytest.raises(ValueError, match="`expert` must be integer expert ids"):
        mean_cost([True, False], [0.5, 0], PRICES)
    with pytest.raises(ValueError, match="`defer` must hold booleans"):
        mean_cost([0.3, 0.0], [0, 0], PRICES)
    assert mean_cost([1, 0], [1, 0], PRICES) == 5.0  # 0/1 are booleans: row 0 pays expert 1's 10


@pytest.mark.parametrize("costs", [[[], [0]], [[1.0], [10.0]], [[1.0, 10.0]], np.array([[1.0, 10.0]]), [1.0, [10.0]]])
def test_nested_or_ragged_costs_are_refused_naming_the_argument(costs):
    # [[], [0]] was drawn by hypothesis: numpy's "setting an array element with a sequence" escaped from np.ravel, and
    # [[1.0], [10.0]] was flattened into two costs without a word.
    with pytest.raises(ValueError, match="expert_costs must be a flat sequence of 2 numbers"):
        error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, costs)
    with pytest.raises(ValueError, match="expert_costs must be a flat sequence"):
        mean_cost([True, False], [1, 0], costs)


def test_plot_error_cost_curves_writes_a_png(tmp_path):
    path = tmp_path / "curve.png"
    plot_error_cost_curves({"A-SM": ([0.0, 1.0], [0.2, 0.1])}, path, points={"person": (5.0, 0.09)}, log_cost=False)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------ costs in the config and the pipeline
# A-SM, K = 3, M = 2, logits (1, 0, 0 | 2, 0.5) whatever the features: top class probability e / (e + 2) = 0.57612,
# alice's accuracy e^2 / (e^2 + 2) = 0.78699, bob's e^0.5 / (e^0.5 + 2) = 0.45186.
def fixed_model(**config) -> EncoderForDeferral:
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=3, num_experts=2,
                                              expert_names=["alice", "bob"], **config))
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 2.0, 0.5]))
    return model.eval()


def test_costs_stored_saved_reloaded_and_overridden(tmp_path):
    model = fixed_model(expert_costs=[0.3, 0.0], expert_kinds=["model", "person"])
    assert model.config.expert_costs == [0.3, 0.0] and model.config.expert_kinds == ["model", "person"]
    model.save_pretrained(tmp_path)
    reloaded = EncoderForDeferral.from_pretrained(tmp_path)
    assert reloaded.config.expert_costs == [0.3, 0.0] and reloaded.config.expert_kinds == ["model", "person"]
    classify = pipeline("deferral", model=reloaded)
    # The config's costs: alice 0.78699 - 0.3 = 0.48699 < 0.57612, bob 0.45186: kept.
    assert classify([0.0] * 4)["defer"] is False
    # The call's costs override them: zero costs send it to alice.
    out = classify([0.0] * 4, expert_costs=[0.0, 0.0])
    assert out["defer"] is True and out["expert"] == "alice"
    assert math.isclose(out["expert_accuracy"][0], math.exp(2) / (math.exp(2) + 2), rel_tol=1e-6)
    assert fixed_model().config.expert_costs == [0.0, 0.0] and fixed_model().config.expert_kinds == ["person"] * 2


@pytest.mark.parametrize(
    ("config", "match"),
    [
        ({"expert_costs": [-0.1, 0.0]}, "finite, non-negative"),
        ({"expert_costs": [float("nan"), 0.0]}, "finite, non-negative"),
        ({"expert_costs": [0.1]}, "one cost per expert"),
        ({"expert_kinds": ["robot", "person"]}, "expert_kinds"),
        ({"expert_kinds": ["model"]}, "expert_kinds"),
    ],
)
def test_bad_costs_and_kinds_are_refused(config, match):
    with pytest.raises(ValueError, match=match):
        DeferralConfig(feature_size=4, num_labels=3, num_experts=2, **config)


def test_model_card_draws_the_error_cost_curve_when_costs_are_set(tmp_path):
    from hf_defer.hub import DeferralModelCardData, render_model_card

    model = fixed_model(expert_costs=[0.3, 0.0])
    curve = error_cost_curve(PROBS, ACCURACY, LABELS, EXPERT_LABELS, PRICES, decision_costs=GRID)
    front_cost, front_error = curve.front()
    data = DeferralModelCardData.from_model(model, error_cost_curve={"cost": front_cost.tolist(),
                                                                      "error": front_error.tolist()})
    assert data.expert_costs == [0.3, 0.0]
    render_model_card(data, tmp_path / "with")
    text = (tmp_path / "with" / "README.md").read_text()
    assert "## Error against cost" in text or "### Error against cost" in text
    assert "(error_cost_curve.png)" in text and (tmp_path / "with" / "error_cost_curve.png").is_file()
    render_model_card(DeferralModelCardData.from_model(fixed_model()), tmp_path / "without")  # no costs: no section
    assert "Error against cost" not in (tmp_path / "without" / "README.md").read_text()


def test_deferral_metrics_reports_the_mean_cost_of_its_decisions():
    from hf_defer import deferral_metrics

    # K = 2, M = 2 (A-SM). Row 0: classes (4, 0), experts (0, 0): not deferred. Rows 1 and 2: expert 1 far above the
    # classes: a_1 = 1 / (1 + e^-30) against p = 1/2, margin 1 - 0.4 - 1/2 > 0 with costs (0.25, 0.4); row 3: expert 0
    # far above, margin 1 - 0.25 - 1/2 > 0. Row 0: a_j = 1/2 < 0.98. Cost paid: (0 + 0.4 + 0.4 + 0.25) / 4.
    logits = np.array([[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, -30.0, 30.0], [0.0, 0.0, -30.0, 30.0], [0.0, 0.0, 30.0, -30.0]])
    labels, experts = [0, 1, 1, 0], [[0, 0], [1, 1], [1, 1], [0, 0]]
    paid = deferral_metrics(logits, labels, experts, num_experts=2, expert_costs=[0.25, 0.4])
    assert paid["coverage"] == 0.25 and paid["mean_cost"] == pytest.approx((0.4 + 0.4 + 0.25) / 4)
    assert "mean_cost" not in deferral_metrics(logits, labels, experts, num_experts=2)  # zero costs: nothing paid


def test_trainer_card_draws_the_error_cost_curve_when_costs_are_set(tmp_path):
    from datasets import Dataset
    from transformers import TrainingArguments

    from hf_defer import DeferralTrainer
    from hf_defer.evaluation.costs import error_cost_curve

    rng = np.random.default_rng(0)
    data = Dataset.from_dict({"features": rng.normal(size=(64, 4)).astype("float32"), "labels": rng.integers(0, 2, 64),
                              "expert_labels": rng.integers(0, 2, (64, 2))})
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=2, expert_costs=[0.1, 0.3]))
    args = TrainingArguments(str(tmp_path / "out"), max_steps=2, report_to=[], use_cpu=True, save_strategy="no")
    trainer = DeferralTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    trainer.evaluate()
    card = trainer.model_card_data()
    with torch.no_grad():  # the wiring: the card's front is error_cost_curve's on the model's estimates of these rows
        out = model.eval()(features=torch.as_tensor(np.asarray(data["features"])))
    expected = error_cost_curve(out.class_probs.numpy(), out.expert_accuracy.numpy(), np.asarray(data["labels"]),
                                np.asarray(data["expert_labels"]), [0.1, 0.3]).front()
    np.testing.assert_allclose(card.error_cost_curve["cost"], expected[0], atol=1e-12)
    np.testing.assert_allclose(card.error_cost_curve["error"], expected[1], atol=1e-12)
    # Worked by hand: the sweep's largest scale (1 / 0.1) decides with costs (1, 3), where no accuracy minus cost
    # can beat a class probability, so nothing is deferred: the front starts at cost 0 with the classifier's error.
    classifier_error = np.mean(out.class_probs.numpy().argmax(1) != np.asarray(data["labels"]))
    assert card.error_cost_curve["cost"][0] == 0.0
    assert card.error_cost_curve["error"][0] == pytest.approx(classifier_error)
    trainer.create_model_card(save_directory=str(tmp_path / "card"))
    assert (tmp_path / "card" / "error_cost_curve.png").is_file()
    assert "error_cost_curve.png" in (tmp_path / "card" / "README.md").read_text()
