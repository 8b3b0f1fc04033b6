"""research.routing_baselines (the confidence cascade and the threshold router of the cascade experiment) against
hand-worked values; bad shapes and values are refused, naming the argument."""

from __future__ import annotations

import numpy as np
import pytest

from research.routing_baselines import confidence_cascade_curve, router_curve

LABELS = [0, 1, 1]


def test_confidence_cascade_and_router_by_hand():
    # Three members (prices 1, 10, 100); confidences of the first two; answers; labels.
    confidence = [[0.9, 0.9], [0.5, 0.95], [0.5, 0.5], [0.95, 0.2]]
    answers = [[0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]]
    labels = [0, 1, 1, 0]
    curve = confidence_cascade_curve(confidence, answers, labels, [1.0, 10.0, 100.0], [[0.8, 0.8], [0.0, 0.0]])
    # t = (0.8, 0.8): rows 0, 3 stop at member 0 (1), row 1 at member 1 (11), row 2 at member 2 (111); row 3 wrong.
    assert curve.cost.tolist() == pytest.approx([(1 + 11 + 111 + 1) / 4, 1.0])
    assert curve.error.tolist() == pytest.approx([0.25, 0.5])
    score = [0.1, 0.6, 0.9, 0.3]
    routed = router_curve(score, answers, labels, [0.0, 10.0, 100.0], [[0.5, 0.8], [0.2, 0.2]], router_cost=1.0)
    # (0.5, 0.8): members 0, 1, 2, 0 -> all right but row 3; cost 1 + (0 + 10 + 100 + 0) / 4.
    # (0.2, 0.2): members 0, 2, 2, 2 -> all right; cost 1 + 300 / 4.
    assert routed.cost.tolist() == pytest.approx([1 + 110 / 4, 1 + 300 / 4])
    assert routed.error.tolist() == pytest.approx([0.25, 0.0])
    assert routed.pareto.tolist() == [0, 1]
    with pytest.raises(ValueError, match="router_cost must be finite, non-negative"):
        router_curve(score, answers, labels, [0.0, 10.0, 100.0], [[0.5, 0.8]], router_cost=-1.0)
    with pytest.raises(ValueError, match="prices must have one cost per expert"):
        confidence_cascade_curve(confidence, answers, labels, [1.0, 10.0], [[0.8, 0.8]])
    with pytest.raises(ValueError, match="ascending"):
        router_curve(score, answers, labels, [0.0, 10.0, 100.0], [[0.8, 0.5]])
    with pytest.raises(ValueError, match="one column per member but the last"):
        confidence_cascade_curve([[0.9]] * 4, answers, labels, [1.0, 10.0, 100.0], [[0.5]])


def test_routing_curves_refuse_transposed_nan_and_negative_inputs():
    confidence = [[0.9, 0.9], [0.5, 0.95], [0.5, 0.5], [0.95, 0.2]]
    answers = [[0, 1, 0], [1, 1, 1], [0, 0, 1], [1, 0, 0]]
    labels, prices, thresholds = [0, 1, 1, 0], [1.0, 10.0, 100.0], [[0.8, 0.8]]
    with pytest.raises(ValueError, match=r"member_confidence.*\[4, 2\].*transpose"):
        confidence_cascade_curve(np.asarray(confidence).T, answers, labels, prices, thresholds)
    with pytest.raises(ValueError, match=r"`member_confidence` must be finite.*rows \[2\]"):
        confidence_cascade_curve([[0.9, 0.9], [0.5, 0.95], [np.nan, 0.5], [0.95, 0.2]], answers, labels, prices,
                                 thresholds)
    with pytest.raises(ValueError, match=r"`labels` must be class ids >= 0, got \[-100\]"):
        confidence_cascade_curve(confidence, answers, [0, 1, -100, 0], prices, thresholds)
    with pytest.raises(ValueError, match="`member_answers` must be class ids"):
        router_curve([0.1, 0.6, 0.9, 0.3], [[0, 1, 0], [1, -1, 1], [0, 0, 1], [1, 0, 0]], labels, prices, [[0.5, 0.8]])
    with pytest.raises(ValueError, match=r"`score` must be finite.*rows \[1\]"):
        router_curve([0.1, np.nan, 0.9, 0.3], answers, labels, prices, [[0.5, 0.8]])
    with pytest.raises(ValueError, match="`thresholds` must be finite"):
        router_curve([0.1, 0.6, 0.9, 0.3], answers, labels, prices, [[0.5, np.nan]])
    # Two members: one confidence per input, `[N]` or `[N, 1]` alike.
    two = [[0, 1], [1, 1], [0, 1], [1, 0]]
    flat = confidence_cascade_curve([0.9, 0.5, 0.5, 0.95], two, labels, [1.0, 10.0], [[0.8]])
    column = confidence_cascade_curve([[0.9], [0.5], [0.5], [0.95]], two, labels, [1.0, 10.0], [[0.8]])
    # Rows 0 and 3 stop at member 0 (right, wrong), rows 1 and 2 go on to member 1 (right, right): error 1/4.
    assert flat.error.tolist() == column.error.tolist() == [0.25]
    assert flat.cost.tolist() == column.cost.tolist() == [pytest.approx((1 + 11 + 11 + 1) / 4)]


@pytest.mark.parametrize("costs", [[[], [0]], [[1.0], [10.0]], [[1.0, 10.0]], np.array([[1.0, 10.0]]), [1.0, [10.0]]])
def test_nested_or_ragged_prices_are_refused_naming_the_argument(costs):
    answers = [[0, 1], [1, 1], [1, 0]]
    with pytest.raises(ValueError, match="prices must be a flat sequence of 2 numbers"):
        router_curve([0.2, 0.7, 0.4], answers, LABELS, costs, [[0.5]])
    with pytest.raises(ValueError, match="prices must be a flat sequence of 2 numbers"):
        confidence_cascade_curve([[0.9], [0.5], [0.3]], answers, LABELS, costs, [[0.8]])
