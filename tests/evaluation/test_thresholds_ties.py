"""calibrate_deferral never puts the threshold on (or within rounding of) a margin: with a budget of floor(bN) = 0 or
tied margins, a later pipeline run whose margins differ in the last digits still defers at most floor(bN) inputs."""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples
from transformers import pipeline

import hf_defer  # noqa: F401  (registers the "deferral" task)
from hf_defer import DeferralConfig, EncoderForDeferral
from hf_defer.evaluation.thresholds import MARGIN_TOLERANCE, calibrate_deferral
from hf_defer.evaluation.guarantees import _threshold_between
from hf_defer.evaluation.metrics import budget_deferrals

D = 5


def threshold_for(margins: np.ndarray, rate: float) -> float:
    """The threshold calibrate_deferral computes from these margins (deferred at 0: margin > 0)."""
    return _threshold_between(margins, budget_deferrals(margins > 0, margins, rate))


@settings(max_examples=examples(300))
@given(st.lists(st.one_of(st.sampled_from([0.0, 0.25, 0.5, -0.25]),  # exact ties, and ties at 0
                          st.floats(-1, 1, allow_nan=False)), min_size=1, max_size=12),
       st.floats(0.01, 1.0), st.floats(-0.9 * MARGIN_TOLERANCE, 0.9 * MARGIN_TOLERANCE))
def test_no_margin_can_round_its_way_past_the_budget(values, rate, jitter):
    margins = np.asarray(values, dtype=np.float64)
    budget = math.floor(rate * len(margins) + 1e-9)
    threshold = threshold_for(margins, rate)
    tolerance = MARGIN_TOLERANCE * max(1.0, margins.max())
    assert threshold >= 0.0
    # Even if every margin rose by the tolerance, at most floor(bN) inputs would be deferred; and a small shift of
    # all margins (another batch size) defers at most floor(bN) too.
    assert (margins > threshold - 0.999 * tolerance).sum() <= budget
    assert (margins + jitter > threshold).sum() <= budget


@settings(max_examples=examples(200))
@given(st.lists(st.integers(-50, 50), min_size=1, max_size=30, unique=True), st.floats(0.01, 1.0))
def test_well_separated_margins_use_the_whole_budget(steps, rate):
    # Margins 0.01 apart and none at 0: no ties, so exactly min(floor(bN), #positive) are deferred, those with the
    # highest margins (worked out by counting, not by the code under test).
    margins = np.asarray(steps, dtype=np.float64) / 100 + 0.005
    budget = math.floor(rate * len(margins) + 1e-9)
    threshold = threshold_for(margins, rate)
    deferred = margins > threshold
    assert deferred.sum() == min(budget, (margins > 0).sum())
    assert set(np.flatnonzero(deferred)) == set(np.argsort(-margins)[: deferred.sum()])


def eager_deferrer(seed: int = 0) -> EncoderForDeferral:
    torch.manual_seed(seed)
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3))
    with torch.no_grad():
        model.head[-1].bias[3:] += 3.0
    return model.eval()


def margins_of(model: EncoderForDeferral, features: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        out = model(features=torch.tensor(features))
    return (out.expert_accuracy.double().max(1).values - out.class_probs.double().max(1).values).numpy()


def test_a_budget_of_no_input_puts_the_threshold_above_every_margin():
    model = eager_deferrer()
    features = np.random.default_rng(1).normal(size=(5, D)).astype("float32")
    margins = margins_of(model, features)
    assert (margins > 0).all()  # the model defers all five; floor(0.1 * 5) = 0 may stay deferred
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=0.1)
    assert threshold >= margins.max() + MARGIN_TOLERANCE / 2  # not on the highest margin (pipeline margins: float32)
    for batch_size in (1, 2, 5):
        assert not any(out["defer"] for out in pipeline("deferral", model=model)(features, batch_size=batch_size))


def test_tied_margins_are_not_split_by_a_threshold_on_them():
    # A head with zero weights gives every input the same logits, hence the same margin m > 0: ten tied inputs and a
    # budget of three. No threshold defers three of ten equal margins; one on m would defer none today and all ten
    # after a rounding difference. The threshold sits above m, by the tolerance.
    model = EncoderForDeferral(DeferralConfig(feature_size=D, num_labels=3)).eval()
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].bias.copy_(torch.tensor([1.0, 0.0, 0.0, 3.0]))
    features = np.random.default_rng(2).normal(size=(10, D)).astype("float32")
    margins = margins_of(model, features)
    assert np.ptp(margins) == 0 and margins[0] > 0
    threshold = calibrate_deferral(model, list(features), max_deferral_rate=0.3)
    assert threshold >= margins[0] + MARGIN_TOLERANCE / 2
    assert not any(out["defer"] for out in pipeline("deferral", model=model)(features))
