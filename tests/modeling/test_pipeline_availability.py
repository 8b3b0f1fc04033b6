"""pipeline("deferral", ...)(..., available_experts=...) and calibrate_deferral(..., available_experts=...) (issue 19).

The model is head-only with an identity head and A-OvA, so the feature vector *is* the logit vector and every estimate
is a sigmoid: K = 2 classes, M = 3 experts (alice, bob, carol). Worked by hand, with sigma(2) = 0.881, sigma(1) = 0.731,
sigma(0.5) = 0.622, sigma(0) = 0.5:

    input 0: classes (0.5, -1), experts (2, 1, -3): alice 0.881 > bob 0.731 > class 0.622 > carol
    input 1: classes (0, -1),   experts (-3, 1, 2): carol 0.881 > bob 0.731 > class 0.5 > alice
    input 2: classes (1, -1),   experts (0.5, -3, -3): class 0.731 beats everyone: never deferred
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import pipeline

import hf_defer
from hf_defer import DeferralConfig, EncoderForDeferral

FEATURES = np.array([[0.5, -1, 2, 1, -3], [0, -1, -3, 1, 2], [1, -1, 0.5, -3, -3]], dtype=np.float32)
NAMES = ["alice", "bob", "carol"]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def identity_model() -> EncoderForDeferral:
    model = EncoderForDeferral(DeferralConfig(feature_size=5, num_labels=2, num_experts=3, surrogate="aova",
                                              expert_names=NAMES))
    with torch.no_grad():
        model.head[-1].weight.copy_(torch.eye(5))
        model.head[-1].bias.zero_()
    return model.eval()


def experts_of(outputs):
    return [out["expert"] for out in outputs]


@pytest.mark.parametrize("batch_size", [1, 2])
def test_names_for_the_whole_call_and_one_entry_per_input(batch_size):
    defer = pipeline("deferral", model=identity_model(), batch_size=batch_size)
    assert experts_of(defer(list(FEATURES))) == ["alice", "carol", None]
    assert experts_of(defer(list(FEATURES), available_experts=["bob"])) == ["bob", "bob", None]
    assert experts_of(defer(list(FEATURES), available_experts=["carol"])) == [None, "carol", None]
    assert experts_of(defer(list(FEATURES), available_experts=[])) == [None, None, None]
    # one entry per input: names, or a bool mask
    per_input = [["bob", "carol"], ["alice"], NAMES]
    assert experts_of(defer(list(FEATURES), available_experts=per_input)) == ["bob", None, None]
    mask = np.array([[False, False, True], [True, True, False], [True, True, True]])
    assert experts_of(defer(FEATURES, available_experts=mask)) == [None, "bob", None]
    one = defer(FEATURES[0], available_experts=[[False, True, False]], return_margin=True)
    assert one["expert"] == "bob" and one["margin"] == pytest.approx(1 / (1 + math.exp(-1)) - 1 / (1 + math.exp(-0.5)))
    nobody = defer(FEATURES[0], available_experts=[], return_margin=True)
    assert nobody["defer"] is False and nobody["label"] == "LABEL_0" and nobody["margin"] == float("-inf")


def test_outputs_name_the_experts():
    out = pipeline("deferral", model=identity_model())(FEATURES[0])
    assert list(out["expert_scores"]) == NAMES
    assert out["expert_scores"]["alice"] == pytest.approx(1 / (1 + math.exp(-2)), abs=1e-6)
    assert list(out["expert_scores"].values()) == out["expert_accuracy"]


def test_availability_set_when_building_the_pipeline():
    defer = pipeline("deferral", model=identity_model(), available_experts=["bob"])
    assert experts_of(defer(list(FEATURES))) == ["bob", "bob", None]
    with pytest.raises(ValueError, match="per input .* must come with the call"):
        pipeline("deferral", model=identity_model(), available_experts=[["bob"], ["alice"]])


@pytest.mark.parametrize(
    ("available", "error", "message"),
    [(["dave"], ValueError, r"available_experts names \['dave'\], which are not in config.expert_names"),
     ([True, False], ValueError, "available_experts must have one entry per expert"),
     ([["alice"], ["bob"]], ValueError, r"available_experts has 2 rows \(one per input\), but the call has 3 inputs"),
     ("alice", TypeError, "available_experts must be a list of expert names"),
     ([0.5, 0.5, 0.5], ValueError, "available_experts must be expert names or a bool mask")],
)
def test_bad_availability_is_refused_naming_the_argument(available, error, message):
    defer = pipeline("deferral", model=identity_model())
    with pytest.raises(error, match=message):
        defer(list(FEATURES), available_experts=available)


def test_calibration_counts_only_the_available_experts():
    # Margins: input 0 alice 0.881 - 0.622 = 0.259; input 1 carol 0.881 - 0.5 = 0.381; input 2 negative.
    # With carol away, input 1's best is bob: 0.731 - 0.5 = 0.231 < 0.259, so a budget of one deferral out of 3
    # (1/3) keeps input 0, and the calibrated pipeline, called with the same availability, defers exactly it.
    model = identity_model()
    threshold = hf_defer.calibrate_deferral(model, list(FEATURES), max_deferral_rate=1 / 3,
                                            available_experts=["alice", "bob"])
    assert 0.231 < threshold < 0.259 and model.config.defer_threshold == threshold
    defer = pipeline("deferral", model=model)
    assert experts_of(defer(list(FEATURES), available_experts=["alice", "bob"])) == ["alice", None, None]
    # Per input: nobody for input 0, so input 1 (0.381 with carol) is the one kept.
    model = identity_model()
    rows = [[], NAMES, NAMES]
    threshold = hf_defer.calibrate_deferral(model, list(FEATURES), max_deferral_rate=1 / 3, available_experts=rows)
    assert 0 <= threshold < 0.381
    assert experts_of(pipeline("deferral", model=model)(list(FEATURES), available_experts=rows)) == [None, "carol",
                                                                                                     None]
