"""Route-only models (`DeferralConfig(route_only=True)`): the loss, the decision against hand-worked cases, bad input,
saving and loading (library and remote-code mode) and the pipeline."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import pipeline

import hf_defer  # noqa: F401  (registers the pipeline and the auto classes)
from hf_defer import AutoModelForDeferral, DeferralConfig, EncoderForRouting, calibrate_deferral
from hf_defer.modeling.surrogate_routing import RouteOnlySurrogate

NAMES = ["classifier_fixed", "small_llm", "large_llm"]


def logits_of(accuracy) -> torch.Tensor:
    return torch.logit(torch.tensor(accuracy, dtype=torch.float64)).float()


def config(**kwargs) -> DeferralConfig:
    return DeferralConfig(**{"feature_size": 3, "route_only": True, "num_experts": 3, "expert_names": NAMES, **kwargs})


# ------------------------------------------------------------------ loss
def test_loss_is_the_masked_binary_log_loss_worked_by_hand():
    router = RouteOnlySurrogate(2)
    u = torch.tensor([[0.0, math.log(3.0)], [0.0, math.log(3.0)], [0.0, 0.0]])  # sigmoid: 0.5, 0.75
    targets = torch.tensor([[1.0, 0.0], [1.0, -100.0], [0.3, -100.0]])
    # row 1: -log 0.5 - log 0.25 = 3 log 2; row 2: log 2 (missing answer dropped); row 3: -(0.3 + 0.7) log 0.5 = log 2
    expected = [3 * math.log(2), math.log(2), math.log(2)]
    per_row = router(u, expert_correct=targets, reduction="none")
    assert per_row.tolist() == pytest.approx(expected, abs=1e-6)
    assert float(router(u, expert_correct=targets)) == pytest.approx(sum(expected) / 3, abs=1e-6)
    assert float(router(u, expert_correct=targets, reduction="sum")) == pytest.approx(sum(expected), abs=1e-6)


def test_loss_is_minimised_at_the_mean_target_proper_scoring():
    # targets of one input: expert 0 right 3 times in 4 (mean 0.75); expert 1 scored 0.2 and 0.6 (mean 0.4)
    targets = torch.tensor([[1.0, 0.2], [1.0, 0.6], [0.0, -100.0], [1.0, -100.0]])
    u = torch.zeros(1, 2, requires_grad=True)
    optimizer = torch.optim.LBFGS([u], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-14)

    def closure():
        optimizer.zero_grad()
        loss = RouteOnlySurrogate(2)(u.expand(4, 2), expert_correct=targets)
        loss.backward()
        return loss

    optimizer.step(closure)
    assert torch.sigmoid(u).detach()[0].tolist() == pytest.approx([0.75, 0.4], abs=1e-5)


def test_loss_and_decision_stay_finite_for_extreme_and_half_precision_logits():
    router = RouteOnlySurrogate(2)
    u = torch.tensor([[1e4, -1e4], [-1e4, 1e4]])
    loss = router(u, expert_correct=torch.tensor([[0.0, 1.0], [1.0, 1.0]]), reduction="none")
    assert torch.isfinite(loss).all() and loss[0] == pytest.approx(2e4) and loss[1] == pytest.approx(1e4)
    half = torch.tensor([[60000.0, -60000.0], [0.0, 1.0]], dtype=torch.float16, requires_grad=True)
    loss = router(half, expert_correct=torch.tensor([[1.0, 0.0], [1.0, 0.0]]))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(half.grad).all()
    assert router.decide(half, expert_costs=[0.0, 0.1])[0].tolist() == [False, True]


# ------------------------------------------------------------------ decision
ACCURACY = [[0.7, 0.8, 0.95], [0.9, 0.8, 0.99], [0.2, 0.3, 0.9]]
COSTS = [0.0, 0.05, 0.3]


def test_decision_is_argmax_of_accuracy_minus_cost_worked_by_hand():
    # gains a - c: [0.70, 0.75, 0.65] -> small LLM; [0.90, 0.75, 0.69] -> classifier; [0.20, 0.25, 0.60] -> large
    defer, chosen, _ = RouteOnlySurrogate(3).decide(logits_of(ACCURACY), expert_costs=COSTS)
    assert chosen.tolist() == [1, 0, 2] and defer.tolist() == [True, False, True]
    # without costs: the most accurate expert, the large LLM, everywhere
    assert RouteOnlySurrogate(3).decide(logits_of(ACCURACY))[1].tolist() == [2, 2, 2]


def test_threshold_availability_and_default_expert():
    router = RouteOnlySurrogate(3)
    # margins over the classifier: 0.05, -0.15, 0.40; a threshold of 0.1 keeps only the third away from it
    defer, chosen, _ = router.decide(logits_of(ACCURACY), expert_costs=COSTS, defer_threshold=0.1)
    assert defer.tolist() == [False, False, True] and chosen.tolist() == [0, 0, 2]
    margin, _ = router.deferral_margin(logits_of(ACCURACY), expert_costs=COSTS)
    assert margin.tolist() == pytest.approx([0.05, -0.15, 0.40], abs=1e-6)
    # the small LLM unavailable on row 1: the large one's 0.65 loses to the classifier's 0.70
    available = [[True, False, True], [True, True, True], [True, True, False]]
    defer, chosen, _ = router.decide(logits_of(ACCURACY), expert_costs=COSTS, available=available)
    assert chosen.tolist() == [0, 0, 1]  # row 3: only the small LLM (0.25) can be asked, and it beats 0.20
    # the default expert is the fallback: it answers even where the mask says it cannot, when nobody else can
    assert router.decide(logits_of(ACCURACY), available=[[False, False, False]] * 3)[1].tolist() == [0, 0, 0]
    # the large LLM as default: a deferral is any route away from it
    large = RouteOnlySurrogate(3, default_expert=2)
    defer, chosen, _ = large.decide(logits_of(ACCURACY), expert_costs=COSTS)
    assert chosen.tolist() == [1, 0, 2] and defer.tolist() == [True, True, False]


def test_availability_binds_the_default_expert_too():
    router = RouteOnlySurrogate(3)
    # gains a - c: [0.70, 0.75, 0.65], [0.90, 0.75, 0.69], [0.20, 0.25, 0.60]; the classifier (default) left out:
    # row 1 -> small LLM (0.75 > 0.65), row 2 -> small LLM (0.75 > 0.69) though the classifier's 0.90 is best,
    # row 3 -> large LLM; whatever the threshold (no other choice), so the margin is +inf
    without_default = [[False, True, True]] * 3
    defer, chosen, _ = router.decide(logits_of(ACCURACY), expert_costs=COSTS, defer_threshold=0.5,
                                     available=without_default)
    assert defer.tolist() == [True, True, True] and chosen.tolist() == [1, 1, 2]
    margin, _ = router.deferral_margin(logits_of(ACCURACY), expert_costs=COSTS, available=without_default)
    assert margin.tolist() == [math.inf] * 3
    # only the large LLM on row 2, only the classifier on row 3: the large LLM, then the classifier (not deferred)
    mixed = [[True, True, True], [False, False, True], [True, False, False]]
    defer, chosen, _ = router.decide(logits_of(ACCURACY), expert_costs=COSTS, available=mixed)
    assert chosen.tolist() == [1, 2, 0] and defer.tolist() == [True, True, False]


def test_pipeline_never_routes_to_an_excluded_default_expert():
    model = EncoderForRouting(config(expert_costs=COSTS, default_expert="classifier_fixed")).eval()
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].bias.copy_(logits_of(ACCURACY[1]))  # gains 0.90, 0.75, 0.69: the classifier is best
    route = pipeline("deferral", model=model)
    assert route([0.0, 0.0, 0.0])["expert"] == "classifier_fixed"
    out = route([0.0, 0.0, 0.0], available_experts=["large_llm"], return_margin=True)
    assert (out["expert"], out["defer"], out["margin"]) == ("large_llm", True, math.inf)
    assert out["estimated_accuracy"] == pytest.approx(0.99, abs=1e-6)
    assert route([0.0, 0.0, 0.0], available_experts=["small_llm", "large_llm"])["expert"] == "small_llm"
    with pytest.raises(ValueError, match="available_experts leaves no expert for this input"):
        route([0.0, 0.0, 0.0], available_experts=[])


def test_model_output_and_config_default_expert_by_name():
    model = EncoderForRouting(config(expert_costs=COSTS, default_expert="large_llm")).eval()
    assert model.config.default_expert == "large_llm" and model.surrogate.default_expert == 2
    assert model.config.num_labels == 0 and model.config.surrogate == "route_only"
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].bias.copy_(logits_of(ACCURACY[0]))
    out = model(features=torch.zeros(2, 3), expert_correct=torch.tensor([[1.0, 1.0, 0.0], [0.0, -100.0, 1.0]]))
    assert out.class_probs.shape == (2, 0)
    assert out.expert_accuracy[0].tolist() == pytest.approx(ACCURACY[0], abs=1e-6)
    assert out.defer.tolist() == [True, True]  # 0.75 (small LLM) beats the default's 0.65
    expected = -(math.log(0.7) + math.log(0.8) + math.log(0.05)) - (math.log(0.3) + math.log(0.95))
    assert out.loss.item() == pytest.approx(expected / 2, abs=1e-5)


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("targets, match", [
    ([[0.5, float("nan"), 1.0]], "expert_correct must lie in"),
    ([[0.5, 1.5, 1.0]], "expert_correct must lie in"),
    ([[0.5, -0.2, 1.0]], "expert_correct must lie in"),
    ([["yes", "no", "no"]], "expert_correct must be"),
])
def test_bad_correctness_is_refused_naming_the_argument(targets, match):
    model = EncoderForRouting(config())
    with pytest.raises(ValueError, match=match):
        model(features=torch.zeros(1, 3), expert_correct=targets)


def test_class_labels_answers_and_bad_config_are_refused():
    model = EncoderForRouting(config())
    with pytest.raises(ValueError, match="labels: a route-only model has no class head"):
        model(features=torch.zeros(1, 3), labels=torch.tensor([1]), expert_correct=torch.ones(1, 3))
    with pytest.raises(ValueError, match="expert_labels"):
        model(features=torch.zeros(1, 3), expert_labels=torch.tensor([[1, 0, 1]]))
    with pytest.raises(ValueError, match="num_labels / id2label"):
        config(num_labels=3)
    with pytest.raises(ValueError, match="num_labels / id2label"):
        config(id2label={0: "neg", 1: "pos"})
    with pytest.raises(ValueError, match="expert_costs must be finite, non-negative"):
        config(expert_costs=[0.0, -0.1, 0.2])
    with pytest.raises(ValueError, match="default_expert must be one of"):
        config(default_expert="gpt5")
    with pytest.raises(ValueError, match="num_experts must be >= 2"):
        DeferralConfig(feature_size=3, route_only=True, num_experts=1)
    with pytest.raises(ValueError, match="default_expert is for route-only"):
        DeferralConfig(feature_size=3, num_labels=2, default_expert=0)
    with pytest.raises(ValueError, match="expert_costs"):
        RouteOnlySurrogate(3).decide(logits_of(ACCURACY), expert_costs=[0.0, -1.0, 0.0])


# ------------------------------------------------------------------ saving, loading, pipeline, calibration
def test_config_round_trip_and_auto_loading(tmp_path):
    model = EncoderForRouting(config(expert_costs=COSTS, default_expert=1, defer_threshold=0.02)).eval()
    again = DeferralConfig.from_dict(model.config.to_dict())
    assert (again.route_only, again.default_expert, again.num_labels, again.expert_costs) == (True, "small_llm", 0, COSTS)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "surrogate_routing.py").exists()
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["EncoderForRouting"]
    assert saved["auto_map"]["AutoModel"] == "modeling_deferral.EncoderForRouting"  # remote code builds the router
    loaded = AutoModelForDeferral.from_pretrained(tmp_path).eval()
    assert type(loaded) is EncoderForRouting
    features = torch.randn(5, 3)
    with torch.no_grad():
        assert torch.equal(loaded(features=features).logits, model(features=features).logits)
        assert torch.equal(loaded(features=features).defer, model(features=features).defer)
    assert loaded.surrogate.default_expert == 1 and loaded.config.id2label == {}


def test_a_route_only_config_builds_an_encoder_for_routing_and_only_that():
    from transformers import AutoModel

    from hf_defer import EncoderForDeferral
    from hf_defer.modeling import DeferralPreTrainedModel

    assert issubclass(EncoderForRouting, DeferralPreTrainedModel) and issubclass(EncoderForDeferral, DeferralPreTrainedModel)
    assert not issubclass(EncoderForRouting, EncoderForDeferral)
    for build in (AutoModelForDeferral.from_config, AutoModel.from_config):
        assert type(build(config())) is EncoderForRouting
        assert type(build(DeferralConfig(feature_size=3, num_labels=2))) is EncoderForDeferral
    with pytest.raises(ValueError, match=r"config is route-only .*EncoderForRouting\(config\)"):
        EncoderForDeferral(config())
    with pytest.raises(ValueError, match="EncoderForRouting needs a route-only config .* got route_only=False"):
        EncoderForRouting(DeferralConfig(feature_size=3, num_labels=2))
    hand_edited = DeferralConfig(feature_size=3, num_labels=2, architectures=["EncoderForRouting"])
    with pytest.raises(ValueError, match="architectures names EncoderForRouting but the config is not route-only"):
        AutoModelForDeferral.from_config(hand_edited)
    # the two heads share the base's modules: a router is a deferral model with M outputs and no class outputs
    router, deferral = EncoderForRouting(config()), EncoderForDeferral(DeferralConfig(feature_size=3, num_labels=2))
    assert router.head[-1].out_features == 3 and deferral.head[-1].out_features == 2 + 1
    assert {name for name, _ in router.named_parameters()} == {name for name, _ in deferral.named_parameters()}


def test_from_encoder_pretrained_on_encoder_for_routing_builds_a_router(tmp_path):
    from tiny_bert import save_tiny_bert

    save_tiny_bert(tmp_path / "enc", "add two numbers prove".split())
    router = EncoderForRouting.from_encoder_pretrained(str(tmp_path / "enc"), num_experts=2, pooling="mean")
    assert type(router) is EncoderForRouting and router.config.route_only is True and router.config.num_labels == 0
    from hf_defer import EncoderForDeferral

    via_flag = EncoderForDeferral.from_encoder_pretrained(str(tmp_path / "enc"), route_only=True, num_experts=2)
    assert type(via_flag) is EncoderForRouting


REMOTE = """
import json, sys, torch
from transformers import AutoModel, pipeline
folder, rows = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
pipe = pipeline(model=folder, trust_remote_code=True)
out = {"defer": model(features=torch.tensor(rows)).defer.tolist(), "pipeline": pipe(rows),
       "modules": sorted(name for name in sys.modules if name.startswith("hf_defer"))}
