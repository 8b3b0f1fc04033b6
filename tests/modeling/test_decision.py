"""The one decision rule, `DeferralSurrogate.decide`: defer iff max_j (a_j - c_j) - max_y p(y|x) > threshold.

With zero costs and threshold it must be the paper's logit rule (what Table 2 was computed with); the equivalence is
checked here by brute force on random logits, with the margin evaluated independently in float64 from the formulas
of DESIGN.md rather than through the surrogate's own estimators.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from hf_defer import DeferralConfig, EncoderForDeferral, deferral_metrics
from hf_defer.modeling import get_surrogate

SURROGATES = ("asm", "ssm", "sova", "aova")


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def raw_estimates(name: str, u: np.ndarray, K: int) -> tuple[np.ndarray, np.ndarray]:
    """(class estimates [N, K], expert estimates [N, M]) before clipping, straight from DESIGN.md, in float64."""
    classes, experts = u[:, :K], u[:, K:]
    M = experts.shape[1]
    if name == "asm":
        top = classes.argmax(axis=1)
        rest = np.where(np.arange(K) == top[:, None], -np.inf, classes)
        lse_rest = np.log(np.exp(rest).sum(axis=1, keepdims=True))
        softmax = np.exp(classes) / np.exp(classes).sum(axis=1, keepdims=True)
        return softmax, sigmoid(experts - lse_rest)
    if name == "ssm":
        total = np.exp(classes).sum(axis=1, keepdims=True)
        return np.exp(classes) / total, np.exp(experts) / total
    if name == "sova":
        if M == 1:
            return sigmoid(classes) * (1 + np.exp(experts)), np.exp(experts)
        mass = sigmoid(classes).sum(axis=1, keepdims=True)
        return sigmoid(classes) / mass, sigmoid(experts) / mass
    return sigmoid(classes), sigmoid(experts)


@pytest.mark.parametrize("name", SURROGATES)
@pytest.mark.parametrize("num_experts", [1, 3])
def test_zero_cost_rule_is_the_logit_rule_by_brute_force(name, num_experts):
    K, n = 3, 20000
    rng = np.random.default_rng(zlib.crc32(f"{name}{num_experts}".encode()))
    u = rng.normal(size=(n, K + num_experts)) * rng.choice([0.3, 1.0, 3.0, 8.0], size=(n, 1))
    logits = torch.tensor(u, dtype=torch.float32)
    u = logits.double().numpy()  # the float32 values, exactly
    surrogate = get_surrogate(name, K, num_experts)
    defer, prediction, expert = (t.numpy() for t in surrogate.decide(logits))

    logit_defer = u[:, K:].max(axis=1) > u[:, :K].max(axis=1)
    np.testing.assert_array_equal(defer, logit_defer)
    np.testing.assert_array_equal(prediction, u[:, :K].argmax(axis=1))
    np.testing.assert_array_equal(expert[defer], u[defer, K:].argmax(axis=1))

    # The probability rule on the raw estimates decides the same (away from float ties)...
    p, a = raw_estimates(name, u, K)
    margin = a.max(axis=1) - p.max(axis=1)
    clear = np.abs(u[:, K:].max(axis=1) - u[:, :K].max(axis=1)) > 1e-4
    np.testing.assert_array_equal((margin > 0)[clear], logit_defer[clear])
    np.testing.assert_array_equal(a.argmax(axis=1)[clear], u[clear, K:].argmax(axis=1))
    np.testing.assert_array_equal(p.argmax(axis=1), u[:, :K].argmax(axis=1))
    # ... and the surrogate's margin is that margin.
    got, got_expert = (t.numpy() for t in surrogate.deferral_margin(logits))
    moderate = u[:, K:].max(axis=1) < 15  # torch's softplus turns linear above 20 (sova: an estimate of e^20 or so)
    np.testing.assert_allclose(got[moderate], margin[moderate], rtol=1e-6, atol=1e-8)
    # The clipped estimates agree for the bounded estimators; for ssm/sova they can tie at 1 where the logits do not.
    clipped = np.minimum(a, 1).max(axis=1) > np.minimum(p, 1).max(axis=1)
    if name in ("asm", "aova"):
        np.testing.assert_array_equal(clipped[clear], logit_defer[clear])
    elif name == "sova" and num_experts == 1:
        assert (clipped != logit_defer).any()


@pytest.mark.parametrize("name", SURROGATES)
def test_margin_is_monotone_in_the_logits(name):
    # Raising the best expert's logit never lowers the margin; raising the top class logit never raises it.
    rng = np.random.default_rng(1)
    K, M = 3, 2
    surrogate = get_surrogate(name, K, M)
    logits = torch.tensor(rng.normal(size=(2000, K + M)) * 2, dtype=torch.float64).float()
    margin, expert = surrogate.deferral_margin(logits)
    up_expert = logits.clone()
    up_expert[torch.arange(len(logits)), K + expert] += 0.5
    up_class = logits.clone()
    top = logits[:, :K].argmax(dim=1)
    up_class[torch.arange(len(logits)), top] += 0.5
    assert (surrogate.deferral_margin(up_expert)[0] >= margin).all()
    assert (surrogate.deferral_margin(up_class)[0] <= margin).all()


def test_costs_and_threshold_by_hand():
    # A-OvA: the estimates are sigmoids of the logits. Classes 0.6, 0.2; experts 0.75, 0.875.
    logit = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    logits = torch.tensor([[logit(0.6), logit(0.2), logit(0.75), logit(0.875)]])
    aova = get_surrogate("aova", 2, 2)
    assert aova.decide(logits)[0].tolist() == [True] and aova.decide(logits)[2].tolist() == [1]
    margin, expert = aova.deferral_margin(logits, expert_costs=[0.0, 0.25])  # gains 0.75, 0.625
    assert margin.item() == pytest.approx(0.15) and expert.item() == 0
    defer, prediction, chosen = aova.decide(logits, expert_costs=[0.0, 0.25], defer_threshold=0.1)
    assert (defer.item(), prediction.item(), chosen.item()) == (True, 0, 0)
    assert aova.decide(logits, expert_costs=[0.0, 0.25], defer_threshold=0.2)[0].item() is False
    assert aova.decide(logits, expert_costs=[0.2, 0.3])[0].item() is False  # gains 0.55, 0.575 < 0.6
    # All-zero costs are no costs: the exact logit rule.
    for costs in ([0.0, 0.0], np.zeros(2), torch.zeros(2)):
        assert aova.check_costs(costs) is None


@pytest.mark.parametrize(
    ("costs", "error", "message"),
    [([0.1], ValueError, "one cost per expert"), ("0.1", TypeError, "sequence"),
     ([0.1, float("nan")], ValueError, "finite"), ([0.1, True], ValueError, "finite")],
)
def test_bad_costs_and_thresholds_are_refused(costs, error, message):
    aova = get_surrogate("aova", 2, 2)
    with pytest.raises(error, match=message):
        aova.decide(torch.zeros(1, 4), expert_costs=costs)
    with pytest.raises(ValueError, match="defer_threshold"):
        aova.decide(torch.zeros(1, 4), defer_threshold=float("inf"))


def test_model_output_and_metrics_decide_with_the_configs_costs_and_threshold():
    torch.manual_seed(0)
    model = EncoderForDeferral(DeferralConfig(feature_size=6, num_labels=3, num_experts=2)).eval()
    features = torch.randn(400, 6)
    rng = np.random.default_rng(0)
    labels, experts = rng.integers(0, 3, 400), rng.integers(0, 3, (400, 2))
    with torch.no_grad():
        logits = model(features=features).logits
    model.config.expert_costs, model.config.defer_threshold = [0.05, 0.0], -0.02
    with torch.no_grad():
        defer = model(features=features).defer
    expected = model.surrogate.decide(logits, [0.05, 0.0], -0.02)[0]
    assert torch.equal(defer, expected) and expected.any() and not expected.all()
    from_config = deferral_metrics(logits, labels, experts, model.config)
    from_model = deferral_metrics(logits, labels, experts, model)
    explicit = deferral_metrics(logits, labels, experts, "asm", 2, expert_costs=[0.05, 0.0], defer_threshold=-0.02)
    assert from_config == from_model == explicit
    assert from_config["coverage"] == pytest.approx(1 - expected.double().mean().item())
    # Keyword overrides win over the config's values; the positional signature still means the logit rule.
    assert deferral_metrics(logits, labels, experts, model, expert_costs=[0, 0], defer_threshold=0.0) == \
        deferral_metrics(logits, labels, experts, "asm", 2)


# ----------------------------------------------------------------------------- availability (issue 19)
def test_availability_by_hand():
    # A-OvA: the estimates are the sigmoids of the logits. Classes 0.6, 0.2; experts 0.75, 0.875.
    logit = lambda p: float(np.log(p / (1 - p)))  # noqa: E731
    row = [logit(0.6), logit(0.2), logit(0.75), logit(0.875)]
    logits = torch.tensor([row, row, row])
    aova = get_surrogate("aova", 2, 2)
    available = torch.tensor([[True, True], [True, False], [False, False]])
    defer, prediction, expert = aova.decide(logits, available=available)
    # all: expert 1 (0.875); only expert 0: 0.75 > 0.6, expert 0; nobody: the model answers class 0
    assert defer.tolist() == [True, True, False] and expert[:2].tolist() == [1, 0] and prediction.tolist() == [0] * 3
    margin, chosen = aova.deferral_margin(logits, available=available)
    np.testing.assert_allclose(margin[:2].numpy(), [0.275, 0.15], atol=1e-6)
    assert margin[2].item() == float("-inf") and chosen[:2].tolist() == [1, 0]
    # Costs and threshold, with expert 0 away: gain 0.875 - 0.25 = 0.625 beats 0.6 by 0.025 only.
    only_second = [False, True]  # one mask for every row
    assert aova.decide(logits, [0.0, 0.25], 0.0, available=only_second)[0].tolist() == [True] * 3
    assert aova.decide(logits, [0.0, 0.25], 0.1, available=only_second)[0].tolist() == [False] * 3
    assert aova.decide(logits, [0.0, 0.25], 0.1)[0].tolist() == [True] * 3  # expert 0: 0.75 - 0.6 > 0.1


@pytest.mark.parametrize("name", SURROGATES)
def test_availability_is_the_logit_rule_over_the_available_experts_by_brute_force(name):
    K, M, n = 3, 3, 4000
    rng = np.random.default_rng(SURROGATES.index(name))
    u = rng.normal(size=(n, K + M)).astype(np.float32) * 2
    available = rng.random((n, M)) < 0.5
    surrogate = get_surrogate(name, K, M)
    defer, prediction, expert = (t.numpy() for t in surrogate.decide(torch.tensor(u), available=available))
    best = np.where(available, u[:, K:], -np.inf)
    want = best.max(axis=1) > u[:, :K].max(axis=1)
    np.testing.assert_array_equal(defer, want)
    np.testing.assert_array_equal(expert[want], best[want].argmax(axis=1))
    assert available[np.arange(n)[defer], expert[defer]].all() and (~available.any(axis=1) <= ~defer).all()
    # With every expert available, the decision is the one without a mask, bit for bit.
    for mask in (np.ones((n, M), dtype=bool), [1] * M):
        got = surrogate.decide(torch.tensor(u), [0.02] * M, 0.01, available=mask)
        assert all(torch.equal(a, b) for a, b in zip(got, surrogate.decide(torch.tensor(u), [0.02] * M, 0.01)))


@pytest.mark.parametrize(
    ("available", "message"),
    [([[True, False, True]], r"available must have shape \[batch, num_experts\] = \[1, 2\]"),
     (np.ones((2, 2), dtype=bool), r"available must have shape \[batch, num_experts\] = \[1, 2\]"),
     ([0.5, 1.0], "available must hold booleans"), ([2, 0], "available must hold booleans"),
     ([["a", "b"]], "available must be a bool mask")],
)
def test_bad_availability_is_refused_naming_the_argument(available, message):
    with pytest.raises(ValueError, match=message):
        get_surrogate("asm", 2, 2).decide(torch.zeros(1, 4), available=available)
