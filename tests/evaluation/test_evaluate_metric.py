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
from hf_defer import deferral_metrics
from hf_defer.modeling import get_surrogate


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


def calibrated_model_with_costs(tmp_path):
    """A head-only model with two priced experts, trained a little, its threshold calibrated on its inputs."""
    from datasets import Dataset
    from transformers import TrainingArguments

    rng = np.random.default_rng(5)
    n = 96
    features = rng.normal(size=(n, 6)).astype(np.float32)
    labels = (features[:, 0] > 0).astype(int) + (features[:, 1] > 1).astype(int)
    experts = np.stack([np.where(rng.random(n) < 0.8, labels, rng.integers(0, 3, n)),
                        np.where(rng.random(n) < 0.6, labels, rng.integers(0, 3, n))], axis=1)
    data = Dataset.from_dict({"features": features, "labels": labels, "expert_labels": experts})
    torch.manual_seed(0)
    model = hf_defer.EncoderForDeferral(hf_defer.DeferralConfig(
        feature_size=6, num_labels=3, num_experts=2, expert_names=["alice", "bob"], expert_costs=[0.05, 0.02]))
    args = TrainingArguments(str(tmp_path / "out"), num_train_epochs=3, learning_rate=0.05, report_to=[],
                             use_cpu=True, save_strategy="no", disable_tqdm=True, per_device_eval_batch_size=32)
    trainer = hf_defer.DeferralTrainer(model=model, args=args, train_dataset=data, eval_dataset=data)
    trainer.train()
    threshold = hf_defer.calibrate_deferral(model, data, max_deferral_rate=0.25)
    assert threshold > 0 and model.config.defer_threshold == threshold
    return model, trainer, data, features, labels, experts


def test_load_metric_of_a_model_gives_the_trainers_and_the_pipelines_numbers(tmp_path):
    from transformers import pipeline

    model, trainer, data, features, labels, experts = calibrated_model_with_costs(tmp_path)
    with torch.no_grad():
        logits = model(features=torch.tensor(features)).logits.numpy()
    metric = hf_defer.load_metric(model)
    for start in range(0, len(labels), 40):
        metric.add_batch(predictions=logits[start:start + 40], references=labels[start:start + 40],
                         expert_predictions=experts[start:start + 40])
    got = metric.compute()
    evaluated = trainer.evaluate()
    assert got == pytest.approx({key[5:]: value for key, value in evaluated.items()
                                 if key[5:] in got}, abs=1e-6)
    assert set(got) <= {key[5:] for key in evaluated}
    # the pipeline's own decisions, counted by hand: coverage, mean cost and system error
    outputs = pipeline("deferral", model=model)(list(features))
    deferred = np.array([out["defer"] for out in outputs])
    names = model.config.expert_names
    chosen = [names.index(out["expert"]) if out["defer"] else -1 for out in outputs]
    predicted = [model.config.label2id[out["class_label"]] for out in outputs]
    wrong = [experts[i, chosen[i]] != labels[i] if deferred[i] else predicted[i] != labels[i] for i in range(len(labels))]
    assert got["coverage"] == pytest.approx(1 - deferred.mean()) and got["system_error"] == pytest.approx(np.mean(wrong))
    costs = [model.config.expert_costs[j] if j >= 0 else 0.0 for j in chosen]
    assert got["mean_cost"] == pytest.approx(np.mean(costs))
    # without the model: the paper's rule (no costs, no threshold), budgets by expert accuracy
    plain = hf_defer.load_metric().compute(predictions=logits, references=labels, expert_predictions=experts)
    assert plain == pytest.approx(deferral_metrics(logits, labels, experts, "asm", 2))
    assert plain["coverage"] != got["coverage"]
    # the same numbers from a clean `evaluate.load` with the settings as compute() keywords
    same = evaluate.load(metric_module.DEFERRAL_METRIC_PATH).compute(
        predictions=logits, references=labels, expert_predictions=experts, expert_costs=[0.05, 0.02],
        defer_threshold=model.config.defer_threshold, budget_ranking="margin")
    for key in ("system_error", "coverage", "budgeted_error_10", "budgeted_error_20", "mean_cost"):
        assert same[key] == pytest.approx(got[key]), key
    with pytest.raises(ValueError, match="budget_ranking must be one of"):
        hf_defer.load_metric(model, budget_ranking="luck")
    with pytest.raises(ValueError, match="model must be a deferral model"):
        hf_defer.load_metric(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("bad", [1.25, -0.1, float("nan")])
def test_probabilities_outside_zero_one_are_refused_not_clipped(bad):
    estimates = np.array([[0.5, 0.3, 0.2, 0.9], [0.1, 0.1, 0.8, bad]])
    with pytest.raises(ValueError, match=r"predictions must be probabilities in \[0, 1\]; row 1, column 3 holds"):
        hf_defer.load_metric().compute(predictions=estimates, references=[0, 2], expert_predictions=[0, 1],
                                       inputs="probabilities")


@pytest.mark.slow  # a fresh interpreter or process: make test-slow (CI) runs it
def test_evaluate_load_of_the_folder_works_in_a_fresh_interpreter(tmp_path):
    import json
    import os
    import subprocess
    from pathlib import Path

    folder = Path(metric_module.DEFERRAL_METRIC_PATH)
    assert "hf-defer" in (folder / "requirements.txt").read_text().split()
    readme = (folder / "README.md").read_text()
    assert readme.startswith("---\n") and "# Metric Card for Deferral" in readme and "## How to Use" in readme
    logits, labels, experts = data(30, 1, seed=7)
    probe = (
        "import json, sys, evaluate\n"
        f"metric = evaluate.load({str(folder)!r})\n"
        "info = metric.info\n"
        f"out = metric.compute(predictions={logits.tolist()!r}, references={labels.tolist()!r}, "
        f"expert_predictions={experts.tolist()!r})\n"
        "print(json.dumps({'metrics': out, 'homepage': info.homepage, 'license': info.license, "
        "'codebase_urls': info.codebase_urls, 'reference_urls': info.reference_urls}))\n")
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf_home"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-I", "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["metrics"] == pytest.approx(deferral_metrics(logits, labels, experts), abs=1e-6)
    assert result["homepage"] and result["license"] == "Apache-2.0" and result["codebase_urls"]
    assert "https://arxiv.org/abs/2311.01106" in result["reference_urls"]


def test_the_module_folder_ships_its_card_and_requirements():
    import tomllib
    from pathlib import Path

    pyproject = tomllib.loads((Path(hf_defer.__file__).resolve().parents[1] / "pyproject.toml").read_text())
    shipped = pyproject["tool"]["setuptools"]["package-data"]["hf_defer.evaluation"]
    assert {"metric_scripts/*/README.md", "metric_scripts/*/requirements.txt"} <= set(shipped)
