"""research.mmlu_e2e_router: the end-to-end route-only router cross-fitted on the MMLU report's folds. Every row is
predicted exactly once, by a model whose training rows exclude its fold; the batched estimates are the library
pipeline's; the files the GPU run writes are what scripts/mmlu_routing.py checks and reads. Tiny random BERTs."""

from __future__ import annotations

import doctest
import json

import numpy as np
import pytest
from transformers import pipeline

import research.mmlu_e2e_router as e2e
from research.mmlu_routing import selected_rows, subject_folds
from script_loader import load_script
from tiny_bert import save_tiny_bert

WORDS = "add two numbers prove theorem name capital city translate word".split()


def _synthetic(n: int, seed: int = 0):
    """Prompts drawn alike for both subjects: the weak model is right on history only, the strong one everywhere."""
    rng = np.random.default_rng(seed)
    subjects = rng.choice(["history", "math"], size=n).tolist()
    prompts = [" ".join(rng.choice(WORDS, size=int(rng.integers(2, 6)))) for _ in range(n)]
    correct = np.stack([np.array(subjects) == "history", np.ones(n, dtype=bool)], axis=1).astype(np.float32)
    return prompts, subjects, correct


def test_every_row_is_predicted_once_by_a_model_that_did_not_train_on_it():
    subjects = ["a"] * 7 + ["b"] * 5 + ["c"] * 11
    fold = subject_folds(subjects, 5, seed=0)
    trained_on, predicted = {}, []

    def fit(train):
        k = len(trained_on)
        trained_on[k] = set(train.tolist())

        def estimate(rows):
            predicted.append((k, rows.tolist()))
            return np.column_stack([np.full(len(rows), k / 10), np.full(len(rows), 0.5)])

        return estimate

    out = e2e.cross_fit_e2e(["q"] * len(subjects), subjects, np.zeros((len(subjects), 2)), fold, fit)
    rows = sorted(row for _, held in predicted for row in held)
    assert rows == list(range(len(subjects)))  # each row exactly once
    for k, held in predicted:
        assert trained_on[k].isdisjoint(held)
        assert trained_on[k] | set(held) == set(range(len(subjects)))
        assert set(fold[held].tolist()) == {k}  # folds visited in order 0..4: model k scored fold k
        np.testing.assert_allclose(out[held, 0], k / 10)
    assert out.shape == (len(subjects), 2)


def test_estimates_out_of_shape_or_nan_are_refused():
    with pytest.raises(ValueError, match="fold 0: the estimates must be finite"):
        e2e.cross_fit_e2e(["q"] * 4, ["s"] * 4, np.zeros((4, 2)), np.array([0, 0, 1, 1]),
                          lambda train: (lambda rows: np.full((len(rows), 2), np.nan)))


def test_the_router_learns_the_subject_and_its_batches_are_the_pipelines(tmp_path):
    encoder = save_tiny_bert(tmp_path / "bert", WORDS, max_positions=16)
    prompts, subjects, correct = _synthetic(64)
    settings = e2e.E2ESettings(lr=1e-3, head_lr=0.05, epochs=4, batch_size=16, eval_batch_size=5, max_length=16,
                               side_feature_dim=4, warmup=0.0)
    estimate = e2e.fit_e2e_router(prompts, subjects, correct, str(encoder), settings)
    test_prompts, test_subjects, _ = _synthetic(12, seed=1)
    got = estimate(test_prompts, test_subjects)
    assert got.shape == (12, 2) and np.all((got >= 0) & (got <= 1))
    assert estimate.steps == 16 and len(estimate.model.config.side_features) == 1
    history = np.array(test_subjects) == "history"
    assert 0 < history.sum() < 12
    assert got[~history, 0].max() < got[history, 0].min()  # the weak model: right on history only
    # the same numbers through the library's pipeline (one row at a time, no padding)
    from transformers import AutoTokenizer

    router = pipeline("deferral", model=estimate.model, tokenizer=AutoTokenizer.from_pretrained(encoder))
    outputs = router([{"text": p, "subject": s} for p, s in zip(test_prompts, test_subjects)], truncation=True)
    expected = np.array([[o["expert_scores"]["mixtral"], o["expert_scores"]["gpt4"]] for o in outputs])
    np.testing.assert_allclose(got, expected, atol=1e-5)


