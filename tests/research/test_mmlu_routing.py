"""research.mmlu_routing: folds, cross-fitting, the routers and the report, on small synthetic data."""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import research.mmlu_routing as mr

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "mmlu_routing.py"


def test_subject_folds_are_stratified_balanced_and_seeded():
    subjects = ["law"] * 23 + ["math"] * 11 + ["art"] * 7
    fold = mr.subject_folds(subjects, folds=5, seed=0)
    for subject in set(subjects):
        counts = np.bincount(fold[np.array(subjects) == subject], minlength=5)
        assert counts.max() - counts.min() <= 1, (subject, counts)
    sizes = np.bincount(fold, minlength=5)
    assert sizes.max() - sizes.min() <= 1 and sizes.sum() == 41
    assert fold.tolist() == mr.subject_folds(subjects, 5, 0).tolist() != mr.subject_folds(subjects, 5, 1).tolist()
    with pytest.raises(ValueError, match="folds"):
        mr.subject_folds(subjects, folds=1)


def test_cross_fit_never_scores_a_row_it_was_fitted_on():
    fold = mr.subject_folds(["a"] * 10 + ["b"] * 7, folds=3, seed=0)
    seen: list[tuple[set[int], set[int]]] = []

    def fit(train):
        def score(rows):
            seen.append((set(train.tolist()), set(rows.tolist())))
            return np.zeros(len(rows))
        return score

    mr.cross_fit(fit, fold)
    assert len(seen) == 3
    assert all(not train & rows and train | rows == set(range(17)) for train, rows in seen)
    assert set().union(*(rows for _, rows in seen)) == set(range(17))


def test_subject_router_scores_each_row_by_the_other_folds_gain():
    subjects = ["a"] * 4 + ["b"] * 4
    strong = np.array([1, 1, 1, 1, 0, 1, 0, 1], dtype=bool)
    weak = np.array([0, 0, 1, 0, 0, 0, 1, 1], dtype=bool)
    fold = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    score = mr.cross_fit(mr.subject_router(subjects, strong, weak), fold)
    # Subject a, gain strong - weak = 1, 1, 0, 1: fold 0 rows (0, 2) learn from rows 1, 3 (gain 1); fold 1 rows
    # (1, 3) from rows 0, 2 (mean 0.5). Subject b, gains 0, 1, -1, 0: rows 4, 6 from 5, 7 (0.5), rows 5, 7 from 4, 6.
    assert score.tolist() == [1.0, 0.5, 1.0, 0.5, 0.5, -0.5, 0.5, -0.5]


