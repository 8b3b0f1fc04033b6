"""The research code of results/monitoring.md: CBPE re-implemented, the summary of alarms, the naive window test and
the certified targets, on values worked by hand."""

import numpy as np
import pytest

from research.monitoring_data import Population, Setting
from research.monitoring_report import _versus, cbpe_reimplemented
from research.monitoring_streams import Targets, _naive_first_alarm, certify, reference_rows, run_streams, summarize


def test_cbpe_recalibrates_on_the_reference_then_averages_each_chunk():
    # reference: a score of 0.9 is right half of the time, 0.6 always: isotonic regression pools them to 0.75
    ref_p = np.array([0.6, 0.6, 0.9, 0.9])
    ref_y = np.array([1.0, 1.0, 1.0, 0.0])
    p = np.array([[0.6, 0.6, 0.9, 0.9]])
    assert cbpe_reimplemented(ref_p, ref_y, p, 2).tolist() == [[0.25, 0.25]]
    calibrated = np.array([0.2, 0.4, 0.6, 0.8])  # a calibrated reference: the scores are kept
    out = cbpe_reimplemented(np.repeat(calibrated, 1000), np.concatenate(
        [np.r_[np.ones(int(1000 * c)), np.zeros(1000 - int(1000 * c))] for c in calibrated]), calibrated[None], 4)
    assert out[0, 0] == pytest.approx(1 - calibrated.mean())


def test_summary_counts_false_alarms_detections_and_delays():
    results = {"alarm": [None, 50, 120, 300], "naive": [None, None, 200, 400], "naive_bonferroni": [None] * 4,
               "channel": [None, "deferral_rate", "estimated_error", "estimated_error"]}
    out = summarize(results, pre=100, harmful=True)
    assert out["alarm"]["false_alarm_before_shift"] == 0.25  # row 50 <= 100
    assert out["alarm"]["detected"] == 0.5 and out["alarm"]["median_delay"] == 110  # delays 20 and 200
    assert out["naive"]["detected"] == 0.5 and out["naive"]["mean_delay"] == 200
    assert out["naive_bonferroni"]["no_alarm"] == 1.0 and out["naive_bonferroni"]["median_delay"] is None
    assert out["alarm_channels"] == {"deferral_rate": 1, "estimated_error": 2}
    assert summarize(results, pre=100, harmful=False)["alarm"]["any_alarm"] == 0.75


def test_the_naive_test_rejects_the_first_window_over_the_budget():
    targets = Targets(threshold=0.0, max_deferral_rate=0.1, max_error=0.9, confidence=0.9)
    deferred = np.r_[np.zeros(100), np.ones(100) * (np.arange(100) % 2 == 0)]  # 0 %, then 50 % deferred
    estimated = np.full(200, 0.1)
    assert _naive_first_alarm(deferred, estimated, targets, 100, 0.01, None, None) == 200


def test_certified_targets():
    rng = np.random.default_rng(0)
    n = 2000
    margin = rng.uniform(-1, 1, n)
    cal = Population("cal", margin, np.full(n, 0.9), np.full(n, 0.95), np.zeros(n, dtype=int),
                     (rng.random(n) < 0.1).astype(float), np.zeros(n))
    targets = certify(Setting("s", "", ["e"], cal, {}), budget=0.2, confidence=0.9)
    deferred = margin > targets.threshold
    assert 0.17 < deferred.mean() <= 0.2  # the binomial order statistic, at 0.95
    error = np.where(deferred, 0.0, cal.loss_kept).mean()
    assert error < targets.max_error <= error + 0.03 and round(targets.max_error, 2) == targets.max_error


def test_reference_rows_carry_the_calibration_truth():
    cal = Population("cal", np.array([-1.0, 1.0, 0.5]), np.array([0.9, 0.8, 0.7]), np.array([0.6, 0.95, 0.85]),
                     np.zeros(3, dtype=int), np.array([1.0, 0.0, 0.0]), np.array([0.0, 1.0, 0.0]))
    outputs, labels, answers = reference_rows(Setting("s", "", ["e"], cal, {}), Targets(0.0, 0.2, 0.1, 0.9))
    assert [out["defer"] for out in outputs] == [False, True, True]
    assert [out["class_label"] for out in outputs] == ["n", "y", "y"] and labels == ["y"] * 3  # kept row 0 wrong
    assert answers == [None, "n", "y"]  # the expert, on the deferred rows: wrong, right
    assert [out["expert_scores"]["e"] for out in outputs] == [0.6, 0.95, 0.85]


def test_followup_streams_recalibrate_where_cox_rejects():
    # calibration inputs: every input kept (margin -1 < threshold 0), the classifier's score 0.9 but right on half:
    # Cox's test rejects (one score: the intercept alone), the isotonic map says 0.5, so every estimate is 0.5
    n = 400
    loss = (np.arange(n) % 2).astype(float)
    cal = Population("cal", np.full(n, -1.0), np.full(n, 0.9), np.full(n, 0.8), np.zeros(n, dtype=int), loss,
                     np.zeros(n))
    setting = Setting("s", "", ["e"], cal, {"a": cal})
    out = run_streams(setting, "a", "a", Targets(0.0, 0.2, 0.6, 0.9), streams=2, pre=100, post=100, window=50,
                      followup=True)
    record = out["recalibration"]
    assert record["fitted_on_rows"] == {"classifier": n} and record["tests"]["classifier"]["df"] == 1
    # 2 (200 log(0.5 / 0.9) + 200 log(0.5 / 0.1))
    assert record["tests"]["classifier"]["statistic"] == pytest.approx(400 * (np.log(0.5 / 0.9) + np.log(5)))
    assert record["reference_error"] == 0.5 and record["reference_estimated"] == pytest.approx(0.1)
    np.testing.assert_allclose(out["estimate_recalibrated"], 0.5)
    np.testing.assert_allclose(out["estimate"], 0.1)


def test_the_comparison_with_cbpe_is_read_at_the_tables_rounding():
    assert _versus(0.01214, 0.01206) == "as close as CBPE (0.0121 against 0.0121)"
    assert _versus(0.0133, 0.0136) == "closer than CBPE (0.0133 against 0.0136)"
    assert _versus(0.0151, 0.0121) == "further than CBPE (0.0151 against 0.0121)"
