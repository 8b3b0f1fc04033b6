"""A cascade whose stage 1 reads a cheap model expert's probabilities (`first_expert`, route-only stage 1) and whose
stage 2 stacks both models' probabilities into its answer (a stage 2 with a classifier): hand-worked decisions, calls
and payments, the confidence rule of stage 2, the save/load/pipeline round trip on raw texts, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from transformers import pipeline

import hf_defer  # noqa: F401  (registers the tasks)
from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
from research.hatespeech_cascade import _learned_cascade_curve
from hf_defer.cascade import DeferralCascade, escalation_features
from test_modeling_cascade import Recorder

PRICES = {"model": 0.0, "cheap": 1.0, "llm": 10.0, "person": 100.0}
TEXTS = ["a", "b", "c", "d"]
CHEAP = {"a": [0.9, 0.1], "b": [0.6, 0.4], "c": [0.3, 0.7], "d": [0.45, 0.55]}
LLM = {"b": [0.45, 0.55], "d": [0.6, 0.4]}
PERSON = {"b": "yes", "c": "yes", "d": "yes"}
NO_FEATURES = np.zeros((4, 0), dtype=np.float32)


def sigmoid(u: float) -> float:
    return 1.0 / (1.0 + math.exp(-u))


def stages() -> tuple[EncoderForDeferral, EncoderForDeferral]:
    """Stage 1, route-only over [cheap, llm, person] on z1 = [p_no, p_yes, max, entropy, log-odds] of the cheap model:
    u_cheap = 10 max - 8, u_llm = 0, u_person = 20 p_yes - 13, a_j = sigmoid(u_j), default the cheap model.
    "a" (max 0.9): a_cheap 0.73 > a_llm 0.5, kept; "b" (max 0.6, p_yes 0.4): 0.12, 0.5, 0.007 -> llm;
    "c" (p_yes 0.7): 0.27, 0.5, 0.73 -> person; "d" (p_yes 0.55): 0.08, 0.5, 0.12 -> llm.
    Stage 2, A-OvA with classes [no, yes] and the person on z2 = [z1 ; the llm's p_no, p_yes, max, entropy,
    log-odds]: u_no = 5 cheap_no + 3 llm_no - 4, u_yes = 5 cheap_yes + 3 llm_yes - 4, u_person = 0.2.
    "b": u = [0.35, -0.35]: stacked "no" at 0.587 (the llm alone says "yes") > a_person 0.55, kept;
    "d": u = [0.05, -0.05]: "no" at 0.512 < 0.55, the person is paid."""
    stage1 = EncoderForRouting(DeferralConfig(feature_size=5, route_only=True, num_experts=3,
                                              expert_names=["cheap", "llm", "person"], default_expert="cheap"))
    stage2 = EncoderForDeferral(DeferralConfig(feature_size=10, num_labels=2, num_experts=1, surrogate="aova",
                                               expert_names=["person"], id2label={0: "no", 1: "yes"},
                                               label2id={"no": 0, "yes": 1}))
    with torch.no_grad():
        w1 = torch.zeros(3, 5)
        w1[0, 2], w1[2, 1] = 10.0, 20.0
        stage1.head[1].weight.copy_(w1)
        stage1.head[1].bias.copy_(torch.tensor([-8.0, 0.0, -13.0]))
        w2 = torch.zeros(3, 10)
        w2[0, 0], w2[0, 5], w2[1, 1], w2[1, 6] = 5.0, 3.0, 5.0, 3.0
        stage2.head[1].weight.copy_(w2)
        stage2.head[1].bias.copy_(torch.tensor([-4.0, -4.0, 0.2]))
    return stage1, stage2


def team() -> dict[str, Recorder]:
    return {"cheap": Recorder(CHEAP), "llm": Recorder(LLM), "person": Recorder(PERSON)}


def build() -> DeferralCascade:
    return DeferralCascade(*stages(), "llm", PRICES, first_expert="cheap")


def test_hand_worked_calls_payments_and_stacked_answer() -> None:
    assert sigmoid(0.35) > sigmoid(0.2) > sigmoid(0.05)  # "b" kept, "d" escalated
    experts = team()
    outputs = build()(NO_FEATURES, experts, inputs=TEXTS)
    assert [o["experts_called"] for o in outputs] == [["cheap"], ["cheap", "llm"], ["cheap", "person"],
                                                      ["cheap", "llm", "person"]]
    assert [o["answered_by"] for o in outputs] == ["cheap", "model", "person", "person"]
    assert [o["label"] for o in outputs] == ["no", "no", "yes", "yes"]  # "b": the stacked answer, not the llm's
    assert [o["paid"] for o in outputs] == [1.0, 11.0, 101.0, 111.0]
    assert experts["cheap"].batches == [TEXTS] and experts["llm"].batches == [["b", "d"]]
    assert experts["person"].batches == [["c", "d"]]


def test_stage2_costs_and_confidence_rule() -> None:
    cascade = build()
    # a person cost of 0.1: 0.55 - 0.1 < 0.512, "d" keeps the stacked "no".
    outputs = cascade(NO_FEATURES, team(), inputs=TEXTS, stage2_costs=[0.1])
    assert [o["label"] for o in outputs][3] == "no" and outputs[3]["experts_called"] == ["cheap", "llm"]
    # the confidence rule ignores the estimates: below 0.55 ("d", 0.512) the person is paid, at 0.587 ("b") not ...
    outputs = cascade(NO_FEATURES, team(), inputs=TEXTS, stage2_costs=[0.1], stage2_min_confidence=0.55)
    assert [o["paid"] for o in outputs] == [1.0, 11.0, 101.0, 111.0]
    # ... and below 0.6 both are escalated.
    outputs = cascade(NO_FEATURES, team(), inputs=TEXTS, stage2_min_confidence=0.6)
    assert [o["answered_by"] for o in outputs] == ["cheap", "person", "person", "person"]
    for bad in (1.5, float("nan"), True):
        with pytest.raises(ValueError, match="stage2_min_confidence"):
            cascade(NO_FEATURES, team(), inputs=TEXTS, stage2_min_confidence=bad)


def test_save_load_and_pipeline_on_raw_texts(tmp_path) -> None:
    cascade = build()
    cascade.save_pretrained(tmp_path / "cascade")
    loaded = DeferralCascade.from_pretrained(tmp_path / "cascade")
    assert loaded.first_expert == "cheap" and loaded.labels == ["no", "yes"] and loaded.input_size == 0
    expected = cascade(NO_FEATURES, team(), inputs=TEXTS)
    assert loaded(NO_FEATURES, team(), inputs=TEXTS) == expected
    runner = pipeline("deferral-cascade", model=str(tmp_path / "cascade"), device="cpu", experts=team())
    assert runner(TEXTS) == expected  # no feature vectors: the texts are what the experts read
    assert runner("d") == expected[3]
    assert runner(TEXTS, stage2_min_confidence=0.6) == cascade(NO_FEATURES, team(), inputs=TEXTS,
                                                               stage2_min_confidence=0.6)
    with pytest.raises(ValueError, match="stage2_min_confidence must be a probability"):
        runner(TEXTS, stage2_min_confidence=2)
    with pytest.raises(TypeError, match="reads no feature vectors"):
        runner(TEXTS, inputs=TEXTS)


def test_bad_input() -> None:
    stage1, stage2 = stages()
    with pytest.raises(ValueError, match="needs first_expert"):
        DeferralCascade(stage1, stage2, "llm", PRICES)
    with pytest.raises(ValueError, match="default_expert is 'llm'"):
        DeferralCascade(stage1, stage2, "person", PRICES, first_expert="llm")
    with pytest.raises(ValueError, match="other than the first expert"):
        DeferralCascade(stage1, stage2, "cheap", PRICES, first_expert="cheap")
    routed = EncoderForRouting(DeferralConfig(feature_size=10, route_only=True, num_experts=2,
                                              expert_names=["llm", "person"], default_expert="llm"))
    with pytest.raises(ValueError, match="labels: neither stage has a classifier"):
        DeferralCascade(stage1, routed, "llm", PRICES, first_expert="cheap")
    assert DeferralCascade(stage1, routed, "llm", PRICES, first_expert="cheap", labels=["no", "yes"]).labels == \
        ["no", "yes"]
    with pytest.raises(ValueError, match="same K >= 2 classes"):
        DeferralCascade(stage1, stage2, "llm", PRICES, first_expert="cheap", labels=["yes", "no"])
    stacked_llm = EncoderForDeferral(DeferralConfig(feature_size=10, num_labels=2, num_experts=1,
                                                    expert_names=["llm"]))
    with pytest.raises(ValueError, match="must not include 'llm'"):
        DeferralCascade(stage1, stacked_llm, "llm", PRICES, first_expert="cheap")
    cascade = build()
    with pytest.raises(ValueError, match=r"'cheap' must return \[4, 2\] class probabilities"):
        cascade(NO_FEATURES, {**team(), "cheap": lambda texts: [[1.0]] * len(texts)}, inputs=TEXTS)
    with pytest.raises(ValueError, match=r"features must have shape \[N, 0\]"):
        cascade(np.zeros((4, 3)), team(), inputs=TEXTS)


def test_the_reports_sweep_is_the_cascades_rule() -> None:
    """`results/hatespeech_cascade.md` sweeps the cheap-first cascade with `_learned_cascade_curve` on the stages'
    estimates; here random stages run as a `DeferralCascade` must give the same error and mean price per setting."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n = 300
    stage1, stage2 = (EncoderForRouting(DeferralConfig(feature_size=5, route_only=True, num_experts=3,
                                                       expert_names=["cheap", "llm", "person"],
                                                       default_expert="cheap")),
                      EncoderForDeferral(DeferralConfig(feature_size=10, num_labels=2, num_experts=1,
                                                        expert_names=["person"])))
    torch.nn.init.normal_(stage1.head[1].weight, std=0.3)
    torch.nn.init.normal_(stage2.head[1].weight, std=1.0)
    cheap, llm = (rng.dirichlet([1.0, 1.0], n) for _ in range(2))
    truth, person = rng.integers(0, 2, n), rng.integers(0, 2, n)
    cascade = DeferralCascade(stage1, stage2, "llm", PRICES, first_expert="cheap")
    first = escalation_features(np.zeros((n, 0)), cheap)
    with torch.no_grad():
        accuracy = stage1(features=torch.as_tensor(first)).expert_accuracy.double().numpy()
        stacked = stage2(features=torch.as_tensor(escalation_features(first, llm))).class_probs.double().numpy()
    wrong = np.stack([cheap.argmax(1) != truth, stacked.argmax(1) != truth, person != truth], axis=1)
    grid = np.array([(0.0, 0.0, -0.7), (0.1, 0.3, -0.8), (-0.2, 0.05, -0.6), (0.3, -0.1, -0.9)])
    curve = _learned_cascade_curve(accuracy[:, 0], accuracy[:, 1:], -stacked.max(1), wrong, (1.0, 10.0, 100.0), grid)
    experts = {"cheap": lambda rows: cheap[rows], "llm": lambda rows: llm[rows],
               "person": lambda rows: person[rows].tolist()}
    branches: set[tuple[str, int]] = set()
    for s, (d_llm, d_person, t) in enumerate(grid):
        # the sweep's decision costs d of either sign, with d_cheap = 0; the route-only rule compares a_j - c_j with
        # the default expert's a_cheap - c_cheap, so shifting every c_j by -min(d) leaves every decision unchanged
        low = min(0.0, d_llm, d_person)
        outputs = cascade(np.zeros((n, 0)), experts, inputs=list(range(n)),
                          stage1_costs=[-low, d_llm - low, d_person - low], stage2_min_confidence=-t)
        branches |= {(o["answered_by"], len(o["experts_called"])) for o in outputs}
        error = np.mean([o["label"] != f"LABEL_{truth[i]}" for i, o in enumerate(outputs)])
        assert curve.error[s] == pytest.approx(error)
        assert curve.cost[s] == pytest.approx(np.mean([o["paid"] for o in outputs]))
    assert branches == {("cheap", 1), ("model", 2), ("person", 2), ("person", 3)}  # every path is compared