def synthetic(n: int = 600, seed: int = 0):
    """Questions where the weak model errs on the x[0] > 0 half: a classifier can see where to call the strong one."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(n, 8)).astype(np.float32)
    hard = features[:, 0] > 0
    weak = rng.random(n) < np.where(hard, 0.3, 0.9)
    strong = rng.random(n) < 0.85
    subjects = np.where(features[:, 1] > 0, "physics", "history").tolist()
    return features, subjects, strong, weak


def test_compare_runs_every_router_and_marks_the_route_only_row_pending(tmp_path):
    features, subjects, strong, weak = synthetic()
    logs = []
    record = mr.compare(features, subjects, strong, weak, folds=3, bootstrap=20, epochs=30, log=logs.append)
    routers = record["routers"]
    assert set(routers) == set(mr.ROUTERS) and routers["route_only"] == {"pending": True}
    assert abs(routers["random"]["apgr"] - 0.5) < 0.1 and abs(np.mean(routers["random"]["repeats_apgr"]) - 0.5) < 0.02
    # The classifiers see the hard half; the subject carries no signal here.
    for name in ("weak_wrong", "strong_wins", "correctness"):
        assert routers[name]["apgr"] > routers["subject"]["apgr"] + 0.1, name
        assert len(routers[name]["bootstrap_apgr"]) == 20
    assert routers["oracle"]["apgr"] > max(r["apgr"] for r in routers.values() if "apgr" in r and r is not routers["oracle"])
    sweep = routers["correctness"]["cost_sweep"]
    assert sorted(p["price"] for p in sweep) == sorted(mr.STRONG_CALL_PRICES)
    by_price = sorted(sweep, key=lambda p: p["price"])  # a dearer GPT-4 call never buys more calls
    assert np.all(np.diff([p["strong_fraction"] for p in by_price]) <= 0) and by_price[0]["strong_fraction"] > 0.3
    record["settings"] |= {"date": "2025-01-01", "machine": "test", "command": "test", "encoder": "random features",
                           "embedding_seconds": 0, "max_rows": None, "subjects": 2}
    text = mr.report_markdown(json.loads(json.dumps(record)))
    assert "Route-only deferral model" in text and "pending" in text and "| Oracle" in text
    assert f"{routers['weak_wrong']['apgr']:.3f}" in text
    # RouteLLM's Table 2 (arXiv:2406.18665v4), typed in from the paper, sits beside this record's rows.
    assert "| RouteLLM, Table 2: SW Ranking | D_arena + D_gold | 35.40% | 71.55% | 0.603 | (+20.7%) |" in text
    assert "| RouteLLM, Table 2: Random (95% CI) |  | 50.07(± 0)% | 79.93(± 0)% | 0.500(± 0) | (+0%) |" in text
    assert "| This report: Subject only | MMLU test, the other 2 folds |" in text and "not quoted" not in text
    assert "This report: Route-only" not in text  # pending: no row beside the paper's


def test_a_route_only_fit_fills_its_row():
    features, subjects, strong, weak = synthetic(300, seed=1)
    calls = []

    def route_only(train_features, correct, seed):
        calls.append((len(train_features), correct.shape))
        return mr.fit_correctness_classifiers(train_features, correct, seed, epochs=5)

    record = mr.compare(features, subjects, strong, weak, folds=3, bootstrap=5, epochs=5, route_only=route_only,
                        log=lambda _: None)
    assert [c[1][1] for c in calls] == [2, 2, 2] and sum(c[0] for c in calls) == 2 * 300
    row = record["routers"]["route_only"]
    assert "pending" not in row and set(row["ece"]) == {"weak", "strong"} and len(row["bootstrap_minus_subject"]) == 5
    record["settings"] |= {"date": "2025-01-01", "machine": "test", "command": "test", "encoder": "random features",
                           "embedding_seconds": 0, "max_rows": None, "subjects": 2}
    text = mr.report_markdown(record)
    assert "cross-fitted on the same folds" in text and "Pending" not in text


def test_docstring_examples():
    result = doctest.testmod(mr, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.slow
def test_script_end_to_end_on_a_tiny_encoder(tmp_path):
    """scripts/mmlu_routing.py on 300 questions with a tiny random BERT, then --render-only."""
    torch = pytest.importorskip("torch")
    from transformers import BertConfig, BertModel, BertTokenizer

    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"the a of is which answer following".split()]
    torch.manual_seed(0)
    encoder = tmp_path / "tiny"
    BertModel(BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=20,
                         vocab_size=len(words))).save_pretrained(encoder)
    BertTokenizer(vocab={word: i for i, word in enumerate(words)}).save_pretrained(encoder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DEFER_CACHE": str(tmp_path / "cache")}
    common = [sys.executable, str(SCRIPT), "--output", str(tmp_path)]
    subprocess.run([*common, "--model", str(encoder), "--max-rows", "300", "--folds", "3", "--bootstrap", "5",
                    "--epochs", "3"], check=True, env=env, capture_output=True, text=True)
    record = json.loads((tmp_path / "mmlu_routing.json").read_text())
    assert record["settings"]["rows"] == 300 and record["routers"]["route_only"] == {"pending": True}
    first = (tmp_path / "mmlu_routing.md").read_text()
    subprocess.run([*common, "--render-only"], check=True, env=env, capture_output=True, text=True)
    assert (tmp_path / "mmlu_routing.md").read_text() == first


def test_the_committed_report_rows_follow_from_the_committed_predictions():
    """results/mmlu_routing.json's end-to-end and subject-only rows, recomputed here from the shipped data and the
    committed out-of-fold estimates (results/mmlu_e2e_predictions.json) with a per-subject lookup written out by hand:
    the report's headline numbers are the files', not retyped."""
    import json
    from pathlib import Path

    from hf_defer.data.routellm_mmlu import load_routellm_mmlu
    from hf_defer.evaluation.routellm_metrics import apgr, call_performance_curve

    root = Path(__file__).resolve().parents[2] / "results"
    report = json.loads((root / "mmlu_routing.json").read_text())["routers"]
    saved = json.loads((root / "mmlu_e2e_predictions.json").read_text())
    data = load_routellm_mmlu()
    strong = np.asarray(data["gpt-4-1106-preview"], dtype=float)
    weak = np.asarray(data["mixtral-8x7b-instruct"], dtype=float)
    assert saved["columns"] == ["mixtral-8x7b-instruct", "gpt-4-1106-preview"] and saved["n"] == data.num_rows
    estimates, fold = np.asarray(saved["estimates"], dtype=float), np.asarray(saved["fold"])
    assert estimates.shape == (data.num_rows, 2) and np.isfinite(estimates).all()
    assert apgr(call_performance_curve(estimates[:, 1] - estimates[:, 0], strong, weak)) == pytest.approx(
        report["route_only_e2e"]["apgr"], abs=1e-9)
    subject, gain = np.asarray(data["subject"]), np.zeros(data.num_rows)
    for k in np.unique(fold):
        for name in np.unique(subject):
            train, held = (subject == name) & (fold != k), (subject == name) & (fold == k)
            gain[held] = strong[train].mean() - weak[train].mean()
    assert apgr(call_performance_curve(gain, strong, weak)) == pytest.approx(report["subject"]["apgr"], abs=1e-9)
    assert report["route_only_e2e"]["apgr"] > report["subject"]["apgr"]
