"""research.mmlu_side_features: the route-only model with the subject embedded inside it, on synthetic data
where only the subject tells which model is right: its estimates must come near each subject's accuracies (worked out
here from the data), and `compare` fills its row with the paired intervals."""

from __future__ import annotations

import numpy as np

import research.mmlu_routing as mr
from research.mmlu_side_features import fit_route_only_side_features

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
    estimate = fit_route_only_side_features(features, subjects, correct, seed=0, epochs=40)
    assert estimate.model.chosen_head in ([], [64]) and len(estimate.model.inner_losses) == 2
    probe = np.zeros((3, 6), dtype=np.float32)  # the features at their mean
    got = estimate(probe, sorted(ACCURACY))
    subjects = np.asarray(subjects)
    for row, name in enumerate(sorted(ACCURACY)):
        observed = correct[subjects == name].mean(0)  # the subject's accuracies in this sample
        np.testing.assert_allclose(got[row], observed, atol=0.06)


def test_compare_fills_the_side_feature_row_with_paired_intervals():
    features, subjects, strong, weak = synthetic(450, seed=1)
    fit = lambda f, s, c, seed: fit_route_only_side_features(f, s, c, seed, epochs=10, hidden=((),))  # noqa: E731
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
