"""Tests for hf_defer.evaluation.metrics on small examples worked out by hand.

Logit construction used throughout (K = 3 classes, A-SM, the default surrogate): the predicted class
gets logit t >= 0, the two other classes get -ln 2, so the "sum over classes other than the argmax"
is S = 2 * e^{-ln 2} = 1 and the A-SM expert estimate is exactly
    psi_{K+j} = e^{u_{K+j}} / (e^{u_{K+j}} + S) = sigma(u_{K+j}).
Expert logit u_{K+j} = logit(p_j) therefore gives estimated accuracy p_j, and the model defers iff
max_j logit(p_j) > t. With t = 3 the model never defers for p <= 0.9; with t = 0 it defers iff
p > 0.5. A-OvA's expert estimate is sigma(u_{K+j}) as well, so it yields the same numbers.

Confidences are kept away from the 15-bin edges k/15 (0.2, 0.4, 0.6, 0.8, ...) so that the float32
computation cannot flip a bin.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hf_defer import deferral_metrics
from hf_defer.evaluation import reliability_bins

K = 3
IGNORE = -100
NEVER = 3.0  # class logit that wins against every expert logit used here
DEFER = 0.0  # class logit that loses against any expert with p > 0.5


def _logit(p):
    return math.log(p / (1.0 - p))


def _row(pred, t, ps):
    cls = [-math.log(K - 1)] * K
    cls[pred] = t
    return cls + [_logit(p) for p in ps]


# --------------------------------------------------------------------------------------------
# deferral_metrics, one expert
# --------------------------------------------------------------------------------------------

# r | y | m | pred | t     | p    | deferred | cls ok | exp ok | 0-1-deferral loss
# 0 | 0 | 1 | 1    | NEVER | 0.1  | no       | 0      | 0      | 1 (classifier wrong)
# 1 | 1 | 2 | 2    | NEVER | 0.3  | no       | 0      | 0      | 1 (classifier wrong)
# 2 | 1 | 1 | 0    | DEFER | 0.9  | yes      | 0      | 1      | 0
# 3 | 2 | 2 | 2    | DEFER | 0.7  | yes      | 1      | 1      | 0
# 4 | 1 | 0 | 1    | DEFER | 0.55 | yes      | 1      | 0      | 1 (expert wrong)
# 5 | 0 | 1 | 0    | DEFER | 0.85 | yes      | 1      | 0      | 1 (expert wrong)
M1_ROWS = [
    (0, 1, 1, NEVER, 0.1),
    (1, 2, 2, NEVER, 0.3),
    (1, 1, 0, DEFER, 0.9),
    (2, 2, 2, DEFER, 0.7),
    (1, 0, 1, DEFER, 0.55),
    (0, 1, 0, DEFER, 0.85),
]
M1_EXPECTED = {
    "system_error": 4 / 6,  # rows 0, 1, 4, 5
    "coverage": 2 / 6,  # rows 0, 1 not deferred
    "classifier_error": 3 / 6,  # rows 0, 1, 2
    # 15 bins; the six confidences fall in six different bins (1, 4, 13, 10, 8, 12), so
    # ECE = mean |p - [[m = y]]| = (0.1 + 0.3 + 0.1 + 0.3 + 0.55 + 0.85) / 6 = 2.2 / 6
    "expert_ece": 2.2 / 6,
    # N = 6, 4 deferred (rows 2, 3, 4, 5 with estimates 0.9, 0.7, 0.55, 0.85).
    # 10%: floor(0.6) = 0 kept -> the classifier answers all -> classifier error 3/6
    "budgeted_error_10": 3 / 6,
    # 20%: floor(1.2) = 1 kept: row 2 (0.9). Rows 3, 4, 5 go back to the classifier (all right),
    # row 2's expert is right -> errors rows 0, 1 = 2/6. (Keeping row 5 would give 4/6, row 3 3/6,
    # row 4 4/6: only the right choice gives 2/6.)
    "budgeted_error_20": 2 / 6,
    # 30%: floor(1.8) = 1 kept -> same as 20%
    "budgeted_error_30": 2 / 6,
}


def _m1_arrays():
    logits = np.array([_row(pred, t, [p]) for (_, _, pred, t, p) in M1_ROWS], dtype=np.float32)
    labels = np.array([r[0] for r in M1_ROWS], dtype=np.int64)
    experts = np.array([r[1] for r in M1_ROWS], dtype=np.int64)
    return logits, labels, experts


def _check(result, expected, tol=1e-6):
    for key, value in expected.items():
        assert key in result, key
        assert float(result[key]) == pytest.approx(value, abs=tol), key


def test_m1_metrics_by_hand():
    logits, labels, experts = _m1_arrays()
    result = deferral_metrics(logits, labels, experts)
    _check(result, M1_EXPECTED)
    for key in ("system_error", "coverage", "classifier_error", "expert_ece"):
        assert 0.0 <= float(result[key]) <= 1.0


def test_m1_metrics_expert_labels_2d_and_aova_same():
    logits, labels, experts = _m1_arrays()
    _check(deferral_metrics(logits, labels, experts[:, None], surrogate="asm", num_experts=1), M1_EXPECTED)
    # A-OvA: expert estimate sigma(u_{K+1}) = p as well, same decision rule -> same numbers
    _check(deferral_metrics(logits, labels, experts, surrogate="aova"), M1_EXPECTED)


def test_m1_expert_ece_with_5_bins():
    logits, labels, experts = _m1_arrays()
    # 5 bins of 0.2: 0.1 -> 0, 0.3 -> 1, 0.9 -> 4, 0.7 -> 3, 0.55 -> 2, 0.85 -> 4
    # bin 4 holds rows 2 (0.9, correct) and 5 (0.85, wrong): mean 0.875, acc 0.5 -> 2 * 0.375 = 0.75
    # others: 0.1, 0.3, 0.55, |0.7 - 1| = 0.3 -> ECE = (0.1 + 0.3 + 0.55 + 0.3 + 0.75) / 6 = 2/6
    result = deferral_metrics(logits, labels, experts, n_bins=5)
    assert float(result["expert_ece"]) == pytest.approx(2 / 6, abs=1e-6)


def test_m1_reliability():
    logits, labels, experts = _m1_arrays()
    result = deferral_metrics(logits, labels, experts, return_reliability=True)
    rel = result["reliability"]
    assert isinstance(rel, dict)
    np.testing.assert_allclose(rel["bin_edges"], np.arange(16) / 15, atol=1e-9)
    counts = np.zeros(15, dtype=int)
    conf = np.full(15, np.nan)
    acc = np.full(15, np.nan)
    # (bin, p, correct): 0.1 -> 1, 0.3 -> 4, 0.9 -> 13, 0.7 -> 10, 0.55 -> 8, 0.85 -> 12
    for b, p, c in [(1, 0.1, 0), (4, 0.3, 0), (13, 0.9, 1), (10, 0.7, 1), (8, 0.55, 0), (12, 0.85, 0)]:
        counts[b], conf[b], acc[b] = 1, p, c
    assert list(rel["counts"]) == counts.tolist()
    got_conf = np.asarray(rel["mean_confidence"], dtype=float)
    got_acc = np.asarray(rel["accuracy"], dtype=float)
    assert np.array_equal(np.isnan(got_conf), np.isnan(conf))
    assert np.array_equal(np.isnan(got_acc), np.isnan(acc))
    ok = ~np.isnan(conf)
    np.testing.assert_allclose(got_conf[ok], conf[ok], atol=1e-6)
    np.testing.assert_allclose(got_acc[ok], acc[ok], atol=1e-9)


def test_m1_padding_rows_are_dropped():
    logits, labels, experts = _m1_arrays()
    # three -100 rows that, if counted, would all be deferred with estimate 0.95 (> every real one),
    # and change N from 6 to 9 (floor(0.3 * 9) = 2 would keep row 5 too and give 3/6 at 30%).
    pad = np.array([_row(0, DEFER, [0.95])] * 3, dtype=np.float32)
    logits_p = np.concatenate([logits[:2], pad[:1], logits[2:5], pad[1:], logits[5:]])
    labels_p = np.concatenate([labels[:2], [IGNORE], labels[2:5], [IGNORE, IGNORE], labels[5:]])
    experts_p = np.concatenate([experts[:2], [IGNORE], experts[2:5], [0, IGNORE], experts[5:]])
    assert len(labels_p) == 9
    _check(deferral_metrics(logits_p, labels_p, experts_p), M1_EXPECTED)


def test_numpy_and_torch_inputs_give_the_same_dict():
    logits, labels, experts = _m1_arrays()
    a = deferral_metrics(logits, labels, experts)
    b = deferral_metrics(torch.from_numpy(logits), torch.from_numpy(labels), torch.from_numpy(experts))
    assert set(a) == set(b)
    for key in a:
        assert float(a[key]) == pytest.approx(float(b[key]), abs=1e-9), key
    _check(b, M1_EXPECTED)


# N = 12, one expert; budgets floor(0.1*12) = 1, floor(0.2*12) = 2, floor(0.3*12) = 3.
# Rows 0..8 are not deferred (t = NEVER, p = 0.1); the classifier is wrong on rows 0 and 1 only.
# Deferred rows (t = DEFER):
# r  | y | m | pred | p    | cls ok | exp ok
# 9  | 1 | 1 | 0    | 0.85 | 0      | 1
# 10 | 1 | 0 | 1    | 0.7  | 1      | 0
# 11 | 0 | 0 | 0    | 0.85 | 1      | 1      (same logits as row 9: a tie, row 9 wins)
BUDGET_ROWS = (
    [(2, 0, 0, NEVER, 0.1), (1, 1, 2, NEVER, 0.1)]
    + [(y, (y + 1) % K, y, NEVER, 0.1) for y in (0, 1, 2, 0, 1, 2, 0)]
    + [(1, 1, 0, DEFER, 0.85), (1, 0, 1, DEFER, 0.7), (0, 0, 0, DEFER, 0.85)]
)


def test_budget_binds_with_tie_broken_by_index_and_does_not_bind_at_equality():
    logits = np.array([_row(pred, t, [p]) for (_, _, pred, t, p) in BUDGET_ROWS], dtype=np.float32)
    labels = np.array([r[0] for r in BUDGET_ROWS])
    experts = np.array([r[1] for r in BUDGET_ROWS])
    assert np.array_equal(logits[9], logits[11])
    result = deferral_metrics(logits, labels, experts)
    expected = {
        # errors: rows 0, 1 (classifier) + row 10 (expert) = 3/12
        "system_error": 3 / 12,
        "coverage": 9 / 12,
        # classifier wrong on rows 0, 1, 9
        "classifier_error": 3 / 12,
        # 10%: keep 1 of the 3 deferred. Rows 9 and 11 tie at 0.85; row 9 (earlier) is kept.
        #   row 9 -> expert right; rows 10, 11 -> classifier right -> errors rows 0, 1 = 2/12.
        #   (keeping row 11 instead: row 9's classifier is wrong -> 3/12; keeping row 10 -> 4/12)
        "budgeted_error_10": 2 / 12,
        # 20%: keep 2: rows 9 and 11 -> row 10 to the classifier (right) -> 2/12
        #   (rows 9,10 -> 3/12; rows 10,11 -> 4/12)
        "budgeted_error_20": 2 / 12,
        # 30%: 3 deferred <= floor(3.6) = 3 -> does not bind -> system error 3/12
        "budgeted_error_30": 3 / 12,
    }
    _check(result, expected)


def test_budget_never_binds_with_few_deferrals():
    # N = 12 with a single deferred row (row 11, expert right, classifier wrong) -> every budget
    # (1, 2, 3 deferrals allowed) is slack -> all three equal the system error.
    rows = list(BUDGET_ROWS[:9]) + [
        (0, 0, 0, NEVER, 0.1),
        (1, 1, 1, NEVER, 0.1),
        (2, 2, 0, DEFER, 0.7),
    ]
    logits = np.array([_row(pred, t, [p]) for (_, _, pred, t, p) in rows], dtype=np.float32)
    labels = np.array([r[0] for r in rows])
    experts = np.array([r[1] for r in rows])
    result = deferral_metrics(logits, labels, experts)
    # system: rows 0, 1 wrong (row 11's expert is right) -> 2/12; classifier: rows 0, 1, 11 -> 3/12
    _check(
        result,
        {
            "system_error": 2 / 12,
            "coverage": 11 / 12,
            "classifier_error": 3 / 12,
            "budgeted_error_10": 2 / 12,
            "budgeted_error_20": 2 / 12,
            "budgeted_error_30": 2 / 12,
        },
    )


# --------------------------------------------------------------------------------------------
# deferral_metrics, two experts
# --------------------------------------------------------------------------------------------

# r | y | m0 | m1 | pred | t     | p0   | p1   | route | cls ok | e0 ok | e1 ok | loss
# 0 | 0 | 0  | 1  | 1    | NEVER | 0.1  | 0.3  | -     | 0      | 1     | 0     | 1
# 1 | 1 | 1  | 1  | 2    | NEVER | 0.45 | 0.25 | -     | 0      | 1     | 1     | 1
# 2 | 2 | 0  | 0  | 2    | DEFER | 0.9  | 0.55 | E0    | 1      | 0     | 0     | 1
# 3 | 0 | 1  | 0  | 1    | DEFER | 0.7  | 0.95 | E1    | 0      | 0     | 1     | 0
# 4 | 1 | 0  | 2  | 0    | DEFER | 0.3  | 0.75 | E1    | 0      | 0     | 0     | 1
# 5 | 2 | 2  | 0  | 2    | DEFER | 0.1  | 0.85 | E1    | 1      | 1     | 0     | 1
M2_ROWS = [
    (0, (0, 1), 1, NEVER, (0.1, 0.3)),
    (1, (1, 1), 2, NEVER, (0.45, 0.25)),
    (2, (0, 0), 2, DEFER, (0.9, 0.55)),
    (0, (1, 0), 1, DEFER, (0.7, 0.95)),
    (1, (0, 2), 0, DEFER, (0.3, 0.75)),
    (2, (2, 0), 2, DEFER, (0.1, 0.85)),
]
M2_EXPECTED = {
    "system_error": 5 / 6,  # rows 0, 1, 2, 4, 5
    "coverage": 2 / 6,
    "classifier_error": 4 / 6,  # rows 0, 1, 3, 4
    "deferral_rate_0": 1 / 6,  # row 2
    "deferral_rate_1": 3 / 6,  # rows 3, 4, 5
    # expert 0: conf (0.1, 0.45, 0.9, 0.7, 0.3, 0.1), correct (1, 1, 0, 0, 0, 1)
    #   bins 1, 6, 13, 10, 4, 1. bin 1: rows 0 and 5, mean 0.1, acc 1 -> 2 * 0.9 = 1.8;
    #   others 0.55 + 0.9 + 0.7 + 0.3 -> ECE_0 = 4.25 / 6
    "expert_ece_0": 4.25 / 6,
    # expert 1: conf (0.3, 0.25, 0.55, 0.95, 0.75, 0.85), correct (0, 1, 0, 1, 0, 0), six distinct
    #   bins -> (0.3 + 0.75 + 0.55 + 0.05 + 0.75 + 0.85) / 6 = 3.25 / 6
    "expert_ece_1": 3.25 / 6,
    "expert_ece": (4.25 + 3.25) / 12,
    # N = 6; deferred rows 2 (E0, 0.9), 3 (E1, 0.95), 4 (E1, 0.75), 5 (E1, 0.85)
    # 10%: 0 kept -> classifier error 4/6
    "budgeted_error_10": 4 / 6,
    # 20%: 1 kept: row 3 (0.95, expert right); rows 2, 5 classifier right, row 4 wrong
    #   -> rows 0, 1, 4 = 3/6 (keeping row 2: 5/6, row 4: 4/6, row 5: 5/6)
    "budgeted_error_20": 3 / 6,
    "budgeted_error_30": 3 / 6,  # floor(1.8) = 1
}


def _m2_arrays():
    logits = np.array([_row(pred, t, list(ps)) for (_, _, pred, t, ps) in M2_ROWS], dtype=np.float32)
    labels = np.array([r[0] for r in M2_ROWS], dtype=np.int64)
    experts = np.array([r[1] for r in M2_ROWS], dtype=np.int64)
    return logits, labels, experts


def test_m2_metrics_by_hand():
    logits, labels, experts = _m2_arrays()
    result = deferral_metrics(logits, labels, experts, num_experts=2)
    _check(result, M2_EXPECTED)
    assert "expert_ece_2" not in result and "deferral_rate_2" not in result


def test_m2_padding_torch_and_reliability():
    logits, labels, experts = _m2_arrays()
    pad_logits = np.array([_row(1, DEFER, [0.95, 0.1]), _row(0, DEFER, [0.25, 0.97])], dtype=np.float32)
    logits_p = np.concatenate([pad_logits[:1], logits, pad_logits[1:]])
    labels_p = np.concatenate([[IGNORE], labels, [IGNORE]])
    experts_p = np.concatenate([[[IGNORE, IGNORE]], experts, [[1, IGNORE]]])
    result = deferral_metrics(
        torch.from_numpy(logits_p), torch.from_numpy(labels_p), torch.from_numpy(experts_p),
        num_experts=2, return_reliability=True,
    )
    _check(result, M2_EXPECTED)
    rel = result["reliability"]
    assert isinstance(rel, list) and len(rel) == 2
    # expert 0: bin 1 holds two rows (conf 0.1, both correct); bins 4, 6, 10, 13 one each
    assert list(rel[0]["counts"]) == [0, 2, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0, 0, 1, 0]
    assert float(rel[0]["accuracy"][1]) == pytest.approx(1.0)
    assert float(rel[0]["mean_confidence"][1]) == pytest.approx(0.1, abs=1e-6)
    # expert 1: bins 3, 4, 8, 11, 12, 14 one each
    assert list(rel[1]["counts"]) == [0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 1]
    assert float(rel[1]["mean_confidence"][14]) == pytest.approx(0.95, abs=1e-6)
    assert float(rel[1]["accuracy"][14]) == 1.0


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------


def test_metrics_reject_unknown_surrogate():
    logits, labels, experts = _m1_arrays()
    with pytest.raises(ValueError, match="surrogate"):
        deferral_metrics(logits, labels, experts, surrogate="nope")


def test_metrics_reject_too_narrow_logits():
    logits, labels, experts = _m1_arrays()
    # K is inferred as width - num_experts; width 2 with one expert leaves K = 1 < 2
    with pytest.raises(ValueError, match="logits|num_experts"):
        deferral_metrics(logits[:, :2], np.zeros(6, dtype=np.int64), np.zeros(6, dtype=np.int64))
    # width 4 with 3 experts: K = 1
    with pytest.raises(ValueError, match="logits|num_experts"):
        deferral_metrics(logits, np.zeros(6, dtype=np.int64), np.zeros((6, 3), dtype=np.int64), num_experts=3)


def test_metrics_reject_labels_and_expert_labels_and_nan():
    logits, labels, experts = _m1_arrays()
    bad = labels.copy()
    bad[0] = 3
    with pytest.raises(ValueError, match="labels"):
        deferral_metrics(logits, bad, experts)
    bad_e = experts.copy()
    bad_e[3] = 5  # K = 3 classes (-100 on a valid row is a missing answer since issue 19: test_metrics_sparse.py)
    with pytest.raises(ValueError, match="expert_labels"):
        deferral_metrics(logits, labels, bad_e)
    with pytest.raises(ValueError, match="expert_labels"):
        deferral_metrics(logits, labels, np.stack([experts, experts], axis=1))  # M' = 2 != 1
    nan = logits.copy()
    nan[2, 1] = np.nan
    with pytest.raises(ValueError, match="logits"):
        deferral_metrics(nan, labels, experts)
    with pytest.raises(ValueError, match="logits"):
        deferral_metrics(logits[0], labels[:1], experts[:1])  # 1-D logits


# ----------------------------------------------------------------------------- names
def test_every_metric_key_has_a_display_name():
    from hf_defer.evaluation.metrics import metric_name_and_meaning

    logits = np.array([[3.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.5, 4.0, 2.0]])
    keys = deferral_metrics(logits, [0, 2], [[1, 2], [2, 2]], num_experts=2)
    names = {key: metric_name_and_meaning(key)[0] for key in keys}
    assert names["system_error"] == "System error" and names["budgeted_error_20"] == "Budgeted error @ 20%"
    assert names["expert_ece_1"] == "Expert ECE (expert 1)" and names["deferral_rate_0"] == "Deferral rate (expert 0)"
    with pytest.raises(ValueError, match="key must be a key of deferral_metrics"):
        metric_name_and_meaning("eval_loss")


# --------------------------------------------------------------------------------------------
# issue 11: numbers that used to be silently wrong
# --------------------------------------------------------------------------------------------


def _budget_arrays():
    logits = np.array([_row(pred, t, [p]) for (_, _, pred, t, p) in BUDGET_ROWS], dtype=np.float32)
    return logits, np.array([r[0] for r in BUDGET_ROWS]), np.array([r[1] for r in BUDGET_ROWS])


def test_budgets_that_round_to_the_same_percent_get_their_own_keys():
    """0.0766 and 0.0834 both used to be keyed budgeted_error_8, the value depending on their order. On the 12 rows of
    BUDGET_ROWS, floor(0.0766 * 12) = 0 deferrals: the classifier answers all, wrong on rows 0, 1, 9 -> 3/12;
    floor(0.0834 * 12) = 1: row 9 stays deferred (expert right) -> 2/12."""
    logits, labels, experts = _budget_arrays()
    for budgets in ((0.0766, 0.0834), (0.0834, 0.0766)):
        result = deferral_metrics(logits, labels, experts, budgets=budgets)
        assert result["budgeted_error_7.66"] == pytest.approx(3 / 12)
        assert result["budgeted_error_8.34"] == pytest.approx(2 / 12)
        assert not any(key.startswith("budgeted_error_8") and key != "budgeted_error_8.34" for key in result)
    keys = [k for k in deferral_metrics(logits, labels, experts, budgets=(0.096, 0.104)) if k.startswith("budgeted")]
    assert keys == ["budgeted_error_9.6", "budgeted_error_10.4"]


def test_small_budget_is_not_keyed_zero_and_the_paper_keys_stay():
    logits, labels, experts = _budget_arrays()
    result = deferral_metrics(logits, labels, experts, budgets=(0.004, 0.1, 0.2, 0.3, np.float32(0.1), 1))
    assert result["budgeted_error_0.4"] == pytest.approx(3 / 12)  # floor(0.048) = 0 deferrals
    assert "budgeted_error_0" not in result
    assert [k for k in result if k.startswith("budgeted")] == [
        "budgeted_error_0.4", "budgeted_error_10", "budgeted_error_20", "budgeted_error_30", "budgeted_error_100"]


@pytest.mark.parametrize("budgets", [0.1, "0.1", (0.1, "a"), (0.0,), (1.5,), (float("nan"),), (True,)])
def test_bad_budgets_name_the_argument(budgets):
    logits, labels, experts = _budget_arrays()
    with pytest.raises(ValueError, match="budgets"):
        deferral_metrics(logits, labels, experts, budgets=budgets)


def test_numpy_integer_sizes_are_integers():
    logits, labels, experts = _m1_arrays()
    expected = deferral_metrics(logits, labels, experts)
    assert deferral_metrics(logits, labels, experts, num_experts=np.int64(1), n_bins=np.int32(15)) == expected
    assert reliability_bins([0.1, 0.9], [0, 1], n_bins=np.int64(2))["counts"] == [1, 1]
    with pytest.raises(ValueError, match="n_bins"):
        reliability_bins([0.1], [0], n_bins=np.float64(2.0))


@pytest.mark.parametrize(("argument", "value"), [("labels", ["a"] * 6), ("expert_labels", [[0, 1], [0]] * 3),
                                                 ("logits", [["x", "y", "z", "w"]] * 6)])
def test_strings_and_ragged_lists_name_the_argument(argument, value):
    logits, labels, experts = _m1_arrays()
    arguments = {"logits": logits, "labels": labels, "expert_labels": experts, argument: value}
    with pytest.raises(ValueError, match=argument):
        deferral_metrics(**arguments)