@pytest.mark.slow  # about 8 s on a shared CPU: embeddings, then five folds
def test_the_script_writes_embeddings_and_complete_predictions_that_the_report_reads(tmp_path, capsys):
    encoder = save_tiny_bert(tmp_path / "bert", WORDS, max_positions=32)
    script = load_script("mmlu_e2e_router.py")
    out = tmp_path / "out"
    argv = ["--model", str(encoder), "--output", str(out), "--device", "cpu", "--max-rows", "30", "--max-steps", "1",
            "--batch-size", "8", "--max-length", "32", "--side-feature-dim", "2"]
    record = script.main(argv)
    rows = selected_rows(14037, 30, 0)
    embeddings = np.load(out / "embeddings_0.npy")
    assert embeddings.shape == (30, 16) and embeddings.dtype == np.float32
    meta = json.loads((out / "embeddings.json").read_text())
    assert meta["rows"] == rows.tolist() and meta["parts"] == ["embeddings_0.npy"]
    saved = json.loads((out / "e2e_predictions.json").read_text())
    assert saved["complete"] and sorted(saved["folds_done"]) == [0, 1, 2, 3, 4]
    assert saved["columns"] == ["mixtral-8x7b-instruct", "gpt-4-1106-preview"] == list(e2e.COLUMNS)
    assert all(info["train_rows"] + info["test_rows"] == 30 and info["steps"] == 1 for info in saved["fold_info"])
    assert saved["settings"]["max_steps"] == 1 and record["n"] == 30
    from hf_defer.data import load_routellm_mmlu

    fold = subject_folds(load_routellm_mmlu().select(rows)["subject"], 5, 0)
    estimates = e2e.check_predictions(saved, rows, fold, "test")
    assert estimates.shape == (30, 2) and np.all((estimates > 0) & (estimates < 1))
    np.testing.assert_array_equal(e2e.load_embeddings(out / "embeddings_0.npy", rows), embeddings)
    with pytest.raises(FileExistsError, match="--overwrite"):  # nothing saved is replaced without asking
        script.main(argv)
    # what the report refuses: another selection, other folds, an unfinished run
    with pytest.raises(ValueError, match="30 dataset rows, but the report has 29"):
        e2e.check_predictions(saved, rows[:29], fold[:29], "f")
    with pytest.raises(ValueError, match="not the report's"):
        e2e.check_predictions(saved, rows, (fold + 1) % 5, "f")
    saved["estimates"][3] = None
    with pytest.raises(ValueError, match="1 rows have no estimate"):
        e2e.check_predictions(saved, rows, fold, "f")
    with pytest.raises(ValueError, match="but the report has 31 questions"):
        e2e.load_embeddings(out / "embeddings_0.npy", np.arange(31))
    with pytest.raises(ValueError, match="other dataset rows"):
        e2e.load_embeddings(out / "embeddings_0.npy", rows + 1)
    # a rerun of the router alone (the embeddings came from an earlier run): no embedding files, the same estimates
    again = tmp_path / "again"
    script.main([*argv[:3], str(again), *argv[4:], "--skip-embeddings"])
    assert sorted(path.name for path in again.iterdir()) == ["e2e_predictions.json"]
    rerun = json.loads((again / "e2e_predictions.json").read_text())
    np.testing.assert_allclose(e2e.check_predictions(rerun, rows, fold, "rerun"), estimates, atol=1e-5)
    with pytest.raises(ValueError, match="exclude each other"):
        script.main([*argv[:3], str(tmp_path / "x"), *argv[4:], "--skip-embeddings", "--embeddings-only"])


