"""The deferral guarantee as one type: its JSON form is the dict config.json always held, and its rule "does this call
still fall under it" is the one every surface applies (the pipeline's warning, the card's statement, calibrate's
statement, the monitor's targets) on the same records."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from transformers import pipeline

import hf_defer
from hf_defer import DeferralConfig, DeferralGuarantee, EncoderForDeferral
from hf_defer.hub.model_card import describe_guarantee
from hf_defer.monitoring import DeferralMonitor, monitor_for

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"

# What calibrate_deferral(..., confidence=0.9, max_deferral_rate={...}, expert_costs=[0.1, 0.0]) records, written out
# as config.json holds it (key order included).
RECORDED = {
    "threshold": 0.125, "confidence": 0.9, "n": 600,
    "claims": [{"kind": "deferral_rate", "expert": "alice", "target": 0.05, "bound": "binomial order statistic "
                "(exact)", "confidence": 0.95, "observed": 0.03},
               {"kind": "deferral_rate", "expert": "bob", "target": 0.1, "bound": "binomial order statistic (exact)",
                "confidence": 0.95, "observed": 0.08}],
    "assumption": "new inputs are drawn independently from the same distribution as the calibration inputs (same "
                  "experts, costs and availability)",
    "date": "2026-11-28", "expert_names": ["alice", "bob"], "expert_costs": [0.1, 0.0], "available_experts": None,
}
# The same promise kind, a total budget and an error target, certified for a restricted availability and no costs.
RESTRICTED = {
    "threshold": 0.0, "confidence": 0.8, "n": 400,
    "claims": [{"kind": "deferral_rate", "target": 0.2, "bound": "binomial order statistic (exact)",
                "confidence": 0.9, "observed": 0.15},
               {"kind": "system_error", "target": 0.3, "bound": "Learn-then-Test", "confidence": 0.9,
                "observed": 0.2, "method": "learn_then_test"}],
    "assumption": "iid", "date": "2026-11-27", "expert_names": ["alice", "bob"], "expert_costs": None,
    "available_experts": ["bob"],
}


def test_the_json_form_is_what_config_json_held():
    for record in (RECORDED, RESTRICTED):
        guarantee = DeferralGuarantee.from_dict(json.loads(json.dumps(record)))
        assert json.dumps(guarantee.to_dict()) == json.dumps(record)  # byte for byte, key order included
    certificate = {key: RECORDED[key] for key in ("threshold", "confidence", "n", "claims", "assumption")}
    assert DeferralGuarantee.from_dict(certificate).to_dict() == certificate  # what certify_threshold returns
    bound = DeferralGuarantee.from_dict(certificate).recorded(["alice", "bob"], expert_costs=[0.1, 0], date="2026-11-28")
    assert bound.to_dict() == RECORDED
    with pytest.raises(ValueError, match=r"deferral_guarantee lacks \['n'\]"):
        DeferralGuarantee.from_dict({"threshold": 0.1, "confidence": 0.9})


def test_a_config_holds_the_dict_and_reads_the_type(tmp_path):
    config = DeferralConfig(feature_size=4, num_labels=2, num_experts=2, expert_names=["alice", "bob"],
                            deferral_guarantee=DeferralGuarantee.from_dict(RECORDED))
    assert config.deferral_guarantee == RECORDED  # stored in its JSON form
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())["deferral_guarantee"]
    assert saved == RECORDED
    assert DeferralGuarantee.from_config(DeferralConfig.from_pretrained(tmp_path)) == DeferralGuarantee.from_dict(RECORDED)
    for folder in ("saved_cascade", "saved_route_only_flag/features"):  # frozen folders: no guarantee, still loads
        assert DeferralGuarantee.from_config(DeferralConfig.from_pretrained(FIXTURES / folder)) is None
    with pytest.raises(ValueError, match="deferral_guarantee lacks"):
        DeferralConfig(feature_size=4, num_labels=2, deferral_guarantee={"claims": []})


# (record, call, what the call changes: worked by hand from the two records above). A call gives the threshold, the
# costs (None: the config's, [0.1, 0.0]) and the whole-call availability (None: every expert).
CASES = [
    (RECORDED, {}, set()),
    (RECORDED, {"defer_threshold": 0.125 + 1e-13}, set()),  # the same threshold within 1e-12
    (RECORDED, {"defer_threshold": 0.25}, {"defer_threshold"}),
    (RECORDED, {"expert_costs": [0.0, 0.0]}, {"expert_costs"}),
    (RECORDED, {"available_experts": ["alice", "bob"]}, set()),
    (RECORDED, {"available_experts": ["alice"]}, {"available_experts"}),
    (RECORDED, {"defer_threshold": 0.5, "expert_costs": [0.1, 0.2]}, {"defer_threshold", "expert_costs"}),
    # no available_experts given: not checked (the pipeline cannot tell "every expert" from "not said")
    (RESTRICTED, {"defer_threshold": 0.0, "expert_costs": [0.0, 0.0]}, set()),
    (RESTRICTED, {"defer_threshold": 0.0, "expert_costs": [0.0, 0.0], "available_experts": ["alice", "bob"]},
     {"available_experts"}),
    (RESTRICTED, {"defer_threshold": 0.0, "expert_costs": [0.0, 0.0], "available_experts": ["bob"]}, set()),
    (RESTRICTED, {"expert_costs": [0.0, 0.0], "available_experts": ["bob"]}, {"defer_threshold"}),
]


def model_with(record: dict) -> EncoderForDeferral:
    model = EncoderForDeferral(DeferralConfig(feature_size=4, num_labels=2, num_experts=2, expert_names=["alice", "bob"],
                                              expert_costs=[0.1, 0.0], defer_threshold=0.125,
                                              deferral_guarantee=dict(record)))
    return model.eval()


@pytest.mark.parametrize("record, call, changed", CASES)
def test_every_surface_applies_the_one_rule(record, call, changed, tmp_path):
    model = model_with(record)
    defer = pipeline("deferral", model=model)
    features = [torch.zeros(4).numpy()] * 2
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        defer(features, **call)
    said = [str(w.message) for w in caught if "not covered by the model's deferral guarantee" in str(w.message)]
    assert len(said) == (1 if changed else 0)
    for name in changed:
        assert f"{name} " in said[0]
    guarantee = DeferralGuarantee.from_config(model.config)
    threshold = call.get("defer_threshold", model.config.defer_threshold)
    # the card and calibrate's statement: the promise in words only for the certified threshold
    statement = describe_guarantee(model.config.deferral_guarantee, threshold)
    assert (statement is None) == ("defer_threshold" in changed)
    assert describe_guarantee(guarantee, threshold) == statement
    if statement is not None:
        assert f"{100 * record['confidence']:.4g} % over the draw of the {record['n']} calibration inputs" in statement
    # the monitor watches the claims of the same record
    monitor = DeferralMonitor.from_model(model)
    assert monitor.confidence == record["confidence"]
    assert monitor.guarantee == record
    assert monitor_for(defer).guarantee == record


def test_the_card_states_the_promise_the_pipeline_honours(tmp_path):
    model = model_with(RECORDED)
    hf_defer.hub.render_model_card(hf_defer.hub.DeferralModelCardData.from_model(model, model_name="sure"), tmp_path)
    card = (tmp_path / "README.md").read_text()
    assert "at most 5 % of the inputs go to `alice`" in card and "at most 10 % of the inputs go to `bob`" in card
    assert "certified: see the guarantee below" in card
    model.config.defer_threshold = 0.3  # moved since: the card no longer promises, and the pipeline warns
    hf_defer.hub.render_model_card(hf_defer.hub.DeferralModelCardData.from_model(model, model_name="moved"),
                                   tmp_path / "moved")
    moved = (tmp_path / "moved" / "README.md").read_text()
    assert "What is guaranteed" not in moved and "certified" not in moved  # no promise claimed for another threshold
    with pytest.warns(UserWarning, match=r"defer_threshold 0\.3 \(certified: 0\.125\)"):
        pipeline("deferral", model=model)([torch.zeros(4).numpy()])
