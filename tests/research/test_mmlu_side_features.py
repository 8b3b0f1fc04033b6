"""research.mmlu_side_features: the route-only model with the subject embedded inside it, on synthetic data
where only the subject tells which model is right: its estimates must come near each subject's accuracies (worked out
here from the data), and `compare` fills its row with the paired intervals."""

from __future__ import annotations

import numpy as np
import pytest

import research.mmlu_routing as mr
from research.mmlu_side_features import WEIGHT_DECAYS, fit_route_only_side_features

ACCURACY = {"law": (0.9, 0.5), "math": (0.3, 0.9), "art": (0.6, 0.7)}  # (weak, strong) right, by subject


def synthetic(n: int = 900, seed: int = 0):
    rng = np.random.default_rng(seed)
    subjects = rng.choice(sorted(ACCURACY), size=n).tolist()
    features = rng.normal(size=(n, 6)).astype(np.float32)  # noise: only the subject is informative
    weak = rng.random(n) < np.array([ACCURACY[s][0] for s in subjects])
    strong = rng.random(n) < np.array([ACCURACY[s][1] for s in subjects])
    return features, subjects, strong, weak


def test_the_subject_inside_the_model_recovers_each_subjects_accuracies():
    features, subjects, strong, weak = synthetic()
    correct = np.stack([weak, strong], axis=1).astype(np.float32)
    estimate = fit_route_only_side_features(features, subjects, correct, seed=0, epochs=40, weight_decays=(0.0, 1.0))
    assert estimate.model.chosen_head in ([], [64]) and estimate.model.chosen_weight_decay in (0.0, 1.0)
    assert len(estimate.model.inner_losses) == 4 and 0.0 in WEIGHT_DECAYS and max(WEIGHT_DECAYS) >= 10
    probe = np.zeros((3, 6), dtype=np.float32)  # the features at their mean
    got = estimate(probe, sorted(ACCURACY))
    subjects = np.asarray(subjects)
    for row, name in enumerate(sorted(ACCURACY)):
        observed = correct[subjects == name].mean(0)  # the subject's accuracies in this sample
        np.testing.assert_allclose(got[row], observed, atol=0.06)


def test_inner_cross_validation_shrinks_what_the_text_says_when_it_is_noise_and_keeps_the_subject():
    # 60 noise features for 150 rows: without a penalty the head fits the noise (held-out loss far above the
    # constant predictor's); the inner CV must pick a penalty, and the subject's accuracies must survive it
    rng = np.random.default_rng(0)
    features, subjects, strong, weak = synthetic(150, seed=0)
    features = rng.normal(size=(150, 60)).astype(np.float32)
    correct = np.stack([weak, strong], axis=1).astype(np.float32)
    estimate = fit_route_only_side_features(features, subjects, correct, seed=0, epochs=40, hidden=((),),
                                            weight_decays=(0.0, 1e-2, 1.0), select_by="loss")
    losses = {row["weight_decay"]: row["loss"] for row in estimate.model.inner_losses}
    assert estimate.model.chosen_weight_decay == min(losses, key=losses.get) > 0
    assert losses[0.0] > 2 * min(losses.values())
    # the constant predictor's loss (each model's overall accuracy), worked out here: the choice is no worse
    p = correct.mean(0)
    constant = float(-(correct * np.log(p) + (1 - correct) * np.log(1 - p)).sum(1).mean())
    assert min(losses.values()) < constant + 0.05
    got = estimate(np.zeros((3, 60), dtype=np.float32), sorted(ACCURACY))
    for row, name in enumerate(sorted(ACCURACY)):
        np.testing.assert_allclose(got[row], correct[np.asarray(subjects) == name].mean(0), atol=0.08)
    # by APGR: the grid point of the highest inner APGR, recomputed here from the report's definition
    by_apgr = fit_route_only_side_features(features, subjects, correct, seed=0, epochs=40, hidden=((),),
                                           weight_decays=(0.0, 0.1, 1.0), select_by="apgr")
    apgrs = {row["weight_decay"]: row["apgr"] for row in by_apgr.model.inner_losses}
    assert by_apgr.model.chosen_weight_decay in [w for w, a in apgrs.items() if a == max(apgrs.values())]
    with pytest.raises(ValueError, match="`select_by` must be 'apgr' or 'loss'"):
        fit_route_only_side_features(features, subjects, correct, seed=0, select_by="auc")
    # the penalty reads the text's weights only: a larger one gives them a smaller norm
    norms = [np.linalg.norm(fit_route_only_side_features(features, subjects, correct, seed=0, epochs=40, hidden=((),),
                                                         weight_decays=(w,)).model.head[1].weight[:, :60].detach())
             for w in (0.0, 0.1)]
    assert norms[1] < norms[0] / 3


def test_compare_fills_the_side_feature_row_with_paired_intervals():
    features, subjects, strong, weak = synthetic(450, seed=1)
    fit = lambda f, s, c, seed: fit_route_only_side_features(f, s, c, seed, epochs=10, hidden=((),),  # noqa: E731
                                                                weight_decays=(0.0, 1.0))
    record = mr.compare(features, subjects, strong, weak, folds=3, bootstrap=5, epochs=5, log=lambda _: None,
                        route_only_subject=fit)
    row = record["routers"]["route_only_subject"]
    assert set(row["paired"]) == {"subject", "correctness_subject"}
    assert all(len(row["paired"][other][m]) == 5 for other in row["paired"] for m in ("apgr", "cpt_50"))
    paired = np.asarray(row["bootstrap_apgr"]) - np.asarray(record["routers"]["subject"]["bootstrap_apgr"])
    np.testing.assert_allclose(row["paired"]["subject"]["apgr"], paired)
    record["settings"] |= {"date": "2025-01-01", "machine": "test", "command": "test", "encoder": "random features",
                           "embedding_seconds": 0, "max_rows": None, "subjects": 3}
    text = mr.report_markdown(record)
    assert "subject as a side feature embedded in the model" in text and "CPT(50 %) difference" in text
