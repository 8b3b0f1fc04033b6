"""Tests for hf_defer.modeling.surrogates.

Every expected value here is derived independently of the code under test: the naive textbook
formulas evaluated in float64 with numpy, the known minimiser of the conditional surrogate risk, or
numbers worked out by hand in comments.

Notation: logits u in R^{K+M}, classes 0..K-1, experts K..K+M-1 (0-based), c_j = [[m_j == y]],
xi(t) = log(1 + e^{-t}), sigma(t) = 1 / (1 + e^{-t}).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis_profiles import examples

from hf_defer.modeling import get_surrogate

NAMES = ("asm", "ssm", "sova", "aova")
IGNORE = -100

HYP = settings(max_examples=examples(40), suppress_health_check=[HealthCheck.too_slow])


# --------------------------------------------------------------------------------------------
# Naive float64 references (the textbook forms, deliberately *not* the numerically stable ones)
# --------------------------------------------------------------------------------------------


def _xi(t):
    return np.log(1.0 + np.exp(-t))


def _sigma(t):
    return 1.0 / (1.0 + np.exp(-t))


def _asm_expert_psi(u, K, M):
    """psi_{K+j} for every expert j, naive forms."""
    e = np.exp(u)
    if M == 1:
        # DESIGN.md: e^{u_{K+1}} / (sum_{y<=K+1} e^{u_y} - max_{y<=K} e^{u_y})
        return np.array([e[K] / (e[: K + 1].sum() - e[:K].max())])
    # e^{u_{K+j}} / (e^{u_{K+j}} + sum_{y<=K, y != y*} e^{u_y})
    ystar = int(np.argmax(u[:K]))
    rest = sum(e[k] for k in range(K) if k != ystar)
    return np.array([e[K + j] / (e[K + j] + rest) for j in range(M)])


def ref_loss(name, u, y, m, K, M):
    """Per-example loss of one row; u float64 [K+M], y int, m sequence of M ints."""
    u = np.asarray(u, dtype=np.float64)
    c = np.array([1.0 if int(mj) == int(y) else 0.0 for mj in m])
    if name == "asm":
        e = np.exp(u[:K])
        psi_y = e[y] / e.sum()
        psi_e = _asm_expert_psi(u, K, M)
        return -np.log(psi_y) - np.sum(c * np.log(psi_e) + (1 - c) * np.log(1 - psi_e))
    if name == "ssm":
        p = np.exp(u) / np.exp(u).sum()
        return -np.log(p[y]) - np.sum(c * np.log(p[K:]))
    if name == "sova":
        n = K + M

        def ell(z):
            return _xi(u[z]) + sum(_xi(-u[zp]) for zp in range(n) if zp != z)

        return ell(y) + sum(c[j] * ell(K + j) for j in range(M))
    if name == "aova":
        out = _xi(u[y]) + sum(_xi(-u[k]) for k in range(K) if k != y)
        out += np.sum(c * _xi(u[K:]) + (1 - c) * _xi(-u[K:]))
        return out
    raise AssertionError(name)


def ref_probabilities(name, u, K, M):
    """Raw (unclipped) estimator (class_probs [K], expert_accuracy [M]), naive forms."""
    u = np.asarray(u, dtype=np.float64)
    if name == "asm":
        e = np.exp(u[:K])
        return e / e.sum(), _asm_expert_psi(u, K, M)
    if name == "ssm":
        p = np.exp(u) / np.exp(u).sum()
        rest = 1.0 - p[K:].sum()
        return p[:K] / rest, p[K:] / rest
    if name == "sova":
        s = _sigma(u)
        if M == 1:
            return s[:K] / (1.0 - s[K]), np.array([np.exp(u[K])])
        tot = s[:K].sum()
        return s[:K] / tot, s[K:] / tot
    if name == "aova":
        s = _sigma(u)
        return s[:K], s[K:]
    raise AssertionError(name)


def ref_decide(u, K):
    u = np.asarray(u, dtype=np.float64)
    best_cls = u[:K].max()
    best_exp = u[K:].max()
    return bool(best_exp > best_cls), int(np.argmax(u[:K])), int(np.argmax(u[K:]))


def _random_batch(rng, K, M, B, scale=5.0, n_ignored=0):
    logits = rng.uniform(-scale, scale, size=(B, K + M)).astype(np.float32).astype(np.float64)
    labels = rng.integers(0, K, size=B)
    experts = rng.integers(0, K, size=(B, M))
    # make sure both correct and incorrect experts occur
    experts[0] = labels[0]
    if B > 1:
        experts[1] = (labels[1] + 1) % K
    if n_ignored:
        idx = rng.choice(np.arange(2, B), size=n_ignored, replace=False)
        labels[idx] = IGNORE
        experts[idx[0]] = IGNORE  # an ignored row may carry -100 expert labels too
    return logits, labels, experts


# --------------------------------------------------------------------------------------------
# Losses against the naive formulas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K", [3, 5])
@pytest.mark.parametrize("M", [1, 3])
def test_loss_matches_naive_formula(name, K, M):
    rng = np.random.default_rng(1000 * K + 10 * M + NAMES.index(name))
    B = 12
    logits, labels, experts = _random_batch(rng, K, M, B)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    assert s.name == name and s.num_classes == K and s.num_experts == M
    expected = np.array([ref_loss(name, logits[i], labels[i], experts[i], K, M) for i in range(B)])

    u = torch.tensor(logits, dtype=torch.float32)
    y = torch.tensor(labels, dtype=torch.long)
    m = torch.tensor(experts, dtype=torch.long)
    per = s.loss(u, y, m, reduction="none")
    assert tuple(per.shape) == (B,)
    np.testing.assert_allclose(per.detach().double().numpy(), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(s(u, y, m)), expected.mean(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(float(s.loss(u, y, m, reduction="mean")), expected.mean(), rtol=1e-5)
    np.testing.assert_allclose(float(s.loss(u, y, m, reduction="sum")), expected.sum(), rtol=1e-5)
    if M == 1:
        # a 1-D expert_labels tensor means the same thing as [B, 1]
        np.testing.assert_allclose(
            s.loss(u, y, m[:, 0], reduction="none").detach().double().numpy(), expected, rtol=1e-5, atol=1e-5
        )


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K,M", [(3, 1), (5, 3)])
def test_loss_ignores_padding_rows(name, K, M):
    rng = np.random.default_rng(7 + K + M + NAMES.index(name))
    B = 10
    logits, labels, experts = _random_batch(rng, K, M, B, n_ignored=3)
    valid = labels != IGNORE
    assert valid.sum() == 7
    expected = np.array(
        [ref_loss(name, logits[i], labels[i], experts[i], K, M) if valid[i] else 0.0 for i in range(B)]
    )
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(logits, dtype=torch.float32)
    y = torch.tensor(labels)
    m = torch.tensor(experts)
    per = s.loss(u, y, m, reduction="none").detach().double().numpy()
    np.testing.assert_allclose(per, expected, rtol=1e-5, atol=1e-6)
    assert np.all(per[~valid] == 0.0)
    # mean over the 7 valid rows only, not over all 10
    np.testing.assert_allclose(float(s(u, y, m)), expected[valid].sum() / 7, rtol=1e-5)
    np.testing.assert_allclose(float(s.loss(u, y, m, reduction="sum")), expected[valid].sum(), rtol=1e-5)
    # the logits of ignored rows do not matter, even when huge
    u2 = u.clone()
    u2[torch.tensor(~valid)] = 1e4
    np.testing.assert_allclose(float(s(u2, y, m)), expected[valid].sum() / 7, rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K,M", [(3, 1), (4, 2)])
def test_gradient_matches_finite_differences_of_naive_formula(name, K, M):
    rng = np.random.default_rng(99 + K + NAMES.index(name))
    B = 4
    logits, labels, experts = _random_batch(rng, K, M, B, scale=3.0)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    s(u, torch.tensor(labels), torch.tensor(experts)).backward()

    def mean_ref(x):
        return np.mean([ref_loss(name, x[i], labels[i], experts[i], K, M) for i in range(B)])

    h = 1e-6
    fd = np.zeros_like(logits)
    for i in range(B):
        for k in range(K + M):
            xp, xm = logits.copy(), logits.copy()
            xp[i, k] += h
            xm[i, k] -= h
            fd[i, k] = (mean_ref(xp) - mean_ref(xm)) / (2 * h)
    np.testing.assert_allclose(u.grad.double().numpy(), fd, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------------------------
# Estimators and decision rule against the naive formulas
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K,M", [(3, 1), (5, 3)])
def test_probabilities_and_decide_match_naive_formula(name, K, M):
    rng = np.random.default_rng(3 + 17 * K + NAMES.index(name))
    B = 16
    logits = rng.uniform(-4, 4, size=(B, K + M)).astype(np.float32).astype(np.float64)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(logits, dtype=torch.float32)
    cls_raw, exp_raw = s.probabilities(u, clip=False)
    cls, exp = s.probabilities(u)
    assert tuple(cls.shape) == (B, K) and tuple(exp.shape) == (B, M)
    for i in range(B):
        rc, re = ref_probabilities(name, logits[i], K, M)
        np.testing.assert_allclose(cls_raw[i].double().numpy(), rc, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(exp_raw[i].double().numpy(), re, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(cls[i].double().numpy(), np.clip(rc, 0, 1), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(exp[i].double().numpy(), np.clip(re, 0, 1), rtol=1e-5, atol=1e-6)
    defer, pred, expert = s.decide(u)
    assert defer.dtype == torch.bool and tuple(defer.shape) == (B,)
    for i in range(B):
        d, p, e = ref_decide(logits[i], K)
        assert (bool(defer[i]), int(pred[i]), int(expert[i])) == (d, p, e)


@pytest.mark.parametrize("name", NAMES)
def test_decide_by_hand(name):
    # K = 3, M = 2.
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u = torch.tensor(
        [
            [1.0, 2.0, 0.0, 1.5, 1.9],  # best class 2.0 > best expert 1.9 -> predict 1, no deferral
            [1.0, 2.0, 0.0, 2.5, 2.1],  # best expert 2.5 > 2.0 -> defer to expert 0
            [3.0, -1.0, 0.0, 0.0, 3.5],  # 3.5 > 3.0 -> defer to expert 1 (class prediction 0)
            [0.0, 0.5, 2.0, 2.0, 1.0],  # tie 2.0 == 2.0 -> strict '>' fails -> predict class 2
        ]
    )
    defer, pred, expert = s.decide(u)
    assert defer.tolist() == [False, True, True, False]
    assert pred.tolist() == [1, 1, 0, 2]
    assert expert.tolist()[:3] == [1, 0, 1]


@pytest.mark.parametrize("name,bounded", [("asm", True), ("ssm", False), ("sova", False), ("aova", True)])
def test_bounded_flag(name, bounded):
    assert get_surrogate(name, num_classes=3, num_experts=1).bounded is bounded


# --------------------------------------------------------------------------------------------
# Consistency: the minimiser of the conditional risk recovers (eta, a) and the Bayes decision
# --------------------------------------------------------------------------------------------


def _eta10(peak_index, peak):
    """A 10-class distribution with mass `peak` on one class and the rest spread unevenly."""
    rest = np.array([3, 1, 2, 4, 1, 2, 3, 1, 2], dtype=np.float64)
    rest = rest / rest.sum() * (1.0 - peak)
    return np.insert(rest, peak_index, peak)


# (eta, a, expected decision) with expected = ("predict", y) or ("defer", j), by Definition 1:
# defer iff max_j a_j > max_y eta_y, to argmax_j a_j, else predict argmax_y eta_y.
CONSISTENCY_CASES = [
    # max eta 0.6 > max a 0.45 -> predict class 0
    (np.array([0.6, 0.3, 0.1]), np.array([0.45, 0.3]), ("predict", 0)),
    # max a 0.8 > max eta 0.5 -> defer to expert 1
    (np.array([0.2, 0.5, 0.3]), np.array([0.35, 0.8]), ("defer", 1)),
    # max a 0.7 > max eta 0.4 -> defer to expert 0 (expert 2 at 0.55 is second best)
    (np.array([0.25, 0.35, 0.4]), np.array([0.7, 0.2, 0.55]), ("defer", 0)),
    # K = 10: max eta 0.3 (class 7) < a_0 = 0.5 -> defer to expert 0
    (_eta10(7, 0.3), np.array([0.5, 0.2]), ("defer", 0)),
    # K = 10: max eta 0.55 (class 2) > max a 0.45 -> predict class 2
    (_eta10(2, 0.55), np.array([0.3, 0.45, 0.1]), ("predict", 2)),
]


def _enumerated_batch(eta, a):
    """All outcomes (y, correctness pattern of the M experts) with their probabilities."""
    K, M = len(eta), len(a)
    labels, experts, weights = [], [], []
    for y in range(K):
        for pattern in itertools.product([0, 1], repeat=M):
            labels.append(y)
            experts.append([y if cj else (y + 1) % K for cj in pattern])
            weights.append(eta[y] * np.prod([a[j] if cj else 1.0 - a[j] for j, cj in enumerate(pattern)]))
    return (
        torch.tensor(labels, dtype=torch.long),
        torch.tensor(experts, dtype=torch.long),
        torch.tensor(weights, dtype=torch.float64),
    )


def _minimise_conditional_risk(s, eta, a):
    labels, experts, weights = _enumerated_batch(eta, a)
    assert abs(float(weights.sum()) - 1.0) < 1e-12
    K, M = len(eta), len(a)
    u = torch.zeros(K + M, dtype=torch.float64, requires_grad=True)

    def risk():
        per = s.loss(u.unsqueeze(0).expand(len(labels), -1), labels, experts, reduction="none")
        return (per.to(torch.float64) * weights).sum()

    for _ in range(4):  # a few restarts refresh the L-BFGS history
        opt = torch.optim.LBFGS(
            [u], lr=1.0, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-14,
            history_size=50, line_search_fn="strong_wolfe",
        )

        def closure():
            opt.zero_grad()
            r = risk()
            r.backward()
            return r

        opt.step(closure)
    return u.detach()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", range(len(CONSISTENCY_CASES)))
def test_conditional_risk_minimiser_recovers_eta_a_and_bayes_rule(name, case):
    eta, a, (kind, index) = CONSISTENCY_CASES[case]
    assert abs(eta.sum() - 1.0) < 1e-12 and eta.min() > 0 and 0 < a.min() and a.max() < 1
    K, M = len(eta), len(a)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = _minimise_conditional_risk(s, eta, a)
    assert torch.isfinite(u).all()
    cls, exp = s.probabilities(u.unsqueeze(0))
    np.testing.assert_allclose(cls[0].double().numpy(), eta, atol=1e-3)
    np.testing.assert_allclose(exp[0].double().numpy(), a, atol=1e-3)
    defer, pred, expert = s.decide(u.unsqueeze(0))
    if kind == "defer":
        assert bool(defer[0]) and int(expert[0]) == index
    else:
        assert not bool(defer[0]) and int(pred[0]) == index
    # the classifier part is Bayes optimal in either case
    assert int(pred[0]) == int(np.argmax(eta))


# --------------------------------------------------------------------------------------------
# Theorem 1: the symmetric estimators are unbounded; the asymmetric one is not
# --------------------------------------------------------------------------------------------


def test_ssm_expert_estimate_unbounded_and_clipped():
    # K = 3, M = 1, u = (0, 0, 0, 3): softmax(u)_{K+1} = e^3 / (3 + e^3) = 0.870 > 1/2, and the
    # estimate p_{K+1} / (1 - p_{K+1}) = e^3 / 3 = 6.695 > 1.
    s = get_surrogate("ssm", num_classes=3, num_experts=1)
    u = torch.tensor([[0.0, 0.0, 0.0, 3.0]])
    _, raw = s.probabilities(u, clip=False)
    assert float(raw[0, 0]) == pytest.approx(math.exp(3) / 3, rel=1e-5)
    _, clipped = s.probabilities(u, clip=True)
    assert float(clipped[0, 0]) == 1.0
    _, default = s.probabilities(u)
    assert float(default[0, 0]) == 1.0


def test_ssm_multi_expert_estimate_unbounded():
    # K = 3, M = 2, u = (0, 0, 0, 2, 1): expert 0 estimate exp(2 - log 3) = e^2 / 3 = 2.463,
    # expert 1: e / 3 = 0.906 (stays below 1, untouched by clipping).
    s = get_surrogate("ssm", num_classes=3, num_experts=2)
    u = torch.tensor([[0.0, 0.0, 0.0, 2.0, 1.0]])
    _, raw = s.probabilities(u, clip=False)
    np.testing.assert_allclose(raw[0].double().numpy(), [math.exp(2) / 3, math.e / 3], rtol=1e-5)
    _, clipped = s.probabilities(u)
    np.testing.assert_allclose(clipped[0].double().numpy(), [1.0, math.e / 3], rtol=1e-5)


def test_sova_estimates_unbounded_and_clipped():
    # K = 2, M = 1, u = (3, -1, 2): expert estimate e^2 = 7.389 > 1; class-0 estimate
    # sigma(3) / (1 - sigma(2)) = 0.952574 / 0.119203 = 7.991 > 1.
    s = get_surrogate("sova", num_classes=2, num_experts=1)
    u = torch.tensor([[3.0, -1.0, 2.0]])
    cls_raw, exp_raw = s.probabilities(u, clip=False)
    assert float(exp_raw[0, 0]) == pytest.approx(math.exp(2), rel=1e-5)
    sig = lambda t: 1 / (1 + math.exp(-t))  # noqa: E731
    assert float(cls_raw[0, 0]) == pytest.approx(sig(3) / (1 - sig(2)), rel=1e-5)
    assert float(cls_raw[0, 0]) > 1
    # class 1: sigma(-1) / (1 - sigma(2)) = 0.268941 / 0.119203 = 2.256 > 1 too
    assert float(cls_raw[0, 1]) == pytest.approx(sig(-1) / (1 - sig(2)), rel=1e-5)
    cls, exp = s.probabilities(u)
    assert float(exp[0, 0]) == 1.0
    assert cls[0].tolist() == [1.0, 1.0]


def test_sova_multi_expert_estimate_unbounded():
    # K = 3, M = 2, u = (-2, -2, -2, 2, -3): sum of class sigmas = 3 sigma(-2) = 0.357608;
    # expert 0: sigma(2) / 0.357608 = 0.880797 / 0.357608 = 2.463 > 1;
    # expert 1: sigma(-3) / 0.357608 = 0.0474259 / 0.357608 = 0.13262.
    s = get_surrogate("sova", num_classes=3, num_experts=2)
    u = torch.tensor([[-2.0, -2.0, -2.0, 2.0, -3.0]])
    _, raw = s.probabilities(u, clip=False)
    np.testing.assert_allclose(raw[0].double().numpy(), [2.46303, 0.132619], rtol=1e-4)
    _, clipped = s.probabilities(u)
    np.testing.assert_allclose(clipped[0].double().numpy(), [1.0, 0.132619], rtol=1e-4)


logit_values = st.floats(min_value=-1e4, max_value=1e4, allow_nan=False, allow_infinity=False)


@st.composite
def logit_rows(draw, low=-1e4, high=1e4, max_k=6, max_m=3, min_rows=1, max_rows=5):
    K = draw(st.integers(2, max_k))
    M = draw(st.integers(1, max_m))
    B = draw(st.integers(min_rows, max_rows))
    vals = st.floats(min_value=low, max_value=high, allow_nan=False, allow_infinity=False, width=32)
    rows = draw(st.lists(st.lists(vals, min_size=K + M, max_size=K + M), min_size=B, max_size=B))
    return K, M, np.array(rows, dtype=np.float64)


@HYP
@given(logit_rows())
def test_asm_estimate_always_bounded(data):
    K, M, rows = data
    s = get_surrogate("asm", num_classes=K, num_experts=M)
    cls, exp = s.probabilities(torch.tensor(rows, dtype=torch.float32), clip=False)
    assert torch.isfinite(cls).all() and torch.isfinite(exp).all()
    assert (cls >= 0).all() and (cls <= 1).all()
    assert (exp >= 0).all() and (exp <= 1).all()
    np.testing.assert_allclose(cls.double().sum(-1).numpy(), 1.0, atol=1e-5)


@HYP
@given(logit_rows(), st.sampled_from(NAMES))
def test_clipped_estimates_in_unit_interval(data, name):
    K, M, rows = data
    s = get_surrogate(name, num_classes=K, num_experts=M)
    cls, exp = s.probabilities(torch.tensor(rows, dtype=torch.float32))
    assert torch.isfinite(cls).all() and torch.isfinite(exp).all()
    assert (cls >= 0).all() and (cls <= 1).all() and (exp >= 0).all() and (exp <= 1).all()


# --------------------------------------------------------------------------------------------
# Maxima preservation and decision rule (hypothesis)
# --------------------------------------------------------------------------------------------


@HYP
@given(logit_rows(low=-5, high=5, max_rows=1), st.sampled_from(["asm", "aova"]))
def test_maxima_preserving(data, name):
    K, M, rows = data
    u = rows[0]
    top2 = np.sort(u)[-2:]
    # a unique max by a margin; within |u| <= 5 the float32 estimates stay distinguishable
    assume(top2[1] - top2[0] > 0.05)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    t = torch.tensor(rows, dtype=torch.float32)
    cls, exp = s.probabilities(t)
    if name == "asm":
        assert (cls >= 0).all() and abs(float(cls.double().sum()) - 1.0) < 1e-5
    assert (exp >= 0).all() and (exp <= 1).all()
    joint = torch.cat([cls, exp], dim=-1)[0].double().numpy()
    assert int(np.argmax(joint)) == int(np.argmax(u))
    defer, pred, expert = s.decide(t)
    best = int(np.argmax(u))
    assert bool(defer[0]) == (best >= K)
    assert int(pred[0]) == int(np.argmax(u[:K]))
    assert int(expert[0]) == int(np.argmax(u[K:]))


@HYP
@given(logit_rows(), st.sampled_from(NAMES))
def test_decide_agrees_with_argmax_rule(data, name):
    K, M, rows = data
    s = get_surrogate(name, num_classes=K, num_experts=M)
    defer, pred, expert = s.decide(torch.tensor(rows, dtype=torch.float32))
    for i, u in enumerate(rows):
        d, p, e = ref_decide(u, K)
        assert bool(defer[i]) == d  # well defined even with ties (strict '>')
        # which index an argmax tie resolves to is not specified: check only untied parts
        if len(set(u[:K].tolist())) == K:
            assert int(pred[i]) == p
        if len(set(u[K:].tolist())) == M:
            assert int(expert[i]) == e


# --------------------------------------------------------------------------------------------
# Numerical robustness: huge logits and half precision
# --------------------------------------------------------------------------------------------


@st.composite
def loss_inputs(draw, low=-1e4, high=1e4):
    K, M, rows = draw(logit_rows(low=low, high=high))
    B = rows.shape[0]
    labels = draw(st.lists(st.integers(0, K - 1), min_size=B, max_size=B))
    experts = draw(st.lists(st.lists(st.integers(0, K - 1), min_size=M, max_size=M), min_size=B, max_size=B))
    return K, M, rows, np.array(labels), np.array(experts)


@HYP
@given(loss_inputs(), st.sampled_from(NAMES))
def test_loss_and_grad_finite_for_huge_logits(data, name):
    K, M, rows, labels, experts = data
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(rows, dtype=torch.float32, requires_grad=True)
    loss = s(u, torch.tensor(labels), torch.tensor(experts))
    assert loss.dim() == 0 and torch.isfinite(loss) and float(loss.detach()) >= 0
    loss.backward()
    assert u.grad is not None and torch.isfinite(u.grad).all()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_extreme_and_half_precision_loss_and_grad(name, dtype):
    K, M = 3, 2
    s = get_surrogate(name, num_classes=K, num_experts=M)
    rows = [
        [1e4, -1e4, 0.0, 1e4, -1e4],
        [-1e4, -1e4, -1e4, 1e4, 1e4],
        [0.5, -0.25, 2.0, 1.0, -3.0],
        [-1e4, 1e4, 1e4, -1e4, 0.0],
    ]
    u = torch.tensor(rows, dtype=dtype, requires_grad=True)
    y = torch.tensor([1, 0, 2, 1])
    m = torch.tensor([[1, 0], [0, 0], [1, 2], [2, 1]])
    loss = s(u, y, m)
    assert torch.isfinite(loss)
    loss.backward()
    assert u.grad.dtype == dtype and torch.isfinite(u.grad).all()
    # the moderate row matches the float64 reference (half-precision inputs, float32 compute)
    per = s.loss(u.detach(), y, m, reduction="none")
    ref = ref_loss(name, u.detach()[2].double().numpy(), 2, [1, 2], K, M)
    assert float(per[2]) == pytest.approx(ref, rel=1e-2)


@HYP
@given(loss_inputs(), st.sampled_from(NAMES), st.sampled_from([torch.float16, torch.bfloat16]))
def test_half_precision_property(data, name, dtype):
    K, M, rows, labels, experts = data
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(rows, dtype=dtype, requires_grad=True)
    loss = s(u, torch.tensor(labels), torch.tensor(experts))
    assert torch.isfinite(loss)
    loss.backward()
    assert u.grad.dtype == dtype and torch.isfinite(u.grad).all()


# --------------------------------------------------------------------------------------------
# Input validation
# --------------------------------------------------------------------------------------------


def _good(K=3, M=2, B=4):
    u = torch.zeros(B, K + M)
    y = torch.tensor([0, 1, 2, 0])[:B]
    m = torch.tensor([[0, 1], [1, 1], [2, 0], [1, 2]])[:B]
    return u, y, m


def test_valid_inputs_do_not_raise():
    s = get_surrogate("asm", num_classes=3, num_experts=2)
    u, y, m = _good()
    assert torch.isfinite(s(u, y, m))


@pytest.mark.parametrize("K", [1, 0])
@pytest.mark.parametrize("name", NAMES)
def test_rejects_too_few_classes(name, K):
    with pytest.raises(ValueError, match="num_classes"):
        get_surrogate(name, num_classes=K, num_experts=1)


def test_rejects_unknown_surrogate_name():
    with pytest.raises(ValueError) as info:
        get_surrogate("softmax", num_classes=3, num_experts=1)
    msg = str(info.value)
    assert "softmax" in msg and "asm" in msg  # says what came and what was expected


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("shape", [(4, 4), (5,), (4, 1, 5)], ids=["width K+M-1", "1-d", "3-d"])
def test_rejects_logits_of_wrong_shape(name, shape):
    s = get_surrogate(name, num_classes=3, num_experts=2)  # expects [B, K + M] = [B, 5]
    _, y, m = _good()
    bad = torch.zeros(shape)
    for call in (lambda: s(bad, y, m), lambda: s.probabilities(bad), lambda: s.decide(bad)):
        with pytest.raises(ValueError, match="logits"):
            call()


@pytest.mark.parametrize("name", NAMES)
def test_rejects_nan_logits(name):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, m = _good()
    u[1, 3] = float("nan")
    with pytest.raises(ValueError, match="logits"):
        s(u, y, m)
    with pytest.raises(ValueError, match="logits"):
        s.loss(u, y, m, reduction="none")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad_label", [3, -1, 7])
def test_rejects_labels_out_of_range(name, bad_label):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, m = _good()
    y[2] = bad_label
    with pytest.raises(ValueError, match="labels"):
        s(u, y, m)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("bad", [3, -1])
def test_rejects_expert_labels_out_of_range(name, bad):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, m = _good()
    m[1, 1] = bad
    with pytest.raises(ValueError, match="expert_labels"):
        s(u, y, m)


@pytest.mark.parametrize("name", NAMES)
def test_missing_expert_label_on_valid_row_masks_that_expert_only(name):
    # Issue 19: -100 on a counted row is a missing answer (that expert's terms leave the row), no longer an error;
    # tests/modeling/test_sparse_targets.py checks the masked values against brute force. Out-of-range answers stay
    # errors, and -100 on an ignored row is fine as before.
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, m = _good()
    m[0, 0] = IGNORE  # labels[0] = 0 is valid
    masked = s.loss(u, y, m, reduction="none")
    assert torch.isfinite(masked).all() and not torch.equal(masked[0], s.loss(u, y, _good()[2], reduction="none")[0])
    m[0, 0] = -5
    with pytest.raises(ValueError, match="expert_labels"):
        s(u, y, m)
    m[0, 0], y[0] = IGNORE, IGNORE
    assert torch.isfinite(s(u, y, m))


@pytest.mark.parametrize("name", NAMES)
def test_rejects_wrong_number_of_expert_columns(name):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, _ = _good()
    with pytest.raises(ValueError, match="expert_labels"):
        s(u, y, torch.zeros(4, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="expert_labels"):
        s(u, y, torch.zeros(4, 1, dtype=torch.long))
    s1 = get_surrogate(name, num_classes=3, num_experts=1)
    with pytest.raises(ValueError, match="expert_labels"):
        s1(torch.zeros(4, 4), y, torch.zeros(4, 2, dtype=torch.long))


def test_each_surrogate_class_carries_its_names_and_the_one_list_is_shared():
    from hf_defer.modeling.configuration_deferral import SURROGATE_NAMES
    from hf_defer.hub.model_card import surrogate_description
    from hf_defer.modeling.surrogates import SURROGATES, surrogate_class

    assert SURROGATES == ("asm", "ssm", "sova", "aova") and SURROGATE_NAMES is SURROGATES
    assert [surrogate_class(name).display_name for name in SURROGATES] == ["A-SM", "S-SM", "S-OvA", "A-OvA"]
    assert [get_surrogate(name, 3).display_name for name in SURROGATES] == ["A-SM", "S-SM", "S-OvA", "A-OvA"]
    for name in SURROGATES:
        cls = surrogate_class(name)
        assert type(get_surrogate(name, 3)) is cls and cls.citation and cls.description
    assert surrogate_description("ssm") == ("softmax cross-entropy over classes and experts (Mozannar & Sontag, 2020): "
                                            "consistent, with an unbounded expert-accuracy estimator")
    with pytest.raises(ValueError, match="surrogate must be one of"):
        surrogate_class("focal")


# --------------------------------------------------------------------------------------------
# The kernels: hand-written gradients, unchecked entry point, torch.compile
# --------------------------------------------------------------------------------------------


def _autograd_reference(name, u, labels, experts, K, M):
    """Per-example loss by float64 autograd over the textbook formulas (masked log-sum-exp for A-SM)."""
    c = (experts == labels[:, None]).double()
    w = torch.cat([torch.nn.functional.one_hot(labels, K).double(), c], dim=1)
    sp = torch.nn.functional.softplus
    if name == "asm":
        classes = u[:, :K]
        top = torch.nn.functional.one_hot(classes.argmax(dim=1), K).bool()
        rest = torch.logsumexp(classes.masked_fill(top, float("-inf")), dim=1, keepdim=True)
        z = u[:, K:] - rest
        return -torch.log_softmax(classes, 1).gather(1, labels[:, None])[:, 0] + (c * sp(-z) + (1 - c) * sp(z)).sum(1)
    if name == "ssm":
        return -(w * torch.log_softmax(u, 1)).sum(1)
    if name == "sova":
        total = 1 + c.sum(1, keepdim=True)
        return (w * sp(-u) + (total - w) * sp(u)).sum(1)
    return (w * sp(-u) + (1 - w) * sp(u)).sum(1)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K,M", [(2, 1), (5, 1), (4, 3)])
def test_kernel_gradient_matches_float64_autograd_for_any_output_weights(name, K, M):
    # reduction="none" with random weights per row exercises the backward's scaling by grad_output row by row
    rng = np.random.default_rng(5 * K + M + NAMES.index(name))
    B = 64
    logits, labels, experts = _random_batch(rng, K, M, B, scale=8.0, n_ignored=5)
    logits[10, :K] = logits[10, 0]  # a tie for the top class
    weights = torch.tensor(rng.uniform(0.1, 2.0, size=B))
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    per = s.loss(u, torch.tensor(labels), torch.tensor(experts), reduction="none")
    (per.double() * weights).sum().backward()

    valid = torch.tensor(labels != IGNORE)
    ref_u = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    safe_labels = torch.where(valid, torch.tensor(labels), 0)
    ref = _autograd_reference(name, ref_u, safe_labels, torch.tensor(experts), K, M)
    (torch.where(valid, ref, 0.0) * weights).sum().backward()
    np.testing.assert_allclose(per.detach().double().numpy(), torch.where(valid, ref, 0.0).detach().numpy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u.grad.double().numpy(), ref_u.grad.numpy(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unchecked_loss_is_the_checked_loss(name, reduction):
    rng = np.random.default_rng(11 + NAMES.index(name))
    logits, labels, experts = _random_batch(rng, 4, 2, 20, n_ignored=4)
    s = get_surrogate(name, num_classes=4, num_experts=2)
    results = []
    for check in (True, False):
        u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
        loss = s.loss(u, torch.tensor(labels), torch.tensor(experts), reduction=reduction, check=check)
        loss.sum().backward()
        results.append((loss.detach(), u.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])


@pytest.mark.parametrize("name", NAMES)
def test_unchecked_loss_skips_only_the_value_checks(name):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y, m = _good()
    u[1, 3] = float("nan")
    assert torch.isnan(s(u, y, m, check=False))  # no pass over the values, no device sync: NaN goes through
    # shapes and dtypes are metadata: still checked, with the same messages
    with pytest.raises(ValueError, match="logits"):
        s(torch.zeros(4, 4), y, m, check=False)
    with pytest.raises(ValueError, match="expert_labels"):
        s(torch.zeros(4, 5), y, torch.zeros(4, 3, dtype=torch.long), check=False)
    with pytest.raises(ValueError, match="labels must be integers"):
        s(torch.zeros(4, 5), y.float(), m, check=False)


@pytest.mark.parametrize("name", NAMES)
def test_unchecked_loss_compiles_without_graph_break(name):
    # fullgraph=True raises on any graph break; aot_eager traces the hand-written backward too, without the
    # minutes a C++ compilation takes (the inductor build is in the slow test below)
    s = get_surrogate(name, num_classes=4, num_experts=2)
    rng = np.random.default_rng(2)
    logits, labels, experts = _random_batch(rng, 4, 2, 8, n_ignored=2)
    compiled = torch.compile(lambda u, y, m: s(u, y, m, check=False), fullgraph=True, backend="aot_eager")
    u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    compiled(u, torch.tensor(labels), torch.tensor(experts)).backward()
    expected = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    s(expected, torch.tensor(labels), torch.tensor(experts)).backward()
    torch.testing.assert_close(u.grad, expected.grad)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_unchecked_loss_compiles_with_inductor(name):
    s = get_surrogate(name, num_classes=5, num_experts=2)
    rng = np.random.default_rng(3)
    logits, labels, experts = _random_batch(rng, 5, 2, 32, n_ignored=3)
    compiled = torch.compile(lambda u, y, m: s(u, y, m, check=False), fullgraph=True)
    u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    loss = compiled(u, torch.tensor(labels), torch.tensor(experts))
    loss.backward()
    expected_u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    expected = s(expected_u, torch.tensor(labels), torch.tensor(experts))
    expected.backward()
    torch.testing.assert_close(loss.detach(), expected.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(u.grad, expected_u.grad, rtol=1e-5, atol=1e-6)


# issue 11: logits too large for float32 arithmetic, numpy integer sizes
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_logits_near_float32_max_are_refused_not_a_nan_loss(name):
    """(3e38, 3e38, -3e38) used to give a NaN A-SM loss (3e38 - (-3e38) overflows) without an error."""
    s = get_surrogate(name, num_classes=2)
    u = torch.tensor([[3e38, 3e38, -3e38], [0.0, 1.0, 2.0]])
    with pytest.raises(ValueError, match=r"logits must lie within \+-1e\+30 .* got 3e\+38 in 1 of 2 rows"):
        s(u, torch.tensor([0, 1]), torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="logits must lie within"):
        s.decide(u)
    with pytest.raises(ValueError, match="logits must be finite"):
        s.probabilities(torch.tensor([[float("inf"), 0.0, 0.0]]))


@pytest.mark.parametrize("name", NAMES)
def test_loss_and_gradient_finite_at_the_largest_accepted_logits(name):
    K, M = 3, 2
    s = get_surrogate(name, num_classes=K, num_experts=M)
    signs = torch.tensor(list(itertools.product([1.0, -1.0, 0.0], repeat=K + M)))
    u = (signs * 1e30).requires_grad_()
    y = torch.arange(u.shape[0]) % K
    m = torch.stack([y, (y + 1) % K], dim=1)
    loss = s(u, y, m)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(u.grad).all()


def test_numpy_integer_sizes_are_accepted():
    s = get_surrogate("asm", num_classes=np.int64(3), num_experts=np.int32(2))
    assert (s.num_classes, s.num_experts) == (3, 2) and type(s.num_classes) is int
    with pytest.raises(ValueError, match="num_classes"):
        get_surrogate("asm", num_classes=np.float64(3.0))


@pytest.mark.parametrize("name", NAMES)
def test_a_batch_with_every_answer_skips_the_mask_and_gets_the_masked_result(name, monkeypatch):
    """The unmasked path (no `observed` tensor) is the masked one with o = 1: loss and gradient agree; a batch with one
    missing answer still gets the mask."""
    K, M = 3, 2
    s = get_surrogate(name, num_classes=K, num_experts=M)
    generator = torch.Generator().manual_seed(0)
    u = torch.randn(64, K + M, generator=generator) * 4
    y = torch.randint(0, K, (64,), generator=generator)
    m = torch.randint(0, K, (64, M), generator=generator)
    seen = []
    kernel = s._per_example_loss
    monkeypatch.setattr(s, "_per_example_loss", lambda *args: seen.append(args[3]) or kernel(*args))
    results = []
    for observed in (None, torch.ones(64, M)):
        v = u.clone().requires_grad_()
        correct = (m == y[:, None]).float()
        loss = kernel(v, y, correct, observed, torch.full((64,), 1 / 64)).sum()
        loss.backward()
        results.append((loss.detach(), v.grad))
    torch.testing.assert_close(results[0], results[1])
    s(u, y, m, check=False)
    holed = m.clone()
    holed[5, 1] = -100
    s(u, y, holed, check=False)
    assert seen[0] is None and seen[1] is not None and seen[1][5, 1] == 0 and seen[1].sum() == 64 * M - 1


@pytest.mark.parametrize("narrow_width", [0, 64])
@pytest.mark.parametrize("K,M", [(3, 1), (4, 3), (9, 2)])
def test_asm_both_layouts_match_float64_autograd(K, M, narrow_width, monkeypatch):
    """A-SM computes narrow logits on CPU one example per column (transposed) and wide ones one per row: forcing each
    layout (the threshold at 0: always rows; at 64: always columns), loss and gradient match the float64 autograd of the
    textbook formula, with a tie for the top class, missing answers on counted rows, a row far past exp's range and
    ignored rows."""
    from hf_defer.modeling import surrogates as surrogate_kernels

    monkeypatch.setattr(surrogate_kernels, "_NARROW_WIDTH", narrow_width)
    monkeypatch.setattr(surrogate_kernels, "_NARROW_MIN_BATCH", 1)
    rng = np.random.default_rng(7 * K + M)
    B = 48
    logits, labels, experts = _random_batch(rng, K, M, B, scale=8.0, n_ignored=4)
    logits[10, :K] = logits[10, 0]  # a tie for the top class
    logits[11, :K] = [300.0] + [-300.0] * (K - 1)  # the other classes 600 below the top: exp(-600) underflows
    logits[11, K:] = 50.0
    experts[12, 0] = IGNORE  # a counted row where expert 0 did not answer
    experts[13, :] = IGNORE  # ... and one where none did
    s = get_surrogate("asm", num_classes=K, num_experts=M)
    u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
    weights = torch.tensor(rng.uniform(0.1, 2.0, size=B))
    per = s.loss(u, torch.tensor(labels), torch.tensor(experts), reduction="none", check=False)
    (per.double() * weights).sum().backward()

    valid = torch.tensor(labels != IGNORE)
    answered = torch.tensor(experts != IGNORE).double()
    ref_u = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    safe = torch.where(valid, torch.tensor(labels), 0)
    classes = ref_u[:, :K]
    top = torch.nn.functional.one_hot(classes.argmax(dim=1), K).bool()
    z = ref_u[:, K:] - torch.logsumexp(classes.masked_fill(top, float("-inf")), dim=1, keepdim=True)
    c = (torch.tensor(experts) == safe[:, None]).double()
    sp = torch.nn.functional.softplus
    ref = -torch.log_softmax(classes, 1).gather(1, safe[:, None])[:, 0] + (answered * (c * sp(-z) + (1 - c) * sp(z))).sum(1)
    ref = torch.where(valid, ref, 0.0)
    (ref * weights).sum().backward()
    np.testing.assert_allclose(per.detach().double().numpy(), ref.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(u.grad.double().numpy(), ref_u.grad.numpy(), rtol=1e-4, atol=1e-6)
    assert u.grad.is_contiguous()  # written back in the logits' layout whichever layout computed it


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_asm_column_layout_finite_for_extreme_and_half_precision_logits(dtype, monkeypatch):
    """The column layout (forced on a small batch) keeps the loss and gradient finite where the gaps between logits
    reach 2e4 and in half precision, and gives the row layout's values."""
    from hf_defer.modeling import surrogates as surrogate_kernels

    rows = [[1e4, -1e4, 0.0, 1e4, -1e4], [-1e4, -1e4, -1e4, 1e4, 1e4], [0.5, -0.25, 2.0, 1.0, -3.0],
            [-1e4, 1e4, 1e4, -1e4, 0.0]]
    y, m = torch.tensor([1, 0, 2, 1]), torch.tensor([[1, 0], [0, 0], [1, 2], [2, -100]])
    s = get_surrogate("asm", num_classes=3, num_experts=2)
    results = []
    for narrow_width in (0, 64):  # rows, then columns
        monkeypatch.setattr(surrogate_kernels, "_NARROW_WIDTH", narrow_width)
        monkeypatch.setattr(surrogate_kernels, "_NARROW_MIN_BATCH", 1)
        u = torch.tensor(rows, dtype=dtype, requires_grad=True)
        loss = s(u, y, m, check=False)
        loss.backward()
        assert torch.isfinite(loss) and u.grad.dtype == dtype and torch.isfinite(u.grad).all()
        results.append((loss.detach(), u.grad))
    torch.testing.assert_close(results[0], results[1])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("narrow_width", [0, 64])
