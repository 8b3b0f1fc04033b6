"""RouteLLM's measures (hf_defer.evaluation.routellm_metrics) against hand-worked examples and brute force."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import hf_defer.evaluation.routellm_metrics as rm
from hf_defer.evaluation.routellm_metrics import (apgr, call_performance_curve, cost_swept_curve, cpt, oracle_curve,
                                                 pgr, random_router_curve, routing_summary)

# Five questions. Sorted scores 0.1 0.2 0.4 0.6 0.8; with num_results=2 the thresholds are the quantiles at 0, 1/2, 1:
# 0.1 (all to the strong model), 0.4 (scores 0.4, 0.6, 0.8: questions 1, 2, 3) and 0.8 (score > 0.8: none).
SCORE = [0.2, 0.6, 0.4, 0.8, 0.1]
STRONG = [1, 1, 0, 1, 1]  # accuracy 0.8
WEAK = [1, 0, 0, 0, 1]  # accuracy 0.4


def test_hand_worked_curve_pgr_apgr_and_cpt():
    curve = call_performance_curve(SCORE, STRONG, WEAK, num_results=2)
    # 0 strong calls: weak answers all, 2/5 right. 3 calls (q1, q2, q3): strong right on q1, q3, weak right on q0, q4:
    # 4/5. All strong: 4/5.
    assert curve.strong_fraction.tolist() == [0.0, 0.6, 1.0]
    assert curve.accuracy == pytest.approx([0.4, 0.8, 0.8])
    assert curve.settings == pytest.approx([0.8, 0.4, 0.1])
    assert (curve.strong_accuracy, curve.weak_accuracy) == pytest.approx((0.8, 0.4))
    assert pgr(curve) == pytest.approx([0.0, 1.0, 1.0])
    # Trapezoids: 0.6 * (0 + 1) / 2 + 0.4 * 1 = 0.7.
    assert apgr(curve) == pytest.approx(0.7)
    # PGR 0.5 is accuracy 0.6, reached halfway along the first segment: 0.3; PGR 0.8 (0.72) at 0.8 * 0.6 = 0.48.
    assert cpt(curve, 0.5) == pytest.approx(0.3)
    assert cpt(curve, 0.8) == pytest.approx(0.48)
    assert routing_summary(curve) == pytest.approx({"apgr": 0.7, "cpt_20": 0.12, "cpt_50": 0.3, "cpt_80": 0.48})


def test_cpt_at_a_plateau_routellm_interp_and_first_crossing_differ():
    curve = call_performance_curve(SCORE, STRONG, WEAK, num_results=2)
    # Accuracy 0.8 is first reached at 0.6 of calls; np.interp over the repeated 0.8 returns the last share, 1.0.
    assert cpt(curve, 1.0, method="first_crossing") == pytest.approx(0.6)
    assert cpt(curve, 1.0) == pytest.approx(1.0)
    for level in (0.2, 0.5, 0.8):  # where accuracy increases strictly, both agree
        assert cpt(curve, level) == pytest.approx(cpt(curve, level, method="first_crossing"))


def test_tied_scores_keep_duplicate_thresholds_as_zero_width_points():
    # Scores 0.1 0.4 0.4 0.8 0.9, num_results=4: quantiles 0.1, 0.4, 0.4, 0.8, 0.9 (a duplicate edge; pd.qcut raises).
    strong, weak = [0, 1, 1, 1, 1], [1, 1, 1, 0, 0]
    curve = call_performance_curve([0.1, 0.4, 0.4, 0.8, 0.9], strong, weak, num_results=4)
    assert curve.strong_fraction.tolist() == [0.0, 0.4, 0.8, 0.8, 1.0]
    # 0 calls: 3/5. Calls on q3, q4: strong right on both + weak right on q0..q2: 5/5. Calls on q1..q4: 4 + 1. All: 4/5.
    assert curve.accuracy == pytest.approx([0.6, 1.0, 1.0, 1.0, 0.8])
    # PGR (gap 0.2): 0, 2, 2, 2, 1. Area: 0.4 * 1 + 0.4 * 2 + 0 + 0.2 * 1.5 = 1.5.
    assert apgr(curve) == pytest.approx(1.5)
    assert cpt(curve, 0.5, method="first_crossing") == pytest.approx(0.1)


def test_routellm_protocol_matches_an_independent_pandas_qcut_computation():
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    strong, weak = rng.random(2000) < 0.8, rng.random(2000) < 0.65
    score = rng.normal(size=2000) + (strong & ~weak)
    _, edges = pd.qcut(score, 10, retbins=True)
    points = []
    for i, edge in enumerate(edges):
        chosen = score > edge if i == len(edges) - 1 else score >= edge
        points.append((chosen.mean(), np.where(chosen, strong, weak).mean()))
    share, accuracy = np.array(sorted(points)).T
    gap = strong.mean() - weak.mean()
    expected_apgr = sum((share[i + 1] - share[i]) * (accuracy[i + 1] + accuracy[i] - 2 * weak.mean()) / 2
                        for i in range(len(share) - 1)) / gap
    curve = call_performance_curve(score, strong, weak)
    assert curve.strong_fraction == pytest.approx(share) and curve.accuracy == pytest.approx(accuracy)
    assert apgr(curve) == pytest.approx(expected_apgr)
    assert cpt(curve, 0.5) == pytest.approx(np.interp(weak.mean() + 0.5 * gap, accuracy, share))


def test_exact_curve_matches_brute_force_over_every_distinct_score():
    rng = np.random.default_rng(1)
    score = rng.integers(0, 12, size=60).astype(float)  # many ties
    strong, weak = rng.random(60) < 0.7, rng.random(60) < 0.5
    curve = call_performance_curve(score, strong, weak, num_results=None)
    brute = {(float((score >= t).mean()), float(np.where(score >= t, strong, weak).mean())) for t in np.unique(score)}
    brute.add((0.0, float(weak.mean())))
    assert set(zip(curve.strong_fraction.round(12), curve.accuracy.round(12))) == {(round(f, 12), round(a, 12))
                                                                                for f, a in brute}


def test_random_router_recovers_half_the_gap_on_average():
    rng = np.random.default_rng(2)
    strong, weak = rng.random(3000) < 0.8, rng.random(3000) < 0.6
    values = [apgr(random_router_curve(strong, weak, iterations=10, seed=seed)) for seed in range(40)]
    assert abs(np.mean(values) - 0.5) < 3 * np.std(values) / np.sqrt(len(values)) + 1e-3
    # Its shares are RouteLLM's deciles of continuous scores: 100 %, 90 %, ..., 0 % up to rounding of positions.
    assert random_router_curve(strong, weak).strong_fraction == pytest.approx(np.linspace(0, 1, 11), abs=1e-3)


def test_oracle_spends_calls_only_where_the_strong_model_alone_is_right():
    strong, weak = [1, 1, 0, 1, 0, 1], [0, 1, 1, 0, 0, 1]  # only-strong questions: 0 and 3
    curve = oracle_curve(strong, weak, strong_fractions=[0, 1 / 6, 1 / 3, 1 / 2, 1])
    assert curve.accuracy == pytest.approx([3 / 6, 4 / 6, 5 / 6, 5 / 6, 5 / 6])
    # Gap: 4/6 - 3/6; PGR 0, 1, 2, 2, 2; area 1/6 * 0.5 + 1/6 * 1.5 + 1/6 * 2 + 1/2 * 2 = 5/3.
    assert apgr(curve) == pytest.approx(5 / 3)


def test_cost_sweep_is_the_route_only_rule_at_each_price():
    rng = np.random.default_rng(3)
    estimates = rng.random((200, 2))
    strong, weak = rng.random(200) < 0.8, rng.random(200) < 0.6
    prices = [0.0, 0.1, 0.3, 0.7]
    curve = cost_swept_curve(estimates, strong, weak, prices, weak_call_cost=0.05)
    for price in prices:
        chosen = estimates[:, 1] - price > estimates[:, 0] - 0.05
        point = curve.settings == price
        assert curve.strong_fraction[point] == pytest.approx(chosen.mean())
        assert curve.accuracy[point] == pytest.approx(np.where(chosen, strong, weak).mean())
    # A tie goes to the weak (cheaper) model.
    tied = cost_swept_curve([[0.5, 0.6]], [1], [0], [0.1])
    assert tied.strong_fraction.tolist() == [0.0]


@pytest.mark.parametrize("bad", [["yes", "no", "yes"], [0, 2, 1], [0.5, 1.0, 0.0]])
def test_correctness_that_is_not_boolean_is_refused_naming_the_argument(bad):
    with pytest.raises(ValueError, match="strong_correct"):
        call_performance_curve([0.1, 0.2, 0.3], bad, [1, 0, 1])
    with pytest.raises(ValueError, match="weak_correct"):
        oracle_curve([1, 0, 1], bad)


def test_negative_prices_and_other_bad_input_are_refused_naming_the_argument():
    with pytest.raises(ValueError, match="strong_call_costs"):
        cost_swept_curve([[0.5, 0.6]], [1], [0], [0.1, -0.2])
    with pytest.raises(ValueError, match="weak_call_cost"):
        cost_swept_curve([[0.5, 0.6]], [1], [0], [0.1], weak_call_cost=-1.0)
    with pytest.raises(ValueError, match="accuracy_estimates"):
        cost_swept_curve([0.5, 0.6], [1, 1], [0, 0], [0.1])
    with pytest.raises(ValueError, match="score"):
        call_performance_curve([0.1, float("nan")], [1, 0], [0, 1])
    with pytest.raises(ValueError, match="one value per query"):
        call_performance_curve([0.1, 0.2], [1, 0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="num_results"):
        call_performance_curve([0.1, 0.2], [1, 0], [0, 1], num_results=0)
    with pytest.raises(ValueError, match="strong_fractions"):
        oracle_curve([1, 0], [0, 1], strong_fractions=[0.5, 1.5])
    curve = call_performance_curve(SCORE, STRONG, WEAK, num_results=2)
    with pytest.raises(ValueError, match="level"):
        cpt(curve, 0.0)
    with pytest.raises(ValueError, match="method"):
        cpt(curve, 0.5, method="nearest")
    with pytest.raises(ValueError, match="same accuracy"):
        apgr(call_performance_curve([0.1, 0.2], [1, 0], [0, 1]))


def test_docstring_examples():
    result = doctest.testmod(rm, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
