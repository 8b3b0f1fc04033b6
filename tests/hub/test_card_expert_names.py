"""The model card writes per-expert metrics under the experts' own names (issue 19, item 4)."""

from __future__ import annotations

from hf_defer.hub.model_card import DeferralModelCardData, render_model_card


def test_card_rows_and_model_index_name_the_experts(tmp_path):
    data = DeferralModelCardData(class_names=["neg", "pos"], expert_names=["Dr. Who", "gpt-4o"], input_kind="features",
                                 metrics={"eval_system_error": 0.1, "eval_expert_ece_Dr_Who": 0.05,
                                          "eval_deferral_rate_gpt_4o": 0.25, "eval_expert_ece": 0.04})
    assert set(data.metrics) == {"system_error", "expert_ece_Dr_Who", "deferral_rate_gpt_4o", "expert_ece"}
    index = data.to_dict()["model-index"][0]["results"][0]["metrics"]
    assert {entry["type"]: entry["name"] for entry in index}["expert_ece_Dr_Who"] == "Expert ECE (Dr. Who)"
    card = render_model_card(data, tmp_path).content
    assert "Expert ECE (Dr. Who)" in card and "Deferral rate (gpt-4o)" in card
    assert "expert 0" not in card and "Dr_Who)" not in card