print("RESULT" + json.dumps(out))
"""


@pytest.mark.slow  # a fresh interpreter or process: make test-slow (CI) runs it
def test_remote_code_mode_routes_as_the_library(tmp_path):
    model = EncoderForRouting(config(expert_costs=COSTS)).eval()
    model.save_pretrained(tmp_path / "saved")
    rows = torch.randn(6, 3).tolist()
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp_path / "modules"))
    run = subprocess.run([sys.executable, "-c", REMOTE, str(tmp_path / "saved"), json.dumps(rows)], cwd=tmp_path,
                         env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    remote = json.loads(run.stdout.split("RESULT", 1)[1])
    assert remote["modules"] == []
    library = pipeline("deferral", model=model)(rows)
    assert [o["expert"] for o in remote["pipeline"]] == [o["expert"] for o in library]
    with torch.no_grad():
        assert remote["defer"] == model(features=torch.tensor(rows)).defer.tolist()


def test_pipeline_names_the_chosen_expert_its_estimate_cost_and_a_model_experts_answer():
    model = EncoderForRouting(config(expert_costs=COSTS, expert_kinds=["model", "model", "person"])).eval()
    with torch.no_grad():
        model.head[-1].weight.zero_()
        model.head[-1].weight[:, 0] = torch.tensor([-1.0, -1.0, 1.0])  # feature 0 favours the large LLM
        model.head[-1].bias.copy_(logits_of(ACCURACY[0]))  # gains 0.70, 0.75, 0.65 at feature 0 = 0
    rows = [[0.0, 0.0, 0.0], [5.0, 0.0, 0.0]]  # second: gains 0.016, -0.024, 0.700: the large LLM
    pipe = pipeline("deferral", model=model, experts={"small_llm": lambda batch: ["small says hi"] * len(batch)})
    first, second = pipe(rows)
    assert (first["expert"], first["defer"], first["answered_by"], first["answer"]) == ("small_llm", True, "small_llm",
                                                                                          "small says hi")
    assert first["estimated_accuracy"] == pytest.approx(0.8, abs=1e-6) and first["cost"] == pytest.approx(0.05)
    assert (second["expert"], second["answered_by"], second["cost"]) == ("large_llm", None, pytest.approx(0.3))
    assert "answer" not in second  # a person answers later
    kept = pipeline("deferral", model=model)(rows[0], available_experts=["classifier_fixed", "large_llm"])
    assert kept["expert"] == "classifier_fixed" and not kept["defer"]  # 0.70 beats the large LLM's 0.65


def test_calibration_caps_the_share_routed_away_from_the_default():
    model = EncoderForRouting(config()).eval()
    with torch.no_grad():
        model.head[-1].weight.copy_(torch.eye(3) * 3)
        model.head[-1].bias.zero_()
    held_out = list(np.random.default_rng(0).normal(size=(40, 3)).astype("float32"))
    with torch.no_grad():
        before = int(model(features=torch.tensor(np.stack(held_out))).defer.sum())
    assert before > 10  # about two thirds of the rows have a larger logit elsewhere than for the classifier
    calibrate_deferral(model, held_out, max_deferral_rate=0.25)
    outputs = pipeline("deferral", model=model)(held_out)
    assert sum(o["defer"] for o in outputs) == 10  # floor(0.25 * 40), no two margins tied
    with pytest.raises(ValueError, match="max_error needs a model with a class head"):  # is_route_only(config)
        calibrate_deferral(model, held_out, max_error=0.1, confidence=0.9, expert_correct=np.ones((40, 3), np.float32))
