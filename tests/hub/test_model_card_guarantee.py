"""The model card states the deferral guarantee in plain words, with its assumption, and only for its threshold."""

from __future__ import annotations

from pathlib import Path

import hf_defer
from hf_defer.hub.model_card import describe_guarantee

GUARANTEE = {
    "threshold": 0.25, "confidence": 0.9, "n": 1000, "date": "2026-11-27", "expert_costs": [0.02],
    "assumption": "new inputs are drawn independently from the same distribution as the calibration inputs",
    "claims": [
        {"kind": "system_error", "target": 0.05, "bound": "Learn-then-Test, fixed-sequence, exact binomial p-values"},
        {"kind": "deferral_rate", "target": 0.1, "bound": "binomial order statistic (exact)"},
        {"kind": "mean_cost", "target": 0.002, "bound": "Learn-then-Test, fixed-sequence, Hoeffding-Bentkus p-values"},
    ],
}


def test_plain_words():
    text = describe_guarantee(GUARANTEE, 0.25)
    assert text.startswith("On new inputs, at most 5 % of the answers are wrong (the model's where it answers, the "
                           "expert's where it defers), at most 10 % of the inputs go to an expert and the mean price "
                           "paid per input is at most 0.002, with probability at least 90 % over the draw of the 1000 "
                           "calibration inputs (calibrated on 2026-11-27).")
    assert "**Assumption:** new inputs are drawn independently" in text and "([0.02])" in text
    assert describe_guarantee(GUARANTEE, 0.3) is None  # the threshold moved since: no promise
    assert describe_guarantee(None) is None


def test_card_has_the_section_only_with_a_guarantee(tmp_path):
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(feature_size=4, num_labels=2))
    model.config.defer_threshold = 0.25
    hf_defer.hub.render_model_card(hf_defer.hub.DeferralModelCardData.from_model(model, model_name="plain"), tmp_path / "a")
    assert "What is guaranteed" not in Path(tmp_path / "a" / "README.md").read_text()
    model.config.deferral_guarantee = GUARANTEE
    hf_defer.hub.render_model_card(hf_defer.hub.DeferralModelCardData.from_model(model, model_name="sure"), tmp_path / "b")
    card = Path(tmp_path / "b" / "README.md").read_text()
    assert "### What is guaranteed" in card and "at most 10 % of the inputs go to an expert" in card