def test_embeddings_in_parts_join_in_order_and_a_missing_part_is_named(tmp_path):
    embeddings = np.arange(11 * 3, dtype=np.float32).reshape(11, 3)
    names = e2e.save_embeddings(tmp_path, embeddings, rows_per_part=4)
    assert names == ["embeddings_0.npy", "embeddings_1.npy", "embeddings_2.npy"]
    assert [len(np.load(tmp_path / n)) for n in names] == [4, 4, 3]
    np.testing.assert_array_equal(e2e.load_embeddings([tmp_path / n for n in names], np.arange(11)), embeddings)
    with pytest.raises(ValueError, match="7 rows .* the report has 11 questions"):
        e2e.load_embeddings([tmp_path / n for n in names[1:]], np.arange(11))


def test_docstring_examples():
    result = doctest.testmod(e2e, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


def _routing_data(n: int = 240, seed: int = 0):
    """Features that say nothing, three subjects; GPT-4 right more often on 'math'."""
    rng = np.random.default_rng(seed)
    subjects = rng.choice(["art", "law", "math"], size=n).tolist()
    weak = rng.random(n) < 0.6
    strong = rng.random(n) < np.where(np.array(subjects) == "math", 0.95, 0.7)
    return rng.normal(size=(n, 4)).astype(np.float32), subjects, strong, weak


def test_compare_adds_the_end_to_end_row_paired_with_the_subject_and_classifier_routers():
    import research.mmlu_routing as mr

    features, subjects, strong, weak = _routing_data()
    # estimates that know the outcome: a router that beats every fitted one
    knowing = np.column_stack([weak, strong]).astype(np.float64) * 0.8 + 0.1
    record = mr.compare(features, subjects, strong, weak, folds=3, bootstrap=10, epochs=2, log=lambda _: None,
                        route_only_e2e=knowing)
    routers = record["routers"]
    row = routers["route_only_e2e"]
    assert set(row["paired"]) == {"subject", "correctness_subject"}
    for other in ("subject", "correctness_subject"):
        for measure in ("apgr", "cpt_50"):
            expected = np.asarray(row[f"bootstrap_{measure}"]) - np.asarray(routers[other][f"bootstrap_{measure}"])
            np.testing.assert_allclose(row["paired"][other][measure], expected)
    assert row["apgr"] > routers["subject"]["apgr"] + 0.3 and row["apgr"] > 1  # keeps Mixtral where GPT-4 is wrong
    # the same estimates by the oracle's rule: call GPT-4 only where it alone is right
    assert row["cpt_50"] < routers["subject"]["cpt_50"]
    record["settings"] |= {"date": "2025-01-01", "machine": "test", "command": "test", "encoder": "random features",
                           "embedding_seconds": 0, "max_rows": None, "subjects": 3}
    text = mr.report_markdown(record)
    label = "Route-only deferral model fine-tuned end to end (MiniLM + subject side feature)"
    assert f"| {label} |" in text
    assert f"{label} against Subject only" in text and "ahead, the interval excludes 0" in text
    for bad, message in ((knowing[:-1], r"must be \[240, 2\]"), (knowing * 2, "values outside")):
        with pytest.raises(ValueError, match=message):
            mr.compare(features, subjects, strong, weak, folds=3, bootstrap=2, epochs=1, log=lambda _: None,
                       route_only_e2e=bad)


def test_an_old_record_without_the_row_renders_it_pending():
    import research.mmlu_routing as mr

    features, subjects, strong, weak = _routing_data(90)
    record = mr.compare(features, subjects, strong, weak, folds=3, bootstrap=2, epochs=1, log=lambda _: None)
    assert record["routers"]["route_only_e2e"] == {"pending": True}
    del record["routers"]["route_only_e2e"]  # a JSON written before the row existed
    record["settings"] |= {"date": "2025-01-01", "machine": "test", "command": "test", "encoder": "random features",
                           "embedding_seconds": 0, "max_rows": None, "subjects": 3}
    text = mr.report_markdown(record)
    assert "| Route-only deferral model fine-tuned end to end (MiniLM + subject side feature) | pending |" in text


def test_the_report_script_reads_the_gpu_embeddings_and_end_to_end_estimates(tmp_path):
    from hf_defer.data import load_routellm_mmlu

    script = load_script("mmlu_routing.py")
    n, folds = 150, 3
    rows = selected_rows(14037, n, 0)
    data = load_routellm_mmlu().select(rows)
    fold = subject_folds([str(s) for s in data["subject"]], folds, 0)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    rng = np.random.default_rng(0)
    embeddings = rng.normal(size=(n, 8)).astype(np.float32)
    parts = e2e.save_embeddings(gpu, embeddings, rows_per_part=60)
    (gpu / "embeddings.json").write_text(json.dumps({"rows": rows.tolist(), "parts": parts, "encoder": "MiniLM",
                                                     "device_name": "NVIDIA H200"}))
    correct = np.stack([np.asarray(data[c], dtype=float) for c in e2e.COLUMNS], axis=1)
    estimates = np.clip(0.5 * correct + 0.25 + rng.normal(0, 0.05, size=correct.shape), 0, 1)
    settings = {"epochs": 2, "batch_size": 32, "lr": 3e-5, "head_lr": 1e-3, "side_feature_dim": 16,
                "weight_decay": 0.01, "warmup": 0.1, "max_length": 256}
    predictions = {"rows": rows.tolist(), "fold": fold.tolist(), "folds": folds, "fold_seed": 0,
                   "columns": list(e2e.COLUMNS), "estimates": estimates.round(6).tolist(), "settings": settings,
                   "device_name": "NVIDIA H200", "encoder": "MiniLM",
                   "fold_info": [{"train_seconds": 10.0, "predict_seconds": 1.0}] * folds}
    (gpu / "e2e_predictions.json").write_text(json.dumps(predictions))
    common = ["--output", str(tmp_path / "report"), "--max-rows", str(n), "--folds", str(folds), "--bootstrap", "5",
              "--epochs", "2", "--embeddings", *[str(gpu / p) for p in parts]]
    script.main([*common, "--route-only-e2e", str(gpu / "e2e_predictions.json")])
    record = json.loads((tmp_path / "report" / "mmlu_routing.json").read_text())
    row = record["routers"]["route_only_e2e"]
    assert record["settings"]["rows"] == n and "NVIDIA H200" in record["settings"]["encoder"]
    # the row is exactly these estimates, evaluated: its exact-curve APGR from the same score computed here
    from hf_defer.evaluation.routellm_metrics import apgr, call_performance_curve

    score = estimates.round(6)[:, 1] - estimates.round(6)[:, 0]
    strong, weak = correct[:, 1].astype(bool), correct[:, 0].astype(bool)
    assert row["apgr_exact"] == pytest.approx(apgr(call_performance_curve(score, strong, weak, None)), abs=1e-9)
    text = (tmp_path / "report" / "mmlu_routing.md").read_text()
    assert "**Fine-tuned end to end.**" in text and "on NVIDIA H200" in text and "33 s for the 3 folds" in text
    # another selection, other folds, a missing part: refused, naming the file
    with pytest.raises(ValueError, match="but the report has 149"):
        script.main([*common[:2], "--max-rows", str(n - 1), "--route-only-e2e", str(gpu / "e2e_predictions.json")])
    with pytest.raises(ValueError, match="not the report's"):
        script.main([*common, "--fold-seed", "0", "--folds", "4", "--route-only-e2e",
                     str(gpu / "e2e_predictions.json")])
    with pytest.raises(ValueError, match="90 rows .* the report has 150 questions"):
        script.main([*common[:-3], str(gpu / parts[1]), str(gpu / parts[2])])
