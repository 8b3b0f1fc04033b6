"""Sparse expert answers (issue 19) and soft expert targets (issue 22) in the four surrogate losses.

The reference is written here, independently of the kernels in `surrogates.py`: the naive per-row formulas of DESIGN.md in
float64 torch ops (plain exp/log, no log-sum-exp tricks), split into the classifier's term and one term per expert,
and the masked loss is the sum of the *remaining* terms, chosen in Python: the terms of an expert who did not answer
are left out, not multiplied by a weight. Gradients of the reference come from float64 autograd.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_defer.modeling import get_surrogate
from hf_defer.modeling.surrogates import _AOvALoss, _ASMLoss, _SOvALoss, _SSMLoss

NAMES = ("asm", "ssm", "sova", "aova")
IGNORE = -100
KERNELS = {"asm": _ASMLoss, "ssm": _SSMLoss, "sova": _SOvALoss, "aova": _AOvALoss}
FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "saved_before_layout"


def xi(t: torch.Tensor) -> torch.Tensor:
    return torch.log(1.0 + torch.exp(-t))


def terms(name: str, u: torch.Tensor, y: int, c: torch.Tensor, K: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(the classifier's term, [expert j's term]) of one row, from the formulas of DESIGN.md, float64."""
    M = u.shape[0] - K
    e = torch.exp(u)
    if name == "asm":
        top = int(torch.argmax(u[:K]))
        rest = sum(e[k] for k in range(K) if k != top)
        psi = [e[K + j] / (e[K + j] + rest) for j in range(M)]
        return -torch.log(e[y] / e[:K].sum()), [-(c[j] * torch.log(psi[j]) + (1 - c[j]) * torch.log(1 - psi[j]))
                                                 for j in range(M)]
    if name == "ssm":
        p = e / e.sum()
        return -torch.log(p[y]), [-c[j] * torch.log(p[K + j]) for j in range(M)]
    if name == "sova":
        def ell(z: int) -> torch.Tensor:
            return xi(u[z]) + sum(xi(-u[other]) for other in range(K + M) if other != z)

        return ell(y), [c[j] * ell(K + j) for j in range(M)]
    classes = xi(u[y]) + sum(xi(-u[k]) for k in range(K) if k != y)
    return classes, [c[j] * xi(u[K + j]) + (1 - c[j]) * xi(-u[K + j]) for j in range(M)]


