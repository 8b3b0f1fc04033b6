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
