"""DeferralCascade.calibrate_escalation: the stage-2 threshold that budgets the costly calls (a person) with a stated
confidence, checked against the binomial order statistic and against the calls the cascade then makes."""

from __future__ import annotations

import numpy as np
import pytest

from hf_defer.evaluation.guarantees import binomial_order_statistic
from test_modeling_cascade import build

N = 2_000


def calibration(seed: int, n: int = N):
    """n inputs: features ~ N(0, I_3), the llm's probability of class 0 ~ U(0, 1)."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, 3)).astype(np.float32)
    first = rng.uniform(size=n)
    probs = np.stack([first, 1 - first], axis=1)
    return features, lambda rows: probs[rows]


def test_escalations_stay_within_the_certified_order_statistic():
    cascade = build()
    features, llm = calibration(0)
    reached = (cascade.decide(features, llm)["stage1"] == 0).sum()
    threshold = cascade.calibrate_escalation(features, llm, max_escalation_rate=0.05, confidence=0.9)
    escalated = cascade.decide(features, llm, stage2_threshold=threshold)["escalate"].sum()
    k = binomial_order_statistic(N, 0.05, 0.9)  # the k-th largest margin stays below the threshold
    assert reached > k and escalated == k - 1  # margins are distinct: exactly k - 1 above it
    empirical = cascade.calibrate_escalation(features, llm, max_escalation_rate=0.05, confidence=None)
    assert cascade.decide(features, llm, stage2_threshold=empirical)["escalate"].sum() == int(0.05 * N)
    with pytest.raises(ValueError, match="stage2_min_confidence replaces it"):
        cascade.calibrate_escalation(features, llm, 0.05, stage2_min_confidence=0.7)


def test_escalation_budget_holds_on_new_inputs():
    # The population rate, estimated on 200,000 fresh inputs, stays within the budget in at least 90 % of 60 draws
    # (a loose check of the promise: the exact one is tests/evaluation/test_guarantees.py's).
    cascade = build()
    margins = cascade.decide(*calibration(10_000, n=200_000))["stage2_margin"]
    broken = 0
    for seed in range(60):
        features, llm = calibration(seed + 1)
        t = cascade.calibrate_escalation(features, llm, max_escalation_rate=0.05, confidence=0.9)
        broken += float((margins > t).mean()) > 0.05
    assert broken <= 0.1 * 60 + 3 * np.sqrt(60 * 0.09)
