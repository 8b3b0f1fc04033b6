"""The `evaluate` deferral metric: deferral_metrics batch by batch and at once, logits or probabilities, offline."""

from __future__ import annotations

import doctest
import sys

import evaluate
import numpy as np
import pytest
import torch

import hf_defer
import hf_defer.evaluation.evaluate_metric as metric_module
from hf_defer import deferral_metrics, get_surrogate


def data(n: int, num_experts: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=2.0, size=(n, 3 + num_experts)).astype(np.float32)
    labels = rng.integers(0, 3, n)
    experts = rng.integers(0, 3, n) if num_experts == 1 else rng.integers(0, 3, (n, num_experts))
    return logits, labels, experts


@pytest.mark.parametrize(("num_experts", "surrogate"), [(1, "asm"), (2, "ssm")])
def test_batch_by_batch_and_at_once_equal_deferral_metrics(num_experts, surrogate):
    logits, labels, experts = data(50, num_experts)
    expected = deferral_metrics(logits, labels, experts, surrogate, num_experts)
    metric = hf_defer.load_metric()
    for start in range(0, 50, 16):  # 16, 16, 16, 2
        metric.add_batch(predictions=logits[start:start + 16], references=labels[start:start + 16],
                         expert_predictions=experts[start:start + 16])
    assert metric.compute(surrogate=surrogate) == pytest.approx(expected)
    at_once = evaluate.load(hf_defer.evaluation.evaluate_metric.DEFERRAL_METRIC_PATH).compute(
        predictions=logits, references=labels, expert_predictions=experts, surrogate=surrogate)
    assert at_once == pytest.approx(expected)
    one = hf_defer.load_metric()
    for row in range(50):
        one.add(predictions=logits[row], references=labels[row], expert_predictions=experts[row])
    assert one.compute(surrogate=surrogate) == pytest.approx(expected)


def test_ignored_rows_budgets_and_bins_are_passed_through():
    logits, labels, experts = data(40, 1, seed=3)
    labels[::5] = -100
    expected = deferral_metrics(logits, labels, experts, n_bins=5, budgets=(0.05, 0.5))
    got = hf_defer.load_metric().compute(predictions=logits, references=labels, expert_predictions=experts, n_bins=5,
                                         budgets=[0.05, 0.5])
    assert got == pytest.approx(expected) and "budgeted_error_5" in got and "budgeted_error_10" not in got


@pytest.mark.parametrize("num_experts", [1, 3])
def test_probabilities_are_the_estimates_of_the_asm_logits_used(num_experts):
    logits, labels, experts = data(60, num_experts, seed=1)
    asm = get_surrogate("asm", 3, num_experts)
    class_probs, accuracy = asm.probabilities(torch.tensor(logits))
    estimates = torch.cat([class_probs, accuracy], dim=1).numpy()
    got = hf_defer.load_metric().compute(predictions=estimates, references=labels, expert_predictions=experts,
                                         inputs="probabilities")
    # Same estimates, hence the same decisions (defer iff the best accuracy beats the top class probability) and
    # the same ECE: the metrics of the logits the probabilities came from.
    assert got == pytest.approx(deferral_metrics(logits, labels, experts, "asm", num_experts), abs=1e-6)
    # And the A-SM logits that the shipped module builds from them are the hand-derived inverse, with exactly these
    # estimates.
    metric = hf_defer.load_metric()
    shipped = sys.modules[type(metric).__module__]._asm_logits(estimates, num_experts)
    np.testing.assert_allclose(shipped, hand_derived_logits(estimates.astype(np.float64), num_experts), atol=1e-9)
    probs_back, accuracy_back = asm.probabilities(torch.tensor(shipped, dtype=torch.float32))
    np.testing.assert_allclose(probs_back.numpy(), class_probs.numpy(), atol=1e-6)
    np.testing.assert_allclose(accuracy_back.numpy(), accuracy.numpy(), atol=1e-5)  # float32 logits


def hand_derived_logits(estimates: np.ndarray, num_experts: int) -> np.ndarray:
    """The hand-derived inverse of the A-SM estimator: u_y = log p_y, and from
    a = e^v / (e^v + sum_{y != y*} p_y) = e^v / (e^v + 1 - max p): v = log a + log(1 - max p) - log(1 - a)."""
    probs, accuracy = estimates[:, :-num_experts], estimates[:, -num_experts:]
    v = np.log(accuracy) + np.log(1 - probs.max(axis=1, keepdims=True)) - np.log(1 - accuracy)
    return np.concatenate([np.log(probs), v], axis=1)


def test_bad_inputs_are_rejected():
    logits, labels, experts = data(5, 1)
    with pytest.raises(ValueError, match="inputs must be 'logits' or 'probabilities'"):
        hf_defer.load_metric().compute(predictions=logits, references=labels, expert_predictions=experts, inputs="x")


def test_shipped_in_the_package_and_docstring_examples_run():
    import tomllib
    from pathlib import Path

    root = Path(hf_defer.__file__).resolve().parent
    assert (root / "evaluation" / "metric_scripts" / "deferral" / "deferral.py").is_file()
    pyproject = tomllib.loads((root.parent / "pyproject.toml").read_text())
    assert "metric_scripts/*/*.py" in pyproject["tool"]["setuptools"]["package-data"]["hf_defer.evaluation"]
    assert any(dep.startswith("evaluate") for dep in pyproject["project"]["dependencies"])
    result = doctest.testmod(metric_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0 and result.attempted > 0
