"""`DeferralCascade`: decisions and call accounting against hand-worked cases, the save/load round trip, bad input,
and the experiment's vectorised error-cost sweep of a learned cascade against a row-by-row count."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from hf_defer import DeferralConfig, EncoderForDeferral, EncoderForRouting
from research.hatespeech_cascade import _learned_cascade_curve
from hf_defer.cascade import DeferralCascade, escalation_features

PRICES = {"model": 1.0, "llm": 10.0, "person": 100.0}
TEXTS = ["a", "b", "c", "d"]
FEATURES = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 1, 0]], dtype=np.float32)
LLM_PROBS = {"a": [0.8, 0.2], "b": [0.1, 0.9], "d": [0.6, 0.4]}
PERSON = {"c": "yes", "d": "no"}


def build(stage2_features: int = 3 + 2 + 3) -> DeferralCascade:
    """Stage 1 (A-OvA: p_y = sigmoid(u_y), a_j = sigmoid(u_{K+j})), one logit column per feature:
    row "a" -> classifier confident in class 0 (p 0.88 > a 0.05), "b" and "d" -> the llm (a 0.95 > p 0.5), "c" -> the
    person (a 0.95). Stage 2: u_llm = 10 (max_k p_k - 0.75), u_person = 0 (a_person = 0.5), so the llm's answer is kept
    at max 0.9 (a_llm = sigmoid(1.5) = 0.82) and escalated at max 0.6 (a_llm = sigmoid(-1.5) = 0.18)."""
    config = DeferralConfig(feature_size=3, num_labels=2, num_experts=2, expert_names=["llm", "person"],
                            surrogate="aova", id2label={0: "no", 1: "yes"}, label2id={"no": 0, "yes": 1})
    stage1 = EncoderForDeferral(config)
    stage2 = EncoderForRouting(DeferralConfig(feature_size=stage2_features, route_only=True, num_experts=2,
                                              expert_names=["llm", "person"], default_expert="llm"))
    with torch.no_grad():
        stage1.head[1].weight.copy_(torch.tensor([[2.0, 0, 0], [-2, 0, 0], [-3, 3, -3], [-3, -3, 3]]))
        stage1.head[1].bias.zero_()
        stage2.head[1].weight.zero_()
        stage2.head[1].weight[0, 3 + 2] = 10.0  # the max probability's column of escalation_features
        stage2.head[1].bias.copy_(torch.tensor([-7.5, 0.0]))
    return DeferralCascade(stage1, stage2, "llm", PRICES)


class Recorder:
    """An expert that records each batch it is asked."""

    def __init__(self, answers: dict) -> None:
        self.answers, self.batches = answers, []

    def __call__(self, texts: list) -> list:
        self.batches.append(list(texts))
        return [self.answers[t] for t in texts]


def run(cascade: DeferralCascade, **kwargs) -> tuple[list[dict], Recorder, Recorder]:
    llm, person = Recorder(LLM_PROBS), Recorder(PERSON)
    return cascade(FEATURES, {"llm": llm, "person": person}, inputs=TEXTS, **kwargs), llm, person


def test_escalation_features_by_hand() -> None:
    p = [0.2, 0.8]
    row = escalation_features([[3.0]], [p])[0]
    entropy = -(0.2 * math.log(0.2) + 0.8 * math.log(0.8))
    np.testing.assert_allclose(row, [3.0, 0.2, 0.8, 0.8, entropy, math.log(4.0)], rtol=1e-6)
    saturated = escalation_features([[0.0]], [[1.0, 0.0]])[0]
    assert np.isfinite(saturated).all() and saturated[-1] == pytest.approx(12.0)
    with pytest.raises(ValueError, match="expert_probs"):
        escalation_features([[0.0]], [[0.7, 0.7]])


def test_calls_and_payments_by_hand() -> None:
    outputs, llm, person = run(build())
    assert [o["experts_called"] for o in outputs] == [[], ["llm"], ["person"], ["llm", "person"]]
    assert [o["answered_by"] for o in outputs] == ["model", "llm", "person", "person"]
    assert [o["paid"] for o in outputs] == [1.0, 11.0, 101.0, 111.0]
    assert [o["label"] for o in outputs] == ["no", "yes", "yes", "no"]
    assert llm.batches == [["b", "d"]] and person.batches == [["c", "d"]]  # each expert once, on its rows only


@pytest.mark.parametrize("answers", [["yes"], ["yes", "no", "no"], "yes"])
def test_an_expert_with_the_wrong_number_of_answers_is_named_with_the_counts(answers) -> None:
    # The person is routed rows c and d (2 inputs). One answer used to be broadcast to both, silently; three gave
    # numpy's "shape mismatch".
    llm = Recorder(LLM_PROBS)
    person = lambda texts: answers  # noqa: E731
    got = len(answers) if isinstance(answers, list) else "str"
    with pytest.raises(ValueError, match=r"expert 'person' must return one answer per input: the batch starting at "
                                         rf"row 2 has 2 inputs, the expert returned {got}\."):
        build()(FEATURES, {"llm": llm, "person": person}, inputs=TEXTS)


def test_an_answer_outside_the_labels_names_the_expert_and_the_row() -> None:
    with pytest.raises(ValueError, match=r"expert 'person' answered 'maybe' for row 3, which is not a label"):
        build()(FEATURES, {"llm": Recorder(LLM_PROBS), "person": lambda texts: ["yes", "maybe"]}, inputs=TEXTS)


def test_decision_costs_at_call_time() -> None:
    # stage 2: a person cost of 0.5 makes 0.5 - 0.5 = 0 < a_llm 0.18, so "d" keeps the llm's answer (class 0).
    outputs, _, person = run(build(), stage2_costs=[0.0, 0.5])
    assert [o["paid"] for o in outputs] == [1.0, 11.0, 101.0, 11.0]
    assert outputs[3]["label"] == "no" and person.batches == [["c"]]
    # stage 1: an llm cost of 1 makes 0.95 - 1 < p = 0.5: "b" and "d" are answered by the classifier (p = 0.5 tie ->
    # class 0), the llm is never called.
    outputs, llm, _ = run(build(), stage1_costs=[1.0, 0.0])
    assert [o["answered_by"] for o in outputs] == ["model", "model", "person", "model"] and llm.batches == []

    # a stage-1 threshold of -1 defers "a" too (margin 0.05 - 0.88 = -0.83 > -1; tie of a_llm = a_person -> the first,
    # the llm), whose max probability 0.8 gives a_llm = sigmoid(0.5) = 0.62 > 0.5: kept.
    outputs, llm, _ = run(build(), stage1_threshold=-1.0)
    assert [o["paid"] for o in outputs] == [11.0, 11.0, 101.0, 111.0] and llm.batches == [["a", "b", "d"]]
    assert outputs[0]["label"] == "no"


def test_save_load_round_trip(tmp_path) -> None:
    cascade = build()
    cascade.save_pretrained(tmp_path / "cascade")
    config = json.loads((tmp_path / "cascade" / "cascade_config.json").read_text())
    assert config["escalation_expert"] == "llm" and config["prices"] == PRICES
    assert (tmp_path / "cascade" / "config.json").is_file()  # stage 1 at the root, what pipeline() reads
    assert (tmp_path / "cascade" / "stage2" / "config.json").is_file()
    loaded = DeferralCascade.from_pretrained(tmp_path / "cascade")
    assert run(loaded)[0] == run(cascade)[0]
    assert run(loaded, stage2_costs=[0.0, 0.5])[0] == run(cascade, stage2_costs=[0.0, 0.5])[0]
    with pytest.raises(FileNotFoundError, match="cascade_config.json"):
        DeferralCascade.from_pretrained(tmp_path / "cascade" / "stage2")


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="stage2 expects 7 input features.*make 8"):
        build(stage2_features=7)
    cascade = build()
    with pytest.raises(ValueError, match="prices"):
        DeferralCascade(cascade.stage1, cascade.stage2, "llm", {**PRICES, "person": -1.0})
    with pytest.raises(ValueError, match="prices must name exactly"):
        DeferralCascade(cascade.stage1, cascade.stage2, "llm", {"model": 1.0, "llm": 10.0})
    with pytest.raises(ValueError, match="escalation_expert"):
        DeferralCascade(cascade.stage1, cascade.stage2, "robot", PRICES)
    with pytest.raises(ValueError, match="stage2_costs"):
        run(cascade, stage2_costs=[0.0, -0.5])
    with pytest.raises(ValueError, match="missing \\['person'\\]"):
        cascade(FEATURES, {"llm": Recorder(LLM_PROBS)}, inputs=TEXTS)
    with pytest.raises(ValueError, match=r"must return \[2, 2\] class probabilities"):
        cascade(FEATURES, {"llm": lambda texts: [[1.0]] * len(texts), "person": Recorder(PERSON)}, inputs=TEXTS)


def test_learned_cascade_sweep_against_row_by_row_count() -> None:
    rng = np.random.default_rng(0)
    n = 200
    top, accuracy, gain = rng.uniform(0.4, 1, n), rng.uniform(0, 1, (n, 2)), rng.uniform(-1, 1, n)
    wrong = rng.random((n, 3)) < 0.3
    grid = np.array([(a, b, t) for a in (0.0, 0.2) for b in (0.0, 0.5) for t in (-2.0, 0.0, 2.0)])
    curve = _learned_cascade_curve(top, accuracy, gain, wrong, (1.0, 10.0, 100.0), grid)
    for s, (d1, d2, t) in enumerate(grid):
        paid, errors = 0.0, 0
        for i in range(n):
            net = [accuracy[i, 0] - d1, accuracy[i, 1] - d2]
            if max(net) <= top[i]:
                paid, errors = paid + 1, errors + wrong[i, 0]
            elif net[1] > net[0]:
                paid, errors = paid + 101, errors + wrong[i, 2]
            elif gain[i] > t:
                paid, errors = paid + 111, errors + wrong[i, 2]
            else:
                paid, errors = paid + 11, errors + wrong[i, 1]
        assert curve.cost[s] == pytest.approx(paid / n) and curve.error[s] == pytest.approx(errors / n)
