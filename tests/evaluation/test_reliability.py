"""Tests for hf_defer.evaluation.reliability (reliability diagrams, ECE, pooling over runs) on examples worked out by hand."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

import hf_defer.evaluation.reliability as reliability_module
from hf_defer.evaluation import expected_calibration_error, reliability_bins
from hf_defer.evaluation.metrics import pool_reliability, reliability_ece


# --------------------------------------------------------------------------------------------
# expected_calibration_error / reliability_bins
# --------------------------------------------------------------------------------------------


def test_ece_15_bins_by_hand_including_0_and_1():
    conf = np.array([0.0, 0.05, 0.5, 0.52, 0.9, 1.0])
    correct = np.array([0, 1, 1, 0, 1, 0])
    # bin index = min(floor(15 c), 14):
    #   0.0 -> 0, 0.05 -> 0 (0.75), 0.5 -> 7 (7.5), 0.52 -> 7 (7.8), 0.9 -> 13 (13.5), 1.0 -> 14 (clamped)
    # bin 0 : n=2, mean conf 0.025, acc 0.5 -> 2 * 0.475 = 0.95
    # bin 7 : n=2, mean conf 0.51,  acc 0.5 -> 2 * 0.01  = 0.02
    # bin 13: n=1, conf 0.9, acc 1          ->     0.1
    # bin 14: n=1, conf 1.0, acc 0          ->     1.0
    # ECE = (0.95 + 0.02 + 0.1 + 1.0) / 6 = 2.07 / 6 = 0.345
    assert expected_calibration_error(conf, correct, n_bins=15) == pytest.approx(0.345, abs=1e-9)
    assert expected_calibration_error(conf, correct) == pytest.approx(0.345, abs=1e-9)  # default 15


def test_ece_and_reliability_bins_at_edges_4_bins():
    conf = np.array([0.0, 0.25, 0.5, 0.75, 1.0, 0.3])
    correct = np.array([0, 0, 1, 1, 0, 1])
    # width 0.25, index = min(floor(4 c), 3): 0.0 -> 0, 0.25 -> 1, 0.5 -> 2, 0.75 -> 3, 1.0 -> 3, 0.3 -> 1
    # bin 0: {0.0 (0)}              mean conf 0     acc 0   -> 0
    # bin 1: {0.25 (0), 0.3 (1)}    mean conf 0.275 acc 0.5 -> 2 * 0.225 = 0.45
    # bin 2: {0.5 (1)}              mean conf 0.5   acc 1   -> 0.5
    # bin 3: {0.75 (1), 1.0 (0)}    mean conf 0.875 acc 0.5 -> 2 * 0.375 = 0.75
    # ECE = (0.45 + 0.5 + 0.75) / 6 = 1.7 / 6
    assert expected_calibration_error(conf, correct, n_bins=4) == pytest.approx(1.7 / 6, abs=1e-9)
    rel = reliability_bins(conf, correct, n_bins=4)
    np.testing.assert_allclose(rel["bin_edges"], [0.0, 0.25, 0.5, 0.75, 1.0], atol=1e-12)
    assert list(rel["counts"]) == [1, 2, 1, 2]
    np.testing.assert_allclose(rel["mean_confidence"], [0.0, 0.275, 0.5, 0.875], atol=1e-9)
    np.testing.assert_allclose(rel["accuracy"], [0.0, 0.5, 1.0, 0.5], atol=1e-9)


def test_reliability_bins_empty_bins_are_nan():
    conf = np.array([0.1, 0.15, 0.95])
    correct = np.array([1, 0, 1])
    # 5 bins of width 0.2: 0.1 -> 0, 0.15 -> 0, 0.95 -> 4; bins 1..3 empty
    rel = reliability_bins(conf, correct, n_bins=5)
    assert len(rel["bin_edges"]) == 6
    assert list(rel["counts"]) == [2, 0, 0, 0, 1]
    mc = np.asarray(rel["mean_confidence"], dtype=float)
    acc = np.asarray(rel["accuracy"], dtype=float)
    assert np.isnan(mc[1:4]).all() and np.isnan(acc[1:4]).all()
    np.testing.assert_allclose(mc[[0, 4]], [0.125, 0.95], atol=1e-9)
    np.testing.assert_allclose(acc[[0, 4]], [0.5, 1.0], atol=1e-9)
    # ECE = (2/3) |0.125 - 0.5| + (1/3) |0.95 - 1| = 0.25 + 0.016667 = 0.266667
    assert expected_calibration_error(conf, correct, n_bins=5) == pytest.approx(0.25 + 0.05 / 3, abs=1e-9)


def test_ece_perfectly_calibrated_is_zero():
    # 4 rows at confidence 0.75 (same bin), 3 of them correct -> |0.75 - 0.75| = 0
    assert expected_calibration_error(np.full(4, 0.75), np.array([1, 1, 0, 1])) == pytest.approx(0, abs=1e-12)


# ----------------------------------------------------------------------------- pooled reliability
def test_pool_reliability_matches_binning_everything_at_once():
    rng = np.random.default_rng(1)
    confidence, correct = rng.random(300), rng.random(300) < 0.7
    parts = [reliability_bins(confidence[i:i + 100], correct[i:i + 100]) for i in (0, 100, 200)]
    pooled, direct = pool_reliability(parts), reliability_bins(confidence, correct)
    assert pooled["counts"] == direct["counts"]
    np.testing.assert_allclose(pooled["accuracy"], direct["accuracy"], equal_nan=True)
    np.testing.assert_allclose(pooled["mean_confidence"], direct["mean_confidence"], equal_nan=True)
    assert reliability_ece(pooled) == pytest.approx(expected_calibration_error(confidence, correct))
    with pytest.raises(ValueError, match="at least one"):
        pool_reliability([])
    with pytest.raises(ValueError, match="bin edges"):
        pool_reliability([parts[0], reliability_bins(confidence, correct, n_bins=5)])


def test_reliability_ece_by_hand():
    # |0.2 - 0| * 1/4 + |0.7 - 0.5| * 3/4 = 0.05 + 0.15; empty bins (NaN) carry no weight.
    bins = {"counts": [1, 0, 3], "mean_confidence": [0.2, float("nan"), 0.7], "accuracy": [0.0, float("nan"), 0.5]}
    assert reliability_ece(bins) == pytest.approx(0.2)
    assert reliability_ece({"counts": [0, 0], "mean_confidence": [0.1, 0.2], "accuracy": [0.0, 0.0]}) == 0.0


@pytest.mark.parametrize("correct", [[2], [0.5], [float("nan")], [-1]])
def test_reliability_bins_refuses_outcomes_other_than_0_and_1(correct):
    """correct=[2] used to report an accuracy of 2.0."""
    with pytest.raises(ValueError, match="correct must hold outcomes 0/1"):
        reliability_bins([0.5], correct)
    assert reliability_bins([0.2, 0.7], [True, 0], n_bins=2)["accuracy"] == [1.0, 0.0]


def test_docstring_examples_run():
    result = doctest.testmod(reliability_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