def brute_force(name: str, logits: np.ndarray, labels: np.ndarray, targets: np.ndarray, answered: np.ndarray,
                K: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row losses (0 on ignored rows) and the gradient of their sum, float64."""
    u = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    rows = []
    for i in range(len(labels)):
        if labels[i] == IGNORE:
            rows.append(torch.zeros((), dtype=torch.float64))
            continue
        classes, experts = terms(name, u[i], int(labels[i]), torch.tensor(targets[i], dtype=torch.float64), K)
        rows.append(classes + sum((term for term, seen in zip(experts, answered[i]) if seen),
                                  torch.zeros((), dtype=torch.float64)))
    losses = torch.stack(rows)
    losses.sum().backward()
    return losses.detach().numpy(), u.grad.numpy()


def sparse_batch(seed: int, K: int, M: int, B: int = 16):
    """Logits, labels (one ignored row), answers with -100 holes: row 0 has none, row 1 lacks expert 0 only."""
    rng = np.random.default_rng(seed)
    logits = rng.uniform(-4, 4, size=(B, K + M)).astype(np.float32)
    labels = rng.integers(0, K, size=B)
    answers = np.where(rng.random((B, M)) < 0.5, labels[:, None], rng.integers(0, K, size=(B, M)))
    answers[rng.random((B, M)) < 0.35] = IGNORE
    answers[0] = IGNORE
    answers[1] = labels[1]
    answers[1, 0] = IGNORE
    labels[5] = IGNORE
    return logits, labels, answers


def ours(name: str, logits: np.ndarray, labels: np.ndarray, **targets) -> tuple[np.ndarray, np.ndarray]:
    K = logits.shape[1] - (targets.get("expert_labels", targets.get("expert_correct")).shape[1])
    s = get_surrogate(name, num_classes=K, num_experts=logits.shape[1] - K)
    u = torch.tensor(logits, requires_grad=True)
    per_row = s.loss(u, torch.tensor(labels), reduction="none",
                     **{key: torch.tensor(value) for key, value in targets.items()})
    per_row.sum().backward()
    return per_row.detach().double().numpy(), u.grad.double().numpy()


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 3])
def test_masked_loss_and_gradient_equal_the_remaining_terms_by_brute_force(name, M):
    K = 4
    logits, labels, answers = sparse_batch(NAMES.index(name) + 10 * M, K, M)
    got, grad = ours(name, logits, labels, expert_labels=answers)
    correct = (answers == labels[:, None]).astype(np.float64)
    want, want_grad = brute_force(name, logits.astype(np.float64), labels, correct, answers != IGNORE, K)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    # Row 0 answered by nobody: its loss is the classifier's term alone, and its expert logits get no gradient from
    # the asymmetric losses (the symmetric ones still push them down through the shared normaliser).
    u0 = torch.tensor(logits[0], dtype=torch.float64)
    np.testing.assert_allclose(got[0], float(terms(name, u0, int(labels[0]), torch.zeros(M), K)[0]), rtol=1e-5)
    if name in ("asm", "aova"):
        assert (grad[0, K:] == 0).all()
    else:
        assert (grad[0, K:] > 0).all()
    # The mean is over the counted rows, whatever their answers.
    s = get_surrogate(name, num_classes=K, num_experts=M)
    mean = s(torch.tensor(logits), torch.tensor(labels), torch.tensor(answers))
    np.testing.assert_allclose(float(mean), want[labels != IGNORE].mean(), rtol=1e-5)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 3])
def test_soft_targets_equal_brute_force_and_hard_targets_are_the_answers(name, M):
    K = 3
    logits, labels, answers = sparse_batch(100 + NAMES.index(name) + 10 * M, K, M)
    rng = np.random.default_rng(7)
    scores = rng.uniform(0, 1, size=answers.shape).astype(np.float32)
    scores[:, 0][::3] = 1.0  # the ends of the interval are scores too
    scores[answers == IGNORE] = IGNORE
    got, grad = ours(name, logits, labels, expert_correct=scores)
    want, want_grad = brute_force(name, logits.astype(np.float64), labels, np.where(scores == IGNORE, 0, scores),
                                  scores != IGNORE, K)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-4, atol=1e-6)
    # c in {0, 1}: the correctness of the answers is the same target as the answers, bit for bit.
    right = np.where(answers == IGNORE, IGNORE, (answers == labels[:, None]).astype(np.float32))
    for given in (right, right.astype(np.float64)):
        soft = ours(name, logits, labels, expert_correct=given)
        hard = ours(name, logits, labels, expert_labels=answers)
        assert np.array_equal(soft[0], hard[0]) and np.array_equal(soft[1], hard[1])
    rows = (answers != IGNORE).all(axis=1)  # booleans hold no -100: rows every expert answered
    as_bool = ours(name, logits[rows], labels[rows], expert_correct=answers[rows] == labels[rows, None])
    hard = ours(name, logits[rows], labels[rows], expert_labels=answers[rows])
    assert rows.sum() >= 2 and np.array_equal(as_bool[0], hard[0]) and np.array_equal(as_bool[1], hard[1])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 3])
def test_kernels_pass_gradcheck_with_masks_and_soft_targets(name, M):
    K, B = 3, 6
    rng = np.random.default_rng(NAMES.index(name) + M)
    u = torch.tensor(rng.uniform(-3, 3, size=(B, K + M)), dtype=torch.float64, requires_grad=True)
    labels = torch.tensor(rng.integers(0, K, size=B))
    observed = torch.tensor(rng.random((B, M)) < 0.6, dtype=torch.float64)
    observed[0] = 0.0
    correct = torch.tensor(rng.uniform(0, 1, size=(B, M))) * observed
    weight = torch.tensor(rng.uniform(0.5, 2.0, size=B))
    kernel = KERNELS[name]
    assert torch.autograd.gradcheck(lambda x: kernel.apply(x, labels, correct, observed, weight, K), (u,))


@pytest.mark.parametrize("name", NAMES)
def test_masked_and_soft_losses_compile_without_graph_break(name):
    K, M = 4, 2
    logits, labels, answers = sparse_batch(3, K, M, B=8)
    s = get_surrogate(name, num_classes=K, num_experts=M)
    scores = np.where(answers == IGNORE, IGNORE, 0.25).astype(np.float32)
    for key, value in (("expert_labels", answers), ("expert_correct", scores)):
        compiled = torch.compile(lambda u, y, t: s(u, y, check=False, **{key: t}), fullgraph=True, backend="aot_eager")
        u = torch.tensor(logits, requires_grad=True)
        compiled(u, torch.tensor(labels), torch.tensor(value)).backward()
        expected = torch.tensor(logits, requires_grad=True)
        s(expected, torch.tensor(labels), **{key: torch.tensor(value)}).backward()
        torch.testing.assert_close(u.grad, expected.grad)


def _old_surrogates():
    """The surrogate code of before issue 19, as `tests/fixtures/saved_before_layout` froze it."""
    if "_before_issue19" not in sys.modules:
        package = types.ModuleType("_before_issue19")
        package.__path__ = [str(FIXTURE)]
        sys.modules["_before_issue19"] = package
    return importlib.import_module("_before_issue19.surrogates")


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("M", [1, 3])
def test_with_every_answer_present_losses_gradients_and_decisions_are_the_old_ones(name, M):
    # Two implementations: the losses and gradients agree to float32 rounding (another kernel may sum in another
    # order on another CPU), the decisions exactly.
    K, B = 5, 64
    rng = np.random.default_rng(NAMES.index(name) * 7 + M)
    logits = (rng.normal(size=(B, K + M)) * rng.choice([0.5, 3.0, 30.0], size=(B, 1))).astype(np.float32)
    labels = rng.integers(0, K, size=B)
    labels[::9] = IGNORE
    answers = np.where(rng.random((B, M)) < 0.6, labels[:, None], rng.integers(0, K, size=(B, M)))
    answers[labels == IGNORE] = IGNORE
    old = _old_surrogates().get_surrogate(name, K, M)
    new = get_surrogate(name, K, M)
    for reduction in ("mean", "sum", "none"):
        results = []
        for surrogate in (old, new):
            u = torch.tensor(logits, requires_grad=True)
            loss = surrogate.loss(u, torch.tensor(labels), torch.tensor(answers), reduction=reduction)
            loss.sum().backward()
            results.append((loss.detach(), u.grad))
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=1e-6, atol=1e-7)
    u = torch.tensor(logits)
    for costs, threshold in ((None, 0.0), ([0.05] * M, 0.02)):
        want = old.decide(u, costs, threshold)
        for available in (None, torch.ones(B, M, dtype=torch.bool), [True] * M):
            got = new.decide(u, costs, threshold, available=available)
            assert all(torch.equal(a, b) for a, b in zip(want, got))
        torch.testing.assert_close(new.deferral_margin(u, costs, available=[True] * M)[0], old.deferral_margin(u, costs)[0],
                                   rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name", NAMES)
def test_bad_soft_targets_are_refused_with_the_argument_named(name):
    s = get_surrogate(name, num_classes=3, num_experts=2)
    u, y = torch.zeros(2, 5), torch.tensor([0, 1])
    for bad in ([[0.5, 1.5], [0.0, 1.0]], [[0.5, float("nan")], [0.0, 1.0]], [[-0.5, 1.0], [0.0, 1.0]]):
        with pytest.raises(ValueError, match=r"expert_correct must lie in \[0, 1\]"):
            s(u, y, expert_correct=torch.tensor(bad))
    with pytest.raises(ValueError, match=r"expert_correct must have shape \[batch, num_experts\] = \[2, 2\]"):
        s(u, y, expert_correct=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="exactly one of the two; got both"):
        s(u, y, torch.zeros(2, 2, dtype=torch.long), expert_correct=torch.zeros(2, 2))
    with pytest.raises(ValueError, match="got neither"):
        s(u, y)
    with pytest.raises(ValueError, match="expert_labels must be integers.*expert_correct"):
        s(u, y, torch.zeros(2, 2))
    # A NaN or out-of-range score on an ignored row is not read, as an ignored row's answers are not.
    assert torch.isfinite(s(u, torch.tensor([0, IGNORE]), expert_correct=torch.tensor([[1.0, 0.0], [9.0, 0.0]])))


def test_missing_at_random_the_asymmetric_estimators_stay_consistent_the_symmetric_ones_scale_by_the_answer_rate():
    """Minimise the conditional risk at one x over every (y, pattern of right/wrong, pattern of answered) with its
    probability: answers are missing at random with rates pi. The known optimum: A-SM and A-OvA estimate a, S-SM and
    S-OvA estimate pi * a (the module docstring of surrogates.py); every surrogate still estimates eta."""
    import itertools

    eta, a, pi = np.array([0.5, 0.3, 0.2]), np.array([0.7, 0.4]), np.array([0.6, 0.25])
    K, M = 3, 2
    labels, answers, weights = [], [], []
    for y in range(K):
        for right in itertools.product([0, 1], repeat=M):
            for seen in itertools.product([0, 1], repeat=M):
                p = eta[y] * np.prod([(a[j] if right[j] else 1 - a[j]) * (pi[j] if seen[j] else 1 - pi[j])
                                      for j in range(M)])
                labels.append(y)
                answers.append([(y if right[j] else (y + 1) % K) if seen[j] else IGNORE for j in range(M)])
                weights.append(p)
    labels, answers, weights = torch.tensor(labels), torch.tensor(answers), torch.tensor(weights, dtype=torch.float64)
    for name in NAMES:
        s = get_surrogate(name, K, M)
        u = torch.zeros(K + M, dtype=torch.float64, requires_grad=True)
        optimizer = torch.optim.LBFGS([u], lr=1.0, max_iter=500, tolerance_grad=1e-10, tolerance_change=1e-14,
                                      history_size=50, line_search_fn="strong_wolfe")

        def closure():
            optimizer.zero_grad()
            risk = (s.loss(u.expand(len(labels), -1), labels, answers, reduction="none").double() * weights).sum()
            risk.backward()
            return risk

        for _ in range(3):
            optimizer.step(closure)
        classes, experts = s.probabilities(u.detach()[None], clip=False)
        np.testing.assert_allclose(classes[0].double().numpy(), eta, atol=2e-3)
        expected = a if name in ("asm", "aova") else pi * a
        np.testing.assert_allclose(experts[0].double().numpy(), expected, atol=2e-3)