def test_reduced_loss_is_the_sum_of_the_weighted_per_example_losses(name, narrow_width, monkeypatch):
    """With "mean" and "sum" the kernel sums the weighted losses itself (a dot product, no separate sum): the loss and
    its gradient are the per-example ones summed (divided by the counted rows for "mean"), with ignored rows and a
    missing answer, in both A-SM layouts (the threshold at 0: always rows; at 64: always columns)."""
    from hf_defer.modeling import surrogates as surrogate_kernels

    monkeypatch.setattr(surrogate_kernels, "_NARROW_WIDTH", narrow_width)
    monkeypatch.setattr(surrogate_kernels, "_NARROW_MIN_BATCH", 1)
    rng = np.random.default_rng(17 + NAMES.index(name))
    K, M, B = 3, 2, 40
    logits, labels, experts = _random_batch(rng, K, M, B, scale=6.0, n_ignored=5)
    experts[3, 1] = IGNORE
    s = get_surrogate(name, num_classes=K, num_experts=M)
    counted = int((labels != IGNORE).sum())
    for reduction, divisor in (("sum", 1.0), ("mean", counted)):
        u = torch.tensor(logits, dtype=torch.float32, requires_grad=True)
        reduced = s.loss(u, torch.tensor(labels), torch.tensor(experts), reduction=reduction, check=False)
        reduced.backward()
        v = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
        per = s.loss(v, torch.tensor(labels), torch.tensor(experts), reduction="none", check=False)
        (per.double().sum() / divisor).backward()
        assert reduced.dim() == 0
        np.testing.assert_allclose(float(reduced), float(per.sum()) / divisor, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(u.grad.numpy(), v.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_unchecked_plain_batch_takes_the_short_target_path_with_the_same_values(name, monkeypatch):
    """``check=False`` on a CPU batch with every row counted and every expert answered builds its targets in one
    comparison (no mask, a constant weight): the loss and gradient are those of the general path (``check=True``), for
    each reduction, int32 labels and ``[B, 1]`` labels; a batch with an ignored row or a missing answer goes the general
    way (the mask reaches the kernel, the ignored row weighs 0); and for S-SM both match the textbook formula."""
    K, M, B = 3, 2, 24
    generator = torch.Generator().manual_seed(5)
    logits = torch.randn(B, K + M, generator=generator) * 3
    y = torch.randint(0, K, (B,), generator=generator)
    m = torch.randint(0, K, (B, M), generator=generator)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    seen = []
    kernel = s._per_example_loss
    monkeypatch.setattr(s, "_per_example_loss", lambda *args: seen.append(args) or kernel(*args))
    for reduction in ("mean", "sum", "none"):
        results = []
        for labels, check in ((y, True), (y, False), (y.int()[:, None], False)):
            u = logits.clone().requires_grad_()
            loss = s.loss(u, labels, m.int(), reduction=reduction, check=check)
            loss.sum().backward()
            results.append((loss.detach(), u.grad))
        assert seen[-1][3] is None and seen[-1][4].shape == (B,)  # the short path: no mask
        torch.testing.assert_close(results[1], results[0], rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(results[2], results[0], rtol=1e-6, atol=1e-7)
    if name == "ssm":  # -log softmax(u)_y - sum_j c_j log softmax(u)_{K+j}, mean over rows, in float64
        log_p = torch.log_softmax(logits.double(), dim=1)
        ref = -(log_p.gather(1, y[:, None])[:, 0] + ((m == y[:, None]) * log_p[:, K:]).sum(1))
        np.testing.assert_allclose(float(s(logits, y, m, check=False)), float(ref.mean()), rtol=1e-6)
    ignored, missing = y.clone(), m.clone()
    ignored[4] = IGNORE
    missing[6, 1] = IGNORE
    for labels, experts in ((ignored, m), (y, missing)):
        expected = s.loss(logits, labels, experts, reduction="none", check=True)
        got = s.loss(logits, labels, experts, reduction="none", check=False)
        # the general path: the ignored row weighs 0, the missing answer's mask reaches the kernel
        assert float(seen[-1][4][4]) == 0.0 if experts is m else seen[-1][3] is not None and seen[-1][3][6, 1] == 0
        torch.testing.assert_close(got, expected)
    assert float(s.loss(logits, ignored, m, reduction="none", check=False)[4]) == 0.0


@pytest.mark.parametrize("name", NAMES)
def test_unchecked_plain_scores_take_the_short_target_path_with_the_same_values(name, monkeypatch):
    """The same short path for targets given as ``expert_correct`` (scores, bools): the scores go to the kernel as
    they are, with the general path's loss and gradient; a missing score (-100) or a NaN one goes the general way."""
    K, M, B = 3, 2, 24
    generator = torch.Generator().manual_seed(6)
    logits = torch.randn(B, K + M, generator=generator) * 3
    y = torch.randint(0, K, (B,), generator=generator)
    scores = torch.rand(B, M, generator=generator)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    seen = []
    kernel = s._per_example_loss
    monkeypatch.setattr(s, "_per_example_loss", lambda *args: seen.append(args) or kernel(*args))
    for targets in (scores, scores > 0.5):
        for reduction in ("mean", "sum", "none"):
            results = []
            for check in (True, False):
                u = logits.clone().requires_grad_()
                loss = s.loss(u, y, reduction=reduction, check=check, expert_correct=targets)
                loss.sum().backward()
                results.append((loss.detach(), u.grad))
            assert seen[-1][3] is None and seen[-1][2].dtype == torch.float32  # the short path: no mask
            torch.testing.assert_close(results[1], results[0], rtol=1e-6, atol=1e-7)
    holed = scores.clone()
    holed[3, 0] = IGNORE
    expected = s.loss(logits, y, reduction="none", expert_correct=holed)
    torch.testing.assert_close(s.loss(logits, y, reduction="none", check=False, expert_correct=holed), expected)
    assert seen[-1][3] is not None and seen[-1][3][3, 0] == 0 and float(seen[-1][2][3, 0]) == 0.0
    holed[3, 0] = float("nan")
    per = s.loss(logits, y, reduction="none", check=False, expert_correct=holed)
    assert torch.isnan(per[3]) and torch.isfinite(per[torch.arange(B) != 3]).all()  # unchecked: NaN goes through


# issue 46.3: the kernels with fewer allocations (A-SM's y* by a product, the rest shifted by the top class; the
# gradient written into a forward buffer) against float64 autograd of the textbook formulas
# --------------------------------------------------------------------------------------------


def _masked_reference(name, u, labels, correct, observed, K):
    """Per-example loss by float64 autograd from targets ``c`` (floats) and the answered mask ``o``: the asymmetric
    losses weight expert ``j``'s binary term by ``o_j``; the symmetric ones see ``c_j = 0`` where ``o_j = 0``."""
    c = correct * observed
    sp = torch.nn.functional.softplus
    w = torch.cat([torch.nn.functional.one_hot(labels, K).double(), c], dim=1)
    if name == "asm":
        classes = u[:, :K]
        top = torch.nn.functional.one_hot(classes.argmax(dim=1), K).bool()
        z = u[:, K:] - torch.logsumexp(classes.masked_fill(top, float("-inf")), dim=1, keepdim=True)
        binary = observed * (c * sp(-z) + (1 - c) * sp(z))
        return -torch.log_softmax(classes, 1).gather(1, labels[:, None])[:, 0] + binary.sum(1)
    if name == "ssm":
        return -(w * torch.log_softmax(u, 1)).sum(1)
    if name == "sova":
        return (w * sp(-u) + (1 + c.sum(1, keepdim=True) - w) * sp(u)).sum(1)
    mask = torch.cat([torch.ones(u.shape[0], K, dtype=u.dtype), observed], dim=1)
    return (mask * (w * sp(-u) + (1 - w) * sp(u))).sum(1)


def _kernel_inputs(K, M, B, seed, scale=4.0):
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, K + M, generator=generator, dtype=torch.float64) * scale
    labels = torch.randint(0, K, (B,), generator=generator)
    correct = torch.rand(B, M, generator=generator, dtype=torch.float64).round()
    correct[::3, 0] = torch.rand(len(correct[::3]), generator=generator, dtype=torch.float64)  # scores too
    observed = (torch.rand(B, M, generator=generator) > 0.2).double()
    observed[1] = 0.0  # a row with no answer at all
    weight = torch.rand(B, generator=generator, dtype=torch.float64) + 0.1
    return logits, labels, correct * observed, observed, weight  # the kernels' contract: c_j = 0 where o_j = 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K,M", [(2, 1), (3, 2), (100, 1), (100, 3), (240, 1), (1000, 2)])
@pytest.mark.parametrize("gap", [None, 40.0, 70.0])
def test_kernels_match_float64_autograd_with_missing_answers_and_wide_gaps(name, K, M, gap, monkeypatch):
    """Each kernel's per-example loss and gradient (row weights, scores, missing answers, a row with none) match float64
    autograd of the textbook formula. Without a tie A-SM takes its fast CPU path (the rest shifted by the top class);
    ``gap`` puts one row's other classes that far below its top: at 40 the rest (``e^-40``) still sums in the fast path,
    at 70 it would near float32's underflow and the batch goes the general way. Rows 2 and 3 hold a near tie (one ulp)
    and the top class a few ulp above the next: not ties, same values. From 64 classes on, the OvA losses sum the
    classes' softplus as logs of products of sigmoids, 120 at a time (K = 240: two whole products, K = 1,000: eight
    and a remainder)."""
    from hf_defer.modeling import surrogates as kernels

    monkeypatch.setattr(kernels, "_FAST_REST_MIN_SIZE", 0)  # 48 rows: the fast path only from B K = 16,384 on
    logits, labels, correct, observed, weight = _kernel_inputs(K, M, 48, seed=K + 10 * M)
    logits = logits.float().double()  # float32 values: the kernel's input, exactly
    logits[2, 1] = float(np.nextafter(np.float32(logits[2, 0]), np.float32(-np.inf)))
    logits[3, 0] = float(np.nextafter(np.float32(logits[3, :K].max()), np.float32(np.inf)) * np.float32(1.0))
    if gap is not None:
        logits[5, :K] = logits[5, :K].clamp(-1.0, 1.0) - gap
        logits[5, 0] = 1.0
    s = get_surrogate(name, num_classes=K, num_experts=M)
    u = logits.float().requires_grad_()
    per = s.kernel.apply(u, labels, correct.float(), observed.float(), torch.ones(48), K, False)
    (per.double() * weight).sum().backward()
    ref_u = logits.clone().requires_grad_()
    ref = _masked_reference(name, ref_u, labels, correct, observed, K)
    (ref * weight).sum().backward()
    np.testing.assert_allclose(per.detach().double().numpy(), ref.detach().numpy(), rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(u.grad.double().numpy(), ref_u.grad.numpy(), rtol=1e-4, atol=1e-6)
    if name == "asm":  # which way A-SM summed the rest: shifted by the top class (fast) unless near underflow
        top, top_index, shift, _, _ = kernels._asm_rest(u.detach()[:, :K])
        assert torch.equal(top_index[:, 0], u.detach()[:, :K].argmax(dim=1))
        assert torch.equal(shift, top) == (gap != 70.0)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("reduce", [False, True])
def test_kernels_pass_gradcheck_in_float64(name, reduce):
    """torch.autograd.gradcheck (finite differences in float64) of each kernel called directly on float64 logits, with
    a missing answer, scores and a row whose other classes lie 100 below the top (A-SM's general path). gradcheck
    backpropagates through the same graph once per output: every backward after the first finds the forward's buffer
    handed out and writes a new one."""
    K, M = 4, 2
    logits, labels, correct, observed, weight = _kernel_inputs(K, M, 6, seed=3)
    logits[4, :K] = torch.tensor([2.0, -98.0, -99.0, -100.5])
    kernel = get_surrogate(name, num_classes=K, num_experts=M).kernel
    assert torch.autograd.gradcheck(lambda v: kernel.apply(v, labels, correct, observed, weight, K, reduce),
                                    (logits.requires_grad_(),))


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("K", [3, 100])
def test_a_second_backward_gets_the_same_gradient_and_leaves_the_first_alone(name, K):
    """The first backward returns the forward's buffer as the gradient; a second one through the same graph
    (retain_graph) must not write into it again: both gradients equal, the first unchanged after the second."""
    s = get_surrogate(name, num_classes=K, num_experts=2)
    logits, labels, correct, observed, _ = _kernel_inputs(K, 2, 32, seed=9)
    experts = torch.where(correct > 0.5, labels[:, None], (labels[:, None] + 1) % K)
    u = logits.float().requires_grad_()
    loss = s(u, labels, experts, check=False)
    (first,) = torch.autograd.grad(loss, u, retain_graph=True)
    kept = first.clone()
    (second,) = torch.autograd.grad(loss * 2.0, u)
    assert torch.equal(first, kept) and first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(second, 2.0 * kept)


def test_asm_nan_row_and_tie_take_the_general_way_with_the_same_values_elsewhere(monkeypatch):
    """check=False lets a NaN through: its row's loss is NaN and the others keep their values (the batch leaves the
    fast path, which reads y* from a product that a NaN row would spoil); a tie for the top class does the same, and
    its y* is the first class at the top, as for ``max``."""
    from hf_defer.modeling import surrogates as kernels

    monkeypatch.setattr(kernels, "_FAST_REST_MIN_SIZE", 0)
    K, M = 50, 1
    logits, labels, correct, observed, weight = _kernel_inputs(K, M, 16, seed=4)
    s = get_surrogate("asm", num_classes=K, num_experts=M)
    experts = torch.where(correct > 0.5, labels[:, None], (labels[:, None] + 1) % K)
    u = logits.float()
    clean = s.loss(u, labels, experts, reduction="none", check=False)
    assert torch.equal(kernels._asm_rest(u[:, :K])[2], u[:, :K].amax(dim=1, keepdim=True))  # clean: the fast path
    for row, value in ((3, float("nan")), (3, float(u[3, :K].max()))):
        v = u.clone()
        v[row, 7] = value  # NaN, or class 7 tied with the top class
        per = s.loss(v, labels, experts, reduction="none", check=False)
        others = torch.arange(16) != row
        torch.testing.assert_close(per[others], clean[others], rtol=1e-6, atol=1e-6)
        if value != value:
            assert torch.isnan(per[row])
        else:
            ref = _masked_reference("asm", v.double(), labels, (experts == labels[:, None]).double(),
                                    torch.ones(16, M, dtype=torch.float64), K)
            assert float(per[row]) == pytest.approx(float(ref[row]), rel=1e-5)


@pytest.mark.parametrize("name", ["sova", "aova"])
def test_ova_class_sum_by_products_keeps_its_absolute_precision(name):
    """From 64 classes on the OvA losses sum the classes' softplus as logs of products of sigmoids: no underflow on a
    row of zeros (0.5^120 is a normal float32), none on rows far out (+-1e4, +50 on wrong classes); a confident row's
    tiny terms count to an absolute precision (a few 1e-6 for 1,000 classes, documented in `_softplus_rest`), every
    other row to float32's relative one."""
    K, M, B = 1000, 1, 6
    generator = torch.Generator().manual_seed(0)
    u = torch.zeros(B, K + M, dtype=torch.float64)
    labels = torch.arange(B)
    u[1] = -12 - 8 * torch.rand(K + M, generator=generator, dtype=torch.float64)
    u[1, 1] = 15.0  # confident: every other class 12 to 20 below 0
    u[2] = torch.randn(K + M, generator=generator, dtype=torch.float64) * 3
    u[2, :50] = 50.0
    u[3] = -1e4
    u[3, 3] = 1e4
    u[4] = -30.0
    u[4, 4] = 30.0  # every term e^-30: below the absolute precision, the row's loss ~1e-10
    u[5] = torch.randn(K + M, generator=generator, dtype=torch.float64) * 0.01
    u = u.float().double()
    correct = torch.tensor([[1.0], [1.0], [0.0], [1.0], [0.0], [1.0]], dtype=torch.float64)
    kernel = get_surrogate(name, K, M).kernel
    got = kernel.apply(u.float(), labels, correct.float(), None, torch.ones(B), K, False).double()
    ref = _masked_reference(name, u, labels, correct, torch.ones(B, M, dtype=torch.float64), K)
    assert torch.isfinite(got).all()
    np.testing.assert_allclose(got.numpy(), ref.numpy(), rtol=2e-6, atol=3e-5)
    assert abs(float(got[4] - ref[4])) < 1e-9
