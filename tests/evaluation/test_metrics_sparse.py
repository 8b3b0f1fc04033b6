"""deferral_metrics on sparse answers, availability, scores and expert names (issues 19 and 22), worked by hand.

The logits are those of test_metrics.py (A-SM, K = 3): the predicted class gets logit t, the other two -ln 2, so an
expert logit logit(p) gives the estimate p exactly; with t = DEFER = 0 an available expert is deferred to iff its p
exceeds 0.5 (the best available one), with t = NEVER = 3 never.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import EvalPrediction

from hf_defer import DeferralMetrics, deferral_metrics
from hf_defer.evaluation.metrics import expert_keys, metric_name_and_meaning, reliability_bins

from test_metrics import DEFER, IGNORE, M1_ROWS, M2_ROWS, NEVER, _check, _m1_arrays, _m2_arrays, _row

# M2_ROWS of test_metrics.py with answers removed. The decisions are the pipeline's on these inputs: nobody knows at
# decision time who answered, so every expert may be asked (issue 41); a deferral to an expert with no recorded answer
# is counted apart (unscored), and the errors are over the rows that can be scored.
# r | y | m0   | m1   | pred | t     | p0   | p1   | decision         | loss
# 0 | 0 | 0    | 1    | 1    | NEVER | 0.1  | 0.3  | classifier wrong | 1
# 1 | 1 | 1    | 1    | 2    | NEVER | 0.45 | 0.25 | classifier wrong | 1
# 2 | 2 | -    | 0    | 2    | DEFER | 0.9  | 0.55 | E0 (0.9)         | unscored (alice did not answer)
# 3 | 0 | 1    | -    | 1    | DEFER | 0.7  | 0.95 | E1 (0.95)        | unscored (bob did not answer)
# 4 | 1 | -    | -    | 0    | DEFER | 0.3  | 0.75 | E1 (0.75)        | unscored
# 5 | 2 | 2    | -    | 2    | DEFER | 0.1  | 0.85 | E1 (0.85)        | unscored
SPARSE_ANSWERS = np.array([[0, 1], [1, 1], [IGNORE, 0], [1, IGNORE], [IGNORE, IGNORE], [2, IGNORE]])
SPARSE_EXPECTED = {
    "system_error": 2 / 2,  # rows 0 and 1, the only ones scored
    "scored_rows": 2,
    "unscored_deferrals": 4,
    "unscored_deferrals_alice": 1,  # row 2
    "unscored_deferrals_bob": 3,  # rows 3, 4, 5
    "coverage": 2 / 6,  # rows 2 to 5 deferred: what the pipeline does on these inputs
    "classifier_error": 4 / 6,  # rows 0, 1, 3, 4 (the classifier does not depend on the experts)
    "majority_class_error": 4 / 6,  # labels 0, 1, 2, 0, 1, 2: any class is right on 2 of 6
    "deferral_rate_alice": 1 / 6,  # row 2
    "deferral_rate_bob": 3 / 6,  # rows 3, 4, 5
    # alice answered rows 0, 1, 3, 5: conf (0.1, 0.45, 0.7, 0.1), right (1, 1, 0, 1); bins 1, 6, 10, 1:
    #   bin 1 holds rows 0 and 5 (mean 0.1, acc 1) -> 2 * 0.9; + 0.55 + 0.7 -> 3.05 / 4
    "expert_ece_alice": 3.05 / 4,
    # bob answered rows 0, 1, 2: conf (0.3, 0.25, 0.55), right (0, 1, 0), bins 4, 3, 8 -> (0.3 + 0.75 + 0.55) / 3
    "expert_ece_bob": 1.6 / 3,
    "expert_ece": (3.05 / 4 + 1.6 / 3) / 2,
    # deferred, by estimate: row 3 (0.95), 2 (0.9), 5 (0.85), 4 (0.75). 10%: none kept -> the classifier on all six:
    # rows 0, 1, 3, 4 wrong.
    "budgeted_error_10": 4 / 6,
    # 20% and 30%: one kept, row 3 (unscored); rows 2, 4, 5 back to the classifier (right, wrong, right) -> 3 / 5
    "budgeted_error_20": 3 / 5,
    "budgeted_error_30": 3 / 5,
}


def test_sparse_answers_by_hand_with_expert_names():
    logits, labels, _ = _m2_arrays()
    result = deferral_metrics(logits, labels, SPARSE_ANSWERS, num_experts=2, expert_names=["alice", "bob"])
    _check(result, SPARSE_EXPECTED)
    assert not any(key.endswith(("_0", "_1")) for key in result)  # names, not numbers
    # The same with the margin ranking: margins p - 0.5 keep the order of the estimates, so the same rows stay.
    by_margin = deferral_metrics(logits, labels, SPARSE_ANSWERS, num_experts=2, budget_ranking="margin")
    _check(by_margin, {"budgeted_error_20": 3 / 5, "expert_ece_0": 3.05 / 4, "deferral_rate_1": 3 / 6,
                       "unscored_deferrals_1": 3})


def test_the_decisions_do_not_depend_on_who_answered():
    # Issue 41: removing answers changes what can be scored, never what is decided (coverage, deferral rates).
    logits, labels, answers = _m2_arrays()
    complete = deferral_metrics(logits, labels, answers, num_experts=2)
    sparse = deferral_metrics(logits, labels, SPARSE_ANSWERS, num_experts=2)
    for key in ("coverage", "deferral_rate_0", "deferral_rate_1", "classifier_error", "majority_class_error"):
        assert sparse[key] == complete[key], key
    assert "unscored_deferrals" not in complete and "scored_rows" not in complete  # every answer present


def test_an_expert_who_answered_nothing_has_no_ece_and_every_deferral_to_them_is_unscored():
    logits, labels, _ = _m2_arrays()
    answers = SPARSE_ANSWERS.copy()
    answers[:, 1] = IGNORE  # bob answered nothing
    result = deferral_metrics(logits, labels, answers, num_experts=2, expert_names=["alice", "bob"],
                              return_reliability=True)
    assert "expert_ece_bob" not in result and result["expert_ece"] == pytest.approx(3.05 / 4)
    assert sum(result["reliability"][1]["counts"]) == 0
    # the decisions are those of the table above: rows 3, 4, 5 still go to bob, and none of them can be scored
    assert result["deferral_rate_bob"] == pytest.approx(3 / 6) and result["unscored_deferrals_bob"] == 3
    assert result["system_error"] == 1.0 and result["coverage"] == pytest.approx(2 / 6)
    # nothing scored at all: no number, not a made-up one
    everything_deferred = deferral_metrics(logits[2:], labels[2:], np.full((4, 2), IGNORE), num_experts=2)
    assert np.isnan(everything_deferred["system_error"]) and everything_deferred["scored_rows"] == 0


def test_an_availability_mask_narrows_the_experts_further():
    logits, labels, answers = _m2_arrays()
    # Only alice may be asked: rows 2 (0.9) and 3 (0.7) go to her, both wrong; rows 4 (0.3), 5 (0.1) stay.
    result = deferral_metrics(logits, labels, answers, num_experts=2, available=[True, False])
    _check(result, {"coverage": 4 / 6, "deferral_rate_0": 2 / 6, "deferral_rate_1": 0.0, "system_error": 5 / 6,
                    "expert_ece_1": 3.25 / 6})  # the ECE still covers every answer bob gave
    everyone = deferral_metrics(logits, labels, answers, num_experts=2, available=np.ones((6, 2), dtype=bool))
    assert everyone == deferral_metrics(logits, labels, answers, num_experts=2)
    with pytest.raises(ValueError, match=r"available must have shape \[batch, num_experts\] = \[6, 2\]"):
        deferral_metrics(logits, labels, answers, num_experts=2, available=[True])


# M1_ROWS of test_metrics.py judged by a score instead of an answer:
# r | pred ok | t     | p    | score | decision                 | loss
# 0 | no      | NEVER | 0.1  | 0.2   | classifier               | 1
# 1 | no      | NEVER | 0.3  | 0.6   | classifier               | 1
# 2 | no      | DEFER | 0.9  | 0.8   | expert                   | 1 - 0.8 = 0.2
# 3 | yes     | DEFER | 0.7  | -     | expert (no score)        | unscored
# 4 | yes     | DEFER | 0.55 | 0.5   | expert                   | 0.5
# 5 | yes     | DEFER | 0.85 | 0.25  | expert                   | 0.75
SCORES = np.array([0.2, 0.6, 0.8, IGNORE, 0.5, 0.25], dtype=np.float32)


def test_scores_by_hand():
    logits, labels, _ = _m1_arrays()
    result = deferral_metrics(logits, labels, expert_correct=SCORES)
    _check(result, {
        "system_error": (1 + 1 + 0.2 + 0.5 + 0.75) / 5,
        "scored_rows": 5,
        "unscored_deferrals": 1,
        "coverage": 2 / 6,
        "classifier_error": 3 / 6,
        # answered rows 0, 1, 2, 4, 5: conf (0.1, 0.3, 0.9, 0.55, 0.85) in five bins, against the scores
        "expert_ece": (0.1 + 0.3 + 0.1 + 0.05 + 0.6) / 5,
        # 20%: one kept, row 2 (0.9); rows 3, 4, 5 back to the classifier (right) -> (1 + 1 + 0.2) / 6
        "budgeted_error_20": 2.2 / 6,
    })
    # Correctness as booleans or 0/1 is the answers' case exactly.
    _, _, answers = _m1_arrays()
    right = answers == labels
    hard = deferral_metrics(logits, labels, answers)
    for given in (right, right.astype(np.float64), torch.tensor(right)):
        assert deferral_metrics(logits, labels, expert_correct=given) == pytest.approx(hard)
    with pytest.raises(ValueError, match=r"expert_correct must lie in \[0, 1\]"):
        deferral_metrics(logits, labels, expert_correct=np.array([0.2, 0.6, np.nan, 1, 0, 0]))
    with pytest.raises(ValueError, match="exactly one of the two; got both"):
        deferral_metrics(logits, labels, answers, expert_correct=right)


def test_reliability_bins_take_scores_only_when_asked():
    np.testing.assert_allclose(reliability_bins([0.1, 0.15, 0.9], [0.5, 0.25, 1.0], n_bins=2, soft=True)["accuracy"],
                               [0.375, 1.0])
    with pytest.raises(ValueError, match="correct must hold outcomes 0/1"):
        reliability_bins([0.1], [0.5])
    with pytest.raises(ValueError, match=r"correct must hold scores in \[0, 1\]"):
        reliability_bins([0.1], [1.5], soft=True)


def test_deferral_metrics_for_the_trainer_reads_answers_or_scores_from_the_label_ids():
    logits, labels, _ = _m2_arrays()
    names = DeferralMetrics("asm", num_experts=2, expert_names=["alice", "bob"])
    _check(names(EvalPrediction(logits, (labels, SPARSE_ANSWERS))), SPARSE_EXPECTED)
    logits1, labels1, _ = _m1_arrays()
    scored = DeferralMetrics("asm")(EvalPrediction(logits1, (labels1, SCORES.astype(np.float32))))
    assert scored["system_error"] == pytest.approx(3.45 / 5) and scored["unscored_deferrals"] == 1


def test_per_expert_keys_use_sanitised_unique_names():
    assert expert_keys(["alice", "Dr. Who", "gpt-4o mini", "expert_3"], 4) == ["alice", "Dr_Who", "gpt_4o_mini", "3"]
    assert expert_keys(["a b", "a_b", "a-b"], 3) == ["a_b", "a_b_1", "a_b_2"]
    assert expert_keys(["!!", "Zoë"], 2) == ["0", "Zoë"]
    with pytest.raises(ValueError, match="expert_names must be 2 names"):
        expert_keys(["alice"], 2)
    logits = np.array([_row(0, DEFER, [0.9, 0.6]), _row(1, NEVER, [0.2, 0.3])], dtype=np.float32)
    result = deferral_metrics(logits, [0, 1], [[0, 0], [1, 1]], num_experts=2, expert_names=["Dr. Who", "gpt-4o"])
    assert {"expert_ece_Dr_Who", "deferral_rate_gpt_4o"} <= set(result)
    assert metric_name_and_meaning("expert_ece_Dr_Who", ["Dr. Who", "gpt-4o"])[0] == "Expert ECE (Dr. Who)"
    assert metric_name_and_meaning("deferral_rate_gpt_4o")[0] == "Deferral rate (gpt_4o)"
    assert metric_name_and_meaning("deferral_rate_1")[0] == "Deferral rate (expert 1)"
    with pytest.raises(ValueError, match="key must be a key of deferral_metrics"):
        metric_name_and_meaning("budgeted_error_ten")


def test_complete_answers_give_the_numbers_of_before():
    # The hand-worked tables of test_metrics.py, with every answer present, through the new paths too.
    logits, labels, answers = _m2_arrays()
    base = deferral_metrics(logits, labels, answers, num_experts=2)
    assert base["system_error"] == pytest.approx(5 / 6) and base["coverage"] == pytest.approx(2 / 6)
    assert deferral_metrics(logits, labels, expert_correct=(answers == labels[:, None]), num_experts=2) == base
    assert len(M1_ROWS) == len(M2_ROWS) == 6


def test_complete_answers_give_the_numbers_of_the_formulas_of_before():
    # The formulas deferral_metrics used before issue 19 (boolean correctness, all rows), evaluated here on random
    # complete data: every number the same to 1e-12 (two code paths: equal up to the order of float sums).
    from hf_defer.modeling import get_surrogate
    from hf_defer.evaluation.metrics import budget_deferrals, reliability_ece

    rng = np.random.default_rng(0)
    n, K, M = 500, 3, 3
    logits = rng.normal(size=(n, K + M)).astype(np.float32) * 2
    labels, answers = rng.integers(0, K, n), rng.integers(0, K, (n, M))
    result = deferral_metrics(logits, labels, answers, num_experts=M)
    surrogate = get_surrogate("asm", K, M)
    defer, prediction, expert = (t.numpy() for t in surrogate.decide(torch.tensor(logits)))
    accuracy = surrogate.probabilities(torch.tensor(logits))[1].double().numpy()
    right = answers == labels[:, None]
    chosen = right[np.arange(n), expert]
    old = {"system_error": float(np.mean(np.where(defer, ~chosen, prediction != labels))),
           "coverage": float(1.0 - defer.mean()), "classifier_error": float(1.0 - (prediction == labels).mean()),
           "majority_class_error": float(1.0 - np.bincount(labels).max() / n)}  # the baseline, added by issue 41
    eces = [reliability_ece(reliability_bins(accuracy[:, j], right[:, j], 15)) for j in range(M)]
    old["expert_ece"] = float(np.mean(eces))
    old.update({f"expert_ece_{j}": eces[j] for j in range(M)})
    old.update({f"deferral_rate_{j}": float(np.mean(defer & (expert == j))) for j in range(M)})
    for budget in (0.1, 0.2, 0.3):
        kept = budget_deferrals(defer, accuracy[np.arange(n), expert], budget)
        old[f"budgeted_error_{round(budget * 100)}"] = float(np.mean(np.where(kept, ~chosen, prediction != labels)))
    assert result.keys() == old.keys()  # the same numbers along another path: to float rounding
    assert all(result[key] == pytest.approx(old[key], rel=1e-12, abs=1e-12) for key in old), {
        key: (result[key], old[key]) for key in old if result[key] != old[key]}
